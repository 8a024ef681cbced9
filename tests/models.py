"""Small real models of every supported kind, trained once per test session (fixed seeds)."""

from __future__ import annotations

import functools

import numpy as np

N_FEATURES = 7


def training_data(seed: int = 0, n: int = 1200, nan: bool = True):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, N_FEATURES))
    X[:, 5] = rng.integers(0, 4, size=n)  # a discrete feature: many rows sit on thresholds
    X[:, 6] = rng.random(n) < 0.3  # a boolean feature
    if nan:
        X[rng.random(X.shape) < 0.05] = np.nan
    c = np.nan_to_num(X)
    y2 = (c[:, 0] + c[:, 1] * c[:, 2] + 0.5 * c[:, 5] + rng.normal(scale=0.5, size=n) > 1)
    y3 = y2.astype(int) + (c[:, 3] > 0.4)
    yr = 2 * c[:, 0] - c[:, 4] * c[:, 1] + c[:, 5]
    return X, y2.astype(int), y3.astype(int), yr


@functools.cache
def xgboost_models():
    import xgboost as xgb

    X, y2, y3, yr = training_data()
    X32 = X.astype(np.float32)
    out = {}
    specs = {
        "xgb-binary-logistic": ({"objective": "binary:logistic", "max_depth": 4}, y2),
        "xgb-binary-logitraw": ({"objective": "binary:logitraw", "max_depth": 3}, y2),
        "xgb-reg-squarederror": ({"objective": "reg:squarederror", "max_depth": 5}, yr),
        "xgb-reg-logistic": ({"objective": "reg:logistic", "max_depth": 4},
                             0.1 + 0.8 * y2),
        "xgb-multi-softprob": ({"objective": "multi:softprob", "num_class": 3,
                                "max_depth": 4}, y3),
        "xgb-multi-softmax": ({"objective": "multi:softmax", "num_class": 3, "max_depth": 3}, y3),
        "xgb-parallel-tree": ({"objective": "binary:logistic", "max_depth": 4,
                               "num_parallel_tree": 3, "subsample": 0.7,
                               "colsample_bynode": 0.7}, y2),
        "xgb-deep": ({"objective": "binary:logistic", "max_depth": 12, "min_child_weight": 0},
                     y2),
    }
    names = [f"feat_{i}" for i in range(N_FEATURES)]
    for name, (params, y) in specs.items():
        dm = xgb.DMatrix(X32, label=y, feature_names=names)
        out[name] = xgb.train({**params, "seed": 0}, dm, num_boost_round=25)
    return out


@functools.cache
def sklearn_models():
    from sklearn import ensemble as E

    X, y2, y3, yr = training_data()
    Xf = np.nan_to_num(X)  # GradientBoosting rejects NaN in training
    kw = {"random_state": 0}
    specs = {
        "rf-binary": (E.RandomForestClassifier(n_estimators=15, max_depth=12, **kw), X, y2),
        "rf-multi": (E.RandomForestClassifier(n_estimators=15, **kw), X, y3),
        "et-multi": (E.ExtraTreesClassifier(n_estimators=15, **kw), X, y3),
        "rf-reg": (E.RandomForestRegressor(n_estimators=10, **kw), X, yr),
        "et-reg": (E.ExtraTreesRegressor(n_estimators=10, max_depth=9, **kw), X, yr),
        "gb-binary": (E.GradientBoostingClassifier(n_estimators=20, **kw), Xf, y2),
        "gb-multi": (E.GradientBoostingClassifier(n_estimators=15, **kw), Xf, y3),
        "gb-exponential": (E.GradientBoostingClassifier(n_estimators=15, loss="exponential",
                                                        **kw), Xf, y2),
        "gb-reg": (E.GradientBoostingRegressor(n_estimators=20, max_depth=4, **kw), Xf, yr),
        "hgb-binary": (E.HistGradientBoostingClassifier(max_iter=20, **kw), X, y2),
        "hgb-multi": (E.HistGradientBoostingClassifier(max_iter=15, **kw), X, y3),
        "hgb-reg": (E.HistGradientBoostingRegressor(max_iter=20, **kw), X, yr),
    }
    return {name: est.fit(XX, y) for name, (est, XX, y) in specs.items()}


def xgboost_thresholds(booster) -> np.ndarray:
    import json

    trees = json.loads(booster.save_raw("json"))["learner"]["gradient_booster"]["model"]["trees"]
    vals = [np.asarray(t["split_conditions"], dtype=np.float32)[np.asarray(t["left_children"]) >= 0]
            for t in trees]
    return np.unique(np.concatenate(vals))


def sklearn_thresholds(est) -> np.ndarray:
    if hasattr(est, "_predictors"):
        t = np.concatenate([p.nodes["num_threshold"][~p.nodes["is_leaf"].astype(bool)]
                            for it in est._predictors for p in it])
    else:
        subs = np.asarray(est.estimators_).ravel()
        t = np.concatenate([s.tree_.threshold[s.tree_.children_left >= 0] for s in subs])
    t32 = t.astype(np.float32)
    return np.unique(np.concatenate([t32, np.nextafter(t32, np.float32(np.inf)),
                                     np.nextafter(t32, np.float32(-np.inf))]))


def hostile_rows(n: int, thresholds: np.ndarray, seed: int, nan=True, inf=True) -> np.ndarray:
    """Random rows mixed with NaN, +-inf, zeros and values exactly on split thresholds."""
    rng = np.random.default_rng(seed)
    X = rng.normal(scale=1.5, size=(n, N_FEATURES)).astype(np.float32)
    pick = rng.random(X.shape)
    X[pick < 0.25] = rng.choice(thresholds, size=int((pick < 0.25).sum()))
    X[(pick >= 0.25) & (pick < 0.3)] = 0.0
    if nan:
        X[(pick >= 0.3) & (pick < 0.4)] = np.nan
    if inf:
        X[(pick >= 0.4) & (pick < 0.43)] = np.inf
        X[(pick >= 0.43) & (pick < 0.46)] = -np.inf
    return X


def finite_for_library(X: np.ndarray) -> np.ndarray:
    """The libraries reject +-inf; +-FLT_MAX compares the same against every finite threshold."""
    big = np.finfo(np.float32).max
    return np.where(np.isposinf(X), big, np.where(np.isneginf(X), -big, X)).astype(np.float32)


def padded_stumps(T: int, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Forest arrays of T padded stumps (depth 1, 5 features, float64 leaves, random
    thresholds and missing-value sides) for kernels.Forest, and the stumps' thresholds:
    kernel table bounds are reached by tree count (tests of the oblivious and leaf-mask
    kernels)."""
    rng = np.random.default_rng(seed)
    thr = rng.normal(size=T).astype(np.float32)
    return {"pnodes": np.stack([rng.integers(0, 10, T).astype(np.uint32),
                                thr.view(np.uint32)], 1),
            "leaves": rng.normal(size=(2 * T, 1)),
            "tree_group": np.zeros(T, dtype=np.int32),
            "base": np.zeros(1)}, thr


def first_stumps(arrays: dict[str, np.ndarray], k: int) -> dict[str, np.ndarray]:
    """The first k stumps of padded_stumps' arrays."""
    return {n: (v[:2 * k] if n == "leaves" else v[:k]) if n != "base" else v
            for n, v in arrays.items()}
