"""The partition walk (walk.h sw_scwalk_part): a large task's rows through each small tree
node by node, staged by column. Every way it runs (16 rows a compare with AVX-512, a row at a
time, and off: the rows walk it replaces) against the libraries' own predictions on hostile
rows, at the task sizes where it starts and where a task ends in a partial group of 16."""

from __future__ import annotations

import numpy as np
import pytest

import worker
from tests import models as M

lgb = pytest.importorskip("lightgbm")

MODES = ["avx512", "row", False]
# 256: the smallest task the rows walks take; 1000: one task; 2048 + 1: a full task and one
# row; 4100: two full tasks and a remainder of 4 rows, fewer than any node's group of 16
SIZES = [256, 257, 1000, 2049, 4100]


def _compact(source, mode):
    model = worker.compile_model(source, layout="compact", kernel="walk")
    assert model.forest.part_walk() in ("avx512", "row"), "small trees take it by default"
    if mode == "avx512" and model.forest.part_walk() != "avx512":
        pytest.skip("this CPU has no AVX-512")
    # force: every task of 256 rows or more takes it, whatever its trees' size (a row at a
    # time, the default limit is 8 rows a node)
    assert model.forest.part_walk(mode, force=True) == mode
    return model


@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("name", ["xgb-binary-logistic", "xgb-multi-softprob",
                                  "xgb-reg-squarederror", "xgb-parallel-tree", "xgb-deep"])
def test_xgboost_margins_are_the_librarys_to_the_bit(name, mode):
    booster = M.xgboost_models()[name]
    model = _compact(booster, mode)
    for seed, n in enumerate(SIZES):
        X = M.hostile_rows(n, M.xgboost_thresholds(booster), seed=seed)
        ref = np.asarray(booster.inplace_predict(M.finite_for_library(X),
                                                 predict_type="margin"), np.float64)
        for threads in (1, 2):
            np.testing.assert_array_equal(model.raw(X, n_threads=threads),
                                          ref.reshape(n, -1), err_msg=f"{n} rows")


@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("name", ["rf-binary", "rf-multi", "gb-binary", "gb-multi", "hgb-binary",
                                  "hgb-multi", "hgb-reg"])
def test_sklearn_matches_the_library(name, mode):
    est = M.sklearn_models()[name]
    model = _compact(est, mode)
    for seed, n in enumerate(SIZES):
        X = M.hostile_rows(n, M.sklearn_thresholds(est), seed=seed,
                           nan=not name.startswith("gb-"))
        Xl = M.finite_for_library(X)
        if hasattr(est, "predict_proba"):
            np.testing.assert_allclose(model.predict_proba(X, n_threads=2),
                                       est.predict_proba(Xl), atol=1e-5, rtol=0)
        else:
            np.testing.assert_allclose(model.predict(X, n_threads=2), est.predict(Xl),
                                       atol=1e-5, rtol=1e-7)


def _lgb_data(seed, n=4000):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 9)).astype(np.float32)
    X[rng.random(X.shape) < 0.1] = np.nan
    y = (np.nan_to_num(X[:, 0]) + np.nan_to_num(X[:, 1]) * np.nan_to_num(X[:, 2]) +
         rng.normal(scale=0.3, size=n))
    return X, y


_BOOSTERS: dict = {}


def _lgb(objective, leaves, missing):
    key = (objective, leaves, missing)
    if key not in _BOOSTERS:
        X, y = _lgb_data(leaves)
        params = {"objective": objective, "num_leaves": leaves, "min_data_in_leaf": 3,
                  "verbose": -1, "seed": 0, **({"use_missing": False} if missing == "none"
                                               else {})}
        if objective == "multiclass":
            params["num_class"] = 3
            y = np.digitize(y, [-0.5, 0.5])
        elif objective == "binary":
            y = (y > 0).astype(int)
        _BOOSTERS[key] = lgb.train(params, lgb.Dataset(X, y), num_boost_round=20)
    return _BOOSTERS[key]


def _thresholds(booster) -> np.ndarray:
    t = booster.trees_to_dataframe()["threshold"].dropna().to_numpy(np.float64)
    t = t[np.abs(t) < 3e38]  # LightGBM's +-1e300 (missing-only splits) fit no float32
    return np.unique(np.concatenate([t, np.nextafter(t, np.inf), np.nextafter(t, -np.inf)]))


@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("leaves", [4, 63, 255])
@pytest.mark.parametrize("objective,missing", [("binary", "nan"), ("regression", "nan"),
                                               ("multiclass", "nan"), ("binary", "none")])
