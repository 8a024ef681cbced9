"""Where the worker's time goes on the broker path (issue 54): a backlog of N-row Arrow
messages on the local broker, the worker started on it (exactly once by default, one scoring
thread, the bench/e2e.py model and config), py-spy attached for a fixed window while it drains
the backlog, then the samples summed by function (its own time and with what it calls) and by
thread.

    python bench/profile_broker.py [--rows 100] [--messages 20000] [--seconds 8]
        [--mode exactly_once|at_least_once] [--native]

Needs `pip install py-spy` and the local broker (`deploy/kafka-local/broker start`, or
BOOTSTRAP=host:port). Writes bench/out/profile-<mode>-<rows>-<all|busy>.txt (the summary)
and .raw (py-spy's collapsed stacks, for a flame graph tool). --busy keeps only the samples
where a thread runs (what uses the CPU); without it waiting is sampled too (what the loop
waits on).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import e2e  # noqa: E402


def summarize(raw: Path, top: int = 30) -> str:
    own: collections.Counter = collections.Counter()
    total: collections.Counter = collections.Counter()
    threads: collections.Counter = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        samples += n
        frames = stack.split(";")
        threads[frames[0]] += n
        seen = set()
        for f in frames[1:]:
            name = f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0] + ")" \
                if " (" in f else f
            if name not in seen:
                total[name] += n
                seen.add(name)
        leaf = frames[-1]
        own[leaf.split(" (")[0] + (" (" + leaf.split(" (")[1].split(":")[0] + ")"
                                   if " (" in leaf else "")] += n
    out = [f"{samples:,} samples", "", "by thread:"]
    out += [f"  {100 * n / samples:5.1f}%  {t}" for t, n in threads.most_common()]
    out += ["", f"own time (top {top}):"]
    out += [f"  {100 * n / samples:5.1f}%  {f}" for f, n in own.most_common(top)]
    out += ["", f"with what it calls (top {top}):"]
    out += [f"  {100 * n / samples:5.1f}%  {f}" for f, n in total.most_common(top)]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--mode", default="exactly_once")
    ap.add_argument("--native", action="store_true", help="native frames too (py-spy --native)")
    ap.add_argument("--busy", action="store_true",
                    help="only samples where a thread is running (no --idle): what uses the CPU, "
                         "not what waits")
    args = ap.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    _xgb, art = e2e.model_files()
    bootstrap = e2e.bootstrap_servers()
    out_dir = REPO / "bench" / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    kind = "busy" if args.busy else "all"
    raw = out_dir / f"profile-{args.mode}-{args.rows}-{kind}.raw"
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        topics = e2e.Topics(bootstrap)
        try:
            e2e.produce_backlog(bootstrap, topics.input, e2e.values(args.rows, args.messages))
            proc = e2e.start_worker(e2e.worker_config(tmp, bootstrap, art, topics, args.mode),
                                    tmp / "worker.log")
            try:
                time.sleep(3)  # start-up, the group join, the first transaction: not profiled
                cmd = [spy, "record", "--pid", str(proc.pid), "--duration",
                       str(int(args.seconds)), "--rate", "250", "--format", "raw",
                       "--threads", "--output", str(raw)] + ([] if args.busy else ["--idle"])
                if args.native:
                    cmd.append("--native")
                subprocess.run(cmd, check=True, capture_output=True)
            finally:
                e2e.stop(proc)
        finally:
            topics.delete()
    text = (f"worker, {args.mode}, {args.rows} rows a message, {args.seconds:.0f} s of a "
            f"{args.messages:,}-message backlog, "
            f"{'running samples only' if args.busy else 'running and waiting samples'} "
            f"(bench/profile_broker.py)\n\n" + summarize(raw))
    (out_dir / f"profile-{args.mode}-{args.rows}-{kind}.txt").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
