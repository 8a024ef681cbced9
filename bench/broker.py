"""Records/s through a real Kafka broker: the demo topic -> worker -> committed scores.

    python bench/broker.py [--messages 2000] [--mode exactly_once|at_least_once]

Needs `deploy/kafka-local/broker start` (or BOOTSTRAP=host:port) and `make demo-data`.
Measures from the worker's start until every input id is readable under read_committed, so
the figure includes process start-up, the group join and the first transaction's set-up.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from confluent_kafka import Consumer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from tests import kafka_util as K  # noqa: E402
from worker.replay import produce_records  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="exactly_once")
    ap.add_argument("--model", default=str(REPO / "models" / "demo-xgb.model"))
    ap.add_argument("--lazy", default="off")
    ap.add_argument("--repeat", type=int, default=5, help="publish the demo topic N times")
    args = ap.parse_args()
    bootstrap = os.environ.get("BOOTSTRAP") or subprocess.run(
        [str(REPO / "deploy" / "kafka-local" / "broker"), "start"], capture_output=True,
        text=True, check=True).stdout.split()[-1]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    run = uuid.uuid4().hex[:8]
    topics = {"in": f"bench-in-{run}", "out": f"bench-out-{run}", "dlq": f"bench-dlq-{run}"}
    for f in admin.create_topics([NewTopic(topics["in"], 3), NewTopic(topics["out"], 3),
                                  NewTopic(topics["dlq"], 1)]).values():
        f.result()
    n = sum(produce_records(bootstrap, topics["in"], REPO / "data" / "demo.arrows")
            for _ in range(args.repeat))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = K.write_config(Path(tmp) / "c.yaml", bootstrap, Path(args.model), topics["in"],
                             topics["out"], topics["dlq"], group=f"bench-{run}", mode=args.mode)
        cfg.write_text(cfg.read_text().replace("threads: 1", "threads: 2"))
        t0 = time.monotonic()
        proc = K.start_worker(cfg, Path(tmp) / "w.log",
                              env={"SCORING_WORKER__SCORING__LAZY__MODE": args.lazy})
        rows = 99_850 * args.repeat  # the demo topic: 2000 messages x 50 rows, 3 malformed
        reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{run}",
                           "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
        reader.subscribe([topics["out"]])
        got, first, ids = 0, None, set()
        deadline = time.monotonic() + 600
        while got < rows and time.monotonic() < deadline:
            for m in reader.consume(1000, 0.2):
                if m.error() is None:
                    batch_ids = K.output_ids([m])
                    got += len(batch_ids)
                    ids.update(batch_ids.tolist())
                    if first is None:
                        first = (time.monotonic(), got)
        done = time.monotonic()
        reader.close()
        K.stop_worker(proc)
    elapsed = done - t0
    steady = (got - first[1]) / max(done - first[0], 1e-9)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"mode {args.mode}, lazy {args.lazy}, {n} messages in")
    print(f"{got} rows ({len(ids)} distinct ids) committed in {elapsed:.1f} s = "
          f"{got / elapsed:,.0f} rows/s including start-up; {steady:,.0f} rows/s after the first "
          "output")
    for f in admin.delete_topics(list(topics.values())).values():
        f.result()
    return 0


if __name__ == "__main__":
    sys.exit(main())
