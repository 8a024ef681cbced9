"""LightGBM models and categorical splits (LightGBM, XGBoost, HistGradientBoosting), held to
each library's own predictions on hostile rows: NaN, +-inf, zeros and values inside LightGBM's
zero band, values on the thresholds and next to them, negative, fractional, unseen and huge
categories. LightGBM's raw score is compared bit for bit (module docstring of
``worker/model/lightgbm_loader.py``: the recipe), XGBoost's margin bit for bit in float32."""

from __future__ import annotations

import numpy as np
import pytest

from worker.model import artifact, structure
from worker.model.compile import compile_model
from worker.model.compiled import load_model
from worker.model.ir import UnsupportedModelError

lgb = pytest.importorskip("lightgbm")
xgb = pytest.importorskip("xgboost")

N_FEATURES = 6
CAT = (3, 4)  # categorical features (integer codes)


def _data(seed=0, n=3000, nan=True):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, N_FEATURES))
    X[:, 3] = rng.integers(0, 20, n)
    X[:, 4] = rng.integers(0, 60, n)
    X[rng.random(n) < 0.25, 1] = 0.0  # zeros for zero_as_missing
    if nan:
        X[rng.random(X.shape) < 0.08] = np.nan
    logit = X[:, 0] + np.where(np.nan_to_num(X[:, 3]) % 3 == 0, 1.5, -0.5) \
        + 0.05 * np.nan_to_num(X[:, 4]) - 1.0 + np.nan_to_num(X[:, 1])
    y = (logit + rng.normal(size=n) * 0.5 > 0).astype(int)
    return X, y, rng


def _lgb_thresholds(booster) -> np.ndarray:
    """Numerical split thresholds of a LightGBM model (doubles)."""
    out = []
    for t in booster.dump_model()["tree_info"]:
        stack = [t["tree_structure"]]
        while stack:
            node = stack.pop()
            if "split_feature" in node:
                if node["decision_type"] == "<=":
                    out.append(float(node["threshold"]))
                stack += [node["left_child"], node["right_child"]]
    return np.asarray(out)


def hostile(n: int, thresholds: np.ndarray, seed: int) -> np.ndarray:
    """float32-representable rows: thresholds and their float32 neighbours, zeros of both
    signs, values inside LightGBM's zero band (|x| <= 1e-35f), NaN, +-inf, and categorical
    columns with negative, fractional, unseen, huge and infinite values."""
    rng = np.random.default_rng(seed)
    X = rng.normal(scale=2.0, size=(n, N_FEATURES))
    finite = thresholds[np.abs(thresholds) < 3e38]
    t32 = finite.astype(np.float32)
    near = np.concatenate([t32, np.nextafter(t32, np.float32(np.inf)),
                           np.nextafter(t32, np.float32(-np.inf))]) if finite.size else [0.0]
    pick = rng.random(X.shape) < 0.4
    X[pick] = rng.choice(near, size=int(pick.sum()))
    special = np.asarray([0.0, -0.0, 1e-36, -1e-36, 1e-35, -1e-35, 2e-35, np.nan, np.inf,
                          -np.inf, 3.4e38], dtype=np.float32)
    pick = rng.random(X.shape) < 0.15
    X[pick] = rng.choice(special, size=int(pick.sum()))
    cats = np.asarray([-1, -0.5, -0.0, 0.5, 2.7, 19.999, 20, 63, 64, 1000, 2.0**31, 2.0**32,
                       np.nan, np.inf, -np.inf, -3], dtype=np.float64)
    for j in CAT:
        X[:, j] = rng.integers(0, 70, n)
        pick = rng.random(n) < 0.3
        X[pick, j] = rng.choice(cats, size=int(pick.sum()))
    return X.astype(np.float32)


LGB_OBJECTIVES = [
    dict(objective="binary"),
    dict(objective="binary", sigmoid=2.0),
    dict(objective="multiclass", num_class=3),
    dict(objective="regression"),
    dict(objective="regression_l1"),
    dict(objective="huber"),
    dict(objective="quantile", alpha=0.8),
    dict(objective="poisson"),
    dict(objective="tweedie"),
    dict(objective="gamma"),
    dict(objective="cross_entropy"),
    dict(objective="binary", boosting="rf", bagging_freq=1, bagging_fraction=0.6),
]
MISSING = {"nan": {}, "none": {"use_missing": False}, "zero": {"zero_as_missing": True}}


def _label(params, X, y, rng):
    obj = params["objective"]
    if obj == "multiclass":
        return rng.integers(0, 3, X.shape[0])
    if obj in ("regression", "regression_l1", "huber", "quantile"):
        return y * 2.0 + rng.normal(size=y.size)
    if obj in ("poisson", "tweedie"):
        return rng.poisson(1.0 + y).astype(float)
    if obj == "gamma":
        return rng.gamma(2.0, 1.0 + y)
    return y


