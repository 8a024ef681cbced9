"""The whole model pipeline in one function: load -> IR -> pack -> verify -> CompiledModel."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import (
    artifact,
    catboost_loader,
    lightgbm_loader,
    onnx_loader,
    pack,
    sklearn_loader,
    xgboost_loader,
)
from . import layout as layouts
from .compiled import CompiledModel
from .ir import Ensemble, UnsupportedModelError

# The only types a skops file may name beyond those skops trusts by default (numpy arrays,
# builtins, scikit-learn estimators and losses): the tree structures of the estimators the
# compiler supports. Anything else is refused by name; nothing outside this list is built.
SKOPS_TRUSTED = (
    "sklearn.tree._tree.Tree",
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
    # HistGradientBoosting with categorical_features (scikit-learn 1.9): its preprocessor
    # holds functools.partial(check_array, ...); skops names every function a partial holds,
    # so a partial of anything else is still refused by that function's name
    "functools.partial",
    "sklearn.utils.validation.check_array",
)


def _read_estimator(path: Path, trust_pickle: bool = False):
    """A scikit-learn estimator file. skops: loaded with an explicit allow-list. joblib or
    pickle runs code from the file while loading it: only with ``trust_pickle``."""
    if path.suffix == ".skops":
        import skops.io as sio

        try:
            untrusted = sio.get_untrusted_types(file=path)
        except Exception as exc:  # noqa: BLE001 (a zip or schema skops cannot read)
            raise UnsupportedModelError(f"{path} is not a readable skops file: {exc}") from None
        refused = sorted(t for t in untrusted if t not in SKOPS_TRUSTED)
        if refused:
            raise UnsupportedModelError(
                f"{path} names types outside the allow-list of tree ensembles: "
                + ", ".join(refused[:8]) + " (nothing was loaded)")
        return sio.load(path, trusted=list(untrusted))
    kind = _sniff(path)
    if kind != "pickle":
        raise UnsupportedModelError(f"{path} is {kind}: the compiler reads {READS}")
    if not trust_pickle:
        raise UnsupportedModelError(
            f"{path} is a joblib/pickle file: loading it runs code from the file. Save the "
            "estimator with skops (.skops), or pass --trust-pickle (Python: "
            "trust_pickle=True) for a file you made yourself")
    import warnings

    import joblib

    warnings.warn(f"loading {path} with joblib/pickle runs code from the file (--trust-pickle)",
                  stacklevel=2)
    try:
        return joblib.load(path)
    except Exception as exc:  # noqa: BLE001 (whatever unpickling a damaged file raises)
        raise UnsupportedModelError(f"{path} is not a readable joblib/pickle file: "
                                    f"{type(exc).__name__}: {exc}") from None


READS = ("XGBoost models (.json, .ubj), LightGBM model files (.txt, .lgb, .lgbm), CatBoost "
         "models (.cbm, or CatBoost's .json export), ONNX tree ensembles (.onnx), scikit-learn "
         "estimators saved with skops (.skops), and "
         "joblib/pickle files (.joblib, .pkl, .pickle) with --trust-pickle")
_PICKLE_SUFFIXES = (".joblib", ".pkl", ".pickle", ".jbl")


def _sniff(path: Path) -> str:
    """What a file that no loader claimed is: "pickle" only for a joblib/pickle file (by its
    name and its first bytes: a pickle protocol 2+ header, or joblib's zlib/gzip/xz/lz4
    compression), else a description for the refusal."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as exc:
        return f"not readable ({exc.strerror})"
    if head[:4] == b"CBM1":
        return "a CatBoost model: name it .cbm"
    other = head[:4] in (b"PK\x03\x04",) or head[:1] in (b"{", b"[") or head[:5] == b"tree\n"
    if path.suffix.lower() in _PICKLE_SUFFIXES:
        # named as one, and not another known format: any pickle protocol (0-5) or joblib's
        # compressed containers; refused unless --trust-pickle, read only then
        return "an empty file" if not head else ("not a joblib/pickle file (another format)"
                                                  if other else "pickle")
    if head[:1] == b"\x80" and len(head) >= 2 and 2 <= head[1] <= 5:
        return "pickle"  # a pickle (protocol 2+) under another name
    return f"not a model file this compiler knows (suffix {path.suffix or 'none'!r})"


def _library_source(source) -> bool:
    """XGBoost, LightGBM or ONNX: a model object, or a file of data (never code)."""
    return catboost_loader.is_catboost_source(source) or \
        xgboost_loader.is_xgboost_source(source) or \
        lightgbm_loader.is_lightgbm_source(source) or onnx_loader.is_onnx_source(source)


