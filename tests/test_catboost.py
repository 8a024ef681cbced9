"""CatBoost models (numeric features, oblivious trees) compiled from the fitted object, the .cbm
file and the JSON export, and compared with CatBoost's own predictions on hostile rows: NaN
under each nan_mode, +-inf, zeros, values on every border and one ulp either side, at kernel
block edges. Margins bit for bit (``RawFormulaVal``), probabilities as CatBoost computes them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import worker
from tests import models as M
from worker.model.ir import UnsupportedModelError

catboost = pytest.importorskip("catboost", reason="pip install catboost (the test extras)")

REPO = Path(__file__).resolve().parent.parent
SIZES = (1, 7, 63, 64, 65, 161, 1000)


def _data(n=2000, seed=0):
    X, y2 = M.training_data(seed=seed, n=n)[:2]
    X = np.asarray(X, dtype=np.float32)
    rng = np.random.default_rng(seed)
    y3 = rng.integers(0, 3, size=n)
    y3[np.nan_to_num(X[:, 0]) > 0.5] = 2
    return X, np.asarray(y2), y3


def _models():
    X, y2, y3 = _data()
    C, R = catboost.CatBoostClassifier, catboost.CatBoostRegressor
    kw = dict(verbose=0, random_seed=0, thread_count=1, allow_writing_files=False)
    return {
        "logloss-nan-min": C(iterations=60, depth=6, **kw).fit(X, y2),
        "logloss-nan-max": C(iterations=40, depth=4, nan_mode="Max", **kw).fit(X, y2),
        "multiclass": C(iterations=30, depth=5, loss_function="MultiClass", **kw).fit(X, y3),
        "rmse": R(iterations=60, depth=6, **kw).fit(X, np.nan_to_num(X[:, 1])),
        "crossentropy": C(iterations=30, depth=3, loss_function="CrossEntropy", **kw).fit(
            X, y2.astype(float)),
    }


@pytest.fixture(scope="module")
def cb_models():
    return _models()


def _borders(model) -> np.ndarray:
    from worker.model.catboost_loader import model_json

    info = model_json(model)["features_info"]["float_features"]
    b = np.asarray([v for f in info for v in f["borders"]], dtype=np.float32)
    with np.errstate(over="ignore"):  # CatBoost keeps +-FLT_MAX borders
        return np.unique(np.concatenate([b, np.nextafter(b, np.float32(np.inf)),
                                         np.nextafter(b, np.float32(-np.inf))]))


@pytest.mark.parametrize("name", ["logloss-nan-min", "logloss-nan-max", "multiclass", "rmse",
                                  "crossentropy"])
@pytest.mark.parametrize("source", ["object", "cbm", "json"])
def test_catboost_matches_its_own_predictions_on_hostile_rows(cb_models, name, source,
                                                               tmp_path):
    model = cb_models[name]
    if source == "object":
        src = model
    else:
        src = tmp_path / f"m.{source}"
        model.save_model(str(src), format="cbm" if source == "cbm" else "json")
    compiled = worker.compile_model(src)
    borders = _borders(model)
    for seed, n in enumerate(SIZES):
        X = M.hostile_rows(n, borders, seed=seed)
        raw = np.asarray(model.predict(X, prediction_type="RawFormulaVal"),
                         dtype=np.float64).reshape(n, -1)
        np.testing.assert_array_equal(compiled.raw(X, n_threads=2), raw,
                                      err_msg=f"{name} from {source}: margins, {n} rows")
        if compiled.task == "regression":
            np.testing.assert_array_equal(compiled.predict(X, n_threads=2),
                                          model.predict(X))
        else:
            np.testing.assert_allclose(compiled.predict_proba(X, n_threads=2),
                                       model.predict_proba(X), rtol=0, atol=1e-15)


def test_what_catboost_models_cannot_be_compiled_is_refused_by_name(tmp_path):
    import pandas as pd

    X, y2, _ = _data(n=400)
    kw = dict(verbose=0, iterations=5, depth=3, allow_writing_files=False)
    df = pd.DataFrame(X[:, :3], columns=["a", "b", "c"])
    df["merchant"] = np.where(X[:, 3] > 0, "m1", "m2")
    df["text"] = np.where(X[:, 4] > 0, "fast food", "late night")
    text = catboost.CatBoostClassifier(text_features=["text"], cat_features=["merchant"],
                                       **kw).fit(df, y2)
    with pytest.raises(UnsupportedModelError, match="text and embedding features are not "
                       "supported.*text features only in cbm"):
        worker.compile_model(text)
    depthwise = catboost.CatBoostRegressor(grow_policy="Depthwise", **kw).fit(
        X, np.nan_to_num(X[:, 0]))
    with pytest.raises(UnsupportedModelError, match="non-oblivious"):
        worker.compile_model(depthwise)
    poisson = catboost.CatBoostRegressor(loss_function="Poisson", **kw).fit(
        X, np.abs(np.nan_to_num(X[:, 0])).round())
    with pytest.raises(UnsupportedModelError, match="loss_function 'Poisson' is not supported"):
        worker.compile_model(poisson)


def test_compile_reads_cbm_files_and_refuses_a_broken_one(cb_models, tmp_path):
    path = tmp_path / "fraud.cbm"
    cb_models["logloss-nan-min"].save_model(str(path))
    run = [sys.executable, "-m", "worker.cli", "compile"]
    proc = subprocess.run([*run, str(path), "-o", str(tmp_path / "fraud.model")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    broken = tmp_path / "broken.cbm"
    broken.write_bytes(path.read_bytes()[:200])
    proc = subprocess.run([*run, str(broken), "-o", str(tmp_path / "x.model")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "not a readable CatBoost model" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_moved_probability_threshold_is_refused_not_ignored(tmp_path):
    """A hostile review: set_probability_threshold(0.9) changes CatBoost's predict (340 of
    2,000 labels) and is saved in the model file; the compiled model labelled at 0.5 with no
    note. Refused from the estimator and from its file; reset, it compiles and agrees."""
    import catboost as cb

    X, y = _data(600, seed=6)[:2]
    e = cb.CatBoostClassifier(iterations=20, depth=4, allow_writing_files=False,
                              verbose=False).fit(X, y)
    e.set_probability_threshold(0.9)
    with pytest.raises(UnsupportedModelError, match="probability threshold 0.9"):
        worker.compile_model(e)
    e.save_model(str(tmp_path / "m.cbm"))
    with pytest.raises(UnsupportedModelError, match="set_probability_threshold"):
        worker.compile_model(str(tmp_path / "m.cbm"))
    e.set_probability_threshold(None)
    m = worker.compile_model(e)
    H = np.random.default_rng(6).normal(size=(2000, X.shape[1])).astype(np.float32)
    np.testing.assert_array_equal(m.predict(H), e.predict(H))
