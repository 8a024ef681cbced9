"""serve's one-row JSON path (worker/serve/onerow.py, issue 50): a one-row request of the
plain JSON form is answered without the general path's layers, and must be answered as the
general path answers it, byte for byte, with the same counts (rows, work units, requests,
missing values, flight monitoring), on hostile values; anything outside its form goes to the
general path; its scores are the libraries' own on hostile rows."""

from __future__ import annotations

import functools
import json
import os

import numpy as np
import pytest

import worker
from tests import models as M
from worker.config import load_settings
from worker.serve.service import Service

NAMES = [f"feat_{i}" for i in range(M.N_FEATURES)]
PATH = b"/v2/models/m/infer"
JSON_HEADERS = {b"content-type": b"application/json"}
F32_MAX = float(np.finfo(np.float32).max)
# JSON numbers a float32 cast turns to infinity, to zero, or keeps at its edges
EDGES = [6e38, -1e39, F32_MAX, -F32_MAX, 3.4028235677973366e38, 1e-46, -1e-46, 5e-324,
         -0.0, 0.0, 1.401298464324817e-45, 2.0**53, -(2.0**53)]
INT_EDGES = [0, 1, -7, 2**24 + 1, 2**53, -(2**53)]  # integers exact in float64


def _service(tmp_path, model, name: str = "m", serve: dict | None = None,
             scoring: dict | None = None, general: bool = False) -> Service:
    path = tmp_path / f"{name}-{id(model)}-{general}.model"
    if not path.exists():
        model.save(path)
    over = {"serve": serve} if serve else {}
    if scoring:
        over["scoring"] = scoring
    s = load_settings(None, defaults={"source": {"type": "file", "path": os.devnull}},
                      model={"path": str(path)}, **over)
    svc = Service(s, str(path), name)
    svc.load()
    if general:  # the general path only: the answers the one-row path must give
        svc.current.one_row = None
    return svc


def _pair(tmp_path, model, **kw) -> tuple[Service, Service, list]:
    """The service as it is, the same with the general path only, and a list the first's
    one-row answers are noted in (True: the one-row path answered)."""
    fast = _service(tmp_path, model, **kw)
    general = _service(tmp_path, model, general=True, **kw)
    taken: list[bool] = []
    real = fast._one_row

    def noted(headers, body):
        got = real(headers, body)
        taken.append(got is not None)
        return got

    fast._one_row = noted
    return fast, general, taken


def _doc(row, name="input-0", datatype="FP32", nested=False, rid=None, **extra) -> dict:
    data = [None if isinstance(v, float) and np.isnan(v) else v for v in row]
    doc = {"inputs": [{"name": name, "shape": [1, len(data)], "datatype": datatype,
                       "data": [data] if nested else data}]}
    if rid is not None:
        doc["id"] = rid
    doc.update(extra)
    return doc


def _py(row: np.ndarray) -> list:
    return [float(v) for v in row]