def to_ir(source, trust_pickle: bool = False, float32_inputs: bool = False) -> Ensemble:
    if catboost_loader.is_catboost_source(source):  # before XGBoost: both export .json
        ens = catboost_loader.to_ir(source)
    elif xgboost_loader.is_xgboost_source(source):
        ens = xgboost_loader.to_ir(source)
    elif lightgbm_loader.is_lightgbm_source(source):
        ens = lightgbm_loader.to_ir(source)
    elif onnx_loader.is_onnx_source(source):
        ens = onnx_loader.to_ir(source, float32_inputs)
    elif isinstance(source, (str, Path)):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"model source {path} does not exist")
        ens = sklearn_loader.to_ir(_read_estimator(path, trust_pickle))
    else:
        ens = sklearn_loader.to_ir(source)
    # before anything walks the trees (our packer, or the library's own predict in verify)
    for i, tree in enumerate(ens.trees):
        tree.check(ens.n_features, f"tree {i}")
    return ens


def meta_of(ens: Ensemble, info: dict) -> dict:
    return {
        "task": ens.task, "link": ens.link, "n_outputs": ens.n_outputs,
        "n_features": ens.n_features, "feature_names": ens.feature_names,
        "classes": [c.item() if isinstance(c, np.generic) else c for c in ens.classes],
        "divisor": ens.divisor, "objective": ens.objective, "source": ens.source,
        "kind": ens.kind, "notes": ens.notes, "format": artifact.FORMAT_VERSION, **info,
        **({"categories": ens.categories} if ens.categories else {}),
        **({"category_hashes": ens.category_hashes} if ens.category_hashes else {}),
        **({"aggregate": ens.aggregate} if ens.aggregate != "sum" else {}),
    }


def threshold_rows(ens: Ensemble, n: int = 512, seed: int = 1) -> np.ndarray:
    """Probe rows on the model's own thresholds and one float32 step either side (where a
    rounding of a threshold shows), a tenth missing; a feature no split reads is normal."""
    rng = np.random.default_rng(seed)
    X = rng.normal(scale=3.0, size=(n, ens.n_features)).astype(np.float32)
    by_feature: dict[int, list] = {}
    for t in ens.trees:
        inner = t.feature >= 0
        for f, thr in zip(t.feature[inner].tolist(), t.threshold[inner].tolist(), strict=True):
            by_feature.setdefault(f, []).append(thr)
    for f, values in by_feature.items():
        v = np.asarray(values, np.float32)
        v = v[np.isfinite(v)]
        if not v.size:
            continue
        col = rng.choice(v, n).astype(np.float32)
        step = rng.integers(-1, 3, n)  # the threshold, one below, one and two above
        for k, direction in ((-1, -np.inf), (1, np.inf), (2, np.inf)):
            at = step == k
            with np.errstate(over="ignore"):  # FLT_MAX steps to inf: a probe row too
                col[at] = np.nextafter(col[at], np.float32(direction))
                if k == 2:
                    col[at] = np.nextafter(col[at], np.float32(np.inf))
        X[:, f] = col
    X[rng.random(X.shape) < 0.1] = np.nan
    return X


