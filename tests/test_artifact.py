"""The compiled-model artifact: round trip, data only, clear errors."""

from __future__ import annotations

import numpy as np
import pytest

import worker
from tests import models as M


@pytest.mark.parametrize("name", ["xgb-multi-softprob", "rf-binary", "hgb-reg"])
def test_round_trip_scores_identically(tmp_path, name):
    src = {**M.xgboost_models(), **M.sklearn_models()}[name]
    model = worker.compile_model(src)
    path = tmp_path / "m.model"
    model_id = model.save(path)
    loaded = worker.load_model(path)
    assert loaded.model_id == model_id == model.model_id
    assert len(model_id) == 64
    assert loaded.feature_names == model.feature_names
    assert loaded.n_features == model.n_features and loaded.work_total == model.work_total
    X = M.hostile_rows(300, np.array([0.0, 1.0]), seed=2)
    np.testing.assert_array_equal(loaded.raw(X), model.raw(X))
    # the content decides the id: saving again gives the same bytes
    assert model.to_bytes() == path.read_bytes()


def test_artifact_is_not_a_pickle(tmp_path):
    model = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    data = model.to_bytes()
    assert data.startswith(b"SWMODEL\x00")
    assert b"\x80\x04\x95" not in data[:64]  # no pickle protocol header


def test_truncated_artifact(tmp_path):
    model = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    path = tmp_path / "m.model"
    path.write_bytes(model.to_bytes()[:-100])
    with pytest.raises(worker.ArtifactError, match="truncated or corrupted"):
        worker.load_model(path)
    path.write_bytes(model.to_bytes()[:20])
    with pytest.raises(worker.ArtifactError, match="truncated"):
        worker.load_model(path)


def test_corrupted_artifact(tmp_path):
    data = bytearray(worker.compile_model(M.sklearn_models()["gb-binary"]).to_bytes())
    data[len(data) // 2] ^= 0xFF
    path = tmp_path / "m.model"
    path.write_bytes(bytes(data))
    with pytest.raises(worker.ArtifactError, match="corrupted"):
        worker.load_model(path)


def test_not_an_artifact(tmp_path):
    path = tmp_path / "m.model"
    path.write_bytes(b"\x80\x04\x95 definitely a pickle")
    with pytest.raises(worker.ArtifactError, match="not a scoring-worker compiled model"):
        worker.load_model(path)


def test_unsupported_models_say_what():
    import xgboost as xgb
    from sklearn.ensemble import AdaBoostClassifier, HistGradientBoostingClassifier

    X, y2, _, yr = M.training_data(nan=False)
    with pytest.raises(worker.UnsupportedModelError, match="AdaBoostClassifier"):
        worker.compile_model(AdaBoostClassifier(n_estimators=2).fit(X, y2))
    Xf = X.copy()
    Xf[:, 5] = np.round(Xf[:, 5]) % 7 + 0.25  # categories that are not whole numbers
    hgb = HistGradientBoostingClassifier(max_iter=3, categorical_features=[5]).fit(Xf, y2)
    with pytest.raises(worker.UnsupportedModelError,
                       match="categorical feature 'f5' has categories that are not whole"):
        worker.compile_model(hgb)
    b = xgb.train({"objective": "reg:gamma"}, xgb.DMatrix(X, label=np.abs(yr) + 1), 2)
    with pytest.raises(worker.UnsupportedModelError, match="reg:gamma"):
        worker.compile_model(b)
    b = xgb.train({"objective": "reg:squarederror", "booster": "gblinear"},
                  xgb.DMatrix(X, label=yr), 2)
    with pytest.raises(worker.UnsupportedModelError, match="gblinear"):
        worker.compile_model(b)
    Xc = np.column_stack([X[:, 0], X[:, 5]])
    dm = xgb.DMatrix(Xc, label=y2, feature_types=["q", "c"], enable_categorical=True)
    b = xgb.train({"objective": "binary:logistic", "max_cat_to_onehot": 1}, dm, 3)
    # categorical splits compile now (tests/test_categorical.py holds them to XGBoost)
    assert "cats" in worker.compile_model(b).arrays


def test_model_files(tmp_path):
    import joblib
    import skops.io as sio

    booster = M.xgboost_models()["xgb-multi-softprob"]
    for suffix in (".json", ".ubj"):
        booster.save_model(tmp_path / f"b{suffix}")
        m = worker.compile_model(tmp_path / f"b{suffix}")
        assert m.feature_names == [f"feat_{i}" for i in range(M.N_FEATURES)]
        assert m.n_classes == 3
    est = M.sklearn_models()["rf-multi"]
    joblib.dump(est, tmp_path / "rf.joblib")
    sio.dump(est, tmp_path / "rf.skops")
    with pytest.raises(worker.UnsupportedModelError, match="trust-pickle"):
        worker.compile_model(tmp_path / "rf.joblib")
    with pytest.warns(UserWarning, match="runs code from the file"):
        a = worker.compile_model(tmp_path / "rf.joblib", trust_pickle=True)
    b = worker.compile_model(tmp_path / "rf.skops", layout=a.layout, kernel=a.kernel)
    assert a.model_id == b.model_id
