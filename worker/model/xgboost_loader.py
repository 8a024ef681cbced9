"""XGBoost Booster / XGBModel / .json / .ubj -> Ensemble (float32, bit-identical to XGBoost)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .ir import Ensemble, Tree, UnsupportedModelError, float32_below

# objective -> (task, link, how base_score becomes a margin)
_OBJECTIVES = {
    "binary:logistic": ("binary", "sigmoid", "logit"),
    "reg:logistic": ("regression", "sigmoid", "logit"),
    "binary:logitraw": ("binary", "identity", "identity"),
    "reg:squarederror": ("regression", "identity", "identity"),
    "reg:squaredlogerror": ("regression", "identity", "identity"),
    "reg:pseudohubererror": ("regression", "identity", "identity"),
    "reg:absoluteerror": ("regression", "identity", "identity"),
    "multi:softprob": ("multiclass", "softmax", "identity"),
    "multi:softmax": ("multiclass", "softmax", "identity"),
}


def load_booster(source):
    """Return an ``xgboost.Booster`` for a Booster, an XGBModel or a model file path."""
    import xgboost as xgb

    if isinstance(source, xgb.Booster):
        return source
    if isinstance(source, xgb.XGBModel):
        return source.get_booster()
    booster = xgb.Booster()
    booster.load_model(str(source))
    return booster


def _base_margin(raw: str, how: str, n_outputs: int) -> np.ndarray:
    values = np.atleast_1d(
        np.asarray(json.loads(raw) if raw.startswith("[") else float(raw), dtype=np.float32)
    )
    if how == "logit":
        one = np.float32(1.0)
        # XGBoost: -std::log(1.0f / base_score - 1.0f); numpy's float32 log is not glibc's
        # logf, so take the float32 quotient, a float64 log, and round once to float32
        with np.errstate(divide="ignore"):
            values = (-np.log((one / values - one).astype(np.float64))).astype(np.float32)
    if values.shape[0] == 1 and n_outputs > 1:
        values = np.repeat(values, n_outputs)
    if values.shape[0] != n_outputs:
        raise UnsupportedModelError(
            f"base_score has {values.shape[0]} values for {n_outputs} outputs"
        )
    return values.astype(np.float32)


def _tree(j: dict, index: int) -> Tree:
    param = j["tree_param"]
    if int(param.get("size_leaf_vector", "1")) > 1:
        raise UnsupportedModelError(
            f"tree {index} has vector leaves (multi_strategy=multi_output_tree)"
        )
    if any(int(t) != 0 for t in j.get("split_type", [])):
        raise UnsupportedModelError(f"tree {index} has categorical splits")
    left = np.asarray(j["left_children"], dtype=np.int32)
    right = np.asarray(j["right_children"], dtype=np.int32)
    cond = np.asarray(j["split_conditions"], dtype=np.float32)
    is_leaf = left < 0
    feature = np.where(is_leaf, -1, np.asarray(j["split_indices"], dtype=np.int32))
    threshold = np.where(is_leaf, np.float32(np.inf), float32_below(cond)).astype(np.float32)
    value = np.where(is_leaf, cond, np.float32(0)).astype(np.float64)[:, None]
    default_left = np.asarray(j["default_left"], dtype=bool)
    cover = np.asarray(j["sum_hessian"], dtype=np.float64) if "sum_hessian" in j else None
    return Tree(feature.astype(np.int32), threshold, left, right, default_left, value, cover)


def to_ir(source) -> Ensemble:
    import xgboost as xgb

    booster = load_booster(source)
    model = json.loads(booster.save_raw("json"))
    learner = model["learner"]
    objective = learner["objective"]["name"]
    if objective not in _OBJECTIVES:
        raise UnsupportedModelError(
            f"XGBoost objective {objective!r} is not supported "
            f"(supported: {', '.join(sorted(_OBJECTIVES))})"
        )
    task, link, base_how = _OBJECTIVES[objective]
    gb = learner["gradient_booster"]
    if gb["name"] != "gbtree":
        raise UnsupportedModelError(
            f"XGBoost booster {gb['name']!r} is not supported (gbtree only)"
        )
    param = learner["learner_model_param"]
    n_class = int(param.get("num_class", "0"))
    if int(param.get("num_target", "1")) > 1:
        raise UnsupportedModelError("multi-target XGBoost models are not supported")
    n_outputs = max(n_class, 1)
    gbm = gb["model"]
    trees = [_tree(t, i) for i, t in enumerate(gbm["trees"])]
    if not trees:
        raise UnsupportedModelError("the XGBoost model has no trees")
    tree_group = np.asarray(gbm["tree_info"], dtype=np.int32)
    indptr = gbm.get("iteration_indptr")
    if indptr is None:
        per_round = n_outputs * int(gbm["gbtree_model_param"].get("num_parallel_tree", "1"))
        indptr = list(range(0, len(trees) + 1, per_round))
    n_features = int(param["num_feature"])
    names = list(learner.get("feature_names") or [f"f{i}" for i in range(n_features)])
    if len(names) != n_features:
        raise UnsupportedModelError(f"{len(names)} feature names for {n_features} features")
    for i, t in enumerate(trees):
        if t.feature.max(initial=-1) >= n_features:
            raise UnsupportedModelError(
                f"tree {i} splits on feature {t.feature.max()} "
                f"but the model has {n_features} features"
            )
    classes = list(range(n_outputs if task == "multiclass" else 2)) if task != "regression" else []
    return Ensemble(
        trees=trees,
        tree_group=tree_group,
        unit_ptr=np.asarray(indptr, dtype=np.int64),
        n_outputs=n_outputs,
        base=_base_margin(param["base_score"], base_how, n_outputs).astype(np.float64),
        divisor=1.0,
        link=link,
        task=task,
        n_features=n_features,
        feature_names=names,
        classes=classes,
        accumulate="float32",
        objective=objective,
        source=f"xgboost {xgb.__version__}",
        kind="Booster",
    )


def reference_margin(source, X: np.ndarray) -> np.ndarray:
    """XGBoost's own raw margin for X (used to verify a compiled model)."""
    booster = load_booster(source)
    out = booster.inplace_predict(np.ascontiguousarray(X, dtype=np.float32), predict_type="margin")
    return np.asarray(out, dtype=np.float64).reshape(X.shape[0], -1)


def is_xgboost_source(source) -> bool:
    if isinstance(source, (str, Path)):
        return Path(source).suffix.lower() in (".json", ".ubj")
    try:
        import xgboost as xgb
    except ImportError:
        return False
    return isinstance(source, (xgb.Booster, xgb.XGBModel))
