"""The rows walks of deep forests, alternated in one process (bench/NOTES.md, issue 36):
8 rows through a tree without refills (walk.h sw_scwalk_fixed, the default for large trees)
against the walk that refills a chain at each leaf (sw_scwalk_rows, Forest.fixed_walk(False))
and, where its trees are small enough, the partition walk (sw_scwalk_part, the default there:
a task's rows through a tree node by node), on the ONNX exports of bench/onnx_speed.py's
random forest and LightGBM model, on bench/models.py's model C, and on an attacker's model and
rows (crafted); predict_proba rows/s at one thread on 50,000 rows (raw scores for the crafted
model), median of the repeats. Also each model's mean path a row takes through a tree on
these rows, the mean of the deepest path of each group of 8 rows (what a group without
refills walks), and kernels.walk_steps' mean (the untested steps).

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


def score(model, X):
    return model.raw(X, n_threads=1) if model.task == "regression" else \
        model.predict_proba(X, n_threads=1)


def crafted(path: Path):
    """An attacker's model and rows (the attacker review of the walk without refills): 50
    trees, each a chain 2,000 splits deep (x0 > 0 goes one level deeper), and rows of which
    one in each 8 goes to the bottom, so every group of 8 rows holds one long path."""
    import worker
    from worker.model import artifact

    base = worker.compile_model(_tiny_forest(), layout="compact", kernel="walk")
    meta = {k: v for k, v in base.meta.items() if k != "layout_choice"}
    meta.update(divisor=1.0, accumulate="float64")
    nodes, leaves = [], []
    zero = int(np.float32(0).view(np.uint32))
    for _ in range(2000):
        i = len(nodes)
        nodes += [[0, zero, i + 1, 0], [0x80000000, 0x7F800000, i + 1, len(leaves)]]
        leaves.append(1.0)
    nodes.append([0x80000000, 0x7F800000, len(nodes), len(leaves)])
    leaves.append(2.0)
    T = 50
    artifact.save(path, meta, {
        "cnodes": np.asarray(nodes, np.uint32), "root": np.zeros(T, np.int64),
        "leaves": np.asarray(leaves, np.float64).reshape(-1, 1),
        "tree_group": np.zeros(T, np.int32), "tree_depth": np.ones(T, np.int32),
        "unit_ptr": np.array([0, T], np.int64), "base": np.zeros(1, np.float64),
        "leaf_min": np.full((T, 1), -1e300), "leaf_max": np.full((T, 1), 1e300)})
    X = np.full((50_000, 2), -1.0, np.float32)
    X[::8, 0] = 1.0
    return worker.load_model(path, kernel="walk"), X


def _tiny_forest():
    from sklearn.ensemble import RandomForestRegressor

    X = np.random.default_rng(5).normal(size=(200, 2)).astype(np.float32)
    return RandomForestRegressor(2, max_depth=2, random_state=0).fit(X, X[:, 0])


def _use(forest, part, walk):
    """Put one walk in force: (fixed_walk, part_walk)."""
    fixed, p = walk
    if part:
        forest.part_walk(p)
    forest.fixed_walk(fixed)


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
    adversary = tempfile.TemporaryDirectory()
    bad, Xbad = crafted(Path(adversary.name) / "crafted.model")
    cases.append(("crafted: 50 trees 2,000 deep, one row in 8 to the bottom", bad,
                  [("dense", Xbad)]))
    c = worker.compile_model(M.load("C").source, layout="compact", kernel="walk")
    Xc = M.data(50_000, seed=7)[0].astype(np.float32)
    cases.append(("model C: RandomForest 100 deep trees", c,
                  [("dense", Xc), ("2% missing", M.with_missing(Xc, seed=8))]))
    print("| model | rows | refilling walk rows/s | without refills rows/s | ratio | "
          "partition walk rows/s | ratio | mean path | deepest of 8, mean | "
          "untested steps, mean |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, model, sets in cases:
        f = model.forest
        steps = K.walk_steps(K.small_key_nodes(K.order_key_nodes(f.arrays["cnodes"])),
                             f.arrays["root"])
        mean, deepest = paths(model, sets[0][1][:4096])
        part = f.part_walk()  # None: trees too large for it
        walks = {"refill": (False, False), "fixed": (True, False)}
        if part:
            walks["part"] = (True, part)

        for label, X in sets:
            _use(f, part, walks["refill"])
            ref = score(model, X)
            times = {w: [] for w in walks}
            for _ in range(args.repeats):
                for w in times:  # alternated
                    _use(f, part, walks[w])
                    t0 = time.perf_counter()
                    p = score(model, X)
                    times[w].append(time.perf_counter() - t0)
                    assert np.array_equal(p, ref), f"the walks differ ({w})"
            r = {w: len(X) / float(np.median(v)) for w, v in times.items()}
            pr = f"{r['part']:,.0f} | {r['part'] / r['fixed']:.2f}x" if part else "- | -"
            print(f"| {name} | {label} | {r['refill']:,.0f} | {r['fixed']:,.0f} | "
                  f"{r['fixed'] / r['refill']:.2f}x | {pr} | {mean:.1f} | {deepest:.1f} | "
                  f"{steps.mean():.1f} |", flush=True)
    adversary.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