def verify(model: CompiledModel, source, rng_seed: int = 0, n: int = 512,
           probe: np.ndarray | None = None) -> float:
    """Compare with the library on probe rows (``probe`` added to random ones: the model's
    thresholds, ``threshold_rows``); raise if the compiled model is not exact."""
    rng = np.random.default_rng(rng_seed)
    X = rng.normal(scale=3.0, size=(n, model.n_features)).astype(np.float32)
    X[rng.random(X.shape) < 0.1] = np.nan
    if probe is not None:
        X = np.concatenate([X, probe.astype(np.float32)])
        n = X.shape[0]
    if model.source.startswith("xgboost"):
        ref = xgboost_loader.reference_margin(source, X)
        ours = model.raw(X, n_threads=1)
    elif model.source.startswith("catboost"):
        if model.category_hashes:  # categorical values: whole numbers (hashed as strings)
            X = X.astype(object)
            for j, name in enumerate(model.feature_names):
                if name in model.category_hashes:
                    X[:, j] = [int(v) for v in rng.integers(-5, 100, n)]
        ref = catboost_loader.reference(source, X)
        ours = model.raw(X, n_threads=1)
    elif model.source.startswith("onnx"):
        ref = onnx_loader.reference_full(source, X)  # the user's whole graph
        ours = (model.predict_proba(X, n_threads=1) if model.task != "regression"
                else model.predict(X, n_threads=1).reshape(-1, 1))
    elif model.source.startswith("lightgbm"):
        # a random forest's raw_score is LightGBM's sum; its average is the margin it links
        ref = lightgbm_loader.reference(source, X) / model.divisor
        ours = model.raw(X, n_threads=1)
    else:
        est = source  # an XGBoost source or a fitted estimator (compile_model reads files)
        try:
            ref = sklearn_loader.reference(est, X)
        except ValueError:  # estimators that reject NaN at prediction
            X = np.nan_to_num(X)
            ref = sklearn_loader.reference(est, X)
        ours = (model.predict_proba(X, n_threads=1) if model.task != "regression"
                else model.predict(X, n_threads=1).reshape(-1, 1))
    with np.errstate(invalid="ignore"):  # inf - inf: equal infinities are no difference
        diff = np.where(ref == ours, 0.0, np.abs(ref - ours))
    diff[np.isnan(ref) & np.isnan(ours)] = 0.0
    err = float(np.max(diff)) if ref.size else 0.0
    limit, promise = tolerance(model)
    # each output against its own scale (at least 1): one large output elsewhere does not
    # loosen the others
    with np.errstate(invalid="ignore"):
        allowed = limit * np.maximum(1.0, np.where(np.isfinite(ref), np.abs(ref), 1.0))
        over = ~(diff <= allowed)
    if over.any():
        worst = int(np.argmax(np.where(over, diff / allowed, -1.0)))
        raise UnsupportedModelError(
            f"compiled {model.kind} ({model.objective or model.task}) differs from "
            f"{model.source} by {float(diff.flat[worst]):.3g} on probe rows (an output of "
            f"{float(ref.flat[worst]):.3g}), where {promise}")
    return err


# What verify holds each library's output to (docs/models.md, "Compiling models"), relative to each
# output's magnitude (at least 1): measured over the test suite's 736 compilations, the largest
# difference of each is well inside its limit (bench/FIDELITY.md gives the matrix)
TOLERANCES = {
    # raw scores in float64 in LightGBM's tree order: bit for bit
    "lightgbm": (0.0, "LightGBM's raw scores are promised bit for bit"),
    # RawFormulaVal: float64 sums; CatBoost's JSON reader rounds what the JSON export prints,
    # so a few float64 ulps
    "catboost": (2.0 ** -48, "CatBoost's RawFormulaVal is promised within 16 float64 ulps"),
    # predict_proba and decision values in float64, summed in another order
    "scikit-learn": (2.0 ** -48, "scikit-learn's outputs are promised within 16 float64 ulps"),
    # float32 margins to the bit; the linked outputs within ONNX Runtime's float32 logistic
    # and softmax (3e-7); an AVERAGE divides in float32
    "onnx": (3e-7, "ONNX Runtime's outputs are promised within 3e-7 (float32 rounding)"),
    # the first comparison, before compile_model's base calibration holds margins to the bit
    "xgboost": (1e-5, "XGBoost's margins are promised bit for bit (after the base margin's "
                      "float32 calibration)"),
}


def tolerance(model: CompiledModel) -> tuple[float, str]:
    """The limit (relative to each output's magnitude, at least 1) and the promise it
    keeps."""
    library = model.source.split()[0] if model.source else ""
    return TOLERANCES.get(library, (1e-5, "its outputs are promised within 1e-5"))


def compile_model(source, layout: str = "auto", check: bool = True,
                  trust_pickle: bool = False, kernel: str = "auto",
                  float32_inputs: bool = False, reference=None, bins: int = 10,
                  thresholds=(0.5,)) -> CompiledModel:
    """XGBoost Booster/XGBModel/.json/.ubj, LightGBM Booster/LGBMModel/model text file (.txt,
    .lgb), a fitted scikit-learn estimator, or a file of one (.skops; joblib/pickle only with
    ``trust_pickle``: loading those runs code).

    ``float32_inputs``: accept an ONNX model with a double input whose thresholds are not
    float32 values, exact for inputs that are float32 values (onnx_loader._double_input).

    ``layout`` (auto, padded, compact) and ``kernel`` (auto, walk, quickscorer, oblivious,
    lanes, masks): "auto" times
    every candidate the model allows on probe rows and keeps the fastest (worker/model/
    layout.py); the choice and the timings are stored in the artifact (``meta.layout_choice``,
    ``CompiledModel.kernel_choice``). Forcing both skips the measurement.

    ``reference``: training rows (a .parquet, .arrow or .csv path, a pyarrow Table, a pandas
    frame, numpy in the model's feature order) profiled for flight monitoring
    (model/reference.py) in ``bins`` quantile bins, the score's decision bands at
    ``thresholds``."""
    if isinstance(source, (str, Path)) and not _library_source(source):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"model source {path} does not exist")
        source = _read_estimator(path, trust_pickle)  # read once, verified against itself
    ens = to_ir(source, float32_inputs=float32_inputs)
    model = chosen(ens, layout, kernel)
    probe = threshold_rows(ens) if check else None
    if check and verify(model, source, probe=probe) != 0.0 and ens.accumulate == "float32":
        model = _calibrate_base(model, source, kernel)
        if model.source.startswith("xgboost"):  # promised bit for bit (docs/models.md): hold it
            err = verify(model, source, probe=probe)
            if err != 0.0:
                raise UnsupportedModelError(
                    f"compiled {model.kind} ({model.objective}) differs from XGBoost's own "
                    f"margins by {err:.3g} on probe rows, where they are promised bit for "
                    "bit")
    if reference is not None:
        model = model.with_reference(reference_rows(reference), bins, thresholds)
    return model


