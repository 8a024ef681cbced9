"""Fitted scikit-learn tree ensembles -> Ensemble (float64 sums, as scikit-learn adds them)."""

from __future__ import annotations

import numpy as np

from .ir import (
    MAX_CATEGORY_BITS,
    Ensemble,
    Tree,
    UnsupportedModelError,
    categorical_entry,
    float32_at_or_below,
)


def _sk_tree(tree_, value: np.ndarray) -> Tree:
    feature = tree_.feature.astype(np.int32)
    is_leaf = tree_.children_left < 0
    feature[is_leaf] = -1
    threshold = np.where(is_leaf, np.float32(np.inf), float32_at_or_below(tree_.threshold))
    missing_left = getattr(tree_, "missing_go_to_left", None)
    default_left = (
        np.ones(len(feature), dtype=bool)
        if missing_left is None
        else np.asarray(missing_left, dtype=bool)
    )
    return Tree(
        feature,
        threshold.astype(np.float32),
        tree_.children_left.astype(np.int32),
        tree_.children_right.astype(np.int32),
        default_left,
        value,
        np.asarray(tree_.weighted_n_node_samples, dtype=np.float64),
    )


def _hgb_tree(pred, cats: _HgbCategories | None) -> Tree:
    nodes = pred.nodes
    is_leaf = nodes["is_leaf"].astype(bool)
    feature = np.where(is_leaf, -1, nodes["feature_idx"]).astype(np.int64)
    if cats is not None:  # predictor features are the preprocessor's (categorical first)
        feature = np.where(is_leaf, -1, cats.original[np.maximum(feature, 0)])
    threshold = np.where(is_leaf, np.float32(np.inf), float32_at_or_below(nodes["num_threshold"]))
    left = np.where(is_leaf, -1, nodes["left"].astype(np.int64)).astype(np.int32)
    right = np.where(is_leaf, -1, nodes["right"].astype(np.int64)).astype(np.int32)
    missing_left = nodes["missing_go_to_left"].astype(bool)
    special = {}
    for node in np.flatnonzero(nodes["is_categorical"].astype(bool) & ~is_leaf):
        left_codes = np.unpackbits(pred.raw_left_cat_bitsets[nodes["bitset_idx"][node]]
                                   .astype("<u4").view(np.uint8), bitorder="little")
        special[int(node)] = cats.entry(int(nodes["feature_idx"][node]),
                                        left_codes.astype(bool), bool(missing_left[node]))
    return Tree(
        feature.astype(np.int32),
        threshold.astype(np.float32),
        left,
        right,
        missing_left,
        nodes["value"].astype(np.float64)[:, None],
        nodes["count"].astype(np.float64),
        special,
    )


class _HgbCategories:
    """HistGradientBoosting's categorical features (scikit-learn >= 1.4: an OrdinalEncoder
    in front of the trees). A value is a category when the encoder knows it; a known
    category goes left when its code is in the node's set and right otherwise; NaN, a value
    the encoder does not know and a category the training data did not hold go where missing
    values go. Numeric categories: the entry is over the values themselves (whole numbers in
    [0, 2^20)); string categories: over their codes, and the model keeps the list."""

    def __init__(self, est):
        pre = est._preprocessor
        cat = np.flatnonzero(est.is_categorical_)
        self.original = np.concatenate([cat, np.flatnonzero(~est.is_categorical_)])
        self.raw = pre.named_transformers_["encoder"].categories_  # per categorical feature
        self.known, self.f_idx = est._bin_mapper.make_known_categories_bitsets()
        self.names = _names(est, int(est.n_features_in_))
        self.strings: dict[str, list[str]] = {}
        for k, j in enumerate(cat):
            values = self.raw[k]
            if values.dtype.kind in "OUS":
                kept = [v for v in values if isinstance(v, str)]
                if len(kept) != len([v for v in values if v is not None and v == v]):
                    raise UnsupportedModelError(f"categorical feature {self.names[j]!r} mixes "
                                                "strings and other categories")
                self.strings[self.names[j]] = kept

    def entry(self, feature: int, left_codes: np.ndarray, missing_left: bool) -> np.ndarray:
        j = int(self.original[feature])
        values = self.raw[feature]  # categorical features come first: feature == their index
        known = np.unpackbits(self.known[self.f_idx[feature]].astype("<u4").view(np.uint8),
                              bitorder="little").astype(bool)
        if values.dtype.kind in "OUS":  # strings: decided by code
            codes = np.arange(len(self.strings[self.names[j]]))
        else:
            real = values[~np.isnan(values.astype(np.float64))].astype(np.float64)
            if real.size and (np.any(real < 0) or np.any(real != np.floor(real))
                              or real.max() >= MAX_CATEGORY_BITS):
                raise UnsupportedModelError(
                    f"categorical feature {self.names[j]!r} has categories that are not whole "
                    f"numbers in [0, {MAX_CATEGORY_BITS})")
            codes = real.astype(np.int64)
        n = int(codes.max()) + 1 if codes.size else 0
        right = np.full(n, not missing_left)  # not a category: where missing values go
        c = np.arange(codes.size)
        c_known = known[c] if c.size <= known.size else np.zeros(c.size, bool)
        right[codes] = np.where(c_known, ~left_codes[c], not missing_left)
        return categorical_entry(right, beyond_right=not missing_left,
                                 negative_right=not missing_left, truncate=False,
                                 whole_only=True, missing_right=not missing_left)