_TRAINED: dict = {}  # models trained once per session: the tests only read them


def _once(train):
    def trained(*args, **kwargs):
        key = (train.__name__, repr(args), repr(sorted(kwargs.items())))
        if key not in _TRAINED:
            _TRAINED[key] = train(*args, **kwargs)
        return _TRAINED[key]
    return trained


@_once
def _lgb(params, missing="nan", seed=0, rounds=25, leaves=15):
    X, y, rng = _data(seed)
    p = {**params, **MISSING[missing], "num_leaves": leaves, "verbose": -1,
         "min_data_per_group": 5, "cat_smooth": 1.0, "max_cat_to_onehot": 4, "seed": seed}
    ds = lgb.Dataset(X, _label(params, X, y, rng), categorical_feature=list(CAT))
    return lgb.train(p, ds, num_boost_round=rounds)


QS_MODES = {"quickscorer": True, "quickscorer1": False, "quickscorer2": "avx2"}


def _compile(source, kernel: str, layout: str = "auto"):
    """kernel "auto" or "walk" ("walk-refill": the rows walk refilling its chains where it
    applies), or QuickScorer forced: "quickscorer" 8 rows at once with the CPU's best
    (AVX-512 here), "quickscorer2" 8 rows with AVX2, "quickscorer1" a row at a time."""
    if kernel == "walk-refill":  # the rows walk refilling its chains at each leaf
        model = compile_model(source, layout=layout, kernel="walk")
        model.forest.part_walk(False)  # small trees: not node by node (test_partition_walk)
        assert model.forest.fixed_walk(False) in (False, None)  # None: categorical splits
        return model
    if kernel not in QS_MODES:
        return compile_model(source, layout=layout, kernel=kernel)
    model = compile_model(source, layout=layout, kernel="quickscorer")
    assert model.kernel == "quickscorer"
    model.forest.quickscorer_simd(QS_MODES[kernel])
    return model


def _lgb_raw(booster, X, divisor):
    return booster.predict(X.astype(np.float64), raw_score=True).reshape(X.shape[0], -1) \
        / divisor


@pytest.mark.parametrize("params", LGB_OBJECTIVES,
                         ids=lambda p: "-".join(str(v) for v in p.values()))
