"""Every supported model kind against the library's own predictions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import worker
from tests import models as M

ROWS = [1, 63, 64, 65, 129, 1000, 2500]  # 2500: a full task of rows walking each tree together
XGB = [
    "xgb-binary-logistic", "xgb-binary-logitraw", "xgb-reg-squarederror", "xgb-reg-logistic",
    "xgb-multi-softprob", "xgb-multi-softmax", "xgb-parallel-tree", "xgb-deep"]
SKL = ["rf-binary", "rf-multi", "et-multi", "rf-reg", "et-reg", "gb-binary", "gb-multi",
       "gb-exponential", "gb-reg", "hgb-binary", "hgb-multi", "hgb-reg"]
NAN_REJECTED = {"gb-binary", "gb-multi", "gb-exponential", "gb-reg"}


def layouts(model) -> list[str]:
    return ["padded", "compact"] if worker.compile_model(model).max_depth <= 12 else ["compact"]


QS_MODES = {"compact-qs": True, "compact-qs1": False, "compact-qs2": "avx2"}


def compiled(source, layout: str):
    """A layout scored by the walks, or the compact layout scored by QuickScorer (forced):
    "compact-qs" 8 rows at once with the CPU's best (AVX-512 here), "compact-qs2" 8 rows with
    AVX2, "compact-qs1" one row at a time. "compact" walks 8-byte nodes where they fit (every
    model here), a large task's rows each tree together, 8 rows at once without refills
    (small trees: node by node, the partition walk);
    "compact-refill" the same rows walk refilling a chain at each leaf (the partition walk of
    small trees, tests/test_partition_walk.py, off); "compact-trees" 16
    trees a row over the same nodes; "compact16" the 16-byte ones."""
    if layout == "compact-refill":  # the rows walk refilling its chains, not 8 rows at once
        model = worker.compile_model(source, layout="compact", kernel="walk")
        model.forest.part_walk(False)  # small trees: not node by node (test_partition_walk)
        assert model.forest.fixed_walk() in (True, None)  # None: special nodes, wide rows
        model.forest.fixed_walk(False)
        assert model.forest.fixed_walk() in (False, None)
        return model
    if layout == "compact-trees":  # large tasks walk 16 trees a row, not 8 rows a tree
        model = worker.compile_model(source, layout="compact", kernel="walk")
        assert model.forest.rows_walk() in (True, None)  # None: special nodes
        model.forest.rows_walk(False)
        assert model.forest.rows_walk() in (False, None)
        return model
    if layout == "compact16":
        model = worker.compile_model(source, layout="compact", kernel="walk")
        assert model.forest.compact_node_bytes in (8, None)  # None: special nodes
        model.forest.small_nodes(False)
        assert model.forest.compact_node_bytes in (16, None)
        return model
    if layout in QS_MODES:
        model = worker.compile_model(source, layout="compact", kernel="quickscorer")
        assert model.kernel == "quickscorer"
        model.forest.quickscorer_simd(QS_MODES[layout])
        return model
    model = worker.compile_model(source, layout=layout, kernel="walk")
    if layout == "compact" and model.forest.compact_node_bytes == 8:
        # large tasks take the rows walk where 2,048 doubled rows fit a task's buffer
        assert model.forest.rows_walk() is (True if model.n_features <= 64 else None)
        assert model.forest.fixed_walk() is (True if model.n_features <= 64 else None)
    return model


# QuickScorer takes trees of at most 64 leaves: every model here but the deep ones
QS_XGB = [n for n in XGB if n != "xgb-deep"]
QS_SKL = ["gb-binary", "gb-multi", "gb-exponential", "gb-reg", "hgb-binary", "hgb-multi",
          "hgb-reg"]


@pytest.fixture(scope="module", params=[(n, lay) for n in XGB
                                        for lay in ("padded", "compact", "compact-refill",
                                                    "compact-trees", "compact16")]
                + [(n, q) for n in QS_XGB for q in QS_MODES],
                ids=lambda p: f"{p[0]}-{p[1]}")
def xgb_case(request):
    name, layout = request.param
    booster = M.xgboost_models()[name]
    return name, booster, compiled(booster, layout)


def xgb_reference_margin(booster, X):
    return booster.inplace_predict(M.finite_for_library(X), predict_type="margin")


@pytest.mark.parametrize("n_rows", ROWS)
@pytest.mark.parametrize("n_threads", [1, 2])
def test_xgboost_margin_bit_identical(xgb_case, n_rows, n_threads):
    name, booster, model = xgb_case
    X = M.hostile_rows(n_rows, M.xgboost_thresholds(booster), seed=n_rows)
    ref = np.asarray(xgb_reference_margin(booster, X), dtype=np.float64).reshape(n_rows, -1)
    ours = model.raw(X, n_threads=n_threads)
    # float32 accumulation in tree order from a float32 base margin: equal to the bit
    np.testing.assert_array_equal(ours, ref)


def short_runs(thresholds, few: str, seed: int, nan=True) -> np.ndarray:
    """2,500 hostile rows of which only 3 hold a missing value ("nan") or only 3 hold none
    ("dense"): a task's two runs of the rows walk (rows without NaN, then rows with NaN) with
    fewer rows than the walk has chains. Without NaN (nan=False, for the estimators that
    reject it) every row is in one run: then it is one more plain case of 2,500 rows."""
    dense = M.hostile_rows(2500, thresholds, seed=seed, nan=False)
    missing = M.hostile_rows(2500, thresholds, seed=seed + 1, nan=nan)
    if nan:
        missing[np.arange(2500), np.arange(2500) % missing.shape[1]] = np.nan
    rows = np.random.default_rng(seed).choice(2500, size=3, replace=False)
    X = dense.copy() if few == "nan" else missing.copy()
    X[rows] = (missing if few == "nan" else dense)[rows]
    return X


@pytest.mark.parametrize("few", ["nan", "dense"])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_xgboost_runs_shorter_than_the_walk(xgb_case, few, n_threads):
    name, booster, model = xgb_case
    X = short_runs(M.xgboost_thresholds(booster), few, seed=11)
    ref = np.asarray(xgb_reference_margin(booster, X), dtype=np.float64).reshape(len(X), -1)
    np.testing.assert_array_equal(model.raw(X, n_threads=n_threads), ref)


@pytest.mark.parametrize("n_rows", [1, 65, 1000])
def test_xgboost_outputs(xgb_case, n_rows):
    name, booster, model = xgb_case
    X = M.hostile_rows(n_rows, M.xgboost_thresholds(booster), seed=7 + n_rows)
    Xl = M.finite_for_library(X)
    pred = booster.inplace_predict(Xl)
    if name in ("xgb-binary-logistic", "xgb-parallel-tree", "xgb-deep"):
        np.testing.assert_allclose(model.predict_proba(X)[:, 1], pred, atol=1e-6, rtol=0)
        assert np.array_equal(model.predict(X), (pred > 0.5).astype(int)) or \
            np.all(np.abs(pred[model.predict(X) != (pred > 0.5)] - 0.5) < 1e-6)
    elif name == "xgb-multi-softprob":
        np.testing.assert_allclose(model.predict_proba(X), pred, atol=1e-6, rtol=0)
    elif name == "xgb-multi-softmax":
        # XGBoost's softmax predicts the class index; ours breaks ties to the lowest index too
        np.testing.assert_array_equal(model.predict(X), pred.astype(int))
    elif name == "xgb-reg-logistic":
        np.testing.assert_allclose(model.predict(X), pred, atol=1e-6, rtol=0)
    else:
        np.testing.assert_allclose(model.predict_margin(X), pred, atol=1e-5, rtol=0)


@pytest.fixture(scope="module", params=[(n, lay) for n in SKL
                                        for lay in ("auto", "compact", "compact-refill",
                                                    "compact-trees", "compact16")]
                + [(n, q) for n in QS_SKL for q in QS_MODES],
                ids=lambda p: f"{p[0]}-{p[1]}")
def skl_case(request):
    name, layout = request.param
    est = M.sklearn_models()[name]
    return name, est, compiled(est, layout)


@pytest.mark.parametrize("n_rows", ROWS)
@pytest.mark.parametrize("n_threads", [1, 2])
def test_sklearn_matches_library(skl_case, n_rows, n_threads):
    name, est, model = skl_case
    X = M.hostile_rows(n_rows, M.sklearn_thresholds(est), seed=n_rows,
                       nan=name not in NAN_REJECTED)
    Xl = M.finite_for_library(X)
    if hasattr(est, "predict_proba"):
        ref = est.predict_proba(Xl)
        ours = model.predict_proba(X, n_threads=n_threads)
        np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=0)
        # labels equal except where the library's own probabilities tie within 1e-6
        top2 = np.sort(ref, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 1e-6
        lib_labels = est.predict(Xl)
        assert np.array_equal(model.predict(X, n_threads=n_threads)[clear], lib_labels[clear])
    else:
        ref = est.predict(Xl)
        np.testing.assert_allclose(model.predict(X, n_threads=n_threads), ref, atol=1e-5,
                                   rtol=1e-7)


@pytest.mark.parametrize("few", ["nan", "dense"])
def test_sklearn_runs_shorter_than_the_walk(skl_case, few):
    name, est, model = skl_case
    X = short_runs(M.sklearn_thresholds(est), few, seed=13, nan=name not in NAN_REJECTED)
    Xl = M.finite_for_library(X)
    if hasattr(est, "predict_proba"):
        np.testing.assert_allclose(model.predict_proba(X, n_threads=2), est.predict_proba(Xl),
                                   atol=1e-5, rtol=0)
    else:
        np.testing.assert_allclose(model.predict(X, n_threads=2), est.predict(Xl), atol=1e-5,
                                   rtol=1e-7)


def test_walk_steps_is_each_trees_expected_path_under_even_routing():
    """kernels.walk_steps on hand-built 8-byte nodes (key = delta << 16 | 2f + right, a
    leaf's key the leaf bit): a balanced tree of depth 2 gives 2; a lopsided one (a leaf at
    depth 1, two at depth 2: 0.5 + 2 x 0.25 x 2 = 1.5) gives 1; a lone leaf 0."""
    from worker import _kernels

    leaf = [0x80000000, 0xFF800000]
    balanced = [[1 << 16 | 2, 5], [2 << 16 | 4, 7], [3 << 16 | 6, 9]] + [leaf] * 4
    lopsided = [[1 << 16, 3], leaf, [1 << 16 | 2, 4], leaf, leaf]
    nodes = np.array(balanced + lopsided + [leaf], dtype=np.uint32)
    steps = _kernels.walk_steps(nodes, np.array([0, 7, 12], dtype=np.int64))
    assert steps.tolist() == [2, 1, 0]
    with pytest.raises(ValueError, match="n x 2"):  # an attacker review: read out of bounds
        _kernels.walk_steps(np.zeros((5, 0), np.uint32), np.array([0, 2], dtype=np.int64))


@pytest.mark.parametrize("name", ["rf-binary", "et-multi", "hgb-binary"])
@pytest.mark.parametrize("steps", [0, 1, 64])
def test_the_walks_untested_steps_change_no_answer(name, steps):
    """The rows walk without refills takes each tree's untested steps, then tests for leaves:
    no untested step (every step tested), one, and more than any tree is deep (a leaf stands
    on itself) score as the library does, rows with and without NaN in one task."""
    est = M.sklearn_models()[name]
    model = worker.compile_model(est, layout="compact", kernel="walk")
    assert model.forest.fixed_walk(True, steps=steps) is True
    X = M.hostile_rows(2500, M.sklearn_thresholds(est), seed=steps)
    np.testing.assert_allclose(model.predict_proba(X, n_threads=1),
                               est.predict_proba(M.finite_for_library(X)), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="steps"):
        model.forest.fixed_walk(True, steps=65)


@pytest.mark.parametrize("n_rows", [256, 257, 263, 519, 1799, 2048])
def test_deep_rows_set_aside_by_the_walk_fill_its_list(n_rows):
    """Every row of a batch down a 45-deep path: every chain of every group of 8 is set aside
    after its tested steps, the walk's list of them (256 places) fills, and the last n % 8 rows
    join it. An attacker review: with the list full, the last rows were written past its end
    (wrong scores at 257 rows, a crash at 263)."""
    from sklearn.ensemble import RandomForestRegressor

    rng = np.random.default_rng(0)
    X = np.sort(np.abs(rng.normal(size=(4000, 1))) ** 6, axis=0).astype(np.float32)
    est = RandomForestRegressor(3, random_state=0, bootstrap=False, max_features=None).fit(
        X, rng.normal(size=len(X)))
    model = worker.compile_model(est, layout="compact", kernel="walk")
    assert model.forest.fixed_walk() is True
    paths = est.estimators_[0].decision_path(X).sum(axis=1).A1
    assert paths.max() > 16 + 8  # deeper than any tree's untested and tested steps here
    B = np.repeat(X[np.argmax(paths)][None], n_rows, axis=0)
    for threads in (1, 2):
        np.testing.assert_allclose(model.predict(B, n_threads=threads), est.predict(B),
                                   rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", ["rf-binary", "hgb-binary", "gb-multi"])
def test_sklearn_nan_follows_tree_default(name):
    """NaN rows (where the library accepts them) score like the library, every layout."""
    est = M.sklearn_models()[name]
    X = M.hostile_rows(300, M.sklearn_thresholds(est), seed=3, inf=False,
                       nan=name not in NAN_REJECTED)
    model = worker.compile_model(est)
    np.testing.assert_allclose(model.predict_proba(X), est.predict_proba(X), atol=1e-5)


finite_or_special = st.one_of(
    st.floats(width=32, allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.0, 3.0]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n_rows=st.integers(1, 80))
def test_hypothesis_xgboost_and_forest(data, n_rows):
    booster = M.xgboost_models()["xgb-multi-softprob"]
    est = M.sklearn_models()["rf-multi"]
    thr = np.concatenate([M.xgboost_thresholds(booster), M.sklearn_thresholds(est)])
    values = st.one_of(finite_or_special, st.sampled_from(thr.tolist()))
    flat = data.draw(st.lists(values, min_size=n_rows * M.N_FEATURES,
                              max_size=n_rows * M.N_FEATURES))
    X = np.asarray(flat, dtype=np.float32).reshape(n_rows, M.N_FEATURES)
    xm = _compiled(booster)
    np.testing.assert_array_equal(
        xm.raw(X), np.asarray(xgb_reference_margin(booster, X), dtype=np.float64))
    fm = _compiled(est)
    np.testing.assert_allclose(fm.predict_proba(X), est.predict_proba(M.finite_for_library(X)),
                               atol=1e-5, rtol=0)


_CACHE = {}


def _compiled(src):
    if id(src) not in _CACHE:
        _CACHE[id(src)] = worker.compile_model(src)
    return _CACHE[id(src)]


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8, bool])
def test_any_dtype_and_memory_order(order, dtype):
    booster = M.xgboost_models()["xgb-binary-logistic"]
    model = _compiled(booster)
    rng = np.random.default_rng(1)
    X = (rng.normal(size=(200, M.N_FEATURES)) * 3).astype(dtype)
    X = np.asarray(X, order=order)
    ref = booster.inplace_predict(np.ascontiguousarray(X, dtype=np.float32),
                                  predict_type="margin")
    np.testing.assert_array_equal(model.predict_margin(X), ref.astype(np.float64))
    # a strided view (every other row, columns through a negative stride) stages the same way
    # as XGBoost sees the same values
    V = X[::2, ::-1][:, ::-1]
    assert not V.flags.c_contiguous and not V.flags.f_contiguous
    ref_v = booster.inplace_predict(np.ascontiguousarray(V, dtype=np.float32),
                                    predict_type="margin")
    np.testing.assert_array_equal(model.predict_margin(V), ref_v.astype(np.float64))


def test_arrow_table_by_column_name_with_nulls_and_types():
    import pyarrow as pa

    booster = M.xgboost_models()["xgb-binary-logistic"]
    model = _compiled(booster)
    rng = np.random.default_rng(5)
    n = 300
    X = rng.normal(size=(n, M.N_FEATURES)).astype(np.float32)
    X[:, 5] = rng.integers(0, 4, size=n)
    X[:, 6] = rng.random(n) < 0.5
    null = rng.random(X.shape) < 0.1
    cols = {}
    for j, name in enumerate(model.feature_names):
        mask = null[:, j]
        if j == 5:
            cols[name] = pa.array(X[:, j].astype(np.int16), mask=mask)
        elif j == 6:
            cols[name] = pa.array(X[:, j].astype(bool), mask=mask)
        elif j == 0:
            cols[name] = pa.array(X[:, j].astype(np.float64), mask=mask)
        else:
            cols[name] = pa.array(X[:, j], mask=mask)
    table = pa.table({"txn_id": pa.array(np.arange(n)), **dict(reversed(list(cols.items()))),
                      "extra": pa.array(["x"] * n)})
    Xn = X.copy()
    Xn[null] = np.nan
    ref = booster.inplace_predict(Xn, predict_type="margin").astype(np.float64)
    np.testing.assert_array_equal(model.predict_margin(table), ref)
    # offsets: a slice of a record batch keeps its own rows
    batch = table.to_batches()[0].slice(37, 100)
    np.testing.assert_array_equal(model.predict_margin(batch), ref[37:137])
    # chunked columns
    chunked = pa.concat_tables([table.slice(0, 100), table.slice(100)])
    np.testing.assert_array_equal(model.predict_margin(chunked), ref)


def test_arrow_missing_or_bad_column_is_an_error():
    import pyarrow as pa

    model = _compiled(M.xgboost_models()["xgb-binary-logistic"])
    cols = {n: pa.array(np.zeros(3, dtype=np.float32)) for n in model.feature_names}
    del cols["feat_2"]
    with pytest.raises(KeyError, match="feat_2"):
        model.predict_margin(pa.table(cols))
    cols["feat_2"] = pa.array(["a", "b", "c"])
    with pytest.raises(TypeError, match="feat_2"):
        model.predict_margin(pa.table(cols))


def test_wrong_feature_count_is_an_error():
    model = _compiled(M.xgboost_models()["xgb-binary-logistic"])
    with pytest.raises(ValueError, match="expects 7"):
        model.predict_proba(np.zeros((3, 5)))
    with pytest.raises(ValueError, match="2-D"):
        model.predict_proba(np.zeros(7))


def test_empty_batch():
    model = _compiled(M.xgboost_models()["xgb-multi-softprob"])
    assert model.predict_proba(np.zeros((0, M.N_FEATURES), dtype=np.float32)).shape == (0, 3)
    r = model.score_batch(np.zeros((0, M.N_FEATURES)))
    assert len(r) == 0


@pytest.mark.parametrize("layout", ["padded", "compact", *QS_MODES])
@pytest.mark.parametrize("n_rows", [1, 64, 65, 1000])
def test_hist_gradient_boosting_split_on_nan(layout, n_rows):
    """HGB's "split on NaN" nodes (threshold +inf, NaN right) route every non-NaN value left,
    +inf included, and only NaN right: the NaN fast paths must not treat NaN like +inf."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 4))
    miss = rng.random(3000) < 0.3
    X[miss, 0] = np.nan
    y = (miss ^ (rng.random(3000) < 0.05)).astype(int)
    est = HistGradientBoostingClassifier(max_iter=10, max_depth=3, random_state=0).fit(X, y)
    thr = np.concatenate([p.nodes["num_threshold"][~p.nodes["is_leaf"].astype(bool)]
                          for it in est._predictors for p in it])
    assert np.isinf(thr).any(), "the model must contain a split on NaN"
    model = compiled(est, layout)
    Xt = M.hostile_rows(n_rows, np.array([0.0]), seed=n_rows)[:, :4]
    np.testing.assert_allclose(model.predict_proba(Xt),
                               est.predict_proba(M.finite_for_library(Xt)), atol=1e-12)


