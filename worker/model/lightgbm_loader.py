"""LightGBM Booster / LGBMModel / model text file -> Ensemble (float64 sums, in LightGBM's order).

The model's text form is parsed here as data (numbers and names, every length checked):
nothing in a model file is executed, and no LightGBM code reads it before the compiled model
exists (``compile.verify`` then compares it with LightGBM's own ``predict``).

Exactness. LightGBM predicts in double precision: a row goes left iff ``x <= t`` with ``x``
and ``t`` doubles, and the trees' outputs are summed in double, round by round. For inputs
representable in float32 (the worker stages float32), ``x <= t`` iff ``not x > t32`` with
``t32`` the largest float32 not above ``t`` (``ir.float32_at_or_below``); leaf values stay
doubles and are summed in float64 in tree order, so ``raw`` equals
``Booster.predict(raw_score=True)`` bit for bit. LightGBM reads a dense row as sparse: every
value with |x| <= kZeroThreshold (1e-35f) becomes 0.0 before any tree sees it. A threshold
inside that band is therefore moved to its edge on the side 0 goes, so that the band's values
go where 0 goes. Missing values:

* ``missing_type=NaN``: NaN goes to the default side; zeros are compared.
* ``missing_type=None``: LightGBM replaces NaN by 0.0 and compares: NaN goes where 0 goes.
* ``missing_type=Zero`` (``zero_as_missing``): NaN and |x| <= 1e-35f go to the default side,
  other values are compared: a zero-band node (``ir.zero_band_entry``).
* categorical: ``int(x)`` (truncated: -0.5 is category 0) in the node's bitset goes left;
  anything else goes right: a negative value, a category past the bitset, and NaN (LightGBM
  casts NaN to int, which is negative on x86, before it tests for NaN).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .ir import (
    Ensemble,
    Tree,
    UnsupportedModelError,
    categorical_entry,
    float32_at_or_below,
    zero_band_entry,
)

K_ZERO = np.float32(1e-35)  # LightGBM's kZeroThreshold (a float literal)
_CATEGORICAL, _DEFAULT_LEFT = 1, 2  # decision_type bits; missing type in bits 2-3

# objective -> (task, link)
_OBJECTIVES = {
    "binary": ("binary", "sigmoid"),
    "multiclass": ("multiclass", "softmax"),
    "softmax": ("multiclass", "softmax"),
    "regression": ("regression", "identity"),
    "regression_l2": ("regression", "identity"),
    "l2": ("regression", "identity"),
    "mean_squared_error": ("regression", "identity"),
    "regression_l1": ("regression", "identity"),
    "l1": ("regression", "identity"),
    "huber": ("regression", "identity"),
    "fair": ("regression", "identity"),
    "quantile": ("regression", "identity"),
    "mape": ("regression", "identity"),
    "poisson": ("regression", "exp"),
    "gamma": ("regression", "exp"),
    "tweedie": ("regression", "exp"),
    "cross_entropy": ("regression", "sigmoid"),
    "xentropy": ("regression", "sigmoid"),
}


def is_lightgbm_source(source) -> bool:
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.suffix.lower() in (".lgb", ".lgbm"):
            return True
        if path.suffix.lower() == ".txt" and path.is_file():
            with open(path, "rb") as f:
                return f.read(5) == b"tree\n"
        return False
    kind = type(source)
    return kind.__module__.startswith("lightgbm") and (
        kind.__name__ == "Booster" or hasattr(source, "booster_"))


def model_text(source) -> str:
    if isinstance(source, (str, Path)):
        try:
            return Path(source).read_text(encoding="utf-8", errors="strict")
        except UnicodeDecodeError:
            from .xgboost_loader import _pickled

            raise UnsupportedModelError(f"{source} is not a LightGBM model file (not UTF-8 "
                                        f"text){_pickled(source)}") from None
    booster = getattr(source, "booster_", source)
    return booster.model_to_string()


def _numbers(fields: dict, key: str, n: int, kind, where: str) -> np.ndarray:
    text = fields.get(key)
    if text is None:
        raise UnsupportedModelError(f"{where}: no {key}")
    try:
        values = np.asarray([kind(v) for v in text.split()] if text else [], dtype=kind)
    except (ValueError, OverflowError):
        raise UnsupportedModelError(f"{where}: {key} is not a list of numbers") from None
    if n >= 0 and values.shape[0] != n:
        raise UnsupportedModelError(f"{where}: {key} has {values.shape[0]} values, "
                                    f"expected {n}")
    return values


def _tree(fields: dict, index: int, n_features: int) -> Tree:
    where = f"LightGBM tree {index}"
    if fields.get("is_linear", "0") != "0":
        raise UnsupportedModelError(f"{where} is a linear tree (linear_tree=true): its leaves "
                                    "are linear models, which the compiler does not reproduce")
    try:
        n_leaves = int(fields.get("num_leaves", ""))
        n_cat = int(fields.get("num_cat", "0"))
    except ValueError:
        raise UnsupportedModelError(f"{where}: num_leaves is not a number") from None
    if not 1 <= n_leaves <= 1 << 24 or not 0 <= n_cat < n_leaves:
        raise UnsupportedModelError(f"{where}: {n_leaves} leaves, {n_cat} categorical splits")
    leaf_value = _numbers(fields, "leaf_value", n_leaves, float, where)
    leaf_count = _numbers(fields, "leaf_count", -1, float, where) \
        if "leaf_count" in fields else None
    ni = n_leaves - 1
    n = ni + n_leaves
    value = np.zeros((n, 1), dtype=np.float64)
    value[ni:, 0] = leaf_value
    if not np.all(np.isfinite(leaf_value)):
        raise UnsupportedModelError(f"{where}: a leaf value that is not finite")
    if ni == 0:
        return Tree(np.full(1, -1, np.int32), np.full(1, np.inf, np.float32),
                    np.full(1, -1, np.int32), np.full(1, -1, np.int32), np.ones(1, bool),
                    value, np.ones(1))
    feature = np.full(n, -1, dtype=np.int32)
    feature[:ni] = _numbers(fields, "split_feature", ni, int, where)
    threshold_d = _numbers(fields, "threshold", ni, float, where)
    dtype = _numbers(fields, "decision_type", ni, int, where)
    left = np.full(n, -1, dtype=np.int32)
    right = np.full(n, -1, dtype=np.int32)
    for side, key in ((left, "left_child"), (right, "right_child")):
        c = _numbers(fields, key, ni, int, where)
        if np.any(c >= ni) or np.any(c < -n_leaves):
            raise UnsupportedModelError(f"{where}: a child outside the tree")
        side[:ni] = np.where(c >= 0, c, ni + ~c)  # leaves (~leaf) after the splits
    if np.any(feature[:ni] < 0) or np.any(feature[:ni] >= n_features):
        raise UnsupportedModelError(f"{where}: a split on a feature outside [0, {n_features})")
    categorical = (dtype & _CATEGORICAL) != 0
    default_left = np.ones(n, dtype=bool)
    default_left[:ni] = (dtype & _DEFAULT_LEFT) != 0
    missing = (dtype >> 2) & 3
    threshold = np.full(n, np.inf, dtype=np.float32)
    num = ~categorical
    if np.any(np.isnan(threshold_d[num])):  # +inf: a split of NaN from the rest
        raise UnsupportedModelError(f"{where}: a threshold that is not a number")
    threshold[:ni][num] = float32_at_or_below(threshold_d[num])
    # values in the zero band are read as 0.0: they go where 0 goes
    t = threshold[:ni]
    inside = num & (t >= -K_ZERO) & (t < K_ZERO)
    t[inside] = np.where(threshold_d[inside] >= 0.0, K_ZERO,
                         np.nextafter(-K_ZERO, np.float32(-np.inf)))
    # missing_type None: NaN is replaced by 0.0 and compared
    none = num & (missing == 0)
    default_left[:ni][none] = threshold_d[none] >= 0.0
    special = {}
    for node in np.flatnonzero(num & (missing == 1)):
        special[int(node)] = zero_band_entry(threshold[node], K_ZERO)
    if np.any(num & (missing == 3)):
        raise UnsupportedModelError(f"{where}: an unknown missing type")
    if categorical.any():
        bounds = _numbers(fields, "cat_boundaries", n_cat + 1, int, where)
        words = _numbers(fields, "cat_threshold", -1, int, where)
        if bounds[0] != 0 or np.any(np.diff(bounds) < 0) or bounds[-1] != words.shape[0] \
                or np.any(words < 0) or np.any(words >= 1 << 32):
            raise UnsupportedModelError(f"{where}: malformed categorical bitsets")
        for node in np.flatnonzero(categorical):
            t = threshold_d[node]
            if not (t.is_integer() and 0 <= t < n_cat):
                raise UnsupportedModelError(f"{where}: a categorical split without a bitset")
            k = int(t)
            left_words = words[bounds[k]:bounds[k + 1]].astype("<u4")
            in_left = np.unpackbits(left_words.view(np.uint8), bitorder="little").astype(bool)
            special[int(node)] = categorical_entry(~in_left, beyond_right=True,
                                                   negative_right=True, truncate=True)
            default_left[node] = False  # NaN goes right (see the module docstring)
    cover = None
    internal_count = fields.get("internal_count")
    if leaf_count is not None and leaf_count.shape[0] == n_leaves and internal_count:
        cover = np.zeros(n, dtype=np.float64)
        cover[:ni] = _numbers(fields, "internal_count", ni, float, where)
        cover[ni:] = leaf_count
    return Tree(feature, threshold, left, right, default_left, value, cover, special)


def _sections(text: str) -> tuple[dict, list[dict], str]:
    """(header fields, per-tree fields, the text after the trees)."""
    head, _, rest = text.partition("\nTree=")
    if not head.startswith("tree\n") or not rest:
        raise UnsupportedModelError("not a LightGBM model (text format, with trees)")
    body, _, tail = ("Tree=" + rest).partition("end of trees")

    def fields(block: str) -> dict:
        out = {}
        for line in block.splitlines():
            key, eq, val = line.partition("=")
            out[key.strip()] = val.strip() if eq else ""
        return out

    trees = [fields(b) for b in body.split("\nTree=") if b.strip()]
    return fields(head), trees, tail


def _pandas_categorical(tail: str) -> list | None:
    for line in tail.splitlines():
        if line.startswith("pandas_categorical:"):
            try:
                return json.loads(line[len("pandas_categorical:"):])
            except ValueError:
                raise UnsupportedModelError("pandas_categorical is not JSON") from None
    return None


def to_ir(source) -> Ensemble:
    text = model_text(source)
    head, tree_fields, tail = _sections(text)
    objective = head.get("objective", "")
    words = objective.split()
    name = words[0] if words else ""
    options = dict(w.split(":", 1) for w in words[1:] if ":" in w)
    if name not in _OBJECTIVES:
        raise UnsupportedModelError(
            f"LightGBM objective {objective or '(none: a custom objective)'!r} is not supported "
            f"(supported: {', '.join(sorted(_OBJECTIVES))})")
    if "sqrt" in words[1:]:
        raise UnsupportedModelError("LightGBM regression with reg_sqrt=true is not supported")
    task, link = _OBJECTIVES[name]
    if name == "binary":
        try:
            sig = float(options.get("sigmoid", "1"))
        except ValueError:
            raise UnsupportedModelError(f"LightGBM objective {objective!r}: sigmoid is not a "
                                        "number") from None
        if sig not in (1.0, 2.0):
            raise UnsupportedModelError(f"LightGBM binary sigmoid:{sig:g} is not supported "
                                        "(sigmoid 1 or 2)")
        link = "sigmoid" if sig == 1.0 else "sigmoid2"
    try:
        k = int(head.get("num_tree_per_iteration", "1"))
        n_class = int(head.get("num_class", "1"))
        n_features = int(head.get("max_feature_idx", "")) + 1
    except ValueError:
        raise UnsupportedModelError("LightGBM header is not numeric") from None
    if not 1 <= k <= 1 << 16 or not 1 <= n_features < 1 << 29 or \
            (task == "multiclass") != (n_class > 1) or k != max(n_class, 1):
        raise UnsupportedModelError(f"LightGBM model with {k} trees per iteration and "
                                    f"{n_class} classes is not supported")
    names = head.get("feature_names", "").split()
    if len(names) != n_features or len(set(names)) != n_features:
        raise UnsupportedModelError(f"{len(set(names))} distinct feature names for "
                                    f"{n_features} features")
    trees = [_tree(f, i, n_features) for i, f in enumerate(tree_fields)]
    if not trees or len(trees) % k:
        raise UnsupportedModelError(f"{len(trees)} trees for {k} trees per iteration")
    average = "average_output" in head
    infos = head.get("feature_infos", "").split()
    cat_features = [j for j, info in enumerate(infos) if not info.startswith("[")
                    and info != "none"]
    categories = {}
    pandas = _pandas_categorical(tail)
    if pandas:
        if not isinstance(pandas, list) or not all(isinstance(c, list) for c in pandas):
            raise UnsupportedModelError("pandas_categorical is not a list of category lists")
        if len(pandas) != len(cat_features):
            raise UnsupportedModelError(f"pandas_categorical lists {len(pandas)} features, the "
                                        f"model has {len(cat_features)} categorical ones")
        categories = {names[j]: [str(c) for c in cats]
                      for j, cats in zip(cat_features, pandas, strict=True)}
    source_name = "lightgbm"
    try:
        import lightgbm

        source_name = f"lightgbm {lightgbm.__version__}"
    except ImportError:
        pass
    classes = list(getattr(source, "classes_", [])) or (
        list(range(n_class)) if task == "multiclass" else [0, 1] if task == "binary" else [])
    n_rounds = len(trees) // k
    return Ensemble(
        trees=trees,
        tree_group=np.tile(np.arange(k, dtype=np.int32), n_rounds),
        unit_ptr=np.arange(0, len(trees) + 1, k, dtype=np.int64),
        n_outputs=k,
        base=np.zeros(k),
        divisor=float(n_rounds) if average else 1.0,
        link=link,
        task=task,
        n_features=n_features,
        feature_names=names,
        classes=[c.item() if isinstance(c, np.generic) else c for c in classes],
        categories=categories,
        accumulate="float64",
        objective=objective,
        source=source_name,
        kind=type(source).__name__ if not isinstance(source, (str, Path)) else "Booster",
        notes=["LightGBM compares float64 features: staging in float32 is exact for inputs "
               "representable in float32"] + (
            [f"random-forest mode: the sum is divided by the {n_rounds} rounds"]
            if average else []),
    )


def reference(source, X: np.ndarray) -> np.ndarray:
    """LightGBM's own raw score (n, n_outputs), as the compiled model's ``raw`` gives it."""
    import lightgbm

    if isinstance(source, (str, Path)):
        booster = lightgbm.Booster(model_file=str(source))
    else:
        booster = getattr(source, "booster_", source)
    out = np.asarray(booster.predict(np.asarray(X, dtype=np.float64), raw_score=True),
                     dtype=np.float64)
    return out.reshape(X.shape[0], -1)