@pytest.mark.parametrize("missing", sorted(MISSING))
def test_lightgbm_raw_is_bit_identical(params, missing):
    booster = _lgb(params, missing)
    model = compile_model(booster)
    X = hostile(3000, _lgb_thresholds(booster), seed=1)
    assert np.array_equal(model.raw(X, n_threads=2), _lgb_raw(booster, X, model.divisor))
    # one row at a time (the small-batch path) gives the same
    assert np.array_equal(model.raw(X[:40], n_threads=1), _lgb_raw(booster, X[:40],
                                                                     model.divisor))
    if model.task == "regression":
        np.testing.assert_allclose(model.predict(X), booster.predict(X.astype(np.float64)),
                                   rtol=1e-12, atol=0)
    else:
        ref = booster.predict(X.astype(np.float64))
        ref = np.column_stack([1 - ref, ref]) if ref.ndim == 1 else ref
        np.testing.assert_allclose(model.predict_proba(X), ref, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("params", LGB_OBJECTIVES,
                         ids=lambda p: "-".join(str(v) for v in p.values()))
@pytest.mark.parametrize("missing", ["nan", "none"])
@pytest.mark.parametrize("kernel", ["walk", "walk-refill", *QS_MODES])
def test_lightgbm_compact_kernels_are_bit_identical(params, missing, kernel):
    # leaf-wise trees of up to 48 leaves, deeper than the padded layout takes: both compact
    # kernels, QuickScorer (worker/model/quickscorer.py) and the walk, against LightGBM
    booster = _lgb(params, missing, leaves=48, rounds=15)
    model = _compile(booster, kernel, layout="compact")
    X = hostile(2000, _lgb_thresholds(booster), seed=2)
    assert np.array_equal(model.raw(X, n_threads=2), _lgb_raw(booster, X, model.divisor))
    for n in (1, 5, 40):  # the small-batch path, SIMD groups of 8 and their remainders
        assert np.array_equal(model.raw(X[:n], n_threads=1), _lgb_raw(booster, X[:n],
                                                                        model.divisor))


def test_quickscorer_refuses_what_it_cannot_score_and_auto_says_why():
    booster = _lgb(LGB_OBJECTIVES[0], "zero", rounds=5)
    with pytest.raises(ValueError, match="zero-as-missing"):
        compile_model(booster, layout="compact", kernel="quickscorer")
    model = compile_model(booster, layout="compact")
    assert model.kernel == "walk" and "zero-as-missing" in model.kernel_choice["reason"]
    deep = _lgb(LGB_OBJECTIVES[0], "nan", rounds=3, leaves=100)
    with pytest.raises(ValueError, match="more than 64 leaves"):
        compile_model(deep, layout="compact", kernel="quickscorer")
    X, y, _ = _data(3)
    numerical = xgb.train({"max_depth": 3}, xgb.DMatrix(X, label=y), 3)
    with pytest.raises(ValueError, match="without categorical splits"):
        compile_model(numerical, layout="padded", kernel="quickscorer")
    with pytest.raises(ValueError, match="unknown kernel"):
        compile_model(booster, kernel="fast")
    qs = compile_model(_lgb(LGB_OBJECTIVES[0], "nan", rounds=3), layout="compact",
                       kernel="quickscorer")
    with pytest.raises(ValueError, match="QuickScorer mode 'avx1024'"):
        qs.forest.quickscorer_simd("avx1024")
    assert qs.forest.quickscorer_simd(False) == "row"


def test_quickscorer_tables_stay_bounded_for_huge_category_counts(monkeypatch):
    # an artifact may declare up to 2^21 categories per feature; the categorical tables
    # (index x tree cells) are not built past a bound: the walks score such a model
    from worker.model import quickscorer

    booster = _lgb(LGB_OBJECTIVES[0], "nan", rounds=5, leaves=20)
    assert compile_model(booster, layout="compact", kernel="quickscorer").kernel == \
        "quickscorer"
    monkeypatch.setattr(quickscorer, "MAX_CAT_CELLS", 100)
    with pytest.raises(ValueError, match="too many categories"):
        compile_model(booster, layout="compact", kernel="quickscorer")
    model = compile_model(booster, layout="compact")
    assert model.kernel == "walk" and "too many categories" in model.kernel_choice["reason"]


def test_lightgbm_special_nodes_are_there():
    """The hostile tests above exercise both special kinds (not a vacuous pass)."""
    for missing, kind in (("zero", "zero"), ("nan", "categorical")):
        ens_cats = compile_model(_lgb(LGB_OBJECTIVES[0], missing)).arrays["cats"]
        heads = ens_cats[2:]
        assert (heads == 0x40000000).any() if kind == "zero" else ens_cats.size > 10


def test_lightgbm_sources_agree(tmp_path):
    """A Booster, an LGBMClassifier, a saved model file (compiled without running anything
    from it) give the same compiled model."""
    X, y, _ = _data(3)
    clf = lgb.LGBMClassifier(n_estimators=20, num_leaves=15, verbose=-1,
                             min_data_per_group=5).fit(X, y, categorical_feature=list(CAT))
    path = tmp_path / "model.txt"
    clf.booster_.save_model(str(path))
    # one layout: "auto" times candidates, and near-equal timings may pick either layout
    a, b, c = (compile_model(s, layout="compact") for s in (clf, clf.booster_, path))
    assert a.to_bytes() != b"" and a.arrays.keys() == c.arrays.keys()
    for k in a.arrays:
        assert np.array_equal(a.arrays[k], b.arrays[k]) and np.array_equal(a.arrays[k],
                                                                           c.arrays[k])
    Xh = hostile(500, _lgb_thresholds(clf.booster_), seed=4)
    np.testing.assert_array_equal(c.predict_proba(Xh), a.predict_proba(Xh))
    np.testing.assert_allclose(a.predict_proba(Xh), clf.predict_proba(Xh.astype(np.float64)),
                               rtol=1e-12)


def test_lightgbm_artifact_round_trip(tmp_path):
    booster = _lgb(LGB_OBJECTIVES[0], "zero")
    model = compile_model(booster)
    model.save(tmp_path / "m.model")
    back = load_model(tmp_path / "m.model")
    X = hostile(800, _lgb_thresholds(booster), seed=5)
    assert np.array_equal(back.raw(X), _lgb_raw(booster, X, 1.0))


@pytest.mark.parametrize("missing", ["nan", "zero"])
def test_lightgbm_contributions_are_pred_contrib(missing):
    booster = _lgb(LGB_OBJECTIVES[0], missing)
    model = compile_model(booster)
    X = hostile(300, _lgb_thresholds(booster), seed=6)
    X = np.where(np.isinf(X), np.float32(0.0), X)  # LightGBM's TreeSHAP refuses nothing, but
    ref = booster.predict(X.astype(np.float64), pred_contrib=True)  # keep the margins finite
    ours = model.contributions(X)
    assert np.abs(ours - ref).max() <= 1e-9 * max(1.0, np.abs(ref).max())
    np.testing.assert_allclose(ours.sum(axis=1), model.raw(X)[:, 0], rtol=0, atol=1e-9)


def test_lightgbm_lazy_policy_on_categorical_model():
    booster = _lgb(LGB_OBJECTIVES[0], "nan", rounds=60)
    model = compile_model(booster)
    X = hostile(2000, _lgb_thresholds(booster), seed=7)
    full = model.score_batch(X, thresholds=[0.5])
    lazy = model.score_batch(X, lazy="certified", thresholds=[0.5])
    assert np.array_equal(lazy.decision, full.decision)
    assert lazy.work_units.mean() < full.work_units.mean()


@pytest.mark.parametrize("what, match", [
    (dict(objective="binary", linear_tree=True), "linear tree"),
    (dict(objective="multiclassova", num_class=3), "multiclassova"),
    (dict(objective="binary", sigmoid=0.5), "sigmoid"),
    (dict(objective="regression", reg_sqrt=True), "reg_sqrt"),
    (dict(objective="cross_entropy_lambda"), "cross_entropy_lambda"),
])
def test_lightgbm_refusals_name_what_is_unsupported(what, match):
    X, y, rng = _data(2, nan=False)
    label = rng.integers(0, 3, X.shape[0]) if "num_class" in what else y
    booster = lgb.train({**what, "verbose": -1, "num_leaves": 7},
                        lgb.Dataset(X, label), num_boost_round=3)
    with pytest.raises(UnsupportedModelError, match=match):
        compile_model(booster)


def test_lightgbm_custom_objective_is_refused():
    X, y, _ = _data(2, nan=False)

    def logloss(preds, data):
        p = 1 / (1 + np.exp(-preds))
        return p - data.get_label(), p * (1 - p)

    booster = lgb.train({"objective": logloss, "verbose": -1, "num_leaves": 7},
                        lgb.Dataset(X, y), num_boost_round=3)
    with pytest.raises(UnsupportedModelError, match="custom"):
        compile_model(booster)


def test_lightgbm_pandas_categories_are_kept():
    pd = pytest.importorskip("pandas")
    X, y, _ = _data(8)
    names = [f"mcc{i:02d}" for i in range(20)]
    df = pd.DataFrame(X, columns=[f"x{j}" for j in range(N_FEATURES)])
    df["x3"] = pd.Categorical.from_codes(np.nan_to_num(X[:, 3], nan=-1).astype(int), names)
    df = df.drop(columns=["x4"])
    clf = lgb.LGBMClassifier(n_estimators=15, num_leaves=15, verbose=-1,
                             min_data_per_group=5).fit(df, y)
    model = compile_model(clf)
    assert model.categories == {"x3": names}


# ---- XGBoost -------------------------------------------------------------------------------

@_once
def _xgb_categorical(strings: bool, objective="binary:logistic", seed=0):
    pd = pytest.importorskip("pandas")
    X, y, rng = _data(seed)
    df = pd.DataFrame(X, columns=[f"x{j}" for j in range(N_FEATURES)])
    for j in CAT:
        codes = np.nan_to_num(X[:, j], nan=-1).astype(int)
        labels = [f"c{j}_{i}" for i in range(int(codes.max()) + 1)] if strings else \
            list(range(int(codes.max()) + 1))
        df[f"x{j}"] = pd.Categorical.from_codes(codes, labels)
    label = rng.integers(0, 3, X.shape[0]) if objective.startswith("multi") else y
    model = xgb.XGBClassifier if objective != "reg:squarederror" else xgb.XGBRegressor
    est = model(n_estimators=40, max_depth=5, enable_categorical=True, tree_method="hist",
                max_cat_to_onehot=1, objective=objective, random_state=seed).fit(df, label)
    return est


@pytest.mark.parametrize("objective", ["binary:logistic", "multi:softprob",
                                       "reg:squarederror"])
@pytest.mark.parametrize("strings", [False, True])
@pytest.mark.parametrize("kernel, layout", [("walk", "padded"), ("walk", "compact"),
                                            ("quickscorer", "padded"),
                                            ("quickscorer1", "padded"),
                                            ("quickscorer2", "padded"),
                                            ("quickscorer", "compact")])
def test_xgboost_categorical_margin_is_bit_identical(objective, strings, kernel, layout):
    est = _xgb_categorical(strings, objective)
    model = _compile(est, kernel, layout)
    assert model.layout == layout
    X = hostile(3000, np.asarray([0.0, 1.0]), seed=9)
    ref = est.get_booster().inplace_predict(X, predict_type="margin")
    ours = model.raw(X).astype(np.float32)
    assert np.array_equal(ours.reshape(ref.shape), ref)
    if strings:
        assert model.categories["x3"][:2] == ["c3_0", "c3_1"]
    else:
        assert model.categories == {}


@pytest.mark.parametrize("method", ["treeshap", "path"])
def test_xgboost_categorical_contributions(method):
    # path: the walk through special nodes (explain.pyx saabas), not saabas_rows
    est = _xgb_categorical(False)
    model = compile_model(est)
    X = hostile(300, np.asarray([0.0]), seed=10)
    X = np.where(np.isinf(X), np.float32(7.0), X)
    dm = xgb.DMatrix(X, enable_categorical=True, feature_names=model.feature_names,
                     feature_types=["c" if j in CAT else "q" for j in range(N_FEATURES)])
    ref = est.get_booster().predict(dm, pred_contribs=True, approx_contribs=method == "path")
    ours = model.contributions(X, method)
    assert np.abs(ours - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())
    if method == "treeshap":  # the pattern tables' walk through special nodes (pattern_rows'
        from worker import _explain  # loop, not pattern.h), leaves cut into groups of 5

        ex = _explain.Explainer(model.arrays, model.n_features, model.n_outputs,
                                float(model.divisor), mode="table", patterns=5)
        assert ex.pattern_groups > ex.patterned > 0
        ours = ex.contributions(np.ascontiguousarray(X, np.float32), 0, 1)[:, 0]
        assert np.abs(ours - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())


# ---- scikit-learn HistGradientBoosting -----------------------------------------------------

@pytest.mark.parametrize("kind", ["classifier", "regressor", "multiclass"])
@pytest.mark.parametrize("kernel", ["walk", *QS_MODES])
def test_hist_gradient_boosting_categorical(kind, kernel):
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    X, y, rng = _data(11)
    X[:, 4] = np.where(np.isnan(X[:, 4]), np.nan, X[:, 4] * 2)  # categories 0, 2, 4, ...
    if kind == "multiclass":
        y = rng.integers(0, 3, X.shape[0])
    est = (HistGradientBoostingRegressor if kind == "regressor" else
           HistGradientBoostingClassifier)(max_iter=25, categorical_features=list(CAT),
                                           random_state=0).fit(X, y)
    model = _compile(est, kernel, "compact" if kernel in QS_MODES else "auto")
    Xh = hostile(3000, np.asarray([0.0]), seed=12)
    Xh = np.where(np.isinf(Xh), np.float32(1e9), Xh)  # scikit-learn refuses inf categories
    Xh[:, 3] = np.minimum(np.abs(Xh[:, 3]), 1e9) * np.sign(Xh[:, 3])
    if kind == "regressor":
        ref, ours = est.predict(Xh), model.predict(Xh)
    else:
        ref, ours = est.predict_proba(Xh), model.predict_proba(Xh)
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-15)
    phi = model.contributions(Xh[:200])
    margin = model.raw(Xh[:200])
    total = phi.sum(axis=-1)
    np.testing.assert_allclose(total.reshape(margin.shape), margin, atol=1e-9)