@pytest.mark.parametrize("layout", ["padded", "compact", *QS_MODES])
@pytest.mark.parametrize("n_rows", [1, 40, 41, 64, 65, 1000])
def test_wide_rows_take_every_walk_rule_and_stay_bit_identical(n_rows, layout):
    """Up to 64 rows (one block, the single-row path): rows are doubled for the
    compare-and-carry walk while the block's buffer has room (64 KB: 40 rows of 203
    features); the rest take the compare-only walk (no NaN) or the NaN-testing walk. Larger
    batches: tasks of 161 rows, every row doubled (blocks.pxd PLAN_FLOATS). Compact: rows this
    wide keep the float walks (kernels.task_buffers: order-key rows only up to 1 MB a task).
    All against XGBoost, bit for bit."""
    import xgboost as xgb

    rng = np.random.default_rng(3)
    nf = 203  # not a multiple of 4: the staging's scalar tail too
    X = rng.normal(size=(2000, nf)).astype(np.float32)
    X[rng.random(X.shape) < 0.05] = np.nan
    c = np.nan_to_num(X)
    y = (c[:, 0] + c[:, 150] * c[:, 202] - c[:, 120] > 0.3).astype(int)
    booster = xgb.train({"objective": "binary:logistic", "max_depth": 5, "seed": 0},
                        xgb.DMatrix(X, label=y), num_boost_round=40)
    thr = M.xgboost_thresholds(booster)
    model = compiled(booster, layout)
    Xt = rng.normal(scale=1.5, size=(n_rows, nf)).astype(np.float32)
    pick = rng.random(Xt.shape)
    Xt[pick < 0.25] = rng.choice(thr, size=int((pick < 0.25).sum()))
    Xt[(pick >= 0.25) & (pick < 0.26)] = 0.0
    Xt[(pick >= 0.26) & (pick < 0.27)] = -0.0  # equal to 0.0 for the compare; not bitwise
    dense = rng.random(n_rows) < 0.5  # about half the rows keep no NaN
    Xt[~dense[:, None] & (pick >= 0.27) & (pick < 0.30)] = np.nan
    Xt[(pick >= 0.30) & (pick < 0.31)] = np.inf
    Xt[(pick >= 0.31) & (pick < 0.32)] = -np.inf
    ref = booster.inplace_predict(M.finite_for_library(Xt), predict_type="margin")
    np.testing.assert_array_equal(model.raw(Xt, n_threads=1)[:, 0], ref)


