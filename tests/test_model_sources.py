"""No code from model files: a skops file naming a type outside the allow-list is refused by
name before anything is built; joblib/pickle only with --trust-pickle."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import worker

ROOT = Path(__file__).resolve().parents[1]


def _evil_skops(tmp_path: Path, marker: Path) -> Path:
    """A skops file whose schema asks skops to build an attribute by calling os.system (the
    issue's attack): a ConstructorFromReduceNode calls whatever type its schema names."""
    import skops.io as sio
    from sklearn.ensemble import RandomForestClassifier

    X = np.random.default_rng(0).normal(size=(50, 3))
    good = tmp_path / "good.skops"
    sio.dump(RandomForestClassifier(n_estimators=2).fit(X, X[:, 0] > 0), good)
    with zipfile.ZipFile(good) as z:
        schema = json.loads(z.read("schema.json"))
        files = {n: z.read(n) for n in z.namelist() if n != "schema.json"}

    # an attribute of the forest, built by calling the type the schema names
    schema["content"]["content"]["n_estimators"] = {
        "__class__": "system", "__module__": "os", "__loader__": "ConstructorFromReduceNode",
        "__id__": 1, "content": {
            "__class__": "tuple", "__module__": "builtins", "__loader__": "TupleNode",
            "__id__": 2, "content": [{"__class__": "str", "__module__": "builtins",
                                      "__loader__": "JsonNode", "is_json": True, "__id__": 3,
                                      "content": json.dumps(f"touch {marker}")}]}}
    evil = tmp_path / "evil.skops"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("schema.json", json.dumps(schema))
        for n, b in files.items():
            z.writestr(n, b)
    return evil


def test_the_attack_file_is_real(tmp_path):
    # control: trusting every type the file names (what compile did before) runs the command
    import skops.io as sio

    marker = tmp_path / "pwned"
    evil = _evil_skops(tmp_path, marker)
    assert "os.system" in sio.get_untrusted_types(file=evil)
    with contextlib.suppress(Exception):
        sio.load(evil, trusted=sio.get_untrusted_types(file=evil))
    assert marker.exists()


def test_skops_outside_the_allow_list_is_refused_by_name(tmp_path):
    marker = tmp_path / "pwned"
    evil = _evil_skops(tmp_path, marker)
    with pytest.raises(worker.UnsupportedModelError, match=r"allow-list.*os\.system"):
        worker.compile_model(evil)
    proc = subprocess.run([sys.executable, "-m", "worker.cli", "compile", str(evil), "-o",
                           str(tmp_path / "m.model")], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode != 0 and "os.system" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists() and not (tmp_path / "m.model").exists()


def test_supported_estimators_load_from_skops(tmp_path):
    import skops.io as sio

    from tests import models as M

    for name in ("rf-binary", "gb-multi", "hgb-reg", "et-multi"):
        est = M.sklearn_models()[name]
        sio.dump(est, tmp_path / f"{name}.skops")
        m = worker.compile_model(tmp_path / f"{name}.skops")
        # the same content whichever way it was read (the layout forced to the one measured
        # fastest: a second measurement could pick another layout, which is other content)
        assert m.model_id == worker.compile_model(est, layout=m.layout,
                                                  kernel=m.kernel).model_id


def test_pickle_needs_trust(tmp_path):
    import pickle

    marker = tmp_path / "ran"

    class Evil:  # unpickling calls os.system
        def __reduce__(self):
            import os

            return (os.system, (f"touch {marker}",))

    (tmp_path / "m.pkl").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(worker.UnsupportedModelError, match="trust-pickle"):
        worker.compile_model(tmp_path / "m.pkl")
    assert not marker.exists()


@pytest.mark.parametrize("lie", ["cycle", "outside", "feature"])
def test_malformed_tree_arrays_are_refused_before_anything_walks_them(lie):
    # skops builds a Tree from any arrays (it does not trust Tree by default for this reason):
    # a child index that points back or outside would crash or hang a walk
    from sklearn.ensemble import RandomForestClassifier

    X = np.random.default_rng(0).normal(size=(80, 3))
    rf = RandomForestClassifier(n_estimators=2, random_state=0).fit(X, X[:, 0] > 0)
    state = rf.estimators_[1].tree_.__getstate__()
    nodes = state["nodes"].copy()
    inner = np.flatnonzero(nodes["left_child"] >= 0)
    if lie == "cycle":
        nodes["left_child"][inner[-1]] = 0
    elif lie == "outside":
        nodes["right_child"][inner[0]] = 10**6
    else:
        nodes["feature"][inner[0]] = 7
    state["nodes"] = nodes
    rf.estimators_[1].tree_.__setstate__(state)
    with pytest.raises(worker.UnsupportedModelError, match="tree 1"):
        worker.compile_model(rf)


@pytest.mark.parametrize("num_feature", ["2147483647", "131073", "0", "-5"])
def test_an_xgboost_file_declaring_absurd_features_is_refused_at_once(tmp_path, num_feature):
    """A hostile review: a 2 KB XGBoost JSON saying num_feature 2^31 - 1 (XGBoost loads it)
    built a name a feature and ran the machine out of memory; now refused by name, as the
    ONNX and CatBoost loaders refuse inputs past 2^17."""
    import time

    import xgboost as xgb

    from tests import models as M
    from worker.model.ir import UnsupportedModelError

    X, y, _, _ = M.training_data(nan=False)
    b = xgb.train({"objective": "binary:logistic", "max_depth": 2}, xgb.DMatrix(X, label=y), 2)
    doc = json.loads(b.save_raw("json"))
    doc["learner"]["learner_model_param"]["num_feature"] = num_feature
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    t0 = time.perf_counter()
    with pytest.raises((UnsupportedModelError, ValueError), match="num_feature|feature"):
        worker.compile_model(str(path))
    assert time.perf_counter() - t0 < 30


def test_positional_rows_of_text_or_complex_numbers_are_refused():
    """A hostile review: numpy rows of strings were parsed as numbers, complex numbers cut to
    their real part; now refused (TypeError) in every entry point. Numbers of any width,
    booleans, and object arrays of numbers with None (missing) are read as before."""
    from tests import models as M

    m = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    n = m.n_features
    X = M.hostile_rows(4, np.array([0.0, 1.0]), seed=3)[:, :n].astype(np.float32)
    want = m.raw(X)
    for bad in (X.astype(str), X.astype(np.complex128), X.astype(object).astype(str)
                .astype(object), np.where(np.isnan(X), None, X.astype(str)).astype(object)):
        for call in (m.raw, m.predict_proba, m.score_batch, m.contributions):
            with pytest.raises(TypeError, match="numbers only"):
                call(bad)
    obj = X.astype(object)
    obj[np.isnan(X)] = None
    for good in (X.astype(np.float64), X.astype(np.longdouble), obj):
        np.testing.assert_array_equal(m.raw(good), want)
    np.testing.assert_array_equal(m.raw(X > 0), m.raw((X > 0).astype(np.float32)))


@pytest.mark.parametrize("suffix", [".json", ".ubj", ".lgb"])
def test_a_pickle_under_a_model_suffix_is_named_and_never_loaded(tmp_path, suffix):
    """A review: pickle bytes named .json, .ubj or .lgb were refused with a bare
    UnicodeDecodeError; now by name, and still never unpickled."""
    import pickle

    from worker.model.ir import UnsupportedModelError

    marker = tmp_path / "ran"

    class Opens:  # unpickled, it creates the marker file
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = tmp_path / f"model{suffix}"
    path.write_bytes(pickle.dumps([Opens(), "x" * 100], protocol=4))
    pickle.loads(path.read_bytes()).pop(0).close()  # (the payload is real)
    assert marker.exists()
    marker.unlink()
    with pytest.raises(UnsupportedModelError, match="it is a pickle"):
        worker.compile_model(str(path))
    assert not marker.exists()