def test_hist_gradient_boosting_string_categories():
    pd = pytest.importorskip("pandas")
    from sklearn.ensemble import HistGradientBoostingClassifier

    X, y, _ = _data(13, nan=False)
    df = pd.DataFrame({"a": X[:, 0].astype(np.float32).astype(np.float64), "mcc": pd.Categorical(
        np.asarray(["grocery", "travel", "gaming", "fuel"])[X[:, 3].astype(int) % 4])})
    est = HistGradientBoostingClassifier(max_iter=10, categorical_features="from_dtype").fit(
        df, y)
    model = compile_model(est, check=False)
    assert model.categories == {"mcc": ["fuel", "gaming", "grocery", "travel"]}
    codes = pd.Categorical(df["mcc"], categories=model.categories["mcc"]).codes
    Xc = np.column_stack([df["a"], codes]).astype(np.float32)
    np.testing.assert_allclose(model.predict_proba(Xc), est.predict_proba(df), rtol=1e-12)


# ---- artifacts that lie about their categorical splits -------------------------------------

def _meta_arrays(layout):
    model = compile_model(_lgb(LGB_OBJECTIVES[0], "nan", rounds=5), layout=layout)
    return dict(model.meta), {k: v.copy() for k, v in model.arrays.items()}


@pytest.mark.parametrize("layout", ["padded", "compact"])
@pytest.mark.parametrize("edit, match", [
    ("offset_out", "nodes"),
    ("header_huge", "nodes"),
    ("no_cats", "cats|nodes"),
    ("first_entry", "unused entry"),
    ("special_leaf", "nodes"),
])
def test_lying_categorical_entries_are_refused(layout, edit, match):
    meta, arrays = _meta_arrays(layout)
    nodes = arrays["cnodes" if layout == "compact" else "pnodes"]
    sp = np.flatnonzero((nodes[:, 0] & 0xC0000000) == 0x40000000)
    assert sp.size
    if edit == "offset_out":
        nodes[sp[0], 1] = arrays["cats"].shape[0] - 1
    elif edit == "header_huge":
        arrays["cats"][nodes[sp[0], 1]] = 0x001FFFFF
    elif edit == "no_cats":
        del arrays["cats"]
    elif edit == "first_entry":
        arrays["cats"][0] = 5
    elif edit == "special_leaf":
        if layout == "compact":
            leaf = np.flatnonzero(nodes[:, 0] == 0x80000000)[0]
            nodes[leaf, 0] |= 0x40000000
        else:  # a padded key with the leaf bit
            nodes[sp[0], 0] |= 0x80000000
    with pytest.raises(artifact.ArtifactError, match=match):
        structure.check(meta, arrays)
    if edit == "first_entry":
        return  # offset 0 marks ordinary splits in x_special; no kernel reads it
    with pytest.raises(ValueError):  # the kernels' own check, for arrays that skip the above
        from worker import _kernels

        _kernels.Forest(arrays, layout, int(meta["depth"]), int(meta["n_features"]),
                        int(meta["n_outputs"]), float(meta["divisor"]))


