"""Where the partition walk pays (bench/NOTES.md "The partition walk", kernels.part_walk):
LightGBM models of 200 trees and 15 to 1,023 leaves, the partition walk forced (AVX-512, and
a row at a time) against the rows walk without refills it replaces, alternated in one process;
predict_proba rows/s at one thread on 50,000 dense rows (tasks of 2,048 rows), median of the
repeats. kernels.part_walk takes the partition walk where the largest tree has at most one
node for each 4 of a task's rows (512 nodes for a full task); the models above that are
timed with the limit lifted (Forest.part_walk(force=True)) to show where it stops paying.

    python bench/part_walk.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import lightgbm as lgb
    import onnx_speed

    import worker

    X = onnx_speed.data(20000, 0, missing=0.05)
    y = ((np.nan_to_num(X[:, 0]) + np.nan_to_num(X[:, 1]) * X[:, 2].clip(-1, 1) +
          np.random.default_rng(1).normal(scale=0.5, size=X.shape[0])) > 0).astype(int)
    Xt = onnx_speed.data(50000, 7)
    print("| leaves | largest tree, nodes | rows walk rows/s | partition walk (AVX-512) "
          "rows/s | ratio | partition walk (a row at a time) rows/s | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for leaves in (15, 63, 127, 255, 511, 1023):
            path = Path(tmp) / f"lgb{leaves}.txt"
            lgb.LGBMClassifier(n_estimators=200, num_leaves=leaves, min_child_samples=5,
                               verbose=-1).fit(X, y).booster_.save_model(str(path))
            model = worker.compile_model(path, layout="compact", kernel="walk")
            f = model.forest
            root = f.arrays["root"]
            largest = int(np.diff(np.append(root, len(f.arrays["cnodes"]))).max())
            limited = f.part_walk() is None  # above the limit: lifted for the timing
            f.part_walk(force=True)
            modes = {"off": False, "avx512": "avx512", "row": "row"}
            f.part_walk(False)
            ref = model.predict_proba(Xt, n_threads=1)
            times = {k: [] for k in modes}
            for _ in range(args.repeats):
                for k, mode in modes.items():  # alternated
                    f.part_walk(mode)
                    t0 = time.perf_counter()
                    p = model.predict_proba(Xt, n_threads=1)
                    times[k].append(time.perf_counter() - t0)
                    assert np.array_equal(p, ref), f"the walks differ ({k})"
            r = {k: len(Xt) / float(np.median(v)) for k, v in times.items()}
            note = " (above the limit)" if limited else ""
            print(f"| {leaves} | {largest:,}{note} | {r['off']:,.0f} | {r['avx512']:,.0f} | "
                  f"{r['avx512'] / r['off']:.2f}x | {r['row']:,.0f} | "
                  f"{r['row'] / r['off']:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
