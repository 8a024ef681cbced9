"""The leaf-mask kernel (cyext/masks.h) against the libraries' own predictions.

Models whose trees have at most 64 leaves and each add one value to one score take it on a
CPU with AVX-512F and CD, compact or padded: 16 rows a block, 4 blocks a group, every split of
a tree asked of every row. LightGBM's float64 sums (leaf-wise trees of 2 to 64 leaves, so
trees whose left subtrees span the two 32-bit words and trees that fill both), an ONNX
export's float32 sums (ONNX Runtime's), XGBoost's float32 margins (padded depth 1 to 6 and
compact) and scikit-learn's are compared with the library on hostile rows (NaN under both
missing-value sides, +-inf, -0.0 and +0.0, values on every threshold and one float32 step
either side) at the kernel's edges: fewer rows than it takes, partial last blocks and groups,
whole groups, and tasks split between two threads. The kernel on and off give the same
bits."""

from __future__ import annotations

import numpy as np
import pytest

import worker
from tests import models as M
from worker.model.compile import chosen, to_ir

lgb = pytest.importorskip("lightgbm")

# compact: 1-3 rows walk, padded 1-12, and a last block of as few rows walks (kernels.pyx
# MASKS_MIN_COMPACT, _PADDED): every side of each cut, every block of 16 and group of 64 edge,
# and tasks split by two threads
SIZES = (1, 3, 4, 5, 12, 13, 14, 15, 16, 17, 19, 20, 28, 29, 31, 32, 33, 44, 45, 47, 48, 49, 63,
         64, 65, 100, 127, 128, 129, 511, 513, 1030, 2055)


def _cpu_has_it() -> bool:
    try:
        chosen(to_ir(M.xgboost_models()["xgb-binary-logitraw"]), "padded", "masks")
    except ValueError as exc:
        assert "AVX-512" in str(exc), exc
        return False
    return True


needs_avx512 = pytest.mark.skipif(not _cpu_has_it(), reason="this CPU has no AVX-512F and CD: "
                                  "the kernel is refused and the walks score")


def _masks(source, layout: str = "compact"):
    model = worker.compile_model(source, layout=layout, kernel="masks")
    assert model.kernel == "masks" and model.forest.masks()
    return model


def _same_with_the_walks(model, X) -> np.ndarray:
    """The kernel on and off: the same bits, at one thread and two."""
    on = [model.raw(X, n_threads=k) for k in (1, 2)]
    model.forest.masks(False)
    try:
        assert not model.forest.masks()
        off = model.raw(X, n_threads=1)
    finally:
        model.forest.masks(True)
    for got in on:
        np.testing.assert_array_equal(got, off)
    return on[0]


def _lgb_data(seed, n=3000):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 9)).astype(np.float32)
    X[rng.random(X.shape) < 0.1] = np.nan
    y = (np.nan_to_num(X[:, 0]) + np.nan_to_num(X[:, 1]) * np.nan_to_num(X[:, 2]) +
         np.sin(3 * np.nan_to_num(X[:, 3])) + rng.normal(scale=0.3, size=n))
    return X, y


_BOOSTERS: dict = {}


def _lgb(objective, leaves, missing):
    key = (objective, leaves, missing)
    if key not in _BOOSTERS:
        X, y = _lgb_data(leaves)
        params = {"objective": objective, "num_leaves": leaves, "min_data_in_leaf": 2,
                  "min_sum_hessian_in_leaf": 0, "verbose": -1, "seed": 0,
                  **({"use_missing": False} if missing == "none" else {})}
        if objective == "binary":
            y = (y > 0).astype(int)
        _BOOSTERS[key] = lgb.train(params, lgb.Dataset(X, y), num_boost_round=25)
    return _BOOSTERS[key]


