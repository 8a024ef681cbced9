"""Our kernels against CatBoost's own predictor on a numeric oblivious-tree model.

    python bench/catboost_speed.py [--trees 500] [--depth 6] [--rows 50000] [--repeats 5]
                                   [--out bench/CATBOOST-RESULTS.md]

One thread each: batch rows/s of ``predict_proba`` (alternated calls, medians), and single-row
calls from Python (p50 and p99 of 1,000). Prints a Markdown table and writes it to --out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", type=int, default=500)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--rows", type=int, default=50000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent /
                                         "CATBOOST-RESULTS.md"))
    args = ap.parse_args()
    import catboost

    import worker

    rng = np.random.default_rng(0)
    X = rng.normal(size=(20000, 30)).astype(np.float32)
    X[rng.random(X.shape) < 0.05] = np.nan
    y = (np.nan_to_num(X[:, 0]) + np.nan_to_num(X[:, 1] * X[:, 2]) +
         rng.normal(scale=0.5, size=X.shape[0]) > 0).astype(int)
    model = catboost.CatBoostClassifier(iterations=args.trees, depth=args.depth, verbose=0,
                                        thread_count=2, allow_writing_files=False,
                                        random_seed=0).fit(X, y)
    ours = worker.compile_model(model)
    Xt = rng.normal(size=(args.rows, 30)).astype(np.float32)
    Xt[rng.random(Xt.shape) < 0.05] = np.nan
    engines = {"ours": lambda A: ours.predict_proba(A, n_threads=1),
               "catboost": lambda A: model.predict_proba(A, thread_count=1)}
    times = {k: [] for k in engines}
    for fn in engines.values():
        fn(Xt[:1000])
    for _ in range(args.repeats):
        for k, fn in engines.items():
            t0 = time.perf_counter()
            fn(Xt)
            times[k].append(time.perf_counter() - t0)
    rate = {k: args.rows / statistics.median(v) for k, v in times.items()}
    lat = {}
    for k, fn in engines.items():
        for i in range(100):
            fn(Xt[i:i + 1])
        ts = []
        for i in range(1000):
            t0 = time.perf_counter_ns()
            fn(Xt[i:i + 1])
            ts.append((time.perf_counter_ns() - t0) / 1000)
        lat[k] = (float(np.percentile(ts, 50)), float(np.percentile(ts, 99)))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from report import machine  # bench/report.py: the machine description

    m = machine()
    lines = [
        "# Our kernels against CatBoost's own predictor",
        "",
        f"`python bench/catboost_speed.py --trees {args.trees} --depth {args.depth} --rows "
        f"{args.rows} --repeats {args.repeats}`, {m['date']}. Machine: "
        f"{m.get('Model name', '?')}, {m.get('cpus_usable')} usable CPUs, load before "
        f"{os.getloadavg()[0]:.2f}. CatBoost {catboost.__version__}, {args.trees} trees x depth "
        f"{args.depth}, 30 numeric features, 5% missing; ours: {ours.layout} layout, "
        f"{ours.kernel} kernel. Batch: medians of alternated `predict_proba` calls on "
        f"{args.rows:,} rows, 1 thread each; single row: 1,000 calls from Python.",
        "",
        "| engine | batch rows/s (1 thread) | single row p50 / p99 (us) |",
        "|---|---:|---:|",
        *[f"| {k} | {rate[k]:,.0f} | {lat[k][0]:.1f} / {lat[k][1]:.1f} |" for k in engines],
        "",
        f"Batch: ours / CatBoost = {rate['ours'] / rate['catboost']:.2f}x. One-hot categorical "
        "models are not compiled yet (refused by name), so they are not measured here.",
    ]
    print("\n".join(lines))
    Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