def _names(est, n_features: int) -> list[str]:
    names = getattr(est, "feature_names_in_", None)
    return [str(n) for n in names] if names is not None else [f"f{i}" for i in range(n_features)]


def _forest(est, classifier: bool) -> Ensemble:
    trees = []
    for i, sub in enumerate(est.estimators_):
        t = sub.tree_
        if t.n_outputs != 1:
            raise UnsupportedModelError("multi-output forests are not supported")
        v = t.value[:, 0, :].astype(np.float64)
        if classifier:
            # scikit-learn's tree predict_proba: leaf class weights normalised to sum 1
            s = v.sum(axis=1, keepdims=True)
            s[s == 0] = 1.0
            v = v / s
            if v.shape[1] == 2:
                v = v[:, 1:]  # binary: carry P(class 1); P(class 0) = 1 - P(class 1)
        trees.append(_sk_tree(t, v))
        if trees[-1].feature.max(initial=-1) >= est.n_features_in_:
            raise UnsupportedModelError(f"tree {i} splits on a feature beyond n_features_in_")
    n = len(trees)
    if classifier:
        k = len(est.classes_)
        task = "binary" if k == 2 else "multiclass"
        n_outputs = 1 if k == 2 else k
        group = -1 if k > 2 else 0
        link = "vote"
    else:
        task, n_outputs, group, link = "regression", 1, 0, "identity"
    return Ensemble(
        trees=trees,
        tree_group=np.full(n, group, dtype=np.int32),
        unit_ptr=np.arange(n + 1, dtype=np.int64),
        n_outputs=n_outputs,
        base=np.zeros(n_outputs),
        divisor=float(n),
        link=link,
        task=task,
        n_features=int(est.n_features_in_),
        feature_names=_names(est, int(est.n_features_in_)),
        classes=list(est.classes_) if classifier else [],
        kind=type(est).__name__,
    )


def _gradient_boosting(est, classifier: bool) -> Ensemble:
    init = est.init_
    if not (init == "zero" or type(init).__name__ in ("DummyClassifier", "DummyRegressor")):
        raise UnsupportedModelError(
            f"GradientBoosting init={type(init).__name__} is not supported (constant inits only)"
        )
    n_stages = int(est.n_estimators_)
    stages = est.estimators_[:n_stages]
    k = stages.shape[1]
    base = est._raw_predict_init(np.zeros((1, est.n_features_in_)))[0].astype(np.float64)
    lr = float(est.learning_rate)
    trees, group = [], []
    for s in range(n_stages):
        for c in range(k):
            t = stages[s, c].tree_
            # scikit-learn adds learning_rate * value in float64: the same product, folded here
            trees.append(_sk_tree(t, lr * t.value[:, 0, :1].astype(np.float64)))
            group.append(c)
    if classifier:
        loss = getattr(est, "loss", "log_loss")
        n_classes = len(est.classes_)
        task = "binary" if n_classes == 2 else "multiclass"
        link = "sigmoid2" if loss == "exponential" else ("sigmoid" if n_classes == 2 else "softmax")
        classes = list(est.classes_)
    else:
        task, link, classes = "regression", "identity", []
    return _boosted(est, trees, group, k, base, link, task, classes,
                    objective=str(getattr(est, "loss", "")))


