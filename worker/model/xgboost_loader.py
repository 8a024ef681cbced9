"""XGBoost Booster / XGBModel / .json / .ubj -> Ensemble (float32, bit-identical to XGBoost)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .ir import (
    MAX_CATEGORY_BITS,
    Ensemble,
    Tree,
    UnsupportedModelError,
    categorical_entry,
    float32_below,
)

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

MAX_FEATURES = 1 << 17  # as the ONNX and CatBoost loaders: wider costs gigabytes to probe


def load_booster(source):
    """Return an ``xgboost.Booster`` for a Booster, an XGBModel or a model file path."""
    import xgboost as xgb

    if isinstance(source, xgb.Booster):
        return source
    if isinstance(source, xgb.XGBModel):
        return source.get_booster()
    booster = xgb.Booster()
    try:
        booster.load_model(str(source))
    except (xgb.core.XGBoostError, UnicodeDecodeError, ValueError) as exc:
        raise UnsupportedModelError(f"{source} is not a readable XGBoost model"
                                    f"{_pickled(source)}: {str(exc).splitlines()[0][:200]}") \
            from None
    return booster


def _pickled(path) -> str:
    """', it is a pickle' where the file's bytes begin as one (never loaded: a review found
    pickles under model suffixes refused with a bare UnicodeDecodeError)."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:
        return ""
    return ", it is a pickle (never loaded here)" if head[:1] == b"\x80" and \
        head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05") else ""


RT_EPS = np.float32(1e-6)  # XGBoost's kRtEps: a logistic base_score is clamped into it


def _base_margin(raw: str, how: str, n_outputs: int, notes: list | None = None) -> np.ndarray:
    values = np.atleast_1d(
        np.asarray(json.loads(raw) if raw.startswith("[") else float(raw), dtype=np.float32)
    )
    if how == "logit":
        one = np.float32(1.0)
        # XGBoost clamps a probability base_score into [kRtEps, 1 - kRtEps] (float32) before
        # it takes the logit: 1e-7 scores as 1e-6 does
        clamped = np.clip(values, RT_EPS, one - RT_EPS).astype(np.float32)
        if notes is not None and not np.array_equal(clamped, values):
            notes.append(f"base_score {values.tolist()} clamped into [1e-6, 1 - 1e-6] as "
                         f"XGBoost does: {clamped.tolist()}")
        values = clamped
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
    left = np.asarray(j["left_children"], dtype=np.int32)
    right = np.asarray(j["right_children"], dtype=np.int32)
    cond = np.asarray(j["split_conditions"], dtype=np.float32)
    is_leaf = left < 0
    feature = np.where(is_leaf, -1, np.asarray(j["split_indices"], dtype=np.int32))
    threshold = np.where(is_leaf, np.float32(np.inf), float32_below(cond)).astype(np.float32)
    value = np.where(is_leaf, cond, np.float32(0)).astype(np.float64)[:, None]
    default_left = np.asarray(j["default_left"], dtype=bool)
    cover = np.asarray(j["sum_hessian"], dtype=np.float64) if "sum_hessian" in j else None
    special = _categorical(j, index, is_leaf, default_left)
    return Tree(feature.astype(np.int32), threshold, left, right, default_left, value, cover,
                special)


def _categorical(j: dict, index: int, is_leaf: np.ndarray,
                 default_left: np.ndarray) -> dict[int, np.ndarray]:
    """XGBoost's partition splits (``enable_categorical``): the listed categories go right;
    a missing value where ``default_left`` says; anything else left (a negative value, a
    category past the node's list, one at or above 2^24). ``int(x)`` truncates: 2.7 is 2."""
    types = np.asarray(j.get("split_type", []), dtype=np.int64)
    if types.size == 0 or not np.any(types != 0):
        return {}
    if types.shape != is_leaf.shape or np.any((types != 0) & (types != 1)):
        raise UnsupportedModelError(f"tree {index}: unknown split types")
    nodes = np.asarray(j.get("categories_nodes", []), dtype=np.int64)
    seg = np.asarray(j.get("categories_segments", []), dtype=np.int64)
    size = np.asarray(j.get("categories_sizes", []), dtype=np.int64)
    cats = np.asarray(j.get("categories", []), dtype=np.int64)
    if not (nodes.shape == seg.shape == size.shape) or np.any(seg < 0) or np.any(size < 0) \
            or np.any(seg + size > cats.size) or np.any(nodes < 0) or \
            np.any(nodes >= is_leaf.size) or set(nodes.tolist()) != set(
                np.flatnonzero(types == 1).tolist()) or np.any(is_leaf[nodes]):
        raise UnsupportedModelError(f"tree {index}: malformed categorical splits")
    out = {}
    for node, s0, k in zip(nodes.tolist(), seg.tolist(), size.tolist(), strict=True):
        chosen = cats[s0:s0 + k]
        if chosen.size and (chosen.min() < 0 or chosen.max() >= MAX_CATEGORY_BITS):
            raise UnsupportedModelError(f"tree {index}: a category outside [0, 2^20)")
        right = np.zeros(int(chosen.max()) + 1 if chosen.size else 0, dtype=bool)
        right[chosen] = True
        out[node] = categorical_entry(right, beyond_right=False, negative_right=False,
                                      truncate=False,
                                      missing_right=not bool(default_left[node]))
    return out