def _lgb_rows(booster, n, seed):
    t = booster.trees_to_dataframe()["threshold"].dropna().to_numpy(np.float64)
    t = t[np.abs(t) < 3e38]  # LightGBM's +-1e300 (missing-only splits) fit no float32
    thr = np.unique(np.concatenate([t, np.nextafter(t, np.inf), np.nextafter(t, -np.inf)]))
    rng = np.random.default_rng(seed)
    X = _lgb_data(100 + seed, n)[0]
    pick = rng.random(X.shape)
    X[pick < 0.3] = rng.choice(thr.astype(np.float32), size=int((pick < 0.3).sum()))
    X[(pick >= 0.3) & (pick < 0.35)] = np.inf
    X[(pick >= 0.35) & (pick < 0.4)] = -np.inf
    X[(pick >= 0.4) & (pick < 0.45)] = 0.0
    X[(pick >= 0.45) & (pick < 0.5)] = -0.0
    return X


@needs_avx512
@pytest.mark.parametrize("leaves", [2, 31, 33, 63, 64])
@pytest.mark.parametrize("objective,missing", [("binary", "nan"), ("regression", "nan"),
                                               ("binary", "none")])
def test_lightgbm_raw_scores_are_the_librarys_to_the_bit(objective, missing, leaves):
    """Float64 sums; leaf-wise trees of one split (stumps) to 64 leaves (both words full),
    their left subtrees within either word or across both; missing values sent both ways."""
    booster = _lgb(objective, leaves, missing)
    sizes = booster.trees_to_dataframe().groupby("tree_index")["left_child"].apply(
        lambda c: c.isna().sum())
    assert sizes.max() == leaves  # the trees are as large as asked: the edge is tested
    model = _masks(booster)
    for seed, n in enumerate(SIZES):
        X = _lgb_rows(booster, n, seed)
        ref = booster.predict(X.astype(np.float64), raw_score=True).reshape(n, -1)
        np.testing.assert_array_equal(_same_with_the_walks(model, X) * model.divisor, ref,
                                      err_msg=f"{n} rows")


@needs_avx512
def test_a_lightgbm_onnx_export_is_onnx_runtimes_float32_sums():
    from onnxmltools import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType

    from worker.model import onnx_loader

    X, y = _lgb_data(7)
    clf = lgb.LGBMClassifier(n_estimators=40, num_leaves=63, min_child_samples=2, verbose=-1)
    export = convert_lightgbm(clf.fit(X, (y > 0).astype(int)),
                              initial_types=[("input", FloatTensorType([None, 9]))],
                              zipmap=False)
    model = _masks(export)
    assert model.forest.float32_acc
    booster = _lgb("binary", 63, "nan")  # its thresholds' neighbourhood, and more
    for seed, n in enumerate(SIZES):
        Xh = _lgb_rows(booster, n, seed)
        ref = onnx_loader.reference(export, Xh, raw=True)
        np.testing.assert_array_equal(_same_with_the_walks(model, Xh).astype(np.float32),
                                      np.asarray(ref, np.float32).reshape(n, -1),
                                      err_msg=f"{n} rows")


def _xgboost(depth: int, objective: str = "binary:logistic"):
    import xgboost as xgb

    X, y2, _, yr = M.training_data(seed=depth)
    y = yr if objective.startswith("reg") else y2
    return xgb.train({"objective": objective, "max_depth": depth, "seed": 0},
                     xgb.DMatrix(X.astype(np.float32), label=y), num_boost_round=30)


@needs_avx512
@pytest.mark.parametrize("layout", ["padded", "compact"])
@pytest.mark.parametrize("depth,objective", [(1, "binary:logistic"), (3, "reg:squarederror"),
                                             (5, "binary:logitraw"), (6, "binary:logistic"),
                                             (6, "reg:squarederror")])
def test_xgboost_margins_are_the_librarys_to_the_bit(depth, objective, layout):
    """Float32 sums; padded trees of depth 1 to 6 (64 leaves, the pass-through nodes of
    shorter branches left out) and the same trees compact."""
    booster = _xgboost(depth, objective)
    model = _masks(booster, layout)
    t = M.xgboost_thresholds(booster)
    with np.errstate(over="ignore"):
        t = np.unique(np.concatenate([t, np.nextafter(t, np.float32(np.inf)),
                                      np.nextafter(t, np.float32(-np.inf))]))
    for seed, n in enumerate(SIZES):
        X = M.hostile_rows(n, t, seed=seed)
        X[np.random.default_rng(seed).random(X.shape) < 0.03] = np.float32(-0.0)
        ref = np.asarray(booster.inplace_predict(M.finite_for_library(X),
                                                 predict_type="margin"), np.float64)
        np.testing.assert_array_equal(_same_with_the_walks(model, X).reshape(-1), ref,
                                      err_msg=f"{n} rows")


