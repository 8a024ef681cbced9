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

from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from tests import kafka_util as K  # noqa: E402
from worker.replay import produce_records  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="exactly_once")
    ap.add_argument("--model", default=str(REPO / "models" / "demo-xgb.model"))
    ap.add_argument("--lazy", default="off")
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
    n = produce_records(bootstrap, topics["in"], REPO / "data" / "demo.arrows")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = K.write_config(Path(tmp) / "c.yaml", bootstrap, Path(args.model), topics["in"],
                             topics["out"], topics["dlq"], group=f"bench-{run}", mode=args.mode)
        text = cfg.read_text().replace("threads: 1", "threads: 2")
        text = text.replace("lazy_placeholder", args.lazy)
        cfg.write_text(text)
        t0 = time.monotonic()
        proc = K.start_worker(cfg, Path(tmp) / "w.log",
                              env={"SCORING_WORKER__SCORING__LAZY__MODE": args.lazy})
        rows = 99_850  # the demo topic: 2000 messages x 50 rows, 3 of them malformed
        out = K.wait_for_ids(bootstrap, topics["out"], rows, timeout=600)
        elapsed = time.monotonic() - t0 - 2.0  # wait_for_ids lingers 2 s for duplicates
        K.stop_worker(proc)
    ids = K.output_ids(out)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"mode {args.mode}, lazy {args.lazy}, {n} messages in")
    print(f"{len(set(ids.tolist()))} ids in {elapsed:.1f} s = {len(ids) / elapsed:,.0f} rows/s "
          f"end to end ({len(out)} output messages)")
    for f in admin.delete_topics(list(topics.values())).values():
        f.result()
    return 0


if __name__ == "__main__":
    sys.exit(main())