def test_lightgbm_raw_scores_are_the_librarys_to_the_bit(objective, missing, leaves, mode):
    """Float64 sums, leaf-wise trees (lopsided: the case the walk is for), missing values
    sent both ways by LightGBM's default_left, and values on, just above and just below
    every threshold."""
    booster = _lgb(objective, leaves, missing)
    model = worker.compile_model(booster, layout="compact", kernel="walk")
    assert model.forest.part_walk() is not None  # trees of at most 512 nodes
    assert model.forest.part_walk(mode, force=True) == mode
    thr = _thresholds(booster).astype(np.float32)
    for seed, n in enumerate(SIZES):
        rng = np.random.default_rng(seed)
        X = _lgb_data(100 + seed, n)[0]
        pick = rng.random(X.shape)
        X[pick < 0.3] = rng.choice(thr, size=int((pick < 0.3).sum()))
        X[(pick >= 0.3) & (pick < 0.35)] = np.inf
        X[(pick >= 0.35) & (pick < 0.4)] = -np.inf
        X[(pick >= 0.4) & (pick < 0.45)] = 0.0
        X[(pick >= 0.45) & (pick < 0.5)] = -0.0
        ref = booster.predict(X.astype(np.float64), raw_score=True).reshape(n, -1)
        for threads in (1, 2):
            np.testing.assert_array_equal(model.raw(X, n_threads=threads) * model.divisor,
                                          ref, err_msg=f"{n} rows, {threads} threads")


@pytest.mark.parametrize("mode", MODES, ids=str)
def test_lone_leaf_trees_and_rows_that_all_go_one_way(mode):
    """Trees that are one leaf (the root is the leaf: every row takes it), and batches of
    one row repeated, an ordinary one, all +inf and all -inf (every node sends all its rows
    to one side, one list all the way down). Rows all missing: the next test."""
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestRegressor

    rng = np.random.default_rng(3)
    X = rng.normal(size=(600, 4)).astype(np.float32)
    lone = RandomForestRegressor(20, random_state=0).fit(X, np.full(len(X), 2.5))
    model = _compact(lone, mode)
    B = M.hostile_rows(1000, np.array([0.0]), seed=1)[:, :4]
    np.testing.assert_array_equal(model.predict(B, n_threads=1),
                                  lone.predict(M.finite_for_library(B)))
    est = GradientBoostingRegressor(n_estimators=30, max_depth=4, random_state=0).fit(
        X, X[:, 0] + X[:, 1] ** 2)
    model = _compact(est, mode)
    for row in (X[7], np.full(4, np.inf, np.float32), np.full(4, -np.inf, np.float32)):
        B = np.repeat(row[None], 2049, axis=0)
        np.testing.assert_allclose(model.predict(B, n_threads=2),
                                   est.predict(M.finite_for_library(B)),
                                   rtol=1e-12, atol=0)


def test_lightgbm_rows_all_missing_follow_each_nodes_default():
    """Every value missing: each node sends every row to its default side, left at some
    nodes and right at others (a NaN's key wraps to 0 for the left-going ones)."""
    booster = _lgb("regression", 63, "nan")
    df = booster.trees_to_dataframe()
    assert set(df["missing_direction"].dropna()) == {"left", "right"}
    B = np.full((2048, 9), np.nan, np.float32)
    ref = booster.predict(B.astype(np.float64), raw_score=True)
    for mode in MODES:
        model = worker.compile_model(booster, layout="compact", kernel="walk")
        model.forest.part_walk(mode, force=True)
        np.testing.assert_array_equal(model.raw(B, n_threads=1)[:, 0] * model.divisor, ref)


def test_the_switch_refuses_what_it_cannot_do_and_large_trees_keep_the_rows_walk():
    booster = _lgb("binary", 63, "nan")
    model = worker.compile_model(booster, layout="compact", kernel="walk")
    with pytest.raises(ValueError, match="partition walk 'avx2'"):
        model.forest.part_walk("avx2")
    assert model.forest.part_walk(False) is False
    assert model.forest.part_walk(True) == "avx512"
    deep = worker.compile_model(M.sklearn_models()["rf-reg"], layout="compact",
                                kernel="walk")
    root = deep.forest.arrays["root"]
    sizes = np.diff(np.append(root, len(deep.forest.arrays["cnodes"])))
    assert sizes.max() * 4 > 2048  # a tree of more than 512 nodes
    assert deep.forest.part_walk() is None
    assert deep.forest.fixed_walk() is True
    # past the limit only slower, never wrong: a tree of 1,500 nodes node by node
    est = M.sklearn_models()["rf-reg"]
    assert deep.forest.part_walk(True, force=True) in ("avx512", "row")
    X = M.hostile_rows(2500, M.sklearn_thresholds(est), seed=5, nan=False)
    np.testing.assert_allclose(deep.predict(X, n_threads=2), est.predict(
        M.finite_for_library(X)), atol=1e-5, rtol=1e-7)
    assert deep.forest.part_walk(force=False) is None
