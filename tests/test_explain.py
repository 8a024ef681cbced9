"""Attributions (``CompiledModel.contributions``) against the libraries' own: XGBoost
``pred_contribs`` / ``approx_contribs`` and shap's TreeExplainer (path-dependent TreeSHAP;
``approximate=True`` is Saabas) for scikit-learn, on hostile rows (NaN, +-inf, zeros, values
on split thresholds). Each row's attributions plus its bias are its raw score."""

from __future__ import annotations

import numpy as np
import pytest

import worker
from tests import models as M

XGB = ["xgb-binary-logistic", "xgb-binary-logitraw", "xgb-reg-squarederror",
       "xgb-reg-logistic", "xgb-multi-softprob", "xgb-parallel-tree", "xgb-deep"]


def _tolerance(margin: np.ndarray) -> float:
    """1e-5 of the margin's scale (XGBoost explains in float32, we in float64)."""
    return 1e-5 * max(1.0, float(np.abs(margin).max()))


@pytest.mark.parametrize("name", XGB)
@pytest.mark.parametrize("method", ["treeshap", "path"])
def test_xgboost_contributions_are_xgboosts(name, method):
    import xgboost as xgb

    booster = M.xgboost_models()[name]
    model = worker.compile_model(booster)
    X = M.hostile_rows(400, M.xgboost_thresholds(booster), seed=1)
    ours = model.contributions(X, method, n_threads=2)
    ref = booster.predict(xgb.DMatrix(M.finite_for_library(X), feature_names=booster.feature_names),
                          pred_contribs=True, approx_contribs=method == "path")
    margin = model.raw(X)
    assert ours.shape == ref.shape
    tol = _tolerance(margin)
    np.testing.assert_allclose(ours, ref, atol=tol, rtol=0)
    total = ours.sum(axis=-1)
    np.testing.assert_allclose(total, margin[:, 0] if model.n_outputs == 1 else margin,
                               atol=tol, rtol=0)


def test_threads_and_batches_give_the_same_attributions():
    model = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    X = M.hostile_rows(300, M.xgboost_thresholds(M.xgboost_models()["xgb-binary-logistic"]), 2)
    one = model.contributions(X, n_threads=1)
    np.testing.assert_array_equal(model.contributions(X, n_threads=2), one)
    np.testing.assert_array_equal(model.contributions(X[7:8]), one[7:8])
    assert model.contributions(X[:0]).shape == (0, model.n_features + 1)


def test_arrow_input_is_read_like_numpy():
    import pyarrow as pa

    booster = M.xgboost_models()["xgb-reg-squarederror"]
    model = worker.compile_model(booster)
    X = M.hostile_rows(50, M.xgboost_thresholds(booster), seed=3)
    table = pa.table({n: pa.array(X[:, j], from_pandas=True)
                      for j, n in enumerate(model.feature_names)})
    np.testing.assert_array_equal(model.contributions(table), model.contributions(X))


def test_artifact_round_trip_keeps_the_covers(tmp_path):
    model = worker.compile_model(M.xgboost_models()["xgb-multi-softprob"])
    model.save(tmp_path / "m.model")
    again = worker.load_model(tmp_path / "m.model")
    X = M.hostile_rows(40, M.xgboost_thresholds(M.xgboost_models()["xgb-multi-softprob"]), 4)
    np.testing.assert_array_equal(again.contributions(X), model.contributions(X))


def test_an_artifact_without_covers_says_so(tmp_path):
    from worker.model.compiled import CompiledModel

    model = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    arrays = {k: v for k, v in model.arrays.items() if not k.startswith("x_")}
    bare = CompiledModel(model.meta, arrays)
    with pytest.raises(ValueError, match="no node covers"):
        bare.contributions(np.zeros((1, model.n_features), np.float32))
    with pytest.raises(ValueError, match="unknown attribution method"):
        model.contributions(np.zeros((1, model.n_features), np.float32), method="lime")


@pytest.mark.parametrize("lie", ["child_loop", "child_outside", "feature", "cover"])
def test_lying_explain_arrays_are_refused(lie):
    from worker.model.artifact import ArtifactError
    from worker.model.compiled import CompiledModel

    model = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    arrays = {k: v.copy() for k, v in model.arrays.items()}
    inner = int(np.flatnonzero(arrays["x_feature"] >= 0)[3])
    if lie == "child_loop":
        arrays["x_child"][inner, 0] = 0  # back to the root: a walk that never ends
    elif lie == "child_outside":
        arrays["x_child"][inner, 1] = 10**6
    elif lie == "feature":
        arrays["x_feature"][inner] = model.n_features
    else:
        arrays["x_cover"][inner] = 0.0
    with pytest.raises(ArtifactError):
        CompiledModel(model.meta, arrays)


SKLEARN = ["rf-binary", "rf-multi", "et-multi", "rf-reg", "et-reg", "gb-binary", "gb-reg",
           "hgb-binary", "hgb-reg"]


@pytest.mark.parametrize("name", SKLEARN)
@pytest.mark.parametrize("method", ["treeshap", "path"])
def test_sklearn_contributions_are_shaps(name, method):
    import shap
    est = M.sklearn_models()[name]
    model = worker.compile_model(est)
    X = M.hostile_rows(200, M.sklearn_thresholds(est), seed=5,
                       nan=name.startswith(("rf", "et")), inf=False)
    explainer = shap.TreeExplainer(est, feature_perturbation="tree_path_dependent")
    ref = np.asarray(explainer.shap_values(X.astype(np.float64), check_additivity=False,
                                           approximate=method == "path"))
    expected = np.atleast_1d(explainer.expected_value)
    ours = model.contributions(X, method, n_threads=1)
    if ours.ndim == 2:  # one output: shap gives (rows, features) or (rows, features, classes)
        ours = ours[:, None, :]
    if ref.ndim == 2:
        ref = ref[:, :, None]
    if ref.shape[-1] != ours.shape[1]:  # a binary forest: shap explains both classes
        ref, expected = ref[:, :, -ours.shape[1]:], expected[-ours.shape[1]:]
    ref = np.transpose(ref, (0, 2, 1))  # (rows, outputs, features)
    margin = model.raw(X)
    tol = _tolerance(margin)
    np.testing.assert_allclose(ours[:, :, :-1], ref, atol=tol, rtol=0)
    np.testing.assert_allclose(ours[0, :, -1], expected, atol=tol, rtol=0)
    np.testing.assert_allclose(ours.sum(axis=-1), margin, atol=tol, rtol=0)


@pytest.mark.parametrize("method", ["treeshap", "path"])
def test_multiclass_gradient_boosting_adds_up_to_its_decision_function(method):
    # shap does not explain multiclass GradientBoostingClassifier: the library's own margins
    est = M.sklearn_models()["gb-multi"]
    model = worker.compile_model(est)
    X = M.hostile_rows(200, M.sklearn_thresholds(est), seed=6, nan=False, inf=False)
    ours = model.contributions(X, method)
    ref = est.decision_function(X.astype(np.float64))
    assert ours.shape == (200, 3, model.n_features + 1)
    np.testing.assert_allclose(ours.sum(axis=-1), ref, atol=_tolerance(ref), rtol=0)
