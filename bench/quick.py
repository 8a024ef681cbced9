"""Our kernels alone on models A-D: predict_proba rows/s (1 thread, 50,000 rows, A and B with
2% NaN, median of 7), single-row predict_proba p50, certified rows/s (A, D). A quick check that
a change left the kernels' speed alone; `make bench` compares with the other libraries.

    python bench/quick.py            # from the repository root; KEYS=C for one model
"""

import os
import sys
import time

sys.path.insert(0, "bench")
sys.path.insert(1, ".")
import models as M  # noqa: E402
import numpy as np  # noqa: E402

import worker  # noqa: E402


def seconds(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    for key in os.environ.get("KEYS", "ABCD"):
        model = worker.compile_model(M.load(key).source)
        X = M.data(50_000, seed=7)[0].astype(np.float32)
        if key in "AB":
            X = M.with_missing(X, seed=8)
        model.predict_proba(X[:1000], n_threads=1)  # warm-up
        full = seconds(lambda m=model, x=X: m.predict_proba(x, n_threads=1), 7)
        one = X[:1].copy()
        lat = []
        for _ in range(20_000):
            t0 = time.perf_counter_ns()
            model.predict_proba(one)
            lat.append(time.perf_counter_ns() - t0)
        lazy = (seconds(lambda m=model, x=X: m.score_batch(x, lazy="certified", n_threads=1), 5)
                if key in "AD" else None)
        print(f"{key}: {50_000 / full:,.0f} rows/s, single row p50 {np.median(lat) / 1000:.2f} us"
              + (f", certified {50_000 / lazy:,.0f} rows/s" if lazy else ""), flush=True)
        # the same figures as NAME VALUE lines, for bench/ab.py
        print(f"{key}.rows_per_s {50_000 / full:.0f}\n{key}.single_row_p50_us "
              f"{np.median(lat) / 1000:.3f}"
              + (f"\n{key}.certified_rows_per_s {50_000 / lazy:.0f}" if lazy else ""), flush=True)


if __name__ == "__main__":
    main()