@pytest.mark.parametrize("layout", ["padded", "compact"])
def test_both_layouts_are_exact(layout):
    booster = _lgb(LGB_OBJECTIVES[2], "zero", rounds=10, leaves=8)
    model = compile_model(booster, layout=layout)
    assert model.layout == layout and "cats" in model.arrays
    X = hostile(2000, _lgb_thresholds(booster), seed=16)
    assert np.array_equal(model.raw(X), _lgb_raw(booster, X, 1.0))
    est = _xgb_categorical(False, "binary:logistic")
    model = compile_model(est, layout=layout)
    X = hostile(2000, np.asarray([0.0]), seed=17)
    ref = est.get_booster().inplace_predict(X, predict_type="margin")
    assert np.array_equal(model.raw(X)[:, 0].astype(np.float32), ref)
    lazy = model.score_batch(X, lazy="certified", thresholds=[0.5])
    assert np.array_equal(lazy.decision, model.score_batch(X, thresholds=[0.5]).decision)


# ---- categorical input from Arrow: dictionary-encoded strings ------------------------------

def _mcc_model():
    pd = pytest.importorskip("pandas")
    X, y, rng = _data(14, nan=False)
    mcc = np.asarray([f"m{i:04d}" for i in range(30)])
    codes = rng.integers(0, 30, X.shape[0])
    y = ((codes % 4 == 0) + X[:, 0] + rng.normal(size=X.shape[0]) * 0.3 > 0.6).astype(int)
    df = pd.DataFrame({"amount": X[:, 0].astype(np.float32), "age": X[:, 1].astype(np.float32),
                       "mcc": pd.Categorical(mcc[codes], categories=list(mcc))})
    clf = lgb.LGBMClassifier(n_estimators=30, num_leaves=15, verbose=-1,
                             min_data_per_group=5, cat_smooth=1.0).fit(df, y)
    return clf, mcc