def _bodies(thresholds: np.ndarray, n_features: int, seed: int = 0) -> list[bytes]:
    """One-row bodies: hostile rows (missing values, zeros, values on the splits, numbers at
    float32's edges, integers) in the path's form, and forms just outside it."""
    rng = np.random.default_rng(seed)
    X = M.hostile_rows(120, thresholds, seed, inf=False)[:, :n_features]
    rows = [_py(r) for r in X]
    for i, r in enumerate(rows[:40]):  # float32's edges and integers among the values
        r[i % n_features] = EDGES[i % len(EDGES)]
        r[(i + 3) % n_features] = INT_EDGES[i % len(INT_EDGES)]
    out = [json.dumps(_doc(r)).encode() for r in rows]
    r = rows[5]
    variants = [
        _doc(r, datatype="FP64"), _doc(r, nested=True), _doc(r, rid="req-1"),
        _doc(r, rid="\u00e9\"\\\n\u2028 x"), _doc(r, rid=""), _doc(r, name="x" * 256),
        # outside the form: the general path's answer (scored, or refused with its reason)
        _doc(r, rid=7), _doc(r, rid=None, id=None), _doc(r, name="x" * 257), _doc(r, name=""),
        _doc(r, name=NAMES[0]), _doc(r, datatype="FP16"), _doc(r, datatype="INT32"),
        _doc(r, datatype="BOOL"), _doc(r, datatype=["FP32"]),
        _doc(r, outputs=[{"name": "score"}]), _doc(r, parameters={}),
        _doc(r, parameters={"binary_data_output": True}), _doc(r, other=1),
        _doc([*r[:-1], True]), _doc([*r[:-1], "1"]), _doc([*r[:-1], [1.0]]),
        _doc([*r[:-1], 2**53 + 1]), _doc([*r[:-1], 2**53 + 2**29 + 1]),
        _doc([*r[:-1], -(2**63)]), _doc([*r[:-1], 10**30]),
        _doc([*r[:-1], {}]), _doc(r[:-1]), _doc([*r, 1.0]), {"inputs": []}, {"inputs": {}},
        {"inputs": [_doc(r)["inputs"][0], _doc(r)["inputs"][0]]}, {"id": "x"}, [], 1, {},
    ]
    for shape in ([1.0, n_features], [True, n_features], [1, n_features + 1],
                  [2, n_features], [1], [n_features], [1, n_features, 1], [-1, n_features],
                  "1x7"):
        d = _doc(r)
        d["inputs"][0]["shape"] = shape
        variants.append(d)
    d = _doc(r)
    d["inputs"][0]["parameters"] = {}
    variants.append(d)
    d = _doc(r, nested=True)
    d["inputs"][0]["data"].append(list(r))  # two nested rows for a shape of one
    variants.append(d)
    d = _doc(r)
    del d["inputs"][0]["datatype"]
    variants.append(d)
    out += [json.dumps(v).encode() for v in variants]
    out += [json.dumps(_doc(r)).encode().replace(b"[", b" [ ", 1),
            json.dumps(_doc(r)).encode().replace(b"0.", b"NaN, 0.", 1),  # NaN literal
            json.dumps(_doc(r)).encode()[:-1], b"", b"\xff",
            json.dumps(_doc([float(v) for v in rng.normal(size=n_features)])).encode()]
    return out


def _samples(svc: Service) -> dict:
    """The counters a request moves (the timing histogram aside), missing values flushed."""
    svc.metrics.flush_features()
    out = {}
    for fam in svc.metrics.registry.collect():
        if fam.name == "serve_request_seconds":
            out["seconds_count"] = sum(s.value for s in fam.samples
                                       if s.name.endswith("_count"))
            continue
        for s in fam.samples:
            if not s.name.endswith("_created"):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _monitor(svc: Service) -> list:
    m = svc.current
    if m.monitor is None:
        return []
    with svc._monitor_lock:
        svc._flush(m)
    mon = m.monitor
    return [None if a is None else np.asarray(a).tolist() for a in (
        mon.total, mon.total_scores, mon.total_bands)] + [mon.window_rows]


def _same_answers(fast: Service, general: Service, bodies: list[bytes],
                  headers=JSON_HEADERS, path=PATH) -> None:
    for body in bodies:
        a = fast.handle(b"POST", path, headers, body)
        b = general.handle(b"POST", path, headers, body)
        assert a == b, body[:300]
    assert _samples(fast) == _samples(general)
    assert _monitor(fast) == _monitor(general)


@functools.cache
def _lgb_binary():
    lgb = pytest.importorskip("lightgbm")
    X, y2, _, _ = M.training_data()
    return lgb.LGBMClassifier(n_estimators=20, num_leaves=15, min_child_samples=5,
                              verbose=-1, random_state=0).fit(X, y2)


def _models():
    xgbs, sks = M.xgboost_models(), M.sklearn_models()
    return {
        "xgb-binary-logistic": (xgbs["xgb-binary-logistic"],
                                M.xgboost_thresholds(xgbs["xgb-binary-logistic"])),
        "rf-binary": (sks["rf-binary"], M.sklearn_thresholds(sks["rf-binary"])),
        "gb-binary": (sks["gb-binary"], M.sklearn_thresholds(sks["gb-binary"])),
        "hgb-binary": (sks["hgb-binary"], M.sklearn_thresholds(sks["hgb-binary"])),
    }