def _categories(gbm: dict, names: list[str]) -> dict[str, list[str]]:
    """String categories XGBoost stored with the model (3.1+), in code order, by feature."""
    out = {}
    cats = gbm.get("cats")
    encs = cats.get("enc", []) if isinstance(cats, dict) else []
    for name, enc in zip(names, encs if isinstance(encs, list) else [], strict=False):
        if not isinstance(enc, dict):
            raise UnsupportedModelError(f"feature {name!r}: unreadable categories")
        offsets, values = enc.get("offsets") or [], enc.get("values") or []
        if len(offsets) < 2:
            continue  # numeric features, or numeric categories (their codes are the input)
        try:
            raw = bytes(values)
            out[name] = [raw[a:b].decode("utf-8")
                         for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
        except (ValueError, TypeError):
            raise UnsupportedModelError(f"feature {name!r}: unreadable categories") from None
    return out


def _missing_of(source) -> float:
    """The value an XGBoost estimator reads as missing (``XGBModel(missing=...)``); NaN for a
    Booster or a file, which do not keep it (the wrappers that load a file read NaN)."""
    import xgboost as xgb

    if isinstance(source, xgb.XGBModel):
        m = source.missing
        return float("nan") if m is None else float(m)
    return float("nan")


def rounds_used(source, learner: dict, rounds: int) -> tuple[int, str | None]:
    """How many boosting rounds the user's predict uses, and why where not all: the
    scikit-learn wrapper (an XGBModel, or a file it saved: its ``scikit_learn`` attribute)
    predicts with the rounds up to ``best_iteration`` after early stopping; a Booster with
    every round (``best_iteration`` kept, not applied: slice it to compile the best)."""
    import xgboost as xgb

    attrs = learner.get("attributes") or {}
    best = attrs.get("best_iteration")
    if best is None:
        return rounds, None
    try:
        best = int(best)
    except ValueError:
        raise UnsupportedModelError(f"best_iteration {best!r} is not an integer") from None
    if not 0 <= best < rounds:
        raise UnsupportedModelError(f"best_iteration {best} is outside the model's {rounds} "
                                    "rounds")
    wrapper = isinstance(source, xgb.XGBModel) or (
        not isinstance(source, xgb.Booster) and "scikit_learn" in attrs)
    if wrapper:
        return best + 1, (f"early stopping: the first {best + 1} of {rounds} rounds "
                          f"(best_iteration {best}), as the scikit-learn wrapper's predict "
                          "uses")
    return rounds, (f"best_iteration {best} recorded, but Booster.predict uses all {rounds} "
                    f"rounds: compiled all (compile booster[:{best + 1}] for the early-stopped "
                    "model)")


def to_ir(source) -> Ensemble:
    import xgboost as xgb

    missing = _missing_of(source)
    if not np.isnan(missing):
        raise UnsupportedModelError(
            f"the estimator reads {missing:g} as missing (XGBModel(missing={missing:g})): the "
            "kernels read only NaN (null) as missing. Send that value as null and compile an "
            "estimator with missing=NaN (set est.missing = float('nan'): the trees are the "
            "same), or retrain on data with NaN for missing values")
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
    notes: list[str] = []
    rounds, why = rounds_used(source, learner, len(indptr) - 1)
    if why:
        notes.append(why)
    if rounds < len(indptr) - 1:  # early stopping: the trees of the rounds used
        indptr = list(indptr[:rounds + 1])
        trees, tree_group = trees[:indptr[-1]], tree_group[:indptr[-1]]
    n_features = int(param["num_feature"])
    if not 1 <= n_features <= MAX_FEATURES:  # (the names below, the probe rows: n_features
        # each; a 2 KB file saying 2^31 - 1 ran the machine out of memory, a hostile review)
        raise UnsupportedModelError(f"num_feature {n_features}: 1 to {MAX_FEATURES} features "
                                    "are supported")
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
        base=_base_margin(param["base_score"], base_how, n_outputs, notes).astype(np.float64),
        divisor=1.0,
        link=link,
        task=task,
        n_features=n_features,
        feature_names=names,
        classes=classes,
        categories=_categories(gbm, names),
        accumulate="float32",
        objective=objective,
        source=f"xgboost {xgb.__version__}",
        kind="Booster",
        notes=notes,
    )


def reference_margin(source, X: np.ndarray) -> np.ndarray:
    """XGBoost's own raw margin for X as the user's predict gives it (the estimator's
    ``predict(output_margin=True)``: early stopping; a file saved by the scikit-learn wrapper
    as that wrapper loads it; a Booster's every round), to verify a compiled model."""
    booster = load_booster(source)
    X = np.ascontiguousarray(X, dtype=np.float32)
    learner = json.loads(booster.save_raw("json"))["learner"]
    rounds, _ = rounds_used(source, learner, booster.num_boosted_rounds())
    out = booster.inplace_predict(X, predict_type="margin", iteration_range=(0, rounds))
    return np.asarray(out, dtype=np.float64).reshape(X.shape[0], -1)


def is_xgboost_source(source) -> bool:
    if isinstance(source, (str, Path)):
        return Path(source).suffix.lower() in (".json", ".ubj")
    try:
        import xgboost as xgb
    except ImportError:
        return False
    return isinstance(source, (xgb.Booster, xgb.XGBModel))