def _mcc_table(mcc, n=500, seed=15):
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    strings = rng.choice(np.concatenate([mcc, ["unseen", "m9999"]]), n).astype(object)
    strings[rng.random(n) < 0.05] = None
    amount = rng.normal(size=n).astype(np.float32)
    age = rng.normal(size=n).astype(np.float32)
    return pa.table({"amount": amount, "age": age,
                     "mcc": pa.array(strings, pa.string()).dictionary_encode()}), strings


def test_dictionary_strings_score_as_lightgbm_scores_the_dataframe():
    pd = pytest.importorskip("pandas")
    clf, mcc = _mcc_model()
    model = compile_model(clf)
    assert model.categories["mcc"] == list(mcc)
    table, strings = _mcc_table(mcc)
    df = pd.DataFrame({"amount": table["amount"].to_numpy(), "age": table["age"].to_numpy(),
                       "mcc": pd.Categorical.from_codes(  # unseen or missing: -1 (NaN)
                           [list(mcc).index(v) if v in mcc else -1 for v in strings],
                           categories=list(mcc))})
    np.testing.assert_allclose(model.predict_proba(table), clf.predict_proba(df), rtol=1e-13)
    raw = clf.booster_.predict(df, raw_score=True)
    assert np.array_equal(model.raw(table)[:, 0], raw)
    phi = model.contributions(table)
    np.testing.assert_allclose(phi, clf.booster_.predict(df, pred_contrib=True), atol=1e-12)