@pytest.mark.parametrize("key", ["xgb-binary-logistic", "rf-binary", "gb-binary",
                                 "hgb-binary", "lgb-binary"])
def test_one_row_answers_are_the_general_paths_byte_for_byte(tmp_path, key):
    """Hostile one-row requests (and forms just outside the path's): the same status, body
    and headers as the general path, the same counters and monitoring counts; the path took
    every request of its form."""
    if key == "lgb-binary":
        src = _lgb_binary()
        thresholds = _lgb_thresholds(src)
    else:
        src, thresholds = _models()[key]
    model = worker.compile_model(src)
    fast, general, taken = _pair(tmp_path, model)
    assert fast.current.one_row is not None
    bodies = _bodies(thresholds, model.n_features)
    _same_answers(fast, general, bodies)
    assert all(taken[:120]), "the path's form went to the general path"
    assert sum(taken) >= 126 and not all(taken)


def _lgb_thresholds(clf) -> np.ndarray:
    """The model's split values as float32 (and their float32 neighbours), finite ones."""
    out = []

    def walk(node):
        if "threshold" in node:
            out.append(float(node["threshold"]))
            walk(node["left_child"])
            walk(node["right_child"])

    for t in clf.booster_.dump_model()["tree_info"]:
        walk(t["tree_structure"])
    t = np.array([v for v in out if abs(v) < F32_MAX], np.float32)
    return np.unique(np.concatenate([t, np.nextafter(t, np.float32(np.inf)),
                                     np.nextafter(t, np.float32(-np.inf))]))


def test_bands_ids_and_monitoring_against_a_reference(tmp_path):
    """Three thresholds (every band, and scores on them), ids, and flight monitoring with a
    reference profile: the same answers and the same monitoring counts."""
    booster = M.xgboost_models()["xgb-binary-logistic"]
    X, _, _, _ = M.training_data()
    model = worker.compile_model(booster).with_reference(X.astype(np.float32))
    fast, general, taken = _pair(tmp_path, model, scoring={"thresholds": [0.2, 0.5, 0.8]})
    rows = M.hostile_rows(300, M.xgboost_thresholds(booster), 11, inf=False)
    rows[:3] = rows[3:6]  # equal rows
    scores = model.predict_proba(rows)[:, 1]
    bodies = [json.dumps(_doc(_py(r), rid=f"r{i}")).encode() for i, r in enumerate(rows)]
    _same_answers(fast, general, bodies)
    assert all(taken)
    bands = [json.loads(fast.handle(b"POST", PATH, JSON_HEADERS, b)[2])["outputs"][2]["data"][0]
             for b in bodies]
    assert set(bands) == {0, 1, 2, 3}
    assert bands == np.searchsorted([0.2, 0.5, 0.8], scores, side="right").tolist()
    assert _monitor(fast)[0] is not None  # counted against the profile


def test_requests_outside_the_paths_form_go_to_the_general_path(tmp_path):
    """Headers, paths and methods the path does not take, and bounds a one-row request can
    meet (serve.max_json_bytes, serve.max_response_bytes): the general path's answers."""
    booster = M.xgboost_models()["xgb-binary-logistic"]
    model = worker.compile_model(booster)
    body = json.dumps(_doc(_py(M.hostile_rows(1, M.xgboost_thresholds(booster), 2, inf=False)[0]),
                           rid="abc")).encode()
    fast, general, taken = _pair(tmp_path, model)
    for headers in ({b"content-type": b"application/json; charset=utf-8"},
                    {b"content-type": b"text/plain"}, {},
                    {**JSON_HEADERS, b"content-encoding": b"identity"},
                    {**JSON_HEADERS, b"content-encoding": b"gzip"},
                    {**JSON_HEADERS, b"inference-header-content-length": str(len(body)).encode()},
                    {b"content-type": b"application/vnd.apache.arrow.stream"}):
        _same_answers(fast, general, [body], headers=headers)
    for path in (PATH + b"?x=1", PATH + b"/", b"/v2/models/m/versions/" +
                 model.model_id[:8].encode() + b"/infer", b"/v2/models/other/infer"):
        _same_answers(fast, general, [body], path=path)
    assert fast.handle(b"GET", PATH, JSON_HEADERS, body) == \
        general.handle(b"GET", PATH, JSON_HEADERS, body)
    assert not any(taken)
    assert fast.handle(b"POST", PATH, JSON_HEADERS, body)[0] == 200 and taken[-1]
    # bounds: a body past serve.max_json_bytes, an answer past serve.max_response_bytes
    # (a one-row answer's bound is past 1,024 bytes: 413, never answered past it)
    big = json.dumps(_doc(_py(M.hostile_rows(1, M.xgboost_thresholds(booster), 3, inf=False)[0]),
                          rid="x" * 1200)).encode()
    for serve in ({"max_json_bytes": 1024}, {"max_response_bytes": 1024}):
        fast, general, taken = _pair(tmp_path, model, serve=serve)
        _same_answers(fast, general, [body, big])
        assert fast.handle(b"POST", PATH, JSON_HEADERS, big)[0] == 413
    fast, general, taken = _pair(tmp_path, model, serve={"max_response_bytes": 4096})
    small = json.dumps(_doc(_py(M.hostile_rows(1, M.xgboost_thresholds(booster), 3, inf=False)[0]),
                            rid="x" * 100)).encode()
    _same_answers(fast, general, [small, big])
    assert taken == [True, False]


