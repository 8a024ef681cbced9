"""The leaf-mask kernel (cyext/masks.h) against the kernel each model had before it, one
thread, by rows a call: where a block of 16 rows starts to pay (kernels.pyx MASKS_MIN_COMPACT
and MASKS_MIN_PADDED), and what it gives on a large batch. Against it, in one process, the
same model compiled with the kernel it took before (the walks, so the partition walk on the
LightGBM models; the lanes kernel on A), the two alternated call by call; microseconds a call,
median of ROUNDS (9 for the 50,000 rows).

Models: L, the LightGBM 500 trees x 63 leaves of bench/onnx_speed.py exported to ONNX (float32
sums) and L64, the same booster native (float64 sums), on rows with 10% missing values; A,
bench/models.py's XGBoost 200 trees x depth 5 (padded), and X6, XGBoost 300 trees x depth 6
on A's data (padded), on A's dense rows.

    python bench/masks_micro.py          # KEYS=L,L64,A,X6; ROUNDS=301

Prints NAME VALUE lines (bench/ab.py reads them): <key>.n<rows>.before_us / .masks_us, and
<key>.rows_per_s.before / .masks for 50,000 rows.
"""

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, ".")  # this checkout's `worker` first (bench/ab.py runs it in a worktree)
import worker  # noqa: E402

sys.path.insert(0, "bench")
import models as M  # noqa: E402
import numpy as np  # noqa: E402

SIZES = (1, 2, 4, 6, 7, 8, 10, 12, 16, 17, 32, 64, 512)


def _lightgbm(native: bool):
    import lightgbm as lgb
    import onnx_speed as O
    from onnxmltools import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType

    X = O.data(20000, 0, missing=0.05)
    y = ((np.nan_to_num(X[:, 0]) + np.nan_to_num(X[:, 1]) * X[:, 2].clip(-1, 1) +
          np.random.default_rng(1).normal(scale=0.5, size=X.shape[0])) > 0).astype(int)
    clf = lgb.LGBMClassifier(n_estimators=500, num_leaves=63, verbose=-1).fit(X, y)
    rows = O.data(50_000, 7, 0.1)
    if native:
        return clf.booster_, "compact", rows
    export = convert_lightgbm(clf, initial_types=[("input", FloatTensorType([None, 30]))],
                              zipmap=False)
    path = Path(tempfile.mkdtemp()) / "lightgbm.onnx"
    path.write_bytes(export.SerializeToString())
    return path, "compact", rows


def _xgb6():
    import xgboost as xgb

    X, y = M.data(20_000, seed=0)
    booster = xgb.train({"objective": "binary:logistic", "max_depth": 6, "eta": 0.1,
                         "seed": 0}, xgb.DMatrix(X, label=y), num_boost_round=300)
    return booster, "padded", M.data(50_000, seed=7)[0].astype(np.float32)


def _source(key):
    if key in ("L", "L64"):
        return _lightgbm(key == "L64")
    if key == "X6":
        return _xgb6()
    return M.load(key).source, "padded", M.data(50_000, seed=7)[0].astype(np.float32)


def main() -> None:
    rounds = int(os.environ.get("ROUNDS", "301"))
    for key in os.environ.get("KEYS", "L,L64,A,X6").split(","):
        source, layout, X = _source(key)
        models = {"masks": worker.compile_model(source, layout=layout, kernel="masks"),
                  "before": worker.compile_model(source, layout=layout,
                                                 kernel="lanes" if key == "A" else "walk")}
        assert models["masks"].forest.masks()
        for n in (*SIZES, X.shape[0]):
            x = np.ascontiguousarray(X[:n])
            t = {k: [] for k in models}
            for _ in range(rounds if n < 1000 else 9):
                for k, m in models.items():
                    t0 = time.perf_counter_ns()
                    m.raw(x, n_threads=1)
                    t[k].append(time.perf_counter_ns() - t0)
            if n < 1000:
                print(f"{key}.n{n}.before_us {np.median(t['before']) / 1000:.3f}\n"
                      f"{key}.n{n}.masks_us {np.median(t['masks']) / 1000:.3f}", flush=True)
            else:
                for k in models:
                    print(f"{key}.rows_per_s.{k} {n / np.median(t[k]) * 1e9:.0f}", flush=True)


if __name__ == "__main__":
    main()
