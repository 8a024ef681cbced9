"""The lanes kernel (cyext/lanes.h) against the libraries' own predictions.

Padded trees of depth 1 to 5 whose every tree adds one value to one score take it on a CPU
with AVX-512F: 16 rows a block, one in each lane. XGBoost's float32 sums and scikit-learn's and
LightGBM's float64 sums are compared with the library on hostile rows (NaN under both
missing-value sides, +-inf, -0.0 and +0.0, values on every threshold and one float32 step
either side) at the kernel's edges: fewer rows than it takes, partial last blocks on both sides
of its cut, whole blocks, and tasks split between two threads. The kernel on and off give the
same bits."""

from __future__ import annotations

import numpy as np
import pytest

import worker
from tests import models as M
from worker.model.compile import chosen, to_ir

# 1-6 rows walk; 7 and more take the lanes, a last block of 1-6 rows walks (kernels.pyx
# LANES_MIN_ROWS): every side of each cut, whole blocks, tasks of 512 rows split by threads
SIZES = (1, 6, 7, 8, 15, 16, 17, 22, 23, 31, 32, 33, 38, 39, 63, 64, 65, 100, 511, 512, 513,
         1030, 2055)


def _has_lanes() -> bool:
    model = worker.compile_model(M.xgboost_models()["xgb-binary-logitraw"], layout="padded",
                                 kernel="walk")
    try:
        chosen(to_ir(M.xgboost_models()["xgb-binary-logitraw"]), "padded", "lanes")
    except ValueError as exc:
        return "AVX-512F" not in str(exc) and model is not None
    return True


needs_avx512 = pytest.mark.skipif(not _has_lanes(), reason="this CPU has no AVX-512F: the "
                                  "lanes kernel is refused and the walks score (tested below)")


def _thresholds_xgb(booster):
    t = M.xgboost_thresholds(booster)
    with np.errstate(over="ignore"):
        return np.unique(np.concatenate([t, np.nextafter(t, np.float32(np.inf)),
                                         np.nextafter(t, np.float32(-np.inf))]))


def _rows(n: int, thresholds: np.ndarray, seed: int) -> np.ndarray:
    X = M.hostile_rows(n, thresholds, seed=seed)
    rng = np.random.default_rng(seed + 1000)
    X[rng.random(X.shape) < 0.03] = np.float32(-0.0)
    return X


def _xgboost(depth: int, objective: str = "binary:logistic"):
    import xgboost as xgb

    X, y2, _, yr = M.training_data(seed=depth)
    y = yr if objective.startswith("reg") else y2
    return xgb.train({"objective": objective, "max_depth": depth, "seed": 0},
                     xgb.DMatrix(X.astype(np.float32), label=y), num_boost_round=40)


def _lanes_model(source):
    model = chosen(to_ir(source), "padded", "lanes")
    assert model.kernel == "lanes" and model.forest.lanes()
    return model


def _same_with_the_walks(model, X):
    """The kernel on and off: the same bits, at one thread and two."""
    on = [model.raw(X, n_threads=k) for k in (1, 2)]
    model.forest.lanes(False)
    try:
        off = model.raw(X, n_threads=1)
    finally:
        model.forest.lanes(True)
    for got in on:
        np.testing.assert_array_equal(got, off)
    return on[0]