@pytest.mark.parametrize("key,scoring", [
    ("xgb-binary-logitraw", None), ("xgb-reg-squarederror", None),
    ("xgb-multi-softprob", None), ("xgb-binary-logistic", {"lazy": {"mode": "certified"}}),
    ("xgb-binary-logistic", {"explain": {"method": "treeshap"}})])
def test_models_and_settings_the_path_is_not_for(tmp_path, key, scoring):
    """Margins, regressions, several classes, a lazy policy, reason codes on every request:
    the general path answers (the path is not built for them)."""
    model = worker.compile_model(M.xgboost_models()[key])
    svc = _service(tmp_path, model, scoring=scoring)
    assert svc.current.one_row is None
    body = json.dumps(_doc([0.5] * model.n_features)).encode()
    assert svc.handle(b"POST", PATH, JSON_HEADERS, body)[0] == 200


def _library_scores(key: str, X: np.ndarray) -> np.ndarray:
    if key == "lgb-binary":
        return _lgb_binary().predict_proba(M.finite_for_library(X))[:, 1]
    if key.startswith("xgb"):
        import xgboost as xgb

        return M.xgboost_models()[key].predict(xgb.DMatrix(M.finite_for_library(X),
                                                           feature_names=NAMES))
    return M.sklearn_models()[key].predict_proba(M.finite_for_library(X))[:, 1]


@pytest.mark.parametrize("key", ["xgb-binary-logistic", "lgb-binary", "rf-binary",
                                 "hgb-binary"])
def test_one_row_scores_equal_the_librarys(tmp_path, key):
    """Each hostile row (missing values, zeros, values on the splits, numbers a float32 cast
    makes infinite) alone in a request, answered by the one-row path: the library's own
    probability, label and band."""
    if key == "lgb-binary":
        src = _lgb_binary()
        thresholds = _lgb_thresholds(src)
    else:
        src = M.xgboost_models()[key] if key.startswith("xgb") else M.sklearn_models()[key]
        thresholds = M.xgboost_thresholds(src) if key.startswith("xgb") else \
            M.sklearn_thresholds(src)
    model = worker.compile_model(src)
    fast, _, taken = _pair(tmp_path, model)
    X = M.hostile_rows(300, thresholds, 21, inf=False)
    X[:10, 2] = np.float32(3.0e38)  # past float32 once doubled below: infinity
    rows = [_py(r) for r in X]
    for r in rows[:10]:
        r[2] = 6e38
    X[:10, 2] = np.inf
    got = []
    for r in rows:
        status, _, out, _ = fast.handle(b"POST", PATH, JSON_HEADERS,
                                        json.dumps(_doc(r)).encode())
        assert status == 200, out
        got.append([o["data"][0] for o in json.loads(out)["outputs"][:3]])
    assert all(taken) and len(taken) == len(rows)
    score, label, band = (np.array(c) for c in zip(*got, strict=True))
    want = _library_scores(key, X)
    np.testing.assert_allclose(score, want, rtol=0, atol=2e-7 if key.startswith("xgb")
                               else 1e-12)
    np.testing.assert_array_equal(label, score > 0.5)
    np.testing.assert_array_equal(band, score >= 0.5)


