"""make bench-serve-fairness: a client sending one-row requests on a kept-alive connection,
timed alone and then while each attack of issue 50 runs against `scoring-worker serve`, now
and as it was before issue 50 (commit BEFORE, its hand-written server, from a worktree built
here); writes bench/SERVE-FAIRNESS.md and bench/out/serve-fairness.json.

    python bench/serve_fairness.py [--seconds 4]

The attacks and the client are tests/test_serve_fairness.py's (which holds the server as it is
now to p99 <= 10x idle); the attacker runs in a process of its own at nice 19. The model is
that test's: XGBoost, 200 trees of depth 6, 32 features.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out" / "serve-fairness"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

BEFORE = "fe43014"  # serve on its hand-written HTTP/1.1 server (issue 50 replaced it)
ATTACKS = ["explain", "big_json", "nested", "trailers", "silent", "pipeline"]


def model() -> Path:
    import xgboost as xgb

    import worker
    from tests.test_serve_fairness import N_FEATURES

    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "m.model"
    if not path.exists():
        rng = np.random.default_rng(7)
        X = rng.normal(size=(4000, N_FEATURES)).astype(np.float32)
        y = (X[:, :4].sum(1) + rng.normal(size=4000) > 0).astype(int)
        booster = xgb.train({"objective": "binary:logistic", "max_depth": 6, "eta": 0.1,
                             "base_score": 0.5}, xgb.DMatrix(X, y), 200)
        worker.compile_model(booster).save(path)
    return path


class Serve:
    def __init__(self, tree: Path, path: Path):
        self.log = open(OUT / f"serve-{time.monotonic_ns()}.log", "w+b")  # noqa: SIM115
        env = dict(os.environ, PYTHONPATH=str(tree))
        self.proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "serve", "--model",
                                      str(path), "--name", "m", "--port", "0"], cwd=tree,
                                     stdout=self.log, stderr=self.log, env=env,
                                     start_new_session=True)
        deadline = time.monotonic() + 120
        while True:
            m = re.search(r"on http://([0-9.]+):(\d+)/v2", Path(self.log.name).read_text())
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                break
            assert self.proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        import urllib.request

        while True:
            try:
                with urllib.request.urlopen(f"http://{self.host}:{self.port}/v2/health/ready",
                                            timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(tree: Path, path: Path, seconds: float) -> dict:
    from tests.test_serve_fairness import _attack, _good_client

    out = {}
    for kind in ["idle", *ATTACKS]:
        s = Serve(tree, path)  # a server of its own for each attack: peak memory is its own
        try:
            _good_client(s.host, s.port, 1.0)  # warm
            p = None
            if kind != "idle":
                ctx = multiprocessing.get_context("spawn")
                ready = ctx.Event()
                p = ctx.Process(target=_attack, args=(kind, s.host, s.port, seconds + 2,
                                                      ready))
                p.start()
                ready.wait(60)
                time.sleep(1.0)
            lat, failed = _good_client(s.host, s.port, seconds)
            if p is not None:
                p.join(180)
                if p.is_alive():
                    p.kill()
            rss = peak_rss_mb(s.proc.pid)
        finally:
            s.stop()
        out[kind] = {"requests": len(lat), "failed": failed,
                     "p50_ms": float(np.percentile(lat, 50)) * 1e3,
                     "p99_ms": float(np.percentile(lat, 99)) * 1e3,
                     "max_ms": max(lat) * 1e3, "peak_rss_mb": rss}
        r = out[kind]
        print(f"{tree.name:>24} {kind:<9} p50 {r['p50_ms']:8.2f} ms  p99 {r['p99_ms']:8.2f} ms"
              f"  max {r['max_ms']:8.1f} ms  {r['requests']:5d} requests, {failed} failed, "
              f"peak RSS {rss:,.0f} MiB", flush=True)
    return out


def report(res: dict) -> str:
    from report import machine

    m = res.get("machine") or machine()
    lines = [
        "# `serve`: a good client while attacks run, before and after issue 50",
        "",
        f"One client sends one-row JSON requests on a kept-alive connection (~400/s) for "
        f"{res['seconds']:g} s, alone (idle) and while each attack runs from a process at nice "
        "19 (tests/test_serve_fairness.py's attacks: 4 clients asking reason codes for "
        "serve.max_explain_rows rows, 2 sending valid JSON at serve.max_json_bytes, 8 sending "
        "16 MiB of nested empty arrays, 40 endless trailers, 1,000 silent connections, 6 "
        "clients pipelining without reading). A server of its own for each row (peak RSS is "
        f"its own). Before: commit {BEFORE} (the hand-written server); after: this commit. "
        f"Machine: {m.get('Model name', '?')}, {m.get('cpus_usable')} usable CPUs, "
        f"{m['date']}. Rerun: `make bench-serve-fairness` (bench/serve_fairness.py).",
        "",
        "| attack | before p50 / p99 / max ms | failed | peak RSS MiB | after p50 / p99 / max ms "
        "| failed | peak RSS MiB | after p99 / idle p99 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    idle = res["after"]["idle"]["p99_ms"]
    for kind in ["idle", *ATTACKS]:
        b, a = res["before"][kind], res["after"][kind]
        lines.append(
            f"| {kind} | {b['p50_ms']:.2f} / {b['p99_ms']:.2f} / {b['max_ms']:.1f} | "
            f"{b['failed']} of {b['requests']} | {b['peak_rss_mb']:,.0f} | "
            f"{a['p50_ms']:.2f} / {a['p99_ms']:.2f} / {a['max_ms']:.1f} | "
            f"{a['failed']} of {a['requests']} | {a['peak_rss_mb']:,.0f} | "
            f"{a['p99_ms'] / idle:.1f}x |")
    return "\n".join(lines) + "\n"


def main() -> int:
    import worktree

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--report", action="store_true")
    args = ap.parse_args()
    path_json = HERE / "out" / "serve-fairness.json"
    if args.report:
        res = json.loads(path_json.read_text())
    else:
        from report import machine

        path = model()
        before = worktree.checkout(BEFORE, HERE / "out" / "serve-before-tree")
        res = {"seconds": args.seconds, "machine": machine(),
               "after": measure(ROOT, path, args.seconds),
               "before": measure(before, path, args.seconds)}
        path_json.write_text(json.dumps(res, indent=1))
    (HERE / "SERVE-FAIRNESS.md").write_text(report(res))
    print(f"wrote {HERE / 'SERVE-FAIRNESS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
