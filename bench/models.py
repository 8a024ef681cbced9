"""The four benchmark models (fixed seeds), trained once and cached under bench/out/cache."""

from __future__ import annotations

import hashlib
import pickle
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

N_FEATURES = 64
N_TRAIN = 20_000
CACHE = Path(__file__).resolve().parent / "out" / "cache"


@dataclass
class BenchModel:
    key: str  # A, B, C, D
    title: str
    library: str  # "xgboost" or "sklearn"
    source: object  # xgboost.Booster or fitted sklearn estimator
    fingerprint: str  # sha256 of the serialised source (names cached TL2cgen builds)
    train_seconds: float


def data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """64 float32 features (a few discrete, 2% missing), a noisy nonlinear binary label."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, N_FEATURES)).astype(np.float32)
    X[:, 60:] = rng.integers(0, 5, size=(n, 4))
    z = X[:, 0] + X[:, 1] * X[:, 2] - 0.7 * np.abs(X[:, 3]) + 0.3 * X[:, 60] \
        + np.sin(2 * X[:, 4]) + 0.2 * X[:, 5:20].sum(axis=1) + rng.normal(scale=0.8, size=n)
    y = (z > 0.5).astype(np.int32)
    return X, y


def with_missing(X: np.ndarray, seed: int, frac: float = 0.02) -> np.ndarray:
    X = X.copy()
    X[np.random.default_rng(seed).random(X.shape) < frac] = np.nan
    return X


def _train(key: str):
    X, y = data(N_TRAIN, seed=1)
    if key in ("A", "B"):
        import xgboost as xgb

        rounds, depth = (200, 5) if key == "A" else (500, 8)
        dm = xgb.DMatrix(with_missing(X, seed=2), label=y)
        params = {"objective": "binary:logistic", "max_depth": depth, "eta": 0.1, "seed": 0,
                  "tree_method": "hist", "nthread": 2}
        return xgb.train(params, dm, num_boost_round=rounds)
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier

    if key == "C":
        return RandomForestClassifier(n_estimators=100, random_state=0, n_jobs=2).fit(
            with_missing(X, seed=2), y)
    return GradientBoostingClassifier(n_estimators=100, max_depth=3, random_state=0).fit(X, y)


TITLES = {
    "A": "XGBoost 200 trees depth 5",
    "B": "XGBoost 500 trees depth 8",
    "C": "sklearn RandomForest 100 deep trees",
    "D": "sklearn GradientBoosting 100 x depth 3",
}


def load(key: str) -> BenchModel:
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"model_{key}.pkl"
    t = 0.0
    if path.exists():
        blob = path.read_bytes()
        model = pickle.loads(blob)  # our own cache file, written below
    else:
        t0 = time.perf_counter()
        model = _train(key)
        t = time.perf_counter() - t0
        blob = pickle.dumps(model)
        path.write_bytes(blob)
    library = "xgboost" if key in ("A", "B") else "sklearn"
    if library == "xgboost":
        model.set_param({"nthread": 1})
    return BenchModel(key, TITLES[key], library, model, hashlib.sha256(blob).hexdigest()[:16], t)