def test_a_swapped_in_model_answers_one_row_requests(tmp_path):
    """A hot swap installs the new model's path with it: its answers name the new model and
    are its scores."""
    a = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    b = worker.compile_model(M.xgboost_models()["xgb-parallel-tree"])
    svc = _service(tmp_path, a)
    body = json.dumps(_doc([0.25] * a.n_features)).encode()
    first = json.loads(svc.handle(b"POST", PATH, JSON_HEADERS, body)[2])
    svc._staged = svc._prepare(b)
    second = json.loads(svc.handle(b"POST", PATH, JSON_HEADERS, body)[2])
    assert first["model_version"] == a.model_id and second["model_version"] == b.model_id
    x = np.full((1, a.n_features), 0.25, np.float32)
    assert second["outputs"][0]["data"][0] == b.predict_proba(x)[0, 1]
    assert first["outputs"][0]["data"][0] == a.predict_proba(x)[0, 1]


def _general_row(data: list) -> np.ndarray:
    from worker.serve import oip

    return oip._json_values(data, "x", len(data), oip.DTYPES["FP32"], "FP32", [1, len(data)])


INTEGER_EDGES = [2**31 - 1, 2**31, -(2**31), 2**32, 2**32 + 1, 2**53 - 1, 2**53, 2**53 + 1,
                 2**53 + 2**29 + 1, -(2**53) - 1, 2**63 - 1, -(2**63), 2**63, 2**64 - 1, 2**64,
                 -(2**64), 10**30, -(10**30), 10**400]


def test_the_row_stager_reads_values_as_the_general_path_or_refuses_them():
    """_eventread.json_row (the path's staging of a row's JSON values): each value as the
    general path's cast gives it (float32's edges, integers exact in float64, None), and -1
    for what it must leave to the general path: integers beyond 2^53 (cast there once, from
    the integer: 2^53 + 2^29 + 1 is 2^53 + 2^30 in float32, 2^53 through float64), booleans,
    strings, lists, objects, and a count not the row's."""
    from worker._eventread import json_row

    rng = np.random.default_rng(5)
    cases = [EDGES, INT_EDGES, [None] * 5, [1.5, None, -2], [0.1] * 64]
    for _ in range(300):
        pool = EDGES + INT_EDGES + [None, float(rng.normal()), float(rng.normal() * 1e30)]
        cases.append([pool[i] for i in rng.integers(0, len(pool), rng.integers(1, 20))])
    for data in cases:
        out = np.full(len(data), 7.0, np.float32)
        assert json_row(data, out) == sum(v is None for v in data), data
        np.testing.assert_array_equal(out, _general_row(data))
        assert np.array_equal(np.signbit(out), np.signbit(_general_row(data)))  # -0.0
    for v in INTEGER_EDGES:
        out = np.zeros(3, np.float32)
        want = -1 if abs(v) > 2**53 else 0
        assert json_row([1.0, v, None][:2] + [2.0], out) == want, v
        if want == 0:
            np.testing.assert_array_equal(out, _general_row([1.0, v, 2.0]))
    assert float(_general_row([2**53 + 2**29 + 1])[0]) == 2**53 + 2**30
    for bad in (True, False, "1", b"1", [1.0], {}, 1j, np.float64(1.0), np.int64(1)):
        assert json_row([1.0, bad], np.zeros(2, np.float32)) == -1, bad
    for n in (0, 1, 3):
        assert json_row([1.0, 2.0], np.zeros(n, np.float32)) == -1
    assert json_row([], np.zeros(0, np.float32)) == 0
    with pytest.raises(TypeError):
        json_row((1.0, 2.0), np.zeros(2, np.float32))  # a list, only
    with pytest.raises(ValueError):
        json_row([1.0], np.zeros(1, np.float64))  # float32 only


