"""The differential matrix: each library's models against its own predict on hostile rows.

Issue 49. Each library's models, trained here in many configurations, compiled as a user
compiles them (the fitted estimator, or the file it saved), then scored on hostile rows
(every threshold and its float32 neighbours, zeros, +-inf, NaN) beside the library's own
predict: the output the README promises (XGBoost's margins, LightGBM's raw scores,
CatBoost's RawFormulaVal, scikit-learn's predict_proba / predict, ONNX Runtime's outputs).
Each row: the largest difference in ulps of each output's magnitude, and a verdict: "bit
for bit", "within N ulp", "refused: <why>" or DIFFERS (a failure).

    python bench/fidelity.py              # the broad matrix -> bench/FIDELITY.md (make fidelity)
    python bench/fidelity.py --quick      # a few configurations of each library (make test)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import worker  # noqa: E402
from worker.model.ir import UnsupportedModelError  # noqa: E402


def data(n=1500, f=6, seed=0, classes=2, missing=0.05):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, f)).astype(np.float32)
    z = X[:, 0] + 0.5 * X[:, 1] * X[:, 2] + rng.normal(size=n) * 0.5
    y = np.digitize(z, np.quantile(z, np.linspace(0, 1, classes + 1)[1:-1])) if classes > 1 \
        else z
    X[rng.random(X.shape) < missing] = np.nan
    return X, y


def hostile(ens, n=3000, seed=1, nan=True, inf=True) -> np.ndarray:
    """Rows drawn from the model's thresholds (its intermediate form ``ens``), one float32
    step either side, zeros, +-inf (or, without ``inf``, +-FLT_MAX) and (``nan``) NaN."""
    from worker.model.compile import threshold_rows

    rng = np.random.default_rng(seed)
    X = threshold_rows(ens, n=n, seed=seed)
    special = rng.random(X.shape)
    X[special < 0.02] = 0.0
    X[(special >= 0.02) & (special < 0.03)] = np.inf
    X[(special >= 0.03) & (special < 0.04)] = -np.inf
    big = np.finfo(np.float32).max
    X = np.nan_to_num(X, nan=np.nan if nan else 0.0, posinf=np.inf if inf else big,
                      neginf=-np.inf if inf else -big)
    return X.astype(np.float32)


def ulps(a: np.ndarray, b: np.ndarray) -> int:
    """The largest difference in units in the last place, each output against the ulp of
    its own magnitude (at least 1: what verify holds each library to), of float32 when both
    are float32 values, else of float64; NaN equal to NaN, inf to the same inf."""
    a, b = np.asarray(a), np.asarray(b)
    t = np.float32 if a.dtype == np.float32 and b.dtype == np.float32 else np.float64
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    if same.all():
        return 0
    a, b = a[~same], b[~same]
    if not np.isfinite(a).all() or not np.isfinite(b).all():
        return 1 << 62  # NaN or inf against a number
    unit = np.spacing(np.maximum(1.0, np.abs(b)).astype(t)).astype(np.float64)
    return int(np.ceil(np.max(np.abs(a - b) / unit)))


# ---- configurations: (library, name, build) -> build() returns (source, reference(X)) ------

def _xgb(params, n_rounds=20, es=False, save=False, classes=2, **kw):
    def build(tmp):
        import xgboost as xgb

        X, y = data(classes=classes if params.get("objective", "").startswith(("binary",
                                                                                "multi"))
                    else 1)
        cls = xgb.XGBClassifier if params.get("objective", "").startswith(("binary", "multi")) \
            else xgb.XGBRegressor
        if es:
            kw.update(early_stopping_rounds=3)
        est = cls(n_estimators=n_rounds, **params, **kw)
        fit = {"eval_set": [(X[1000:], y[1000:])], "verbose": False} if es else {}
        est.fit(X[:1000] if es else X, y[:1000] if es else y, **fit)
        if save:
            path = tmp / "model.json"
            est.save_model(path)
            est = cls()
            est.load_model(path)
            source = path
        else:
            source = est

        def ref(Xh):
            return np.asarray(est.predict(Xh, output_margin=True), np.float32)
        return source, ref, "margin"
    return build


def _lgb(params, n_rounds=20, es=False, save=False, classes=2, categorical=False):
    def build(tmp):
        import lightgbm as lgb

        X, y = data(classes=classes if params.get("objective") in ("binary", "multiclass")
                    else 1)
        if categorical:
            X[:, 3] = np.random.default_rng(3).integers(0, 12, X.shape[0])
        if params.get("objective") in ("poisson", "gamma", "tweedie"):
            y = np.abs(y) + 0.1  # counts and amounts: positive targets
        cls = lgb.LGBMClassifier if params.get("objective") in ("binary", "multiclass") \
            else lgb.LGBMRegressor
        est = cls(n_estimators=n_rounds, verbose=-1, **params)
        fit = {"categorical_feature": [3]} if categorical else {}
        if es:
            fit.update(eval_set=[(X[1000:], y[1000:])],
                       callbacks=[lgb.early_stopping(3, verbose=False)])
            est.fit(X[:1000], y[:1000], **fit)
        else:
            est.fit(X, y, **fit)
        source = est
        if save:
            path = tmp / "model.txt"
            est.booster_.save_model(path)
            source = path

        def ref(Xh):
            return np.asarray(est.predict(Xh, raw_score=True), np.float64)
        return source, ref, "raw score"
    return build


def _cb(params, n_rounds=20, es=False, save=None, classes=2):
    def build(tmp):
        import catboost

        loss = params.get("loss_function", "Logloss")
        X, y = data(classes=classes if loss in ("Logloss", "MultiClass") else 1)
        cls = catboost.CatBoostClassifier if loss in ("Logloss", "MultiClass") \
            else catboost.CatBoostRegressor
        est = cls(iterations=n_rounds, verbose=0, random_seed=0, **params)
        if es:
            est.fit(X[:1000], y[:1000], eval_set=(X[1000:], y[1000:]), early_stopping_rounds=3)
        else:
            est.fit(X, y)
        source = est
        if save:
            path = tmp / f"model.{save}"
            est.save_model(str(path), format="json" if save == "json" else "cbm")
            source = path

        def ref(Xh):
            return np.asarray(est.predict(Xh, prediction_type="RawFormulaVal"), np.float64)
        return source, ref, "RawFormulaVal"
    return build


def _skl(kind, classes=2, **kw):
    def build(tmp):
        from sklearn import ensemble

        est = getattr(ensemble, kind)(random_state=0, **kw)
        X, y = data(classes=classes if "Classifier" in kind else 1,
                    missing=0.05 if kind.startswith(("Hist", "Random", "Extra")) else 0.0)
        if kw.get("categorical_features"):
            X[:, 3] = np.random.default_rng(3).integers(0, 12, X.shape[0])
        est.fit(X, y)

        def ref(Xh):
            out = est.predict_proba(Xh) if "Classifier" in kind else est.predict(Xh)
            return np.asarray(out, np.float64)
        return est, ref, "predict_proba" if "Classifier" in kind else "predict"
    return build


def _onnx(maker, double=False, float32_inputs=False):
    def build(tmp):
        import onnxruntime as ort

        model = maker(double)
        path = tmp / "model.onnx"
        path.write_bytes(model.SerializeToString())
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

        def ref(Xh):
            out = sess.run(None, {sess.get_inputs()[0].name: Xh.astype(np.float64) if double
                                  else Xh})
            return np.asarray(out[-1], np.float32)
        return (path, float32_inputs), ref, "ONNX Runtime output"
    return build


def _skl2onnx_rf(double, as_tensor=False):
    from skl2onnx import to_onnx
    from sklearn.ensemble import RandomForestClassifier

    X, y = data(missing=0.0)
    rf = RandomForestClassifier(n_estimators=10, max_depth=6, random_state=0).fit(X, y)
    model = to_onnx(rf, X[:1].astype(np.float64 if double else np.float32),
                    options={id(rf): {"zipmap": False}})
    if as_tensor:
        _double_thresholds(model, rf)
    return model


def _double_thresholds(model, rf) -> None:
    """skl2onnx 1.20 writes float32 thresholds (ai.onnx.ml opset 1) even for a double input;
    a double export (opset 3, ``nodes_values_as_tensor``) carries scikit-learn's own float64
    thresholds (midpoints between float32 values): written here from the estimator."""
    from onnx import TensorProto, helper

    node = next(n for n in model.graph.node if n.op_type == "TreeEnsembleClassifier")
    a = {x.name: x for x in node.attribute}
    values = [float(rf.estimators_[t].tree_.threshold[k]) if m != b"LEAF" else 0.0
              for t, k, m in zip(a["nodes_treeids"].ints, a["nodes_nodeids"].ints,
                                 a["nodes_modes"].strings, strict=True)]
    node.attribute.remove(a["nodes_values"])
    node.attribute.append(helper.make_attribute("nodes_values_as_tensor", helper.make_tensor(
        "nodes_values", TensorProto.DOUBLE, [len(values)], values)))
    for o in model.opset_import:
        if o.domain == "ai.onnx.ml":
            o.version = 3


def _skl2onnx_rf_ml3(double):
    return _skl2onnx_rf(double, as_tensor=True)


def _onnxmltools_lgb(double):
    import lightgbm as lgb
    import onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType

    X, y = data()
    X[:, 3] = np.random.default_rng(3).integers(0, 12, X.shape[0])
    est = lgb.LGBMClassifier(n_estimators=20, num_leaves=8, verbose=-1).fit(
        X, y, categorical_feature=[3])
    return onnxmltools.convert_lightgbm(est, initial_types=[("X", FloatTensorType([None, 6]))],
                                        zipmap=False)


def _onnxmltools_xgb(double):
    import onnxmltools
    import xgboost as xgb
    from onnxmltools.convert.common.data_types import FloatTensorType

    X, y = data()
    est = xgb.XGBClassifier(n_estimators=20, max_depth=4).fit(X, y)
    return onnxmltools.convert_xgboost(est, initial_types=[("X", FloatTensorType([None, 6]))])


QUICK = [
    ("XGBoost", "binary:logistic depth 4", _xgb({"objective": "binary:logistic",
                                                   "max_depth": 4})),
    ("XGBoost", "early stopping (XGBClassifier)", _xgb({"objective": "binary:logistic"},
                                                        n_rounds=60, es=True)),
    ("XGBoost", "missing=-999", _xgb({"objective": "binary:logistic"}, missing=-999.0)),
    ("XGBoost", "base_score 1e-7 (clamped)", _xgb({"objective": "binary:logistic",
                                                    "base_score": 1e-7})),
    ("LightGBM", "binary", _lgb({"objective": "binary"})),
    ("LightGBM", "early stopping (LGBMClassifier)", _lgb({"objective": "binary"}, 60, es=True)),
    ("CatBoost", "Logloss depth 6", _cb({"depth": 6})),
    ("CatBoost", "scale 0.3, bias 0.1", None),  # filled below
    ("scikit-learn", "RandomForestClassifier", _skl("RandomForestClassifier", n_estimators=10,
                                                     max_depth=8)),
    ("scikit-learn", "HistGradientBoosting categorical", _skl(
        "HistGradientBoostingClassifier", max_iter=20, categorical_features=[3])),
    ("ONNX", "skl2onnx RF, float input", _onnx(_skl2onnx_rf)),
    ("ONNX", "skl2onnx RF, double input (ml opset 1: float thresholds)",
     _onnx(_skl2onnx_rf, double=True)),
    ("ONNX", "skl2onnx RF, double input, scikit-learn's double thresholds (ml opset 3)",
     _onnx(_skl2onnx_rf_ml3, double=True)),
    ("ONNX", "onnxmltools LightGBM categorical", _onnx(_onnxmltools_lgb)),
]


def _cb_scaled(tmp):
    source, ref, what = _cb({"depth": 4})(tmp)
    source.set_scale_and_bias(0.3, 0.1)
    return source, ref, what


QUICK[7] = ("CatBoost", "scale 0.3, bias 0.1", _cb_scaled)

BROAD = QUICK + [
    ("XGBoost", f"binary:logistic depth {d}", _xgb({"objective": "binary:logistic",
                                                     "max_depth": d})) for d in (2, 8, 12)
] + [
    ("XGBoost", "early stopping, saved .json", _xgb({"objective": "binary:logistic"}, 60,
                                                     es=True, save=True)),
    ("XGBoost", "binary:logitraw", _xgb({"objective": "binary:logitraw"})),
    ("XGBoost", "multi:softprob 4 classes", _xgb({"objective": "multi:softprob"}, classes=4)),
    ("XGBoost", "reg:squarederror", _xgb({"objective": "reg:squarederror"})),
    ("XGBoost", "reg:absoluteerror", _xgb({"objective": "reg:absoluteerror"})),
    ("XGBoost", "reg:pseudohubererror", _xgb({"objective": "reg:pseudohubererror"})),
    ("XGBoost", "num_parallel_tree 4", _xgb({"objective": "binary:logistic",
                                              "num_parallel_tree": 4})),
    ("XGBoost", "base_score 0.9999999 (clamped)", _xgb({"objective": "binary:logistic",
                                                         "base_score": 0.9999999})),
    ("XGBoost", "max_bin 16", _xgb({"objective": "binary:logistic", "max_bin": 16})),
    ("LightGBM", "multiclass 4", _lgb({"objective": "multiclass"}, classes=4)),
    ("LightGBM", "regression l2", _lgb({"objective": "regression"})),
    ("LightGBM", "regression l1", _lgb({"objective": "regression_l1"})),
    ("LightGBM", "poisson", _lgb({"objective": "poisson"})),
    ("LightGBM", "categorical", _lgb({"objective": "binary"}, categorical=True)),
    ("LightGBM", "zero_as_missing", _lgb({"objective": "binary", "zero_as_missing": True})),
    ("LightGBM", "rf", _lgb({"objective": "binary", "boosting_type": "rf",
                             "bagging_freq": 1, "bagging_fraction": 0.7})),
    ("LightGBM", "saved .txt", _lgb({"objective": "binary"}, save=True)),
    ("LightGBM", "max_bin 15, num_leaves 63", _lgb({"objective": "binary", "max_bin": 15,
                                                    "num_leaves": 63})),
    ("CatBoost", "Logloss depth 2", _cb({"depth": 2})),
    ("CatBoost", "Logloss depth 10", _cb({"depth": 10}, n_rounds=10)),
    ("CatBoost", "MultiClass 4", _cb({"loss_function": "MultiClass"}, classes=4)),
    ("CatBoost", "RMSE", _cb({"loss_function": "RMSE"})),
    ("CatBoost", "nan_mode Max", _cb({"nan_mode": "Max"})),
    ("CatBoost", "border_count 8", _cb({"border_count": 8})),
    ("CatBoost", "early stopping (use_best_model)", _cb({}, 80, es=True)),
    ("CatBoost", "saved .cbm", _cb({}, save="cbm")),
    ("CatBoost", "saved .json", _cb({}, save="json")),
    ("scikit-learn", "ExtraTreesClassifier 3 classes", _skl("ExtraTreesClassifier", classes=3,
                                                             n_estimators=10)),
    ("scikit-learn", "RandomForestRegressor", _skl("RandomForestRegressor", n_estimators=10)),
    ("scikit-learn", "GradientBoostingClassifier", _skl("GradientBoostingClassifier",
                                                         n_estimators=20)),
    ("scikit-learn", "GradientBoostingClassifier 3 classes", _skl(
        "GradientBoostingClassifier", classes=3, n_estimators=10)),
    ("scikit-learn", "GradientBoosting exponential", _skl("GradientBoostingClassifier",
                                                           loss="exponential",
                                                           n_estimators=20)),
    ("scikit-learn", "GradientBoostingRegressor", _skl("GradientBoostingRegressor",
                                                        n_estimators=20)),
    ("scikit-learn", "HistGradientBoostingClassifier", _skl("HistGradientBoostingClassifier",
                                                             max_iter=20)),
    ("scikit-learn", "HistGradientBoosting early stopping", _skl(
        "HistGradientBoostingClassifier", max_iter=200, early_stopping=True)),
    ("scikit-learn", "HistGradientBoostingRegressor", _skl("HistGradientBoostingRegressor",
                                                            max_iter=20)),
    ("ONNX", "skl2onnx RF double (ml opset 3), --float32-inputs",
     _onnx(_skl2onnx_rf_ml3, double=True, float32_inputs=True)),
    ("ONNX", "onnxmltools XGBoost", _onnx(_onnxmltools_xgb)),
]


def run_one(library: str, name: str, build) -> dict:
    """One configuration: compiled as the user compiles it, against the library's predict."""
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        source, ref, what = build(Path(d))
        float32_inputs = False
        if isinstance(source, tuple):
            source, float32_inputs = source
        try:
            model = worker.compile_model(source, float32_inputs=float32_inputs)
        except UnsupportedModelError as exc:
            return {"library": library, "configuration": name, "output": what,
                    "verdict": f"refused: {exc}", "ulp": None, "rows": 0,
                    "seconds": time.perf_counter() - t0}
        nan_ok = not (library == "scikit-learn" and "GradientBoosting" in name
                      and "Hist" not in name)
        from worker.model.compile import to_ir

        # scikit-learn refuses +-inf (and GradientBoosting NaN) at predict: +-FLT_MAX for them
        X = hostile(to_ir(source, float32_inputs=float32_inputs), nan=nan_ok,
                    inf=library != "scikit-learn")
        want = ref(X)
        if library == "ONNX":
            got = (model.predict_proba(X, n_threads=1) if model.task != "regression"
                   else model.predict(X, n_threads=1)).astype(np.float32)
        elif library == "scikit-learn":
            got = (model.predict_proba(X, n_threads=1) if model.task != "regression"
                   else model.predict(X, n_threads=1))
        else:
            got = model.raw(X, n_threads=1)
            if library == "LightGBM" and model.divisor != 1:
                # a random forest's raw score is LightGBM's sum; divided by the rounds, the
                # margin it links (README) is what the kernels compute
                want = want / model.divisor
        got = np.asarray(got).reshape(want.shape[0], -1)
        want = want.reshape(got.shape[0], -1)
        if got.shape != want.shape:  # a binary margin as one column
            got = got[:, -want.shape[1]:]
        u = ulps(got.astype(want.dtype), want)
        limit = {"XGBoost": 0, "LightGBM": 0, "CatBoost": 16, "scikit-learn": 16}.get(library)
        if library == "ONNX":
            ok = bool(np.nanmax(np.abs(got.astype(np.float64) - want)) <= 3e-7) \
                if u else True
            verdict = "bit for bit" if u == 0 else \
                (f"within {u} ulp (promise: 3e-7 absolute)" if ok else f"DIFFERS ({u} ulp)")
        else:
            verdict = "bit for bit" if u == 0 else (
                f"within {u} ulp (promise: {limit} ulp)" if u <= limit
                else f"DIFFERS ({u} ulp)")
        return {"library": library, "configuration": name, "output": what, "ulp": u,
                "verdict": verdict, "rows": int(X.shape[0]), "notes": model.meta.get("notes"),
                "seconds": time.perf_counter() - t0}


