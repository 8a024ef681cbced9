"""The oblivious kernel's bins (cyext/oblivious.h sw_obl_bins512, sw_obl_sum512_w) against
CatBoost's own predictions and at their edges.

A block of more than 16 rows of a model with the bins built bins each column its levels read
once (a byte: how many of the column's thresholds the key exceeds, found by a binary search in
registers: one level of 5 steps for 31 thresholds or fewer, two levels past that, at most 255),
then reads every tree as byte compares and picks its float64 leaves as four 16-bit words. The
scores must be CatBoost's to the bit (and the walks', and the halves'), on hostile rows at the
block edges, at every depth 1-6, both missing-value sides, thresholds counted to each edge of
the search (1, 15, 16, 31, 32, 33, 63, 64, 254, 255), and keys on, beside and past every
threshold."""

from __future__ import annotations

import numpy as np
import pytest

from tests import models as M
from worker.model.compile import chosen, to_ir

catboost = pytest.importorskip("catboost", reason="pip install catboost (the test extras)")

SIZES = (17, 31, 32, 33, 63, 64, 65, 127, 129, 300)


def _bins_cpu() -> bool:
    from worker import _kernels

    arrays, _ = M.padded_stumps(64)
    f = _kernels.Forest(arrays, "padded", 1, 5, 1, 1.0, "oblivious", "sum")
    return f.oblivious_simd() == "avx512" and f.oblivious_bins(True)


needs_bins = pytest.mark.skipif(not _bins_cpu(), reason="no AVX-512 BW on this CPU: the bins "
                                "are never built (tests below check that they are refused)")


def _rows(n: int, borders: np.ndarray, seed: int, width: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = rng.normal(scale=1.5, size=(n, width)).astype(np.float32)
    pick = rng.random(X.shape)
    X[pick < 0.35] = rng.choice(borders, size=int((pick < 0.35).sum()))
    X[(pick >= 0.35) & (pick < 0.4)] = np.float32(0.0)
    X[(pick >= 0.4) & (pick < 0.43)] = np.float32(-0.0)
    X[(pick >= 0.43) & (pick < 0.5)] = np.nan
    X[(pick >= 0.5) & (pick < 0.52)] = np.inf
    X[(pick >= 0.52) & (pick < 0.54)] = -np.inf
    return X


def _borders(model) -> np.ndarray:
    from worker.model.catboost_loader import model_json

    info = model_json(model)["features_info"]["float_features"]
    b = np.asarray([v for f in info for v in f["borders"]], dtype=np.float32)
    with np.errstate(over="ignore"):
        return np.unique(np.concatenate([b, np.nextafter(b, np.float32(np.inf)),
                                         np.nextafter(b, np.float32(-np.inf))]))


@pytest.fixture(scope="module")
def cb_models():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(2000, 8)).astype(np.float32)
    X[:, 3] = rng.integers(0, 4, size=2000)  # rows on the thresholds
    X[rng.random(X.shape) < 0.05] = np.nan
    c = np.nan_to_num(X)
    y = (c[:, 0] + c[:, 1] * c[:, 2] + 0.5 * c[:, 3] + rng.normal(scale=0.5, size=2000) > 1)
    kw = dict(verbose=0, random_seed=0, thread_count=1, allow_writing_files=False)
    C, R = catboost.CatBoostClassifier, catboost.CatBoostRegressor
    out = {}
    for depth in range(1, 7):
        for nan in ("Min", "Max"):
            cls = C if depth % 2 else R
            target = y.astype(int) if cls is C else c[:, 0] * 2 - c[:, 4]
            out[f"d{depth}-{nan}"] = cls(iterations=120, depth=depth, nan_mode=nan,
                                         **kw).fit(X, target)
    return X.shape[1], out


@needs_bins
@pytest.mark.parametrize("depth", range(1, 7))
@pytest.mark.parametrize("nan", ["Min", "Max"])
def test_catboost_scores_by_the_bins_are_catboosts_to_the_bit(cb_models, depth, nan):
    width, models = cb_models
    model = models[f"d{depth}-{nan}"]
    m = chosen(to_ir(model), "padded", "oblivious")
    f = m.forest
    assert f.oblivious_bins(True) is True
    walks = chosen(to_ir(model), "padded", "walk")
    borders = _borders(model)
    for seed, n in enumerate(SIZES):
        X = _rows(n, borders, seed, width)
        want = np.asarray(model.predict(X, prediction_type="RawFormulaVal"),
                          dtype=np.float64).reshape(n, 1)
        for bins in (True, False):
            assert f.oblivious_bins(bins) is bins
            for threads in (1, 2):
                np.testing.assert_array_equal(m.raw(X, n_threads=threads), want,
                                              err_msg=f"d{depth} {nan}, bins {bins}, {n} rows,"
                                                      f" {threads} threads")
        np.testing.assert_array_equal(walks.raw(X), want, err_msg=f"walks, {n} rows")


