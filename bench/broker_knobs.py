"""The worker's broker-path rate under other consumer and batch settings (issue 54): for each
setting, a fresh backlog of N-row Arrow messages, the worker started on it, the rate a
read_committed reader sees (bench/e2e.py's measure), exactly once.

    python bench/broker_knobs.py [--rows 100] [--messages 20000]

Needs the local broker (`deploy/kafka-local/broker start`, or BOOTSTRAP=host:port).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import e2e  # noqa: E402

SETTINGS = [
    ("as configured", {}, {}),
    ("max.partition.fetch.bytes 8 MB", {"max.partition.fetch.bytes": 8 << 20}, {}),
    ("... and fetch.wait.max.ms 100", {"max.partition.fetch.bytes": 8 << 20,
                                       "fetch.wait.max.ms": 100}, {}),
    ("max_batch_rows 65,536", {}, {"max_batch_rows": 65_536}),
    ("as configured, again", {}, {}),
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--messages", type=int, default=20_000)
    args = ap.parse_args()
    _xgb, art = e2e.model_files()
    bootstrap = e2e.bootstrap_servers()
    vals = e2e.values(args.rows, args.messages)
    print(f"| setting ({args.rows} rows a message, exactly once) | msg/s |\n|---|---|")
    for name, client, delivery in SETTINGS:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            topics = e2e.Topics(bootstrap)
            try:
                e2e.produce_backlog(bootstrap, topics.input, vals)
                proc = e2e.start_worker(e2e.worker_config(tmp, bootstrap, art, topics,
                                                          "exactly_once", client=client,
                                                          **delivery), tmp / "w.log")
                try:
                    r = e2e.read_rate(bootstrap, topics.output, args.messages, 600)
                finally:
                    e2e.stop(proc)
            finally:
                topics.delete()
        print(f"| {name} | {r['rate'] or 0:,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