@needs_avx512
@pytest.mark.parametrize("name", ["gb-binary", "gb-reg", "hgb-binary", "hgb-reg"])
def test_sklearn_matches_the_library(name):
    """Float64 sums (GradientBoosting of depth 3 and 4; HistGradientBoosting's 31 leaves with
    learned missing-value sides), within scikit-learn's own tolerance."""
    est = M.sklearn_models()[name]
    model = _masks(est)
    for seed, n in enumerate(SIZES):
        X = M.hostile_rows(n, M.sklearn_thresholds(est), seed=seed,
                           nan=not name.startswith("gb-"))
        _same_with_the_walks(model, X)
        Xl = M.finite_for_library(X)
        if hasattr(est, "predict_proba"):
            np.testing.assert_allclose(model.predict_proba(X, n_threads=2),
                                       est.predict_proba(Xl), atol=1e-5, rtol=0)
        else:
            np.testing.assert_allclose(model.predict(X, n_threads=2), est.predict(Xl),
                                       atol=1e-5, rtol=1e-7)


@needs_avx512
def test_lone_leaf_trees_and_rows_that_all_go_one_way():
    """Trees that are one leaf (no split: empty lists, every row takes rank 0), mixed with
    ordinary trees, and batches of one row repeated, an ordinary one, all +inf, all -inf and
    all NaN (every split sends every row one way)."""
    from sklearn.ensemble import RandomForestRegressor

    rng = np.random.default_rng(3)
    X = rng.normal(size=(600, 4)).astype(np.float32)
    lone = RandomForestRegressor(20, max_depth=5, random_state=0).fit(
        X, np.where(np.arange(600) < 300, 2.5, 2.5))
    model = _masks(lone)
    assert model.forest.masks()
    B = M.hostile_rows(200, np.array([0.0]), seed=1)[:, :4]
    np.testing.assert_array_equal(_same_with_the_walks(model, B), np.full((200, 1), 2.5))
    mixed = RandomForestRegressor(20, max_depth=4, random_state=0).fit(
        X, np.where(rng.random(600) < 0.5, X[:, 0], 1.0))
    model = _masks(mixed)
    for v in (0.25, np.inf, -np.inf, np.nan):
        R = np.full((130, 4), v, dtype=np.float32)
        R[:, 1] = rng.normal(size=130)
        _same_with_the_walks(model, R)
        np.testing.assert_allclose(model.predict(R), mixed.predict(M.finite_for_library(R)),
                                   rtol=1e-7, atol=1e-12)


def test_what_the_kernel_cannot_take_is_refused_by_name():
    """Several scores, trees of more than 64 leaves, categorical splits and wide rows: each
    refused with its reason, the walks left in force where `auto` chose."""
    import xgboost as xgb

    reasons = {}
    for name, source in [("multiclass", M.xgboost_models()["xgb-multi-softprob"]),
                         ("deep", M.xgboost_models()["xgb-deep"]),
                         ("padded depth 7", _xgboost(7))]:
        with pytest.raises(ValueError, match="kernel masks: ") as exc:
            chosen(to_ir(source), "padded" if name == "padded depth 7" else "compact",
                   "masks")
        reasons[name] = str(exc.value)
    if _cpu_has_it():
        assert "several scores" in reasons["multiclass"]
        # refused under both layouts for one reason: said once
        with pytest.raises(ValueError) as both:
            worker.compile_model(M.xgboost_models()["xgb-multi-softprob"], kernel="masks")
        assert str(both.value).count("several scores") == 1
        assert "more than 64 leaves" in reasons["deep"]
        assert "depth 7" in reasons["padded depth 7"]
    rng = np.random.default_rng(0)
    wide = rng.normal(size=(200, 600)).astype(np.float32)
    booster = xgb.train({"max_depth": 2}, xgb.DMatrix(wide, label=wide[:, 599] > 0),
                        num_boost_round=2)
    with pytest.raises(ValueError, match="600 features|AVX-512"):
        chosen(to_ir(booster), "compact", "masks")
    cat = M.training_data(seed=1)[0][:, :3].copy()
    cat[:, 0] = np.floor(np.abs(np.nan_to_num(cat[:, 0])) * 3)
    cb = lgb.train({"objective": "binary", "verbose": -1, "num_leaves": 8},
                   lgb.Dataset(cat, (cat[:, 0] % 2 == 0).astype(int), categorical_feature=[0]),
                   num_boost_round=5)
    with pytest.raises(ValueError, match="special \\(categorical\\) splits|AVX-512"):
        chosen(to_ir(cb), "compact", "masks")


