"""Where a `serve` request's time goes, in process (no HTTP): `Service.handle` for a one-row
JSON request and a 1,000-row binary and Arrow request, against `score_batch` on the same rows,
one thread; with --profile, cProfile's top entries for the one-row request.

    taskset -c 0 python bench/serve_profile.py [--profile]

Uses bench/serve.py's model (bench/out/serve/xgb300.swm; run make bench-serve once first).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def per_call_us(f, n: int) -> float:
    for _ in range(min(n // 10, 200)):
        f()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    import models
    import serve as sb

    from worker.config import load_settings
    from worker.serve.service import Service

    art = HERE / "out" / "serve" / "xgb300.swm"
    s = load_settings(None, defaults={"source": {"type": "file", "path": os.devnull}},
                      model={"path": str(art)})
    svc = Service(s, str(art), "xgb300")
    svc.load()
    m = svc.current.model
    path = b"/v2/models/xgb300/infer"
    X, _ = models.data(2000, seed=7)
    Xm = models.with_missing(X, seed=8, frac=0.2)
    one, thousand = X[:1].copy(), Xm[:1000].copy()
    body1 = sb.json_body(one)
    h1 = {b"content-type": b"application/json"}
    bb, hl = sb.binary_body(thousand)
    hb = {b"content-type": b"application/octet-stream",
          b"inference-header-content-length": str(hl).encode()}
    ab = sb.arrow_body(thousand, [f"f{i}" for i in range(thousand.shape[1])])
    ha = {b"content-type": b"application/vnd.apache.arrow.stream"}
    rows = [
        ("one row: Service.handle, JSON", per_call_us(
            lambda: svc.handle(b"POST", path, h1, body1), 20000)),
        ("one row: score_batch", per_call_us(lambda: m.score_batch(one, n_threads=1), 20000)),
        ("1,000 rows: Service.handle, binary", per_call_us(
            lambda: svc.handle(b"POST", path, hb, bb), 500)),
        ("1,000 rows: Service.handle, Arrow", per_call_us(
            lambda: svc.handle(b"POST", path, ha, ab), 500)),
        ("1,000 rows: score_batch", per_call_us(
            lambda: m.score_batch(thousand, n_threads=1), 500)),
    ]
    for name, us in rows:
        print(f"{name:<40} {us:10.1f} us")
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20000):
            svc.handle(b"POST", path, h1, body1)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
