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

One-hot categorical splits (``OneHotFeature``: the value's hash equals the split's) become
categorical splits over codes: a categorical feature's codes are the hashes its splits name
(``Ensemble.category_hashes``), and a value (a string, or an integer hashed as its decimal
string, as CatBoost does) takes the code of its hash (model/cathash.py); a value whose hash no
split names, or a missing value, goes where CatBoost sends it, the false side (left).

Refused by name: CTR (target statistics) splits and the tables built for them, text and
embedding features, non-oblivious (depthwise, lossguide) trees, and objectives other than
Logloss, CrossEntropy, RMSE and MultiClass.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .cathash import MAX_HASHES
from .ir import Ensemble, Tree, UnsupportedModelError, categorical_entry

MAX_DEPTH = 16  # CatBoost's own limit
MAX_TREES = 1 << 20
MAX_NODES = 1 << 24  # the trees unfolded to full binary trees (2^(d + 1) - 1 nodes a tree)
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
        try:
            model.save_model(str(out), format="json")
        except Exception as exc:  # noqa: BLE001 (CatBoostError: e.g. text features)
            raise UnsupportedModelError(f"CatBoost cannot export this model to JSON, the form "
                                        f"the worker reads (text and embedding features are "
                                        f"not supported): {exc}") from None
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


_CTR = ("CatBoost CTR (target statistics) features are not supported: they need the "
        "model's CTR tables and CatBoost's hashing of feature combinations; train with "
        "one_hot_max_size above each categorical feature's category count (every split "
        "one-hot), which is")