def _stump_forest(thresholds: np.ndarray, T: int, seed: int, sides: int = 2):
    """T padded stumps (depth 1) on feature 0, their thresholds drawn from `thresholds` (each
    at least once), missing values to either side (sides 2: two columns of the block) or to
    the left (1: one column), float64 leaves."""
    from worker import _kernels

    rng = np.random.default_rng(seed)
    thr = np.concatenate([thresholds, rng.choice(thresholds, T - thresholds.size)])
    rng.shuffle(thr)
    side = rng.integers(0, sides, T).astype(np.uint32)  # node key 2f + missing-goes-right
    arrays = {"pnodes": np.stack([side, thr.astype(np.float32).view(np.uint32)], 1),
              "leaves": rng.normal(size=(2 * T, 1)) * 10.0 ** rng.integers(-8, 8, (2 * T, 1)),
              "tree_group": np.zeros(T, dtype=np.int32), "base": np.zeros(1)}
    f = _kernels.Forest(arrays, "padded", 1, 5, 1, 1.0, "oblivious", "sum")
    return f, arrays, thr, side


def _reference(X: np.ndarray, thr: np.ndarray, side: np.ndarray, leaves: np.ndarray):
    """The stumps' sums in tree order, by numpy float64: right when x > threshold, missing
    values to the side the key says."""
    x = X[:, 0].astype(np.float64)[:, None]
    right = np.where(np.isnan(x), side[None, :] == 1, x > thr.astype(np.float64)[None, :])
    picked = np.where(right, leaves[1::2, 0][None, :], leaves[0::2, 0][None, :])
    out = np.zeros(X.shape[0])
    for t in range(thr.size):  # one add a tree, in order: the kernels' rounding
        out = out + picked[:, t]
    return out


@needs_bins
@pytest.mark.parametrize("count", [1, 15, 16, 31, 32, 33, 63, 64, 254, 255])
def test_every_threshold_count_to_the_searchs_edges_scores_as_numpy(count):
    from worker import _kernels

    rng = np.random.default_rng(count)
    thresholds = np.unique(np.concatenate([
        np.float32([-np.inf, np.finfo(np.float32).min, -1.0, -0.0, 1e-45, 1.0,
                    np.finfo(np.float32).max]),
        rng.normal(size=400).astype(np.float32)]))[:count]
    if thresholds.size < count:
        pytest.fail("not enough distinct thresholds drawn")
    f, arrays, thr, side = _stump_forest(thresholds, max(600, 2 * count), seed=count,
                                         sides=1 + count % 2)
    assert f.oblivious_bins(True) is True
    walks = _kernels.Forest(arrays, "padded", 1, 5, 1, 1.0, "walk", "sum")
    with np.errstate(over="ignore"):
        near = np.concatenate([thresholds, np.nextafter(thresholds, np.float32(np.inf)),
                               np.nextafter(thresholds, np.float32(-np.inf)),
                               np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0])])
    for n in SIZES:
        X = np.zeros((n, 5), dtype=np.float32)
        X[:, 0] = rng.choice(near, n)
        cols = _kernels.Columns.from_numpy(X)
        want = _reference(X, thr, side, arrays["leaves"])
        for bins in (True, False):
            f.oblivious_bins(bins)
            np.testing.assert_array_equal(f.raw(cols, 1)[:, 0], want,
                                          err_msg=f"{count} thresholds, bins {bins}, {n} rows")
        np.testing.assert_array_equal(walks.raw(cols, 1)[:, 0], want)