def test_127_thresholds_and_a_name_that_is_not_utf8(tmp_path):
    """A hostile review: 128 thresholds stopped serve from starting (the answer's bytes were
    made for every band as int8: 127 is now the config's bound, and the top band is
    answered); a model file's undecodable name stopped it with a traceback (the one-row
    path's URL), where it had exited 2 naming the model."""
    booster = M.xgboost_models()["xgb-binary-logistic"]
    model = worker.compile_model(booster)
    top = [i / 1e6 for i in range(1, 128)]
    fast, general, taken = _pair(tmp_path, model, scoring={"thresholds": top})
    body = json.dumps(_doc([0.25] * model.n_features)).encode()
    _same_answers(fast, general, [body])
    assert taken == [True]
    assert json.loads(fast.handle(b"POST", PATH, JSON_HEADERS, body)[2])["outputs"][2][
        "data"] == [127]
    s = load_settings(None, defaults={"source": {"type": "file", "path": os.devnull}},
                      model={"path": str(tmp_path / "x.model")})
    svc = Service(s, str(tmp_path / "x.model"), "mod\udce8le")
    assert svc._infer_path is None
    from worker._eventread import json_row

    with pytest.raises(TypeError):
        json_row(None, np.zeros(0, np.float32))
    with pytest.raises(TypeError):
        json_row([], None)


def test_through_the_server_the_answers_are_the_general_paths(tmp_path):
    """The real server (uvicorn's protocol, a client over a socket): one-row requests'
    answers, with their HTTP head, are the general path's, counted once each; a request the
    path does not take (charset in Content-Type) is answered alike."""
    from tests.test_serve import Server, get, post

    booster = M.xgboost_models()["xgb-binary-logistic"]
    model = worker.compile_model(booster)
    path = tmp_path / "m.model"
    model.save(path)
    general = _service(tmp_path, model, general=True)
    rows = M.hostile_rows(40, M.xgboost_thresholds(booster), 31, inf=False)
    bodies = [json.dumps(_doc(_py(r), rid=f"q{i}")).encode() for i, r in enumerate(rows)]
    s = Server(path, tmp_path)
    try:
        for body in bodies:
            for ctype in ("application/json", "application/json; charset=utf-8"):
                status, headers, out = post(s, "/v2/models/m/infer", body,
                                            {"Content-Type": ctype})
                want = general.handle(b"POST", PATH, {b"content-type": ctype.encode()}, body)
                assert (status, out) == (want[0], want[2])
                assert headers["content-type"] == "application/json"
                assert headers["model-id"] == model.model_id
                assert int(headers["content-length"]) == len(out)
        status, page = get(s, "/metrics")
        assert f'serve_requests_total{{route="infer",status="200"}} {2 * len(bodies)}.0' \
            in page.decode()
        assert f"serve_rows_total {2 * len(bodies)}.0" in page.decode()
    finally:
        assert s.stop() == 0


def test_the_bounds_at_their_edges(tmp_path):
    """serve.max_json_bytes: a body of exactly the bound is answered by the path, one byte
    more is the general path's 413; serve.max_response_bytes: an id that brings the answer's
    bound to exactly the limit is answered by the path, one character more is 413."""
    booster = M.xgboost_models()["xgb-binary-logistic"]
    model = worker.compile_model(booster)
    row = _py(M.hostile_rows(1, M.xgboost_thresholds(booster), 4, inf=False)[0])
    body = json.dumps(_doc(row)).encode()
    fast, general, taken = _pair(tmp_path, model, serve={"max_json_bytes": 1024})
    at, past = body + b" " * (1024 - len(body)), body + b" " * (1025 - len(body))
    _same_answers(fast, general, [at, past])
    assert taken == [True, False]
    assert fast.handle(b"POST", PATH, JSON_HEADERS, past)[0] == 413
    bound = fast.current.one_row.bound
    fast, general, taken = _pair(tmp_path, model, serve={"max_response_bytes": bound + 600})
    at = json.dumps(_doc(row, rid="x" * 100)).encode()
    past = json.dumps(_doc(row, rid="x" * 101)).encode()
    _same_answers(fast, general, [at, past])
    assert taken == [True, False]
    assert fast.handle(b"POST", PATH, JSON_HEADERS, past)[0] == 413
