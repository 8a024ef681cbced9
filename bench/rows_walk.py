"""The two rows walks of deep forests, alternated in one process (bench/NOTES.md, issue 36):
8 rows through a tree without refills (walk.h sw_scwalk_fixed, the default) against the walk
that refills a chain at each leaf (sw_scwalk_rows, Forest.fixed_walk(False)), on the ONNX
exports of bench/onnx_speed.py's random forest and LightGBM model and on bench/models.py's
model C; predict_proba rows/s at one thread on 50,000 rows, median of the repeats. Also each
model's mean path a row takes through a tree on these rows, the mean of the deepest path of
each group of 8 rows (what a group without refills walks), and kernels.walk_steps' mean (the
untested steps).

    python bench/rows_walk.py [--repeats 7]
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


def paths(model, X: np.ndarray) -> tuple[float, float]:
    """Mean path length of X's rows over the model's trees, and the mean over groups of 8
    rows of the group's longest path (numpy over the 8-byte nodes, NaN-free rows)."""
    from worker import _kernels as K

    f = model.forest
    q = K.small_key_nodes(K.order_key_nodes(f.arrays["cnodes"]))
    root = f.arrays["root"]
    b = X.view(np.uint32)
    keys = b ^ ((b.view(np.int32) >> 31).view(np.uint32) | np.uint32(0x80000000))
    key, thr = q[:, 0].astype(np.int64), q[:, 1].astype(np.int64)
    rows = np.arange(len(X))
    mean, deepest = [], []
    for t in range(len(root)):
        node, depth = np.full(len(X), root[t]), np.zeros(len(X), np.int64)
        while True:
            k = key[node]
            leaf = (k & 0x80000000) != 0
            if leaf.all():
                break
            x = keys[rows, np.minimum((k & 0xFFFF) >> 1, X.shape[1] - 1)].astype(np.int64)
            node = np.where(leaf, node, node + ((k >> 16) & 0x7FFF) + (thr[node] < x))
            depth += ~leaf
        mean.append(depth.mean())
        deepest.append(depth[: len(X) // 8 * 8].reshape(-1, 8).max(axis=1).mean())
    return float(np.mean(mean)), float(np.mean(deepest))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    import models as M
    import onnx_speed

    import worker
    from worker import _kernels as K

    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        ex = onnx_speed.exports(Path(tmp))
        for name in ("sklearn random forest 200 x depth 12", "lightgbm 500 trees x 63 leaves"):
            model = worker.compile_model(ex[name], layout="compact", kernel="walk")
            cases.append((f"ONNX {name}", model, [
                ("dense", onnx_speed.data(50000, 7)),
                ("10% missing", onnx_speed.data(50000, 7, 0.1))]))
    c = worker.compile_model(M.load("C").source, layout="compact", kernel="walk")
    Xc = M.data(50_000, seed=7)[0].astype(np.float32)
    cases.append(("model C: RandomForest 100 deep trees", c,
                  [("dense", Xc), ("2% missing", M.with_missing(Xc, seed=8))]))
    print("| model | rows | refilling walk rows/s | without refills rows/s | ratio | "
          "mean path | deepest of 8, mean | untested steps, mean |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, model, sets in cases:
        f = model.forest
        steps = K.walk_steps(K.small_key_nodes(K.order_key_nodes(f.arrays["cnodes"])),
                             f.arrays["root"])
        mean, deepest = paths(model, sets[0][1][:4096])
        for label, X in sets:
            f.fixed_walk(False)
            ref = model.predict_proba(X, n_threads=1)
            times = {False: [], True: []}
            for _ in range(args.repeats):
                for on in times:  # alternated
                    f.fixed_walk(on)
                    t0 = time.perf_counter()
                    p = model.predict_proba(X, n_threads=1)
                    times[on].append(time.perf_counter() - t0)
                    assert np.array_equal(p, ref), "the two walks differ"
            r = {on: len(X) / float(np.median(v)) for on, v in times.items()}
            print(f"| {name} | {label} | {r[False]:,.0f} | {r[True]:,.0f} | "
                  f"{r[True] / r[False]:.2f}x | {mean:.1f} | {deepest:.1f} | "
                  f"{steps.mean():.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