def test_a_column_of_256_thresholds_is_not_binned_and_scores_by_the_halves():
    """A bin is a byte: a column asked 256 distinct thresholds keeps the halves."""
    from worker import _kernels

    thresholds = np.unique(np.random.default_rng(1).normal(size=300).astype(np.float32))[:256]
    f, arrays, thr, side = _stump_forest(thresholds, 600, seed=3, sides=1)
    assert f.oblivious_bins(True) is False
    g = _stump_forest(thresholds[:255], 600, seed=3, sides=1)[0]
    assert g.oblivious_bins(True) is _bins_cpu()  # 255: binned
    X = np.zeros((100, 5), dtype=np.float32)
    X[:, 0] = np.random.default_rng(2).choice(thresholds, 100)
    np.testing.assert_array_equal(f.raw(_kernels.Columns.from_numpy(X), 1)[:, 0],
                                  _reference(X, thr, side, arrays["leaves"]))


def test_the_bins_are_built_only_where_the_trees_pay_for_binning(cb_models):
    """Binning a column costs a block what about 3 trees save where it has 31 thresholds or
    fewer, and 8 past that (bench/oblivious_words.c): the kernel builds the bins for at least
    4 trees a column of the first kind and 8 of the second, and not below."""
    from worker import _kernels

    if not _bins_cpu():
        pytest.skip("no AVX-512 BW: never built")
    for T, built in ((39, False), (40, True)):  # 10 columns: 5 features, both sides
        arrays = _stump_forest(np.float32([-1.0, 0.0, 1.0]), T, seed=T)[1]
        arrays["pnodes"][:, 0] = np.arange(T, dtype=np.uint32) % 10
        f = _kernels.Forest(arrays, "padded", 1, 5, 1, 1.0, "oblivious", "sum")
        assert f.oblivious_bins() is built, T
    # 2 columns of 40 thresholds (8 trees each) and k of one (4 each), one stump on each:
    # 80 + k trees pay for 16 + 4k up to k = 21
    many = np.unique(np.random.default_rng(4).normal(size=60).astype(np.float32))[:40]
    for k, built in ((21, True), (22, False)):
        thr = np.concatenate([many, many, np.zeros(k, dtype=np.float32)])
        col = np.concatenate([np.zeros(40), np.ones(40), 2 + np.arange(k)]).astype(np.uint32)
        arrays = _stump_forest(np.float32([0.0]), 80 + k, seed=k)[1]
        arrays["pnodes"] = np.stack([col, thr.view(np.uint32)], 1)
        f = _kernels.Forest(arrays, "padded", 1, 40, 1, 1.0, "oblivious", "sum")
        assert f.oblivious_bins() is built, k
        assert f.oblivious_bins(True) is True, k  # built when asked


def test_models_the_bins_do_not_apply_to_are_refused_and_score_as_before(cb_models):
    """Float32 sums (XGBoost stumps), several scores (MultiClass), depth 7 and more, and modes
    other than AVX-512: the bins are not built, or not in force, and the scores are unchanged."""
    import xgboost as xgb

    width, models = cb_models
    X = _rows(200, _borders(models["d6-Min"]), 0, width)
    y = (np.nan_to_num(X[:, 0]) > 0).astype(int)
    Xf = M.finite_for_library(X)  # XGBoost refuses +-inf
    multi = catboost.CatBoostClassifier(iterations=40, depth=4, loss_function="MultiClass",
                                        verbose=0, thread_count=1, random_seed=0,
                                        allow_writing_files=False).fit(
        Xf, y + (np.nan_to_num(X[:, 1]) > 0))
    deep = catboost.CatBoostRegressor(iterations=40, depth=7, verbose=0, thread_count=1,
                                      random_seed=0, allow_writing_files=False).fit(Xf, y)
    stumps = xgb.train({"objective": "binary:logistic", "max_depth": 1, "seed": 0},
                       xgb.DMatrix(Xf, label=y), num_boost_round=200)
    for name, model in (("multiclass", multi), ("depth 7", deep), ("xgboost", stumps)):
        m = chosen(to_ir(model), "padded", "oblivious")
        assert m.forest.oblivious_bins(True) is False, name
        assert m.forest.oblivious_bins() is False, name
    m = chosen(to_ir(models["d6-Min"]), "padded", "oblivious")
    want = np.asarray(models["d6-Min"].predict(X, prediction_type="RawFormulaVal")).reshape(-1, 1)
    best = m.forest.oblivious_simd()
    built = m.forest.oblivious_bins(True)
    for mode in ("row", "avx2", "avx512")[:("row", "avx2", "avx512").index(best) + 1]:
        m.forest.oblivious_simd(mode)
        assert m.forest.oblivious_bins() is (built and mode == "avx512"), mode
        np.testing.assert_array_equal(m.raw(X), want, err_msg=mode)