def _hist_gradient_boosting(est, classifier: bool) -> Ensemble:
    categorical = getattr(est, "is_categorical_", None)
    cats = None
    if categorical is not None and np.any(categorical):
        if getattr(est, "_preprocessor", None) is None:
            raise UnsupportedModelError("HistGradientBoosting with categorical features needs "
                                        "scikit-learn >= 1.4 (its categories preprocessor)")
        cats = _HgbCategories(est)
    k = int(est.n_trees_per_iteration_)
    base = np.asarray(est._baseline_prediction, dtype=np.float64).reshape(-1)
    if base.shape[0] == 1 and k > 1:
        base = np.repeat(base, k)
    trees, group = [], []
    for it in est._predictors:
        for c, pred in enumerate(it):
            trees.append(_hgb_tree(pred, cats))
            group.append(c)
    if classifier:
        n_classes = len(est.classes_)
        task = "binary" if n_classes == 2 else "multiclass"
        link = "sigmoid" if n_classes == 2 else "softmax"
        classes = list(est.classes_)
    else:
        loss = est.loss if isinstance(est.loss, str) else type(est.loss).__name__
        if loss not in ("squared_error", "absolute_error", "quantile"):
            raise UnsupportedModelError(
                f"HistGradientBoostingRegressor loss {loss!r} is not "
                "supported (identity-link losses only)"
            )
        task, link, classes = "regression", "identity", []
    return _boosted(est, trees, group, k, base, link, task, classes, notes=[
        "HistGradientBoosting compares float64 features: staging in float32 is exact "
        "for inputs representable in float32"], categories=cats.strings if cats else {})


def _boosted(est, trees, group, k, base, link, task, classes, **extra) -> Ensemble:
    """A boosted ensemble of k trees per round, summed in order from ``base``."""
    return Ensemble(
        trees=trees,
        tree_group=np.asarray(group, dtype=np.int32),
        unit_ptr=np.arange(0, len(trees) + 1, k, dtype=np.int64),
        n_outputs=k,
        base=base,
        divisor=1.0,
        link=link,
        task=task,
        n_features=int(est.n_features_in_),
        feature_names=_names(est, int(est.n_features_in_)),
        classes=classes,
        kind=type(est).__name__,
        **extra,
    )


def to_ir(est) -> Ensemble:
    import sklearn
    from sklearn import ensemble as E

    kinds = [
        ((E.RandomForestClassifier, E.ExtraTreesClassifier), _forest, True),
        ((E.RandomForestRegressor, E.ExtraTreesRegressor), _forest, False),
        ((E.GradientBoostingClassifier,), _gradient_boosting, True),
        ((E.GradientBoostingRegressor,), _gradient_boosting, False),
        ((E.HistGradientBoostingClassifier,), _hist_gradient_boosting, True),
        ((E.HistGradientBoostingRegressor,), _hist_gradient_boosting, False),
    ]
    for types, build, classifier in kinds:
        if type(est) in types:
            if not hasattr(est, "n_features_in_"):
                raise UnsupportedModelError(f"{type(est).__name__} is not fitted")
            ens = build(est, classifier)
            ens.source = f"scikit-learn {sklearn.__version__}"
            return ens
    raise UnsupportedModelError(
        f"{type(est).__name__} is not a supported scikit-learn estimator (supported: "
        "RandomForest/ExtraTrees/GradientBoosting/HistGradientBoosting classifiers and regressors)"
    )


def reference(est, X: np.ndarray) -> np.ndarray:
    """The library's own output in the compiled model's output space (proba or value)."""
    if hasattr(est, "predict_proba"):
        return est.predict_proba(X)
    return est.predict(X).reshape(-1, 1)
