"""Where a `serve` one-row request's time goes (issue 50), in the real server: `scoring-worker
serve` on bench/serve.py's model pinned to one core, `wrk` (1 thread, 8 connections) sending
one-row JSON requests from the other, py-spy attached for a fixed window; the samples summed
by function (its own time and with what it calls), as bench/profile_broker.py sums them, and
the requests/s wrk measured (py-spy's sampling slows the server a little: the rate is for
the proportions, bench/serve.py gives the speed). Only running samples are kept (what uses
the core); py-spy reads the stacks without pausing the server (--nonblocking: a paused server
is another server), and drops the samples it cannot read whole.

    python bench/profile_serve.py [--seconds 8] [--missing]

Needs `pip install py-spy` and wrk. Writes bench/out/profile-serve-<dense|missing>.txt (the
summary) and .raw (py-spy's collapsed stacks).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import models  # noqa: E402
import profile_broker  # noqa: E402
import serve as sb  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--missing", action="store_true", help="rows with missing values")
    args = ap.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists() or shutil.which("wrk") is None:
        print("needs py-spy (pip install py-spy) and wrk", file=sys.stderr)
        return 2
    _, art, _ = sb.model_files()
    X, _ = models.data(2000, seed=7)
    if args.missing:
        X = models.with_missing(X, seed=8, frac=0.2)
    body = sb.json_body(X[:1].copy())
    kind = "missing" if args.missing else "dense"
    out = REPO / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    raw = out / f"profile-serve-{kind}.raw"
    server = sb.ours(art, sb.free_port())
    try:
        server.wait_ready()
        sb.wrk(server.infer_url, body, "application/json", 2)  # warm
        rec = subprocess.Popen([spy, "record", "--pid", str(server.proc.pid), "--rate", "400",
                                "--duration", str(int(args.seconds)), "--format", "raw",
                                "--output", str(raw), "--threads", "--nonblocking"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        res: dict = {}
        t = threading.Thread(target=lambda: res.update(
            sb.wrk(server.infer_url, body, "application/json", args.seconds)))
        t.start()
        t.join()
        _, err = rec.communicate(timeout=120)
        if rec.returncode != 0 or not raw.exists():
            print(err[-2000:], file=sys.stderr)
            return 1
    finally:
        server.stop()
    text = (f"one-row JSON requests ({kind}), wrk 1 thread 8 connections {args.seconds:g} s "
            f"under py-spy: {res.get('rps', 0):,.0f} requests/s\n\n"
            + profile_broker.summarize(raw, top=40))
    (out / f"profile-serve-{kind}.txt").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