@needs_avx512
@pytest.mark.parametrize("depth", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("objective", ["binary:logistic", "reg:squarederror"])
def test_xgboost_float32_sums_match_xgboost_to_the_bit(depth, objective):
    import xgboost as xgb

    booster = _xgboost(depth, objective)
    model = _lanes_model(booster)
    thr = _thresholds_xgb(booster)
    for seed, n in enumerate(SIZES):
        X = _rows(n, thr, seed)
        want = booster.predict(xgb.DMatrix(M.finite_for_library(X)), output_margin=True)
        got = _same_with_the_walks(model, X)
        np.testing.assert_array_equal(got[:, 0], want.astype(np.float64),
                                      err_msg=f"depth {depth}, {n} rows")


def _sklearn_models():
    from sklearn import ensemble as E

    X, y2, _, yr = M.training_data(seed=3)
    Xf = np.nan_to_num(X)
    out = {}
    for d in (1, 2, 3, 4, 5):
        out[f"gb-d{d}"] = E.GradientBoostingClassifier(n_estimators=25, max_depth=d,
                                                       random_state=0).fit(Xf, y2)
    out["gb-reg-d5"] = E.GradientBoostingRegressor(n_estimators=25, max_depth=5,
                                                   random_state=0).fit(Xf, yr)
    # NaN sides learned per split
    out["hgb-d4"] = E.HistGradientBoostingClassifier(max_iter=25, max_depth=4,
                                                     random_state=0).fit(X, y2)
    return out


@needs_avx512
@pytest.mark.parametrize("name", ["gb-d1", "gb-d2", "gb-d3", "gb-d4", "gb-d5", "gb-reg-d5",
                                  "hgb-d4"])
def test_sklearn_float64_sums_match_sklearn(name):
    est = _sklearn_models()[name]
    model = _lanes_model(est)
    thr = M.sklearn_thresholds(est)
    for seed, n in enumerate(SIZES):
        X = _rows(n, thr, seed)
        got = _same_with_the_walks(model, X)
        Xl = X if name.startswith("hgb") else np.nan_to_num(M.finite_for_library(X), nan=0.0)
        if not name.startswith("hgb"):
            got = model.raw(Xl, n_threads=1)
        want = est.decision_function(Xl.astype(np.float64)) if hasattr(est, "classes_") \
            else est.predict(Xl.astype(np.float64))
        # docs/models.md: scikit-learn's float64 sums are held within 1e-12 relative
        np.testing.assert_allclose(got[:, 0], want, rtol=1e-12, atol=1e-12,
                                   err_msg=f"{name}, {n} rows")


@needs_avx512
def test_lightgbm_float64_sums_match_lightgbm():
    import lightgbm as lgb

    X, y2, _, _ = M.training_data(seed=4)
    booster = lgb.train({"objective": "binary", "num_leaves": 24, "max_depth": 5,
                         "verbose": -1, "seed": 0}, lgb.Dataset(X.astype(np.float32), label=y2),
                        num_boost_round=40)
    model = _lanes_model(booster)
    d = booster.dump_model()["tree_info"]
    thr = []

    def walk(node):
        if "threshold" in node:
            thr.append(node["threshold"])
            walk(node["left_child"])
            walk(node["right_child"])

    for t in d:
        walk(t["tree_structure"])
    with np.errstate(over="ignore"):  # a threshold past float32 (LightGBM: 1e300) is +inf
        thr = np.unique(np.asarray(thr, dtype=np.float32))
    for seed, n in enumerate(SIZES):
        X = _rows(n, thr, seed)
        got = _same_with_the_walks(model, X)
        want = booster.predict(M.finite_for_library(X), raw_score=True)
        np.testing.assert_allclose(got[:, 0], want, rtol=1e-12, atol=1e-12,
                                   err_msg=f"{n} rows")


@needs_avx512
def test_every_lane_reads_its_own_row():
    """Rows that differ in one feature only, each sending its row down a different path of
    every tree, in one block: a kernel mixing lanes up gives another row's sum."""
    import xgboost as xgb

    booster = _xgboost(5)
    model = _lanes_model(booster)
    thr = _thresholds_xgb(booster)
    rng = np.random.default_rng(9)
    base = _rows(1, thr, 9)
    X = np.repeat(base, 48, axis=0)
    for r in range(48):
        X[r, r % M.N_FEATURES] = rng.choice(thr)
    want = booster.predict(xgb.DMatrix(M.finite_for_library(X)), output_margin=True)
    np.testing.assert_array_equal(_same_with_the_walks(model, X)[:, 0],
                                  want.astype(np.float64))
    assert len(np.unique(want)) > 10  # the rows' sums do differ


def test_what_the_kernel_does_not_take_is_refused_by_name():
    import xgboost as xgb

    X, y2, y3, _ = M.training_data(seed=5)
    X32 = X.astype(np.float32)
    deep = xgb.train({"objective": "binary:logistic", "max_depth": 6, "seed": 0},
                     xgb.DMatrix(X32, label=y2), num_boost_round=10)
    with pytest.raises(ValueError, match="depth 6: the kernel takes trees of depth 5"):
        chosen(to_ir(deep), "padded", "lanes")
    with pytest.raises(ValueError, match="the compact layout: this kernel reads the padded layout"):
        chosen(to_ir(_xgboost(3)), "compact", "lanes")
    multi = M.xgboost_models()["xgb-multi-softprob"]
    with pytest.raises(ValueError, match="several scores"):
        chosen(to_ir(multi), "padded", "lanes")
    wide = np.random.default_rng(0).normal(size=(600, 513)).astype(np.float32)
    w = xgb.train({"objective": "binary:logistic", "max_depth": 3, "seed": 0},
                  xgb.DMatrix(wide, label=(wide[:, 512] > 0).astype(int)), num_boost_round=3)
    with pytest.raises(ValueError, match="513 features: the kernel takes 1 to 512"):
        chosen(to_ir(w), "padded", "lanes")
    w512 = xgb.train({"objective": "binary:logistic", "max_depth": 3, "seed": 0},
                     xgb.DMatrix(wide[:, :512], label=(wide[:, 511] > 0).astype(int)),
                     num_boost_round=3)
    at = chosen(to_ir(w512), "padded", "lanes")  # the bound itself is taken
    assert at.kernel == "lanes"
    want = w512.predict(xgb.DMatrix(wide[:100, :512]), output_margin=True)
    np.testing.assert_array_equal(at.raw(wide[:100, :512])[:, 0], want.astype(np.float64))
    auto = worker.compile_model(deep)
    assert auto.kernel != "lanes"
    assert "depth 6" in auto.kernel_choice["not_candidates"]["padded lanes"]


def test_a_stored_lanes_kernel_the_model_cannot_take_falls_back_to_the_walks(tmp_path):
    """An artifact whose record names the lanes kernel for trees too deep for it (written by
    hand, or compiled on a CPU with AVX-512F and loaded on one without) loads with the walks,
    says why, and scores as XGBoost does."""
    import xgboost as xgb

    from tests.test_layout_choice import _with_choice

    booster = M.xgboost_models()["xgb-deep"]
    model = worker.compile_model(booster, layout="padded", kernel="walk")
    path = tmp_path / "m.model"
    path.write_bytes(_with_choice(model, kernel="lanes"))
    loaded = worker.load_model(path)
    assert loaded.kernel == "walk" and "depth 12" in loaded.kernel_choice["reason"]
    X = _rows(200, M.xgboost_thresholds(booster), seed=3)
    want = booster.predict(xgb.DMatrix(M.finite_for_library(X),
                                       feature_names=booster.feature_names), output_margin=True)
    np.testing.assert_array_equal(loaded.raw(X)[:, 0], want.astype(np.float64))


@needs_avx512
def test_a_saved_lanes_model_loads_with_the_lanes(tmp_path):
    booster = _xgboost(4)
    model = _lanes_model(booster)
    path = tmp_path / "m.model"
    model.save(path)
    loaded = worker.load_model(path)
    assert loaded.kernel == "lanes"
    X = _rows(300, _thresholds_xgb(booster), seed=4)
    np.testing.assert_array_equal(loaded.raw(X), model.raw(X))


_STACK_RUN = """
import sys, threading
import numpy as np
import xgboost as xgb
from worker.model.compile import chosen, to_ir
booster = xgb.Booster(model_file=sys.argv[2])
m = chosen(to_ir(booster), "padded", "lanes")
assert m.forest.lanes()
Xs = np.load(sys.argv[3])
out = {}
def run():
    for n in (1030, 2055, 4000, 4096):
        out[f"n{n}"] = m.raw(Xs[:n], n_threads=2)[:, 0]
threading.stack_size(int(sys.argv[1]) * 1024)
t = threading.Thread(target=run)
t.start()
t.join()
np.savez(sys.argv[4], **out)
print("scored", len(out))
"""


@needs_avx512
def test_small_thread_stacks_score_with_the_lanes(tmp_path):
    """The block of 16 rows lives on the heap and a task's last rows take the task's own
    buffers: a Python thread of 112 KiB and OpenMP threads of 64 KiB score tasks of 500 rows
    and more (before: the kernel's 64 KB block on the stack, and a task's last 1-6 rows
    through eval_trees' 64 KB stack buffer, overflowed both, SIGSEGV; tasks of 64 rows or
    fewer still take that buffer, as the walks always did)."""
    import os
    import subprocess
    import sys

    import xgboost as xgb

    booster = _xgboost(4)
    booster.save_model(tmp_path / "m.json")
    X = _rows(4096, _thresholds_xgb(booster), seed=11)
    np.save(tmp_path / "x.npy", X)
    (tmp_path / "stack.py").write_text(_STACK_RUN)
    env = {**os.environ, "OMP_STACKSIZE": "64k", "PYTHONPATH": os.getcwd()}
    run = subprocess.run([sys.executable, str(tmp_path / "stack.py"), "112",
                          str(tmp_path / "m.json"), str(tmp_path / "x.npy"),
                          str(tmp_path / "out.npz")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    want = booster.predict(xgb.DMatrix(M.finite_for_library(X)), output_margin=True)
    got = np.load(tmp_path / "out.npz")
    assert sorted(got) == ["n1030", "n2055", "n4000", "n4096"]
    for name in got:
        n = int(name[1:])
        np.testing.assert_array_equal(got[name], want[:n].astype(np.float64), err_msg=name)


@needs_avx512
def test_a_forest_initialised_again_drops_its_old_tables():
    """__init__ run again on a Forest replaces the arrays the lanes tables pointed into: the
    tables go with them, and switching the kernel on then finds none (before: a read of freed
    memory, SIGSEGV)."""
    import xgboost as xgb

    booster = _xgboost(4)
    model = _lanes_model(booster)
    f = model.forest
    f.__init__(dict(model.arrays), "padded", model.depth, model.n_features, 1,
               float(model.divisor), "walk", "sum")
    assert f.lanes(True) is False and f.kernel == "walk"
    X = _rows(300, _thresholds_xgb(booster), seed=6)
    want = booster.predict(xgb.DMatrix(M.finite_for_library(X)), output_margin=True)
    np.testing.assert_array_equal(f.raw(model._columns(X), 1)[:, 0], want.astype(np.float64))
    f._lanes()
    f._lanes()  # built twice: the first tables freed, the second in force
    with pytest.raises(ValueError, match="unknown aggregate"):  # refused before any change
        f.__init__(dict(model.arrays), "padded", model.depth, model.n_features, 1,
                   float(model.divisor), "lanes", "bogus")
    assert f.lanes() is True
    np.testing.assert_array_equal(f.raw(model._columns(X), 1)[:, 0], want.astype(np.float64))
    assert f.lanes() is True
    np.testing.assert_array_equal(f.raw(model._columns(X), 1)[:, 0], want.astype(np.float64))


@needs_avx512
def test_tables_past_their_bound_are_refused_by_name():
    """The tables take 16 entries a tree to depth 4 (32 at depth 5); past 64 MB of them the
    kernel is refused by name and the walks score (400,000 stumps: 76.8 MB of tables, where
    the model's own arrays are 6 MB)."""
    from worker import _kernels

    T = 400_000
    rng = np.random.default_rng(0)
    arrays = {"pnodes": np.stack([rng.integers(0, 14, T).astype(np.uint32),
                                  rng.normal(size=T).astype(np.float32).view(np.uint32)], 1),
              "leaves": rng.normal(size=(2 * T, 1)).astype(np.float32),
              "tree_group": np.zeros(T, dtype=np.int32),
              "base": np.zeros(1, dtype=np.float32)}
    with pytest.raises(ValueError, match=r"kernel lanes: tables of 76,800,000 bytes, past "
                                         r"the kernel's 67,108,864"):
        _kernels.Forest(arrays, "padded", 1, 7, 1, 1.0, "lanes", "sum")
    walks = _kernels.Forest(arrays, "padded", 1, 7, 1, 1.0, "walk", "sum")
    assert walks.lanes(True) is False
    # at the bound and one tree past it: 16 entries x 12 bytes a tree
    last = (64 << 20) // (16 * 12)

    def first(k):
        return {n: (v[:2 * k] if n == "leaves" else v[:k]) if n != "base" else v
                for n, v in arrays.items()}

    assert _kernels.Forest(first(last), "padded", 1, 7, 1, 1.0, "lanes", "sum").lanes() is True
    with pytest.raises(ValueError, match=r"tables of 67,108,992 bytes, past the kernel's "
                                         r"67,108,864"):
        _kernels.Forest(first(last + 1), "padded", 1, 7, 1, 1.0, "lanes", "sum")