def matrix(configs) -> list[dict]:
    return [run_one(*c) for c in configs]


def table(rows: list[dict]) -> str:
    out = ["| library | configuration | output compared | max ulp | verdict |",
           "|---|---|---|---|---|"]
    for r in rows:
        verdict = r["verdict"]
        if verdict.startswith("refused"):
            verdict = verdict[:160] + ("..." if len(verdict) > 160 else "")
        out.append(f"| {r['library']} | {r['configuration']} | {r['output']} | "
                   f"{'-' if r['ulp'] is None else r['ulp']} | {verdict} |")
    return "\n".join(out)


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few configurations of each library")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "FIDELITY.md",
                    help="the table (Markdown) to write, and beside it its .json with the full "
                         "refusal texts (default: bench/FIDELITY.md)")
    args = ap.parse_args()
    rows = matrix(QUICK if args.quick else BROAD)
    import catboost
    import lightgbm
    import onnxruntime
    import sklearn
    import xgboost

    versions = (f"XGBoost {xgboost.__version__}, LightGBM {lightgbm.__version__}, CatBoost "
                f"{catboost.__version__}, scikit-learn {sklearn.__version__}, ONNX Runtime "
                f"{onnxruntime.__version__}")
    text = (f"# Fidelity matrix\n\n`python bench/fidelity.py{' --quick' if args.quick else ''}`"
            f" (`make fidelity`), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{_cpu()}, {os.cpu_count()} CPUs, Python "
            f"{platform.python_version()}; {versions}.\n\n"
            "Each configuration trained here, compiled as a user compiles it (the fitted "
            "estimator, or the file it saved), then scored beside the library's own predict "
            "on hostile rows: thresholds and their float32 neighbours, zeros, +-inf, NaN "
            "(scikit-learn refuses +-inf: +-FLT_MAX for it; GradientBoosting refuses NaN). "
            "max ulp: the largest difference in units in the last place of each output's "
            "magnitude (at least 1), of float64 (float32 for ONNX Runtime's outputs), the "
            "scale verify holds each library to.\n\n"
            + table(rows) + "\n")
    args.out.write_text(text)
    (args.out.with_suffix(".json")).write_text(json.dumps(rows, indent=1, default=str) + "\n")
    print(text)
    bad = [r for r in rows if r["verdict"].startswith("DIFFERS")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