def test_decoder_maps_dictionary_strings_once_per_message(tmp_path):
    import pyarrow as pa

    from worker import codec

    clf, mcc = _mcc_model()
    model = compile_model(clf)
    table, _ = _mcc_table(mcc, n=64)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    dec = codec.Decoder(model.feature_names, None, categories=model.categories)
    batch = dec.decode(sink.getvalue().to_pybytes())
    assert batch.schema.field("mcc").type == pa.float32()
    np.testing.assert_array_equal(model.raw(batch), model.raw(table))
    # without the model's categories the same message is a bad type, with a clear reason
    with pytest.raises(codec.InvalidMessage, match="bad_type"):
        codec.Decoder(model.feature_names, None).decode(sink.getvalue().to_pybytes())


def test_cli_compiles_a_lightgbm_model_file(tmp_path):
    from click.testing import CliRunner

    from worker.cli import main

    booster = _lgb(LGB_OBJECTIVES[2], "nan", rounds=5)
    src = tmp_path / "model.txt"
    booster.save_model(str(src))
    out = tmp_path / "m.model"
    res = CliRunner().invoke(main, ["compile", str(src), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "lightgbm" in res.output and "multiclass" in res.output
    X = hostile(500, _lgb_thresholds(booster), seed=18)
    assert np.array_equal(load_model(out).raw(X), _lgb_raw(booster, X, 1.0))
    # a text file that is not a LightGBM model is refused with a reason, not a traceback
    bad = tmp_path / "bad.txt"
    bad.write_text("tree\nversion=v4\nnum_class=1\n")
    res = CliRunner().invoke(main, ["compile", str(bad), "-o", str(tmp_path / "b.model")])
    assert res.exit_code != 0 and "LightGBM" in res.output and "Traceback" not in res.output


def test_hostile_lightgbm_model_text_is_refused_by_name(tmp_path):
    """Mutated model files (lines dropped or duplicated, numbers replaced by hostile ones)
    either compile to a model that scores hostile rows or are refused with
    UnsupportedModelError; nothing else escapes and nothing crashes."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    base = _lgb(LGB_OBJECTIVES[0], "zero", rounds=3, leaves=6).model_to_string()
    lines = base.splitlines()
    hostile_numbers = ["-1", "0", "1", "2147483648", "-2147483649", "nan", "inf", "-inf",
                       "1e308", "99999999999999999999", "x", "", "3.5", "4294967296", "-2"]
    X = hostile(64, np.asarray([0.0, 1.0]), seed=19)

    @settings(max_examples=300, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.integers(0, len(lines) - 1), st.sampled_from(
        ["drop", "dup", "number"]), st.integers(0, 40), st.sampled_from(hostile_numbers)),
        min_size=1, max_size=4))
    def run(edits):
        text = list(lines)
        for i, how, k, v in edits:
            i %= len(text)
            if how == "drop":
                del text[i]
            elif how == "dup":
                text.insert(i, text[i])
            elif "=" in text[i]:
                key, _, vals = text[i].partition("=")
                parts = vals.split(" ")
                parts[k % len(parts)] = v
                text[i] = key + "=" + " ".join(parts)
            if not text:
                return
        path = tmp_path / "m.txt"
        path.write_text("\n".join(text) + "\n")
        try:
            model = compile_model(path, check=False)
        except UnsupportedModelError:
            return
        model.raw(X)
        model.raw(X[:1])

    run()
    # found reading the parser, not by the mutations above: a negative num_cat
    path = tmp_path / "neg.txt"
    import re

    path.write_text(re.sub(r"num_cat=\d+", "num_cat=-1", base, count=1))
    assert "num_cat=-1" in path.read_text()
    with pytest.raises(UnsupportedModelError, match="categorical splits"):
        compile_model(path, check=False)
    for good, bad in (("sigmoid:1", "sigmoid:x"), ("pandas_categorical:null",
                                                   "pandas_categorical:[1, 2]")):
        path.write_text(base.replace(good, bad))
        with pytest.raises(UnsupportedModelError):
            compile_model(path, check=False)


def test_staged_categories_leave_the_callers_rows_alone():
    """A model whose categorical features only categorical splits read stages them as bit
    indices: in a copy, never in the caller's array (numpy direct path, one-row path, lazy)."""
    booster = _lgb(LGB_OBJECTIVES[0], "nan", rounds=20)
    model = compile_model(booster)
    assert sorted(model.arrays["cat_feat"].tolist()) == list(CAT)
    X = hostile(300, _lgb_thresholds(booster), seed=20)
    before = X.copy()
    for part in (X, X[:1], X[:64]):
        model.raw(part)
        model.predict_proba(part)
        model.score_batch(part, lazy="certified", thresholds=[0.5])
    np.testing.assert_array_equal(X, before)
    assert np.array_equal(model.raw(X), _lgb_raw(booster, X, 1.0))


@pytest.mark.parametrize("edit", ["head", "feature", "missing_head"])
def test_lying_staged_categories_are_refused(edit):
    meta, arrays = _meta_arrays("compact")
    assert "cat_feat" in arrays
    if edit == "head":
        arrays["cat_head"][0] += 1  # wider than the entries: an index past their bits
    elif edit == "feature":
        arrays["cat_feat"][0] = 0  # a numerical feature read as a bit index
    else:
        del arrays["cat_head"]
    with pytest.raises(artifact.ArtifactError, match="cat_"):
        structure.check(meta, arrays)
    if edit == "head":  # the kernels' own check: an index past an entry's bits
        from worker import _kernels

        with pytest.raises(ValueError, match="staged"):
            _kernels.Forest(arrays, "compact", 0, int(meta["n_features"]),
                            int(meta["n_outputs"]), float(meta["divisor"]))


def test_dictionary_strings_score_as_xgboost_scores_the_dataframe():
    """XGBoost (3.1+) stores its string categories and re-codes a DataFrame's; dictionary
    strings map through the same list. XGBoost refuses an unseen string; the worker scores it
    as missing, which is what XGBoost gives for a missing category."""
    pd = pytest.importorskip("pandas")
    import pyarrow as pa

    rng = np.random.default_rng(21)
    cats = [f"m{i:03d}" for i in range(40)]
    codes = rng.integers(0, 40, 3000)
    a = rng.normal(size=3000).astype(np.float32)
    y = ((codes % 3 == 0) + a > 0.5).astype(int)
    df = pd.DataFrame({"a": a, "mcc": pd.Categorical(np.asarray(cats)[codes], categories=cats)})
    est = xgb.XGBClassifier(n_estimators=30, max_depth=4, enable_categorical=True,
                            tree_method="hist", max_cat_to_onehot=1).fit(df, y)
    model = compile_model(est)
    assert model.categories == {"mcc": cats}
    strings = np.asarray(cats + ["unseen"], dtype=object)[rng.integers(0, 41, 500)]
    strings[rng.random(500) < 0.05] = None
    table = pa.table({"a": a[:500], "mcc": pa.array(strings, pa.string()).dictionary_encode()})
    known = np.asarray([s in cats for s in strings])
    as_missing = pd.DataFrame({"a": a[:500], "mcc": pd.Categorical(
        np.where(known, strings, None), categories=cats)})
    ref = est.get_booster().inplace_predict(as_missing, predict_type="margin")
    assert np.array_equal(model.raw(table)[:, 0].astype(np.float32), ref)


@pytest.mark.parametrize("edit", ["child_out", "child_back", "root_out", "leaf_not_self"])
def test_kernels_refuse_broken_compact_trees_themselves(edit):
    """The Forest's own check (defence in depth, for arrays that skip structure.check) on a
    compact model with and without special nodes: a regression test for the pointer checks
    that once ran only for models with special nodes."""
    from sklearn.ensemble import RandomForestClassifier

    from worker import _kernels

    X, y, _ = _data(22, nan=False)
    for model in (compile_model(RandomForestClassifier(n_estimators=3, max_depth=6,
                                                       random_state=0).fit(X, y),
                                layout="compact"),
                  compile_model(_lgb(LGB_OBJECTIVES[0], "nan", rounds=3), layout="compact")):
        arrays = {k: v.copy() for k, v in model.arrays.items()}
        cn = arrays["cnodes"]
        inner = np.flatnonzero((cn[:, 0] & 0x80000000) == 0)
        leaf = np.flatnonzero((cn[:, 0] & 0x80000000) != 0)
        if edit == "child_out":
            cn[inner[-1], 2] = cn.shape[0] - 1
        elif edit == "child_back":
            cn[inner[-1], 2] = inner[-1]
        elif edit == "root_out":
            arrays["root"][0] = cn.shape[0]
        else:
            cn[leaf[0], 2] = leaf[0] + 1
        with pytest.raises(ValueError):
            _kernels.Forest(arrays, "compact", 0, model.n_features, model.n_outputs,
                            float(model.divisor))
