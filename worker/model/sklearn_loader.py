"""Fitted scikit-learn tree ensembles -> Ensemble (float64 sums, as scikit-learn adds them)."""

from __future__ import annotations

import numpy as np

from .ir import Ensemble, Tree, UnsupportedModelError, float32_at_or_below


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


def _hgb_tree(nodes) -> Tree:
    if nodes["is_categorical"].any():
        raise UnsupportedModelError("HistGradientBoosting categorical splits are not supported")
    is_leaf = nodes["is_leaf"].astype(bool)
    feature = np.where(is_leaf, -1, nodes["feature_idx"]).astype(np.int32)
    threshold = np.where(is_leaf, np.float32(np.inf), float32_at_or_below(nodes["num_threshold"]))
    left = np.where(is_leaf, -1, nodes["left"].astype(np.int64)).astype(np.int32)
    right = np.where(is_leaf, -1, nodes["right"].astype(np.int64)).astype(np.int32)
    return Tree(
        feature,
        threshold.astype(np.float32),
        left,
        right,
        nodes["missing_go_to_left"].astype(bool),
        nodes["value"].astype(np.float64)[:, None],
        nodes["count"].astype(np.float64),
    )


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
    if getattr(est, "is_categorical_", None) is not None and np.any(est.is_categorical_):
        idx = int(np.flatnonzero(est.is_categorical_)[0])
        raise UnsupportedModelError(
            f"HistGradientBoosting categorical feature {_names(est, est.n_features_in_)[idx]!r} "
            "is not supported"
        )
    k = int(est.n_trees_per_iteration_)
    base = np.asarray(est._baseline_prediction, dtype=np.float64).reshape(-1)
    if base.shape[0] == 1 and k > 1:
        base = np.repeat(base, k)
    trees, group = [], []
    for it in est._predictors:
        for c, pred in enumerate(it):
            trees.append(_hgb_tree(pred.nodes))
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
        "for inputs representable in float32"])


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
