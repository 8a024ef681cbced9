"""Where a `serve` one-row request's time goes, measured by taking parts away (issue 50): the
real server (`worker.serve.server.serve_socket`, bench/serve.py's model, pinned to CPU 0) under
`wrk` (1 thread, 8 connections, on CPU 1), once as it is and once with `Service.handle`
replaced by its own answer to the same request (what is left is the HTTP layer: uvloop,
httptools, uvicorn's request cycle, the bounds, the kernel's sockets). Also `Service.handle`
timed inside the serving process (a wrapper's perf_counter around each call, and a second
call right after the first) and in a loop of its own (bench/serve_profile.py's way), and
CPU 0's user, system and softirq time a request from /proc/stat.

    python bench/serve_floor.py [--seconds 6] [--rounds 2] [--missing]

Needs wrk (Debian's package) and bench/serve.py's model (made on first use). Prints one
line a figure (NAME VALUE) and a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

PATH = b"/v2/models/xgb300/infer"
HEADERS = {b"content-type": b"application/json"}
WRK_LUA = """wrk.method = "POST"
local f = io.open(os.getenv("FLOOR_BODY"), "rb")
wrk.body = f:read("*all")
f:close()
wrk.headers["Content-Type"] = "application/json"
"""


def _service(art: str):
    from worker.config import load_settings
    from worker.serve.service import Service

    s = load_settings(None, defaults={"source": {"type": "file", "path": os.devnull}},
                      model={"path": art})
    svc = Service(s, art, "xgb300")
    svc.load()
    return svc


def _body() -> bytes:
    """bench/serve.py's one-row body: dense, or (FLOOR_MISSING=1) its row with missing values."""
    import models
    import serve as sb

    X, _ = models.data(2000, seed=7)
    if os.environ.get("FLOOR_MISSING") == "1":
        X = models.with_missing(X, seed=8, frac=0.2)
    return sb.json_body(X[:1].copy())


def server_main(mode: str, port: int, art: str, report: str) -> None:
    """The serving process: ``mode`` real, canned (handle answers its one answer) or timed
    (handle called twice a request, each call timed; the totals written to ``report`` when
    SIGTERM has stopped it)."""
    os.sched_setaffinity(0, {0})
    from worker.serve import server

    svc = _service(art)
    real = svc.handle
    body = _body()
    if mode == "canned":
        answer = real(b"POST", PATH, HEADERS, body)
        assert answer[0] == 200, answer
        svc.handle = lambda *a, **k: answer
    elif mode == "timed":
        acc = [0, 0.0, 0.0]

        def timed(*a, **k):
            t0 = time.perf_counter()
            r = real(*a, **k)
            t1 = time.perf_counter()
            real(*a, **k)
            acc[0] += 1
            acc[1] += t1 - t0
            acc[2] += time.perf_counter() - t1
            return r

        svc.handle = timed

        import atexit

        atexit.register(lambda: Path(report).write_text(json.dumps(acc)))  # after SIGTERM
    sock = server.bind("127.0.0.1", port, False)
    server.serve_socket(svc, sock, load_first=True)


def _cpu0() -> list[int]:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu0 "):
                return [int(v) for v in line.split()[1:8]]
    raise RuntimeError("no cpu0 in /proc/stat")


def run_server(mode: str, art: str, seconds: float, lua: Path, body_path: str) -> dict:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    report = tempfile.mktemp(suffix=".json")
    proc = subprocess.Popen([sys.executable, __file__, "--server", mode, str(port), art,
                             report], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(url + "/v2/health/ready", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"the {mode} server did not start")
        time.sleep(3)  # the JSON parsing process's start (its imports) done on CPU 0
        env = dict(os.environ, FLOOR_BODY=body_path)
        cmd = ["taskset", "-c", "1", "wrk", "-t1", "-c8", "--timeout", "10s", "-s", str(lua),
               url + PATH.decode()]
        subprocess.run(cmd[:4] + ["-d2s"] + cmd[4:], env=env, check=True,
                       capture_output=True)  # warm-up
        before = _cpu0()
        out = subprocess.run(cmd[:4] + [f"-d{seconds:g}s"] + cmd[4:], env=env, check=True,
                             capture_output=True, text=True).stdout
        after = _cpu0()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    rps = float(next(x for x in out.splitlines() if x.startswith("Requests/sec:")).split()[1])
    n = rps * seconds
    tick = 1e6 / os.sysconf("SC_CLK_TCK")
    d = [b - a for a, b in zip(before, after, strict=True)]  # user nice system idle iowait
    # irq softirq
    res = {"rps": rps, "user_us": d[0] * tick / n, "system_us": d[2] * tick / n,
           "softirq_us": d[6] * tick / n}
    if mode == "timed" and os.path.exists(report):
        calls, first, second = json.loads(Path(report).read_text())
        res["handle_us"] = first / calls * 1e6
        res["handle_again_us"] = second / calls * 1e6
        os.unlink(report)
    return res


def in_loop_us(art: str, calls: int = 20000) -> float:
    """Service.handle on the same request in a loop of its own, pinned to CPU 0."""
    code = ("import sys, time\n"
            f"sys.path[:0] = [{str(HERE)!r}, {str(HERE.parent)!r}]\n"
            "import os; os.sched_setaffinity(0, {0})\n"
            "import serve_floor as f\n"
            "svc = f._service(sys.argv[1]); body = f._body()\n"
            "h = lambda: svc.handle(b'POST', f.PATH, f.HEADERS, body)\n"
            "for _ in range(2000): h()\n"
            "t0 = time.perf_counter()\n"
            f"for _ in range({calls}): h()\n"
            f"print((time.perf_counter() - t0) / {calls} * 1e6)\n")
    out = subprocess.run([sys.executable, "-c", code, art], capture_output=True, text=True,
                         check=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--server":
        server_main(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--missing", action="store_true",
                    help="bench/serve.py's one-row request with missing values")
    args = ap.parse_args()
    if args.missing:  # (the serving processes and the loop read it too)
        os.environ["FLOOR_MISSING"] = "1"
    import serve as sb

    art = str(sb.model_files()[1])
    with tempfile.TemporaryDirectory() as d:
        lua = Path(d) / "post.lua"
        lua.write_text(WRK_LUA)
        body_path = str(Path(d) / "body.json")
        Path(body_path).write_bytes(_body())
        runs: dict[str, list[dict]] = {"real": [], "canned": [], "timed": []}
        loop = []
        for _ in range(args.rounds):  # alternated, so a slow minute falls on all
            for mode in runs:
                runs[mode].append(run_server(mode, art, args.seconds, lua, body_path))
            loop.append(in_loop_us(art))
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
    for m, r in med.items():
        for k, v in r.items():
            print(f"{m}_{k} {v:.1f}")
    print(f"handle_in_a_loop_us {statistics.median(loop):.1f}")
    real, canned = med["real"], med["canned"]
    per_real, per_canned = 1e6 / real["rps"], 1e6 / canned["rps"]
    print(f"\nOne-row JSON, {args.rounds} rounds of {args.seconds:g} s, medians: the server "
          f"{real['rps']:,.0f} requests/s ({per_real:.0f} us a request on its core); with "
          f"Service.handle answered at once {canned['rps']:,.0f} ({per_canned:.0f} us): the "
          f"HTTP layer is {per_canned / per_real:.0%} of a request, Service.handle "
          f"{1 - per_canned / per_real:.0%}. Service.handle timed in the server "
          f"{med['timed']['handle_us']:.0f} us (called again at once "
          f"{med['timed']['handle_again_us']:.0f}), in a loop of its own "
          f"{statistics.median(loop):.0f} us.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