def test_an_artifact_sharing_nodes_between_parents_is_walked_not_masked(tmp_path):
    """A compact artifact may give two parents the same children (the structure check allows
    it: the walks read a shared node once per path). A leaf's rank is then one path's, so
    the leaf-mask kernel and QuickScorer would score the other path's rows to the wrong leaf
    (the hostile review's finding): both refuse such a tree, and an artifact that stores
    either kernel loads with the walks and scores as they do."""
    from sklearn.ensemble import GradientBoostingRegressor

    from worker.model import artifact

    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 2)).astype(np.float32)
    est = GradientBoostingRegressor(n_estimators=1, max_depth=2, learning_rate=1.0).fit(
        X, (X[:, 0] > 0) * 1.0 + (X[:, 1] > 0) * 2.0)
    kernel = "masks" if _cpu_has_it() else "quickscorer"
    model = worker.compile_model(est, layout="compact", kernel=kernel)
    model.save(tmp_path / "m.model")
    meta, arrays, _ = artifact.load(tmp_path / "m.model")
    arrays = dict(arrays)
    c = arrays["cnodes"].copy()
    assert c[1, 2] == 3 and c[2, 2] == 5  # the root's children 1 and 2, theirs 3-4 and 5-6
    c[2, 2] = 3  # node 2 takes node 1's children
    arrays["cnodes"] = c
    (tmp_path / "dag.model").write_bytes(artifact.dumps(meta, arrays))
    walks = worker.load_model(tmp_path / "dag.model", kernel="walk")
    rows = np.array([[1.0, 1.0], [-1.0, 1.0], [1.0, -1.0], [-1.0, -1.0]] * 8, np.float32)
    want = walks.raw(rows)
    for k in ("auto", "masks", "quickscorer"):
        if k == "auto":
            loaded = worker.load_model(tmp_path / "dag.model")
            assert loaded.kernel == "walk" and "two paths" in loaded.kernel_choice["reason"]
            np.testing.assert_array_equal(loaded.raw(rows), want)
        else:
            with pytest.raises(worker.ArtifactError, match="the model is valid, but kernel "
                               f"{k}: .*(two paths|AVX-512)"):
                worker.load_model(tmp_path / "dag.model", kernel=k)


@needs_avx512
def test_tables_at_their_bound_are_built_and_one_tree_past_it_are_refused():
    """The tables are bounded (kernels.pyx MASKS_MAX_TABLE_BYTES, 64 MB, counted as two
    16-byte entries a split, 64 leaves and two offsets a tree): padded stumps of float64
    leaves count 560 bytes a tree, so 119,837 trees are built and score as the walks do, bit
    for bit, and one tree more is refused by name."""
    from worker import _kernels

    last = (64 << 20) // 560
    arrays, thr = M.padded_stumps(last + 1)

    X = _kernels.Columns.from_numpy(M.hostile_rows(40, np.unique(thr[:64]), seed=3)[:, :5])
    f = _kernels.Forest(M.first_stumps(arrays, last), "padded", 1, 5, 1, 1.0, "masks", "sum")
    assert f.kernel == "masks" and f.masks()
    walks = _kernels.Forest(M.first_stumps(arrays, last), "padded", 1, 5, 1, 1.0, "walk", "sum")
    np.testing.assert_array_equal(f.raw(X, 1), walks.raw(X, 1))
    with pytest.raises(ValueError, match="kernel masks: tables of up to 67,109,280 bytes, "
                       "past the kernel's 67,108,864"):
        _kernels.Forest(M.first_stumps(arrays, last + 1), "padded", 1, 5, 1, 1.0, "masks", "sum")
