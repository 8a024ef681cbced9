"""The pair walk (cyext/walk.h sw_pair_*) against the libraries' own predictions.

Padded models whose rows are doubled (the SPLIT walks), one value a leaf summed to one score,
walk their rows two at a time in a task's groups of 12 trees (kernels.eval_planned): six
trees a call, each row's leaves added to its sum in tree order. XGBoost's float32 sums and
scikit-learn's and LightGBM's float64 sums are compared with the library on hostile rows (NaN
under both missing-value sides, +-inf, -0.0 and +0.0, values on every threshold and one
float32 step either side), at depths 1 to 10, with tree counts that leave 12-tree groups, an
8-tree group and single trees, at row counts of both parities either side of the 64-row block
and the 512-row task, at one thread and two; and rows past the doubled ones in a block (a
wide model: a row left without a partner, then rows walked one at a time). The pair walk on
and off give the same bits."""

from __future__ import annotations

import numpy as np
import pytest

import worker
from tests import models as M

# 1-64 rows: eval_trees' blocks; 65 and more: planned tasks (512 rows, split by two threads)
SIZES = (1, 2, 3, 4, 5, 13, 63, 64, 65, 66, 67, 129, 511, 512, 513, 1025)


def _thr32(t: np.ndarray) -> np.ndarray:
    t = t.astype(np.float32)
    with np.errstate(over="ignore"):
        return np.unique(np.concatenate([t, np.nextafter(t, np.float32(np.inf)),
                                         np.nextafter(t, np.float32(-np.inf))]))


def _rows(n: int, thresholds: np.ndarray, seed: int, nf: int = M.N_FEATURES) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = rng.normal(scale=1.5, size=(n, nf)).astype(np.float32)
    pick = rng.random(X.shape)
    X[pick < 0.25] = rng.choice(thresholds, size=int((pick < 0.25).sum()))
    X[(pick >= 0.25) & (pick < 0.28)] = np.float32(0.0)
    X[(pick >= 0.28) & (pick < 0.31)] = np.float32(-0.0)
    X[(pick >= 0.31) & (pick < 0.4)] = np.nan
    X[(pick >= 0.4) & (pick < 0.43)] = np.inf
    X[(pick >= 0.43) & (pick < 0.46)] = -np.inf
    return X


def _walks(source):
    model = worker.compile_model(source, layout="padded", kernel="walk")
    assert model.forest.pair_walk() is True, "the pair walk does not apply"
    return model


def _same_without_pairs(model, X):
    """The pair walk on, at one thread and two, and off: the same bits."""
    on = [model.raw(X, n_threads=k) for k in (1, 2)]
    model.forest.pair_walk(False)
    try:
        assert model.forest.pair_walk() is False
        off = model.raw(X, n_threads=1)
    finally:
        model.forest.pair_walk(True)
    for got in on:
        np.testing.assert_array_equal(got, off)
    return on[0]


def _xgboost(depth: int, objective: str, rounds: int, nf: int = M.N_FEATURES):
    import xgboost as xgb

    rng = np.random.default_rng(depth)
    X = rng.normal(size=(1500, nf)).astype(np.float32)
    X[:, min(5, nf - 1)] = rng.integers(0, 4, size=1500)  # rows on thresholds
    X[rng.random(X.shape) < 0.05] = np.nan
    c = np.nan_to_num(X)
    y = (c[:, 0] + c[:, 1] * c[:, 2] + 0.3 * c[:, -1] + rng.normal(scale=0.5, size=1500) > 0.5)
    label = c[:, 0] * 2 - c[:, 1] * c[:, -1] if objective.startswith("reg") else y
    return xgb.train({"objective": objective, "max_depth": depth, "seed": 0,
                      "min_child_weight": 0},
                     xgb.DMatrix(X, label=label.astype(np.float32)), num_boost_round=rounds)


def _check_xgboost(booster, sizes, nf=M.N_FEATURES):
    import xgboost as xgb

    model = _walks(booster)
    thr = _thr32(M.xgboost_thresholds(booster))
    for seed, n in enumerate(sizes):
        X = _rows(n, thr, seed, nf)
        want = booster.predict(xgb.DMatrix(M.finite_for_library(X)), output_margin=True)
        got = _same_without_pairs(model, X)
        np.testing.assert_array_equal(got[:, 0], want.astype(np.float64), err_msg=f"{n} rows")


