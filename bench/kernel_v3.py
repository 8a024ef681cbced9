"""Issue 56's XGBoost ratios in one quick run: ours against XGBoost's `inplace_predict` on
models A and B, one thread, dense rows and rows with 2% missing values, the two engines
alternated call by call (median of ROUNDS), and A's one-row `predict_proba` p50.

    python bench/kernel_v3.py            # KEYS=A for one model; ROUNDS=15 for more rounds

Prints NAME VALUE lines (bench/ab.py reads them). `make bench` gives the full tables.
"""

import os
import sys
import time

sys.path.insert(0, ".")  # this checkout's `worker` first (bench/ab.py runs it in a worktree)
import worker  # noqa: E402

sys.path.insert(0, "bench")
import models as M  # noqa: E402
import numpy as np  # noqa: E402

N = 50_000


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    rounds = int(os.environ.get("ROUNDS", "9"))
    for key in os.environ.get("KEYS", "AB"):
        bm = M.load(key)
        ours = worker.compile_model(bm.source)
        booster = bm.source
        booster.set_param({"nthread": 1})
        dense = M.data(N, seed=7)[0].astype(np.float32)
        for name, X in (("dense", dense), ("missing", M.with_missing(dense, seed=8))):
            a = ours.predict_proba(X[:2000], n_threads=1)[:, 1]
            b = booster.inplace_predict(X[:2000])
            assert np.max(np.abs(a - b)) <= 1e-5, "answers differ from XGBoost's"
            t_ours, t_xgb = [], []
            for _ in range(rounds):
                t_ours.append(timed(lambda m=ours, x=X: m.predict_proba(x, n_threads=1)))
                t_xgb.append(timed(lambda b=booster, x=X: b.inplace_predict(x)))
            o, x = N / np.median(t_ours), N / np.median(t_xgb)
            print(f"{key}.{name}.ours_rows_per_s {o:.0f}\n{key}.{name}.xgboost_rows_per_s "
                  f"{x:.0f}\n{key}.{name}.ratio {o / x:.3f}", flush=True)
        if key == "A":
            one = dense[:1].copy()
            lat = []
            for _ in range(20_000):
                t0 = time.perf_counter_ns()
                ours.predict_proba(one)
                lat.append(time.perf_counter_ns() - t0)
            print(f"A.single_row_p50_us {np.median(lat) / 1000:.3f}", flush=True)


if __name__ == "__main__":
    main()