def reference_rows(reference):
    """Reference rows as given, or read from a .parquet, .arrow (IPC file or stream) or .csv
    file (its columns matched to the features by name)."""
    if not isinstance(reference, (str, Path)):
        return reference
    import pyarrow as pa

    path = Path(reference)
    if path.suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        return pq.read_table(path)
    if path.suffix == ".csv":
        import pyarrow.csv as pcsv

        return pcsv.read_csv(path)
    if path.suffix in (".arrow", ".feather"):
        with pa.memory_map(str(path)) as source:
            try:
                return pa.ipc.open_file(source).read_all()
            except pa.ArrowInvalid:
                source.seek(0)
                return pa.ipc.open_stream(source).read_all()
    raise ValueError(f"reference {path}: a .parquet, .arrow or .csv file")


# the full-evaluation kernels a compile times (walk.h, qs.h, oblivious.h, lanes.h, masks.h),
# under each layout
KERNELS = ("walk", "quickscorer", "oblivious", "lanes", "masks")


def chosen(ens: Ensemble, layout: str = "auto", kernel: str = "auto") -> CompiledModel:
    """The model packed and scored as measured fastest (or as forced), its choice recorded."""
    if layout not in ("auto", "padded", "compact"):
        raise ValueError(f"unknown layout {layout!r} (auto, padded or compact)")
    if kernel not in ("auto",) + KERNELS:
        raise ValueError(f"unknown kernel {kernel!r} (auto, {', '.join(KERNELS)})")
    kernels = list(KERNELS) if kernel == "auto" else [kernel]
    built, refused = {}, {}
    for lay in layouts.layouts(ens, layout):
        info, arrays = pack.pack(ens, lay)
        meta = meta_of(ens, info)
        for k in kernels:
            try:
                built[layouts.name(lay, k)] = (meta, arrays, CompiledModel(meta, arrays,
                                                                          kernel=k))
            except ValueError as exc:
                if k == "walk" or not str(exc).startswith(f"kernel {k}: "):
                    raise
                refused[layouts.name(lay, k)] = str(exc).removeprefix(f"kernel {k}: ")
    if not built:  # only a forced QuickScorer or oblivious kernel can leave nothing
        raise ValueError(f"kernel {kernel}: " + "; ".join(dict.fromkeys(refused.values())))
    choice = {"by": "forced", "us_per_row": {}, "not_candidates": refused}
    if len(built) > 1 or layout == "auto" or kernel == "auto":
        X = layouts.probe_rows(ens)
        timings = layouts.measure({k: v[2] for k, v in built.items()}, X)
        fallback = layouts.name(*layouts.default(ens, layout))
        pick = layouts.choose(timings, fallback)
        choice.update(
            by="only candidate" if len(built) == 1 else "measured" if pick != fallback
            else f"default (no candidate {layouts.MARGIN:.0%} faster)",
            us_per_row=timings, probe_rows=int(X.shape[0]), machine=layouts.machine())
    else:
        pick = next(iter(built))
    meta, arrays, _ = built[pick]
    lay, k = pick.split(" ")
    meta = {**meta, artifact.MEASURED: {"layout": lay, "kernel": k, **choice}}
    return CompiledModel(meta, arrays, kernel=k)


def _calibrate_base(model: CompiledModel, source, kernel: str = "auto") -> CompiledModel:
    """XGBoost derives its float32 base margin with libm; where ours lands one ulp away,
    take the neighbour that reproduces XGBoost's margins to the bit on the probe rows."""
    base = model.arrays["base"]
    for direction in (-np.inf, np.inf):
        arrays = dict(model.arrays)
        arrays["base"] = np.nextafter(base, np.float32(direction)).astype(np.float32)
        candidate = CompiledModel(model.meta, arrays, kernel=kernel)
        if verify(candidate, source) == 0.0:
            return candidate
    return model
