"""The whole model pipeline in one function: load -> IR -> pack -> verify -> CompiledModel."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import artifact, pack, sklearn_loader, xgboost_loader
from .compiled import CompiledModel
from .ir import Ensemble, UnsupportedModelError


def _read_estimator(path: Path):
    """Trusted offline input only: joblib/pickle execute code on load; skops does not."""
    if path.suffix == ".skops":
        import skops.io as sio

        return sio.load(path, trusted=sio.get_untrusted_types(file=path))
    import joblib

    return joblib.load(path)


def to_ir(source) -> Ensemble:
    if xgboost_loader.is_xgboost_source(source):
        return xgboost_loader.to_ir(source)
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"model source {path} does not exist")
        return to_ir(_read_estimator(path))
    return sklearn_loader.to_ir(source)


def meta_of(ens: Ensemble, info: dict) -> dict:
    return {
        "task": ens.task, "link": ens.link, "n_outputs": ens.n_outputs,
        "n_features": ens.n_features, "feature_names": ens.feature_names,
        "classes": [c.item() if isinstance(c, np.generic) else c for c in ens.classes],
        "divisor": ens.divisor, "objective": ens.objective, "source": ens.source,
        "kind": ens.kind, "notes": ens.notes, "format": artifact.FORMAT_VERSION, **info,
    }


def verify(model: CompiledModel, source, rng_seed: int = 0, n: int = 512) -> float:
    """Compare with the library on probe rows; raise if the compiled model is not exact."""
    rng = np.random.default_rng(rng_seed)
    X = rng.normal(scale=3.0, size=(n, model.n_features)).astype(np.float32)
    X[rng.random(X.shape) < 0.1] = np.nan
    if model.source.startswith("xgboost"):
        ref = xgboost_loader.reference_margin(source, X)
        ours = model.raw(X, n_threads=1)
    else:
        est = source if not isinstance(source, (str, Path)) else _read_estimator(Path(source))
        try:
            ref = sklearn_loader.reference(est, X)
        except ValueError:  # estimators that reject NaN at prediction
            X = np.nan_to_num(X)
            ref = sklearn_loader.reference(est, X)
        ours = (model.predict_proba(X, n_threads=1) if model.task != "regression"
                else model.predict(X, n_threads=1).reshape(-1, 1))
    err = float(np.max(np.abs(ref - ours))) if ref.size else 0.0
    if not err <= 1e-5:
        raise UnsupportedModelError(f"compiled {model.kind} ({model.objective or model.task}) "
                                    f"differs from {model.source} by {err:.3g} on probe rows")
    return err


def compile_model(source, layout: str = "auto", check: bool = True) -> CompiledModel:
    """XGBoost Booster/XGBModel/.json/.ubj, a fitted scikit-learn estimator, or a file of one."""
    ens = to_ir(source)
    info, arrays = pack.pack(ens, layout)
    model = CompiledModel(meta_of(ens, info), arrays)
    if check and verify(model, source) != 0.0 and ens.accumulate == "float32":
        model = _calibrate_base(model, source)
    return model


def _calibrate_base(model: CompiledModel, source) -> CompiledModel:
    """XGBoost derives its float32 base margin with libm; where ours lands one ulp away,
    take the neighbour that reproduces XGBoost's margins to the bit on the probe rows."""
    base = model.arrays["base"]
    for direction in (-np.inf, np.inf):
        arrays = dict(model.arrays)
        arrays["base"] = np.nextafter(base, np.float32(direction)).astype(np.float32)
        candidate = CompiledModel(model.meta, arrays)
        if verify(candidate, source) == 0.0:
            return candidate
    return model


def load_model(path) -> CompiledModel:
    """A compiled model from its artifact: checksum, then structure, then the kernels' view.
    Every failure is an ArtifactError that names what is wrong."""
    meta, arrays, model_id = artifact.load(path)
    try:
        return CompiledModel(meta, arrays, model_id)  # checks the structure first
    except artifact.ArtifactError as exc:
        raise artifact.ArtifactError(f"{path}: {exc}") from None
    except (KeyError, ValueError, TypeError, OverflowError) as exc:
        raise artifact.ArtifactError(f"{path}: invalid compiled model: {exc}") from exc