def _to_ir(d: dict) -> Ensemble:
    info = d.get("features_info", {})
    for kind in ("text_features", "embedding_features"):
        if info.get(kind):
            raise UnsupportedModelError(f"CatBoost {kind.replace('_', ' ')} are not "
                                        "supported (numeric and one-hot categorical "
                                        "features are)")
    if d.get("ctr_data"):
        raise UnsupportedModelError(_CTR + " supported")
    if "trees" in d and "oblivious_trees" not in d:
        raise UnsupportedModelError("non-oblivious CatBoost trees (grow_policy Depthwise or "
                                    "Lossguide) are not supported")
    floats = info.get("float_features", [])
    cat_info = info.get("categorical_features", [])
    flat = [int(f["flat_feature_index"]) for f in floats + cat_info]
    n_features = 1 + max(flat, default=-1)
    if n_features < 1 or n_features > 1 << 17 or len(set(flat)) != len(flat) or min(flat) < 0:
        raise UnsupportedModelError(f"{n_features} features, or a feature index twice")
    nan_right = np.zeros(n_features, dtype=bool)
    names = [f"f{i}" for i in range(n_features)]
    flat_of: dict[int, int] = {}  # float feature (its index among them) -> flat index
    for f in floats:
        j = int(f["flat_feature_index"])
        i = int(f.get("feature_index", j))
        if not 0 <= j < n_features or i in flat_of:
            raise UnsupportedModelError(f"float feature {i} (feature {j}) out of range or "
                                        "listed twice")
        flat_of[i] = j
        treatment = f.get("nan_value_treatment", "AsIs")
        if treatment not in ("AsFalse", "AsTrue", "AsIs"):
            raise UnsupportedModelError(f"nan_value_treatment {treatment!r}")
        nan_right[j] = treatment == "AsTrue"
        if f.get("feature_id"):
            names[j] = str(f["feature_id"])
    # categorical feature (its index among them) -> flat index, and its codes' hashes
    cats: dict[int, tuple[int, list[int]]] = {}
    for c in cat_info:
        j, i = int(c["flat_feature_index"]), int(c["feature_index"])
        values = c.get("values", [])
        if not isinstance(values, list) or len(values) > MAX_HASHES:
            raise UnsupportedModelError(f"categorical feature {j}: more than {MAX_HASHES} "
                                        "one-hot values")
        hashes = [_hash(v, f"categorical feature {j}") for v in values]
        if i in cats or len(set(hashes)) != len(hashes):
            raise UnsupportedModelError(f"categorical feature {j}: its index twice or a "
                                        "value twice")
        cats[i] = (j, hashes)
        if c.get("feature_id"):
            names[j] = str(c["feature_id"])
    if len(set(names)) != len(names):
        raise UnsupportedModelError("a feature name twice")
    params = d.get("model_info", {}).get("params", {})
    loss = (params.get("loss_function", {}) or {}).get("type")
    if loss is None:
        raise UnsupportedModelError(
            "the CatBoost model records no loss_function (catboost.sum_models drops it), so "
            "the link that turns its sum into a score is unknown: refused rather than "
            "guessed (compile the models apart, or a model trained whole)")
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
    cut = d.get("model_info", {}).get("binclass_probability_threshold")
    try:  # (CatBoost's JSON writes it as a string)
        moved = cut is not None and float(cut) != 0.5
    except (TypeError, ValueError):
        moved = True
    if task == "binary" and moved:
        # CatBoost's predict labels a row positive above it; the compiled model's label is
        # P > 0.5 (a hostile review: 340 of 2,000 labels differed, the probabilities exact)
        raise UnsupportedModelError(
            f"probability threshold {cut} (set_probability_threshold): the compiled model "
            "labels a row positive at P > 0.5. Reset it (model.set_probability_threshold("
            "None)) and band the probabilities with scoring.thresholds, or score_batch's "
            "thresholds, instead")
    sb = d.get("scale_and_bias", [1.0, [0.0] * G])
    scale = _float(sb[0], "scale_and_bias")
    if scale != 1.0:
        # CatBoost multiplies the trees' sum by it; scaling each leaf instead rounds
        # differently (up to ~1,900 ulp on the margin, measured): refused, not approximated
        raise UnsupportedModelError(
            f"scale {scale!r} (set_scale_and_bias): CatBoost multiplies the trees' sum by it, "
            "which the kernels do not reproduce to the bit. Compile the model with scale 1 "
            "(model.set_scale_and_bias(1.0, bias)) and apply the scale to its raw score, "
            "or keep the model unscaled")
    bias = np.asarray([_float(b, "scale_and_bias") for b in sb[1]], dtype=np.float64)
    if bias.size == 0:
        bias = np.zeros(G)
    if bias.shape != (G,):
        raise UnsupportedModelError(f"{bias.size} biases for {G} outputs")
    raw = d.get("oblivious_trees", [])
    if not isinstance(raw, list) or not raw or len(raw) > MAX_TREES:
        raise UnsupportedModelError(f"{len(raw)} trees")
    nodes = sum((2 << min(len(t.get("splits", [])), MAX_DEPTH + 1)) - 1 for t in raw)
    if nodes > MAX_NODES:
        raise UnsupportedModelError(f"the trees unfold to {nodes:,} nodes (at most "
                                    f"{MAX_NODES:,})")
    code = {c: {h: k for k, h in enumerate(hashes)} for c, (_, hashes) in cats.items()}
    for t in raw:  # a one-hot value the feature's list lacks gets a code of its own
        for sp in t.get("splits", []):
            c = int(sp["cat_feature_index"]) if sp.get("split_type") == "OneHotFeature" else -1
            if c in cats:
                h = _hash(sp["value"], "a one-hot split")
                if h not in code[c]:
                    code[c][h] = len(cats[c][1])
                    cats[c][1].append(h)
                    if len(cats[c][1]) > MAX_HASHES:
                        raise UnsupportedModelError(f"categorical feature {cats[c][0]}: more "
                                                    f"than {MAX_HASHES} one-hot values")
    entries: dict[tuple[int, int], np.ndarray] = {}  # (feature, hash) -> its split's entry
    trees = [_tree(t, i, flat_of, nan_right, G, scale, cats, code, entries)
             for i, t in enumerate(raw)]
    # every categorical feature, also one no split reads (all its values are unseen)
    hashed = {names[j]: hashes for j, hashes in cats.values()}
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
        category_hashes=hashed,
    )