@pytest.mark.parametrize("depth", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
def test_xgboost_float32_sums_match_xgboost_to_the_bit(depth):
    # 45 trees: three 12-tree groups, an 8-tree group, one tree walked alone
    _check_xgboost(_xgboost(depth, "binary:logistic", 45), SIZES)


@pytest.mark.parametrize("rounds", [12, 13, 23, 24, 25, 37])
def test_every_tree_count_around_the_groups(rounds):
    _check_xgboost(_xgboost(6, "reg:squarederror", rounds), (2, 7, 64, 130, 513))


def test_rows_past_the_doubled_ones_in_a_block():
    # 199 features: a 64-row block doubles 41 rows (eval_trees' 16,384 floats), so 40 walk in
    # pairs, the 41st alone though doubled, and the rest one at a time with the other walks
    booster = _xgboost(5, "binary:logistic", 30, nf=199)
    _check_xgboost(booster, (39, 40, 41, 42, 43, 63, 64), nf=199)


def test_the_pair_walk_is_not_taken_where_it_does_not_apply():
    # several scores, or the compact layout: None, whatever it is set to
    for name, layout in (("xgb-multi-softprob", "padded"), ("xgb-deep", "compact")):
        forest = worker.compile_model(M.xgboost_models()[name], layout=layout,
                                      kernel="walk").forest
        assert forest.pair_walk() is None
        assert forest.pair_walk(True) is None and forest.pair_walk(False) is None


@pytest.mark.parametrize("lazy", ["certified", "lazygbm"])
def test_the_lazy_modes_walk_pairs_to_the_same_bits(lazy):
    # the lazy modes' chunks of trees go through the same planned walks (cyext/lazy.pyx): the
    # pair walk on and off give the same results, and the rows that ran every tree the full
    # model's scores to the bit
    booster = _xgboost(6, "binary:logistic", 45)
    model = _walks(booster)
    thr = _thr32(M.xgboost_thresholds(booster))
    X = _rows(777, thr, seed=11)
    full = model.score_batch(X, n_threads=1)
    cut = [float(np.quantile(full.score, 0.3)), float(np.quantile(full.score, 0.7))]
    for threads in (1, 2):
        got = {}
        for on in (True, False):
            model.forest.pair_walk(on)
            try:
                got[on] = model.score_batch(X, lazy=lazy, thresholds=cut, n_threads=threads)
            finally:
                model.forest.pair_walk(True)
        for field in ("score", "score_lo", "score_hi", "decision", "work_units", "stop_code"):
            np.testing.assert_array_equal(getattr(got[True], field), getattr(got[False], field),
                                          err_msg=f"{lazy}, {field}, {threads} threads")
        ran = got[True].work_units == model.work_total
        assert ran.any() and not ran.all()
        np.testing.assert_array_equal(got[True].score[ran], full.score[ran])


def _sklearn(name):
    from sklearn import ensemble as E

    X, y2, _, yr = M.training_data(seed=5)
    Xf = np.nan_to_num(X)
    if name == "gb-d8":
        return E.GradientBoostingClassifier(n_estimators=45, max_depth=8,
                                            random_state=0).fit(Xf, y2)
    if name == "gb-reg-d6":
        return E.GradientBoostingRegressor(n_estimators=45, max_depth=6,
                                           random_state=0).fit(Xf, yr)
    return E.HistGradientBoostingClassifier(max_iter=45, max_depth=7, random_state=0).fit(X, y2)


@pytest.mark.parametrize("name", ["gb-d8", "gb-reg-d6", "hgb-d7"])
def test_sklearn_float64_sums_match_sklearn(name):
    est = _sklearn(name)
    model = _walks(est)
    thr = M.sklearn_thresholds(est)
    for seed, n in enumerate(SIZES):
        X = _rows(n, thr, seed)
        if not name.startswith("hgb"):  # GradientBoosting takes no NaN or inf
            X = np.nan_to_num(M.finite_for_library(X), nan=0.0)
        got = _same_without_pairs(model, X)
        Xl = M.finite_for_library(X)
        want = est.decision_function(Xl.astype(np.float64)) if hasattr(est, "classes_") \
            else est.predict(Xl.astype(np.float64))
        # docs/models.md: scikit-learn's float64 sums are held within 1e-12 relative
        np.testing.assert_allclose(got[:, 0], want, rtol=1e-12, atol=1e-12,
                                   err_msg=f"{name}, {n} rows")


def test_lightgbm_float64_sums_match_lightgbm():
    import lightgbm as lgb

    X, y2, _, _ = M.training_data(seed=6)
    booster = lgb.train({"objective": "binary", "max_depth": 7, "num_leaves": 100,
                         "min_data_in_leaf": 2, "verbose": -1, "seed": 0},
                        lgb.Dataset(X.astype(np.float32), label=y2), num_boost_round=45)
    model = _walks(booster)
    t = booster.trees_to_dataframe()["threshold"].dropna().to_numpy(dtype=np.float64)
    with np.errstate(over="ignore"):  # a threshold past float32 (LightGBM: 1e300) is +inf
        thr = _thr32(t)
    for seed, n in enumerate(SIZES):
        X = _rows(n, thr, seed)
        got = _same_without_pairs(model, X)
        want = booster.predict(M.finite_for_library(X), raw_score=True)
        np.testing.assert_allclose(got[:, 0], want, rtol=1e-12, atol=1e-12,
                                   err_msg=f"{n} rows")