def test_order_keys_sort_as_float32_compares():
    """The SPLIT walks compare order keys (walk.h sw_order_key), not floats: for every pair of
    non-NaN float32 values, key(a) > key(b) exactly when a > b, signed zeros, subnormals and
    infinities included."""
    from worker._kernels import order_key_nodes

    f32 = np.finfo(np.float32)
    special = np.array([0.0, -0.0, f32.tiny, -f32.tiny, 1e-45, -1e-45, f32.max, -f32.max,
                        np.inf, -np.inf, 1.0, -1.0, np.nextafter(np.float32(1), np.float32(2)),
                        np.nextafter(np.float32(-1), np.float32(-2))], dtype=np.float32)
    rng = np.random.default_rng(0)
    v = np.concatenate([special, rng.normal(scale=10, size=300).astype(np.float32),
                        rng.integers(0, 2**32, 300, dtype=np.uint32).view(np.float32)])
    v = v[~np.isnan(v)]
    nodes = np.zeros((v.size, 2), np.uint32)
    nodes[:, 1] = v.view(np.uint32)
    key = order_key_nodes(nodes)[:, 1]
    np.testing.assert_array_equal(key[:, None] > key[None, :], v[:, None] > v[None, :])


def test_doubled_rows_of_order_keys_follow_the_split_rule():
    """The staged row (SSE2 four features at a time, then a scalar tail) against every
    threshold key: right iff x > thr, and for NaN iff the node's missing value goes right."""
    from worker._kernels import order_key_nodes, split_row_keys

    f32 = np.finfo(np.float32)
    thr = np.array([0.0, -0.0, f32.tiny, -f32.tiny, 1e-45, -1e-45, 1.0, -2.5, f32.max,
                    -f32.max, np.inf, -np.inf], dtype=np.float32)
    x = np.array([0x7FC00001, 0xFF800001], np.uint32).view(np.float32)
    x = np.concatenate([thr, np.array([np.nan, 0.5, -0.5], np.float32), x])  # 17: a tail of 1
    nodes = np.zeros((thr.size, 2), np.uint32)
    nodes[:, 1] = thr.view(np.uint32)
    tkey = order_key_nodes(nodes)[:, 1]
    keys = split_row_keys(x).reshape(-1, 2)
    for right in (0, 1):
        got = keys[:, right][:, None] > tkey[None, :]
        # (a +inf threshold: with missing right HistGradientBoosting's NaN-only split, with
        # missing left a pass-through node)
        want = np.where(np.isnan(x)[:, None], bool(right), x[:, None] > thr[None, :])
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kernel", ["walk", *QS_MODES])
@pytest.mark.parametrize("kind", ["rf-classifier", "et-regressor"])
def test_forests_of_at_most_64_leaves_on_both_kernels(kind, kernel):
    """Random forests with max_leaf_nodes (vector leaves, float64 sums): QuickScorer and the
    walk against scikit-learn, rows on the thresholds, NaN and infinities included."""
    from sklearn import ensemble as E

    rng = np.random.default_rng(5)
    X = rng.normal(size=(2000, M.N_FEATURES))
    X[rng.random(X.shape) < 0.05] = np.nan
    y3 = (np.nan_to_num(X[:, 0]) > 0).astype(int) + (np.nan_to_num(X[:, 1]) > 0.5)
    if kind == "rf-classifier":
        est = E.RandomForestClassifier(n_estimators=20, max_leaf_nodes=64, random_state=0)
        est.fit(X, y3)
    else:
        est = E.ExtraTreesRegressor(n_estimators=20, max_leaf_nodes=40, random_state=0)
        est.fit(np.nan_to_num(X), y3 + rng.normal(size=y3.size))
    model = compiled(est, "compact" if kernel == "walk" else kernel)
    assert model.kernel == ("walk" if kernel == "walk" else "quickscorer")
    for n_rows in (1, 7, 64, 1500):
        Xt = M.hostile_rows(n_rows, M.sklearn_thresholds(est), seed=n_rows,
                            nan=kind == "rf-classifier")
        Xl = M.finite_for_library(Xt)
        if kind == "rf-classifier":
            np.testing.assert_allclose(model.predict_proba(Xt, n_threads=2),
                                       est.predict_proba(Xl), atol=1e-12, rtol=0)
        else:
            np.testing.assert_allclose(model.predict(Xt, n_threads=2), est.predict(Xl),
                                       atol=1e-12, rtol=1e-12)


