"""CatBoost models (numeric features) -> Ensemble.

A model is read from CatBoost's JSON export as data (``save_model(path, format="json")``), from
a fitted ``CatBoostClassifier``/``CatBoostRegressor``/``CatBoost`` (exported to JSON first), or
from a ``.cbm`` file (CatBoost's own reader loads it, then it is exported to JSON: nothing in
the file is executed). ``compile.verify`` then compares with CatBoost's own ``predict``.

An oblivious tree of depth d asks the same question at every node of a level: split i is
``x[f_i] > border_i`` (float32 feature, float32 border), and the leaf is
``sum_i 2^i * [split i true]``. It becomes a full binary tree of depth d: level i splits on
split i, right when it is true (the ir's rule as it stands). A missing value is compared as
CatBoost's ``nan_value_treatment`` says: ``AsFalse`` (nan_mode Min, and Forbidden: NaN > b is
false) goes left, ``AsTrue`` (nan_mode Max) right. Leaf values are doubles, summed in float64
in tree order, times the model's scale, plus its bias.

Refused by name: categorical features and the CTR tables built from them, text and embedding
features, non-oblivious (depthwise, lossguide) trees, and objectives other than Logloss,
CrossEntropy, RMSE and MultiClass.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .ir import Ensemble, Tree, UnsupportedModelError

MAX_DEPTH = 16  # CatBoost's own limit
MAX_TREES = 1 << 20
_OBJECTIVES = {"Logloss": ("binary", "sigmoid"), "CrossEntropy": ("binary", "sigmoid"),
               "RMSE": ("regression", "identity"), "MultiClass": ("multiclass", "softmax")}


def is_catboost_source(source) -> bool:
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.suffix.lower() == ".cbm":
            return True
        if path.suffix.lower() == ".json" and path.is_file():
            with open(path, "rb") as f:
                head = f.read(4096)
            return b'"oblivious_trees"' in head or b'"features_info"' in head
        return False
    return type(source).__module__.startswith("catboost") and hasattr(source, "save_model")


def model_json(source) -> dict:
    """The model's JSON export, parsed."""
    import tempfile

    if isinstance(source, (str, Path)) and Path(source).suffix.lower() == ".json":
        try:
            return json.loads(Path(source).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UnsupportedModelError(f"{source} is not a readable CatBoost JSON model: "
                                        f"{exc}") from None
    try:
        from catboost import CatBoost
    except ImportError:
        raise UnsupportedModelError("a .cbm model needs the catboost package to be read "
                                    "(pip install catboost), or export it to JSON "
                                    "(model.save_model(path, format='json'))") from None
    model = source
    if isinstance(source, (str, Path)):
        model = CatBoost()
        try:
            model.load_model(str(source))
        except Exception as exc:  # noqa: BLE001 (CatBoostError and what a bad file raises)
            raise UnsupportedModelError(f"{source} is not a readable CatBoost model: "
                                        f"{exc}") from None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "model.json"
        model.save_model(str(out), format="json")
        return json.loads(out.read_text())


def _float(v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise UnsupportedModelError(f"{where}: {v!r} is not a number")
    return float(v)


def to_ir(source) -> Ensemble:
    d = model_json(source)
    try:
        return _to_ir(d)
    except UnsupportedModelError:
        raise
    except (TypeError, KeyError, ValueError, AttributeError, IndexError) as exc:
        raise UnsupportedModelError(f"malformed CatBoost model: {type(exc).__name__}: "
                                    f"{exc}") from None


def _to_ir(d: dict) -> Ensemble:
    info = d.get("features_info", {})
    for kind in ("categorical_features", "text_features", "embedding_features"):
        if info.get(kind):
            raise UnsupportedModelError(f"CatBoost {kind.replace('_', ' ')} are not supported "
                                        "(numeric features are; one-hot and CTR categorical "
                                        "splits need their hashes and tables)")
    if d.get("ctr_data"):
        raise UnsupportedModelError("CatBoost CTR (target statistics) features are not "
                                    "supported")
    if "trees" in d and "oblivious_trees" not in d:
        raise UnsupportedModelError("non-oblivious CatBoost trees (grow_policy Depthwise or "
                                    "Lossguide) are not supported")
    floats = info.get("float_features", [])
    n_features = 1 + max((int(f["flat_feature_index"]) for f in floats), default=-1)
    if n_features < 1 or n_features > 1 << 17:
        raise UnsupportedModelError(f"{n_features} features")
    nan_right = np.zeros(n_features, dtype=bool)
    names = [f"f{i}" for i in range(n_features)]
    for f in floats:
        j = int(f["flat_feature_index"])
        if not 0 <= j < n_features or int(f.get("feature_index", j)) != j:
            raise UnsupportedModelError(f"feature index {j} out of order")
        treatment = f.get("nan_value_treatment", "AsIs")
        if treatment not in ("AsFalse", "AsTrue", "AsIs"):
            raise UnsupportedModelError(f"nan_value_treatment {treatment!r}")
        nan_right[j] = treatment == "AsTrue"
        if f.get("feature_id"):
            names[j] = str(f["feature_id"])
    params = d.get("model_info", {}).get("params", {})
    loss = (params.get("loss_function", {}) or {}).get("type")
    if loss not in _OBJECTIVES:
        raise UnsupportedModelError(f"CatBoost loss_function {loss!r} is not supported "
                                    f"({', '.join(_OBJECTIVES)})")
    task, link = _OBJECTIVES[loss]
    class_params = d.get("model_info", {}).get("class_params", {})
    classes = list(class_params.get("class_names", [])) if task != "regression" else []
    G = len(classes) if task == "multiclass" else 1
    if task == "multiclass" and G < 3:
        raise UnsupportedModelError(f"a MultiClass model with {G} classes")
    if task == "binary" and len(classes) != 2:
        classes = [0, 1]
    sb = d.get("scale_and_bias", [1.0, [0.0] * G])
    scale = _float(sb[0], "scale_and_bias")
    bias = np.asarray([_float(b, "scale_and_bias") for b in sb[1]], dtype=np.float64)
    if bias.size == 0:
        bias = np.zeros(G)
    if bias.shape != (G,):
        raise UnsupportedModelError(f"{bias.size} biases for {G} outputs")
    raw = d.get("oblivious_trees", [])
    if not raw or len(raw) > MAX_TREES:
        raise UnsupportedModelError(f"{len(raw)} trees")
    trees = [_tree(t, i, n_features, nan_right, G, scale) for i, t in enumerate(raw)]
    if np.any(bias != 0):
        # CatBoost adds the bias after the trees' sum: a last tree of one leaf adds it there
        trees.append(Tree.constant(bias))
        bias = np.zeros(G)
    n = len(trees)
    return Ensemble(
        trees=trees,
        tree_group=np.full(n, -1 if G > 1 else 0, dtype=np.int32),
        unit_ptr=np.arange(n + 1, dtype=np.int64),
        n_outputs=G,
        base=bias,
        divisor=1.0,
        link=link,
        task=task,
        n_features=n_features,
        feature_names=names,
        classes=classes,
        accumulate="float64",
        objective=loss,
        source="catboost",
        kind="CatBoost oblivious trees",
    )


def _tree(t: dict, i: int, n_features: int, nan_right: np.ndarray, G: int,
          scale: float) -> Tree:
    where = f"tree {i}"
    splits = t.get("splits", [])
    depth = len(splits)
    if depth > MAX_DEPTH:
        raise UnsupportedModelError(f"{where}: depth {depth} (at most {MAX_DEPTH})")
    feats, borders = [], []
    for s in splits:
        if s.get("split_type", "FloatFeature") != "FloatFeature":
            raise UnsupportedModelError(f"{where}: a {s.get('split_type')} split is not "
                                        "supported")
        j = int(s["float_feature_index"])
        if not 0 <= j < n_features:
            raise UnsupportedModelError(f"{where}: a split on feature {j}")
        b = _float(s["border"], f"{where} border")
        if np.isnan(b):
            raise UnsupportedModelError(f"{where}: a NaN border")
        feats.append(j)
        borders.append(np.float32(b))
    leaves = np.asarray([_float(v, f"{where} leaf") for v in t.get("leaf_values", [])],
                        dtype=np.float64)
    if leaves.shape[0] != (1 << depth) * G:
        raise UnsupportedModelError(f"{where}: {leaves.shape[0]} leaf values for depth "
                                    f"{depth} and {G} outputs")
    leaves = leaves.reshape(1 << depth, G) * scale
    # full binary tree, breadth first: node k at level L (k in [2^L - 1, 2^(L+1) - 1)) splits
    # on split L; its children are 2k + 1 (false, left) and 2k + 2 (true, right)
    inner = (1 << depth) - 1
    m = inner + (1 << depth)
    feature = np.full(m, -1, dtype=np.int32)
    threshold = np.zeros(m, dtype=np.float32)
    left = np.full(m, -1, dtype=np.int32)
    right = np.full(m, -1, dtype=np.int32)
    default_left = np.zeros(m, dtype=bool)
    value = np.zeros((m, G), dtype=np.float64)
    for k in range(inner):
        level = (k + 1).bit_length() - 1
        feature[k] = feats[level]
        threshold[k] = borders[level]
        left[k], right[k] = 2 * k + 1, 2 * k + 2
        default_left[k] = not nan_right[feats[level]]
    for k in range(inner, m):
        # the path from the root: bit L of the position among the leaves is level L's answer
        # read from the top, so the leaf index (bit i = split i) reverses it
        pos = k - inner
        index = 0
        for level in range(depth):
            if pos >> (depth - 1 - level) & 1:
                index |= 1 << level
        value[k] = leaves[index]
    return Tree(feature=feature, threshold=threshold, left=left, right=right,
                default_left=default_left, value=value)


def reference(source, X: np.ndarray) -> np.ndarray:
    """CatBoost's own scores: probabilities (n, classes) or values (n, 1)."""
    from catboost import CatBoost

    model = source
    if isinstance(source, (str, Path)):
        model = CatBoost()
        model.load_model(str(source), format="json" if str(source).endswith(".json")
                         else "cbm")
    raw = np.asarray(model.predict(np.asarray(X, dtype=np.float32),
                                   prediction_type="RawFormulaVal"), dtype=np.float64)
    return raw.reshape(X.shape[0], -1)