def _hash(v, where: str) -> int:
    """A one-hot value as CatBoost writes it (a signed 32-bit integer) -> its unsigned hash."""
    if isinstance(v, bool) or not isinstance(v, int) or not -(1 << 31) <= v < 1 << 32:
        raise UnsupportedModelError(f"{where}: {v!r} is not a 32-bit category hash")
    return v & 0xFFFFFFFF


def _tree(t: dict, i: int, flat_of: dict[int, int], nan_right: np.ndarray, G: int,
          scale: float, cats: dict[int, tuple[int, list[int]]],
          code: dict[int, dict[int, int]], built: dict[tuple[int, int], np.ndarray]) -> Tree:
    where = f"tree {i}"
    splits = t.get("splits", [])
    depth = len(splits)
    if depth > MAX_DEPTH:
        raise UnsupportedModelError(f"{where}: depth {depth} (at most {MAX_DEPTH})")
    feats, borders, entries = [], [], []
    for s in splits:
        kind = s.get("split_type", "FloatFeature")
        if kind == "OneHotFeature":
            c = int(s["cat_feature_index"])
            if c not in cats:
                raise UnsupportedModelError(f"{where}: a split on categorical feature {c}, "
                                            "which the model does not list")
            j = cats[c][0]
            h = _hash(s["value"], where)
            feats.append(j)
            borders.append(np.float32(0))
            entries.append((c, h))
            continue
        if kind != "FloatFeature":
            raise UnsupportedModelError(f"{where}: a {kind} split is not supported" + (
                f" ({_CTR} supported)" if "Ctr" in str(kind) else ""))
        f = int(s["float_feature_index"])
        if f not in flat_of:
            raise UnsupportedModelError(f"{where}: a split on float feature {f}, which the "
                                        "model does not list")
        j = flat_of[f]
        b = _float(s["border"], f"{where} border")
        if np.isnan(b):
            raise UnsupportedModelError(f"{where}: a NaN border")
        feats.append(j)
        borders.append(np.float32(b))
        entries.append(None)
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
    special: dict[int, np.ndarray] = {}
    level_entry = []
    for e in entries:  # a one-hot split: its category (the hash's code) goes right
        if e is None:
            level_entry.append(None)
            continue
        if e not in built:  # one entry per (feature, value), shared by every node asking
            right_of = np.zeros(len(cats[e[0]][1]), dtype=bool)
            right_of[code[e[0]][e[1]]] = True
            built[e] = categorical_entry(right_of, beyond_right=False, negative_right=False,
                                         truncate=False, whole_only=True, missing_right=False)
        level_entry.append(built[e])
    for k in range(inner):
        level = (k + 1).bit_length() - 1
        feature[k] = feats[level]
        threshold[k] = borders[level]
        left[k], right[k] = 2 * k + 1, 2 * k + 2
        if level_entry[level] is not None:  # unseen and missing values: the false side
            default_left[k] = True
            special[k] = level_entry[level]
        else:
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
                default_left=default_left, value=value, special=special)


def reference(source, X: np.ndarray) -> np.ndarray:
    """CatBoost's own scores: probabilities (n, classes) or values (n, 1)."""
    from catboost import CatBoost

    model = source
    if isinstance(source, (str, Path)):
        model = CatBoost()
        model.load_model(str(source), format="json" if str(source).endswith(".json")
                         else "cbm")
    if np.asarray(X).dtype != object:  # numeric features only
        X = np.asarray(X, dtype=np.float32)
    raw = np.asarray(model.predict(X, prediction_type="RawFormulaVal"), dtype=np.float64)
    return raw.reshape(X.shape[0], -1)