def test_small_compact_nodes_hold_what_the_walks_need_or_are_not_made():
    """8-byte compact nodes (kernels.small_key_nodes) from a real model: each node's child,
    row slot, threshold and leaf slot read back; a model whose values do not fit (a child
    farther than 2^15 - 1 nodes, a row slot past 2^16, special nodes, a leaf slot past 2^23)
    keeps the 16-byte nodes."""
    from worker._kernels import order_key_nodes, small_key_nodes

    model = worker.compile_model(M.sklearn_models()["rf-binary"], layout="compact")
    q = order_key_nodes(model.arrays["cnodes"])
    s = small_key_nodes(q)
    leaf = (q[:, 0] & 0x80000000) != 0
    assert model.forest.compact_node_bytes == 8 and leaf.any() and (~leaf).any()
    idx = np.arange(q.shape[0])
    np.testing.assert_array_equal(((s[~leaf, 0] >> 16) & 0x7FFF) + idx[~leaf], q[~leaf, 2])
    np.testing.assert_array_equal(s[~leaf, 0] & 0xFFFF, q[~leaf, 0])
    np.testing.assert_array_equal(s[~leaf, 1], q[~leaf, 1])
    np.testing.assert_array_equal(s[leaf, 0], np.uint32(0x80000000))
    np.testing.assert_array_equal(s[leaf, 1] & 0x7FFFFF, q[leaf, 3])
    assert (s[leaf, 1] >= np.uint32(0xFF800000)).all()  # >= key(+inf): a leaf stays put
    inner = int(np.flatnonzero(~leaf)[0])
    for lie in ("far child", "wide row", "special", "many leaves"):
        bad = q.copy()
        if lie == "far child":
            bad[inner, 2] = inner + 0x8000
        elif lie == "wide row":
            bad[inner, 0] = 0x10000
        elif lie == "special":
            bad[inner, 0] |= 0x40000000
        else:
            bad[np.flatnonzero(leaf)[0], 3] = 0x800000
        assert small_key_nodes(bad) is None, lie
    assert model.forest.small_nodes(False) == 16 and model.forest.small_nodes(True) == 8
