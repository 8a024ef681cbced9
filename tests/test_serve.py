"""`scoring-worker serve`: the Open Inference Protocol (KServe v2) over HTTP, checked with
Triton's own HTTP client (tritonclient) against the real server process; scores equal the
libraries' own predictions on hostile rows in every body kind (JSON, binary tensors, Arrow);
hostile requests (malformed bodies and HTTP, wrong shapes and types, oversized bodies, slow
and idle clients) get a 4xx and the server keeps serving; hot swap between requests."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import yaml

import worker
from tests import models as M
from worker.config import load_settings
from worker.serve import oip
from worker.serve.service import Service

ROOT = Path(__file__).resolve().parent.parent
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

NAMES = [f"feat_{i}" for i in range(M.N_FEATURES)]


class Server:
    """``scoring-worker serve`` in its own process, on a port the system picks."""

    def __init__(self, model: Path, tmp: Path, config: dict | None = None, *args: str,
                 open_files: int | None = None):
        cfg = tmp / f"serve-{time.monotonic_ns()}.yaml"
        cfg.write_text(yaml.safe_dump(config or {}))
        self.log = open(tmp / f"serve-{time.monotonic_ns()}.log", "w+b")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "serve", "--model", str(model), "--port", "0",
             "--config", str(cfg), *args], cwd=ROOT, stdout=self.log, stderr=self.log,
            preexec_fn=None if open_files is None else lambda: resource.setrlimit(
                resource.RLIMIT_NOFILE, (open_files, open_files)))
        deadline = time.monotonic() + 60
        while True:
            text = Path(self.log.name).read_text(errors="replace")
            m = re.search(r"on http://([0-9.]+):(\d+)/v2", text)
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                break
            assert self.proc.poll() is None, text
            assert time.monotonic() < deadline, text
            time.sleep(0.05)
        self.url = f"{self.host}:{self.port}"
        self.wait_ready()

    def wait_ready(self, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            try:
                if get(self, "/v2/health/ready")[0] == 200:
                    return
            except OSError:
                pass
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline
            time.sleep(0.05)

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(20)
        self.log.close()
        return rc


def get(server, path):
    try:
        with urllib.request.urlopen(f"http://{server.url}{path}", timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post(server, path, body: bytes, headers=None):
    req = urllib.request.Request(f"http://{server.url}{path}", body,
                                 {"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def raw_http(server, data: bytes, timeout=10.0, read=True) -> bytes:
    with socket.create_connection((server.host, server.port), timeout=timeout) as s:
        s.sendall(data)
        if not read:
            return b""
        out = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except TimeoutError:
            pass
        return out


# ---- fixtures -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve-models")
    xgbs, sks = M.xgboost_models(), M.sklearn_models()
    out = {}
    for key, src in (("binary", xgbs["xgb-binary-logistic"]),
                     ("multi", xgbs["xgb-multi-softprob"]),
                     ("other", xgbs["xgb-parallel-tree"]),
                     ("rf", sks["rf-multi"]), ("reg", xgbs["xgb-reg-squarederror"])):
        m = worker.compile_model(src)
        if key == "rf":  # sklearn knows no feature names: the same ones as the boosters'
            m.feature_names = list(NAMES)
            m.meta["feature_names"] = list(NAMES)
        out[key] = d / f"{key}.model"
        m.save(out[key])
    return out


@pytest.fixture(scope="module")
def server(artifacts, tmp_path_factory):
    s = Server(artifacts["binary"], tmp_path_factory.mktemp("serve"),
               {"serve": {"max_body_bytes": 1 << 20, "max_rows": 5000,
                          "request_timeout_ms": 1500, "max_connections": 64,
                          "keepalive_timeout_ms": 5000}})
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def client(server):
    c = httpclient.InferenceServerClient(url=server.url)
    yield c
    c.close()


def _hostile(booster, n=400, seed=0, inf=True):
    return M.hostile_rows(n, M.xgboost_thresholds(booster), seed, inf=inf)


# ---- conformance with tritonclient ------------------------------------------------------------

def test_health_and_metadata_through_tritonclient(client, artifacts):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("binary")
    assert not client.is_model_ready("nonesuch")
    meta = client.get_model_metadata("binary")
    m = worker.load_model(artifacts["binary"])
    assert meta["name"] == "binary" and meta["versions"] == [m.model_id]
    assert meta["inputs"] == [{"name": "input-0", "datatype": "FP32",
                               "shape": [-1, M.N_FEATURES]}]
    assert [o["name"] for o in meta["outputs"]] == ["score", "label", "decision",
                                                     "work_units", "stop_reason"]
    assert meta["parameters"]["feature_names"] == NAMES
    server_meta = client.get_server_metadata()
    assert "binary_tensor_data" in server_meta["extensions"]
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.get_model_metadata("nonesuch")


@pytest.mark.parametrize("binary_in,binary_out", [(False, False), (True, False), (True, True),
                                                  (False, True)])
def test_scores_equal_predict_proba_on_hostile_rows(client, binary_in, binary_out):
    """Every body kind of tritonclient: scores equal XGBoost's predict on NaN, +-inf
    (binary) / numbers beyond float32 (JSON: inf after the cast), zeros, threshold values."""
    xgb = pytest.importorskip("xgboost")
    booster = M.xgboost_models()["xgb-binary-logistic"]
    X = _hostile(booster, inf=binary_in)
    if not binary_in:  # JSON cannot say inf: numbers a float32 cast makes +-inf of
        X[:7, 1] = np.float32(3.0e38)
    inp = httpclient.InferInput("input-0", list(X.shape), "FP32")
    inp.set_data_from_numpy(X, binary_data=binary_in)
    outs = [httpclient.InferRequestedOutput(n, binary_data=binary_out)
            for n in ("score", "label", "decision", "stop_reason", "work_units")]
    res = client.infer("binary", [inp], outputs=outs, request_id="r-1")
    want = booster.predict(xgb.DMatrix(M.finite_for_library(X), feature_names=NAMES))
    score = res.as_numpy("score")
    assert score.dtype == np.float64 and score.shape == (len(X),)
    np.testing.assert_allclose(score, want, rtol=0, atol=2e-7)
    assert (res.as_numpy("label") == (want > 0.5)).all()
    assert (res.as_numpy("decision") == (score >= 0.5)).all()
    assert [s.decode() if isinstance(s, bytes) else s
            for s in res.as_numpy("stop_reason")] == ["full"] * len(X)
    assert (res.as_numpy("work_units") == 25).all()
    r = res.get_response()
    assert r["id"] == "r-1" and r["model_name"] == "binary"
    assert r["model_version"] == r["parameters"]["model_id"]


def test_one_input_per_feature_with_missing_features(server):
    """Inputs named by the features (any order); a request that leaves a feature out is 400
    naming it (before: scored with it missing in every row); null is a missing value."""
    xgb = pytest.importorskip("xgboost")
    booster = M.xgboost_models()["xgb-binary-logistic"]
    X = _hostile(booster, n=50, seed=3, inf=False)
    X[:, 4] = np.nan  # feat_4 sent as nulls
    order = [6, *range(6), *range(7, len(NAMES))]
    inputs = [{"name": NAMES[j], "shape": [len(X)], "datatype": "FP64",
               "data": [None if np.isnan(v) else float(v) for v in X[:, j]]}
              for j in order]
    left_out = [t for t in inputs if t["name"] != "feat_4"]
    status, _, body = post(server, "/v2/models/binary/infer",
                           json.dumps({"inputs": left_out}).encode())
    assert status == 400 and "feat_4" in json.loads(body)["error"], body
    status, _, body = post(server, "/v2/models/binary/infer",
                           json.dumps({"inputs": inputs}).encode())
    assert status == 200, body
    score = np.array(json.loads(body)["outputs"][0]["data"])
    want = booster.predict(xgb.DMatrix(X, feature_names=NAMES))
    np.testing.assert_allclose(score, want, rtol=0, atol=2e-7)


def test_multiclass_and_forest_scores_equal_the_libraries(artifacts, tmp_path):
    xgb = pytest.importorskip("xgboost")
    for key, ref in (("multi", M.xgboost_models()["xgb-multi-softprob"]),
                     ("rf", M.sklearn_models()["rf-multi"])):
        s = Server(artifacts[key], tmp_path)
        try:
            thresholds = M.xgboost_thresholds(ref) if key == "multi" else \
                M.sklearn_thresholds(ref)
            X = M.hostile_rows(300, thresholds, 5, inf=True)
            c = httpclient.InferenceServerClient(url=s.url)
            inp = httpclient.InferInput("input-0", list(X.shape), "FP32")
            inp.set_data_from_numpy(X, binary_data=True)
            res = c.infer(key, [inp])
            c.close()
            Xl = M.finite_for_library(X)
            proba = ref.predict(xgb.DMatrix(Xl, feature_names=NAMES)) if key == "multi" \
                else ref.predict_proba(Xl)
            np.testing.assert_array_equal(res.as_numpy("label"), proba.argmax(axis=1))
            np.testing.assert_allclose(res.as_numpy("score"), proba.max(axis=1), rtol=0,
                                       atol=2e-6)
        finally:
            assert s.stop() == 0, s.output()[-3000:]


def test_arrow_body_is_answered_in_arrow_with_ids(server):
    xgb = pytest.importorskip("xgboost")
    booster = M.xgboost_models()["xgb-binary-logistic"]
    X = _hostile(booster, n=120, seed=9)
    cols = [pa.array(X[:, j]) for j in range(X.shape[1])]
    for ids in (None, pa.array([f"t{i}" for i in range(len(X))])):
        names = list(NAMES)
        if ids is not None:
            cols2, names = [*cols, ids], [*NAMES, "txn_id"]
        else:
            cols2 = cols
        batch = pa.RecordBatch.from_arrays(cols2, names=names)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as w:
            w.write_batch(batch)
        status, headers, body = post(server, "/v2/models/binary/infer",
                                     sink.getvalue().to_pybytes(),
                                     {"Content-Type": "application/vnd.apache.arrow.stream"})
        assert status == 200, body
        assert headers["Content-Type"] == "application/vnd.apache.arrow.stream"
        out = pa.ipc.open_stream(body).read_all()
        want = booster.predict(xgb.DMatrix(M.finite_for_library(X), feature_names=NAMES))
        np.testing.assert_allclose(out.column("score").to_numpy(), want, rtol=0, atol=2e-7)
        if ids is not None:
            assert out.column("id").to_pylist() == ids.to_pylist()
        assert headers["model-id"] == out.schema.metadata[b"model_id"].decode()


def test_reason_codes_when_asked(server):
    X = np.zeros((3, M.N_FEATURES), np.float32)
    X[1] = 2.0
    body = {"inputs": [{"name": "x", "shape": [3, M.N_FEATURES], "datatype": "FP32",
                        "data": X.ravel().tolist()}],
            "outputs": [{"name": "score"}, {"name": "reason_feature"},
                        {"name": "reason_value"}], "parameters": {"top_k": 2}}
    status, _, out = post(server, "/v2/models/binary/infer", json.dumps(body).encode())
    assert status == 200, out
    got = {o["name"]: o for o in json.loads(out)["outputs"]}
    assert got["reason_feature"]["shape"] == [3, 2]
    assert all(f in NAMES for f in got["reason_feature"]["data"])
    assert got["reason_value"]["shape"] == [3, 2]
    m = worker.load_model(server.proc.args[server.proc.args.index("--model") + 1])
    r = m.score_batch(X, explain="treeshap", top_k=2, explain_min_score=-np.inf)
    np.testing.assert_allclose(np.array(got["reason_value"]["data"]).reshape(3, 2),
                               r.reason_value, rtol=1e-6)


def test_reason_codes_name_the_features_xgboost_attributes_most(server):
    """The reason codes' names and values against XGBoost's own TreeSHAP (pred_contribs):
    each row's top features by absolute contribution, in order (issue 55: names shifted by
    one feature passed a check that each name is one of the model's)."""
    xgb = pytest.importorskip("xgboost")
    booster = M.xgboost_models()["xgb-binary-logistic"]
    X = np.random.default_rng(5).normal(size=(40, M.N_FEATURES)).astype(np.float32)
    X[::5, 2] = np.nan
    body = {"inputs": [{"name": "x", "shape": list(X.shape), "datatype": "FP32",
                        "data": [None if np.isnan(v) else float(v) for v in X.ravel()]}],
            "outputs": [{"name": "reason_feature"}, {"name": "reason_value"}],
            "parameters": {"top_k": 3}}
    status, _, out = post(server, "/v2/models/binary/infer", json.dumps(body).encode())
    assert status == 200, out
    got = {o["name"]: o for o in json.loads(out)["outputs"]}
    names = np.array(got["reason_feature"]["data"]).reshape(len(X), 3)
    values = np.array(got["reason_value"]["data"], dtype=np.float64).reshape(len(X), 3)
    contribs = booster.predict(xgb.DMatrix(X, feature_names=NAMES), pred_contribs=True)[:, :-1]
    order = np.argsort(-np.abs(contribs), axis=1, kind="stable")[:, :3]
    top = np.take_along_axis(contribs, order, axis=1)
    gaps = np.abs(np.abs(top[:, :-1]) - np.abs(top[:, 1:]))
    clear = (gaps > 1e-4).all(axis=1)  # rows whose order a float rounding cannot change
    assert clear.sum() >= 30
    assert (names[clear] == np.array(NAMES)[order[clear]]).all()
    np.testing.assert_allclose(values, top, rtol=0, atol=1e-5)


def test_serve_max_rows_at_its_edge(server):
    """serve.max_rows (5,000 here): 5,000 rows scored, 5,001 refused with 413 naming it."""
    for rows, want in ((5000, 200), (5001, 413)):
        X = np.ones((rows, M.N_FEATURES), np.float32).tobytes()
        head = json.dumps({"inputs": [{"name": "x", "shape": [rows, M.N_FEATURES],
                                       "datatype": "FP32",
                                       "parameters": {"binary_data_size": len(X)}}]}).encode()
        status, _, out = post(server, "/v2/models/binary/infer", head + X,
                              {"Inference-Header-Content-Length": str(len(head)),
                               "Content-Type": "application/octet-stream"})
        assert status == want, (rows, out[:200])
        if want == 413:
            assert b"max_rows" in out, out


def test_content_length_at_the_body_limit(server):
    """serve.max_body_bytes (1 MiB here): a body of exactly that many bytes is read (and
    answered for what it is), one byte more is refused with 413 before it is read."""
    limit = 1 << 20
    pad = b'{"inputs": []}'
    body = pad + b" " * (limit - len(pad))
    status, _, out = post(server, "/v2/models/binary/infer", body)
    assert status == 400 and b"inputs" in out, (status, out[:200])  # read, then judged
    out = raw_http(server, b"POST /v2/models/binary/infer HTTP/1.1\r\nHost: x\r\n"
                   b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                   % (limit + 1), timeout=5)
    assert out.startswith(b"HTTP/1.1 413"), out[:200]


# ---- hostile requests --------------------------------------------------------------------------

BAD_BODIES = {
    b"": 400, b"not json": 400, b"[]": 400, b'{"inputs": []}': 400,
    b'{"inputs": [1]}': 400, b'{"inputs": [{"name": "x"}]}': 400,
    b'{"inputs": [{"name": "x", "shape": [1, 7], "datatype": "FP32"}]}': 400,
    b'{"inputs": [{"name": "x", "shape": [1, 6], "datatype": "FP32", "data": [1,2,3,4,5,6]}]}':
        400,
    b'{"inputs": [{"name": "x", "shape": [1, 7], "datatype": "BYTES", "data": ["a"]}]}': 400,
    b'{"inputs": [{"name": "x", "shape": [1, 7], "datatype": "FP32", "data": [1,2,3,"4",5,6,7]'
    b'}]}': 400,
    b'{"inputs": [{"name": "x", "shape": [1, 7], "datatype": "FP32", "data": [1,2,3,{},5,6,7]'
    b'}]}': 400,
    b'{"inputs": [{"name": "x", "shape": [2, 7], "datatype": "FP32", "data": [1,2]}]}': 400,
    b'{"inputs": [{"name": "x", "shape": [1, -7], "datatype": "FP32", "data": []}]}': 400,
    b'{"inputs": [{"name": "x", "shape": [1, 7.0], "datatype": "FP32", "data": []}]}': 400,
    b'{"inputs": [{"name": "x", "shape": [true, 7], "datatype": "FP32", "data": []}]}': 400,
    b'{"inputs": [{"name": "x", "shape": [1, 7], "datatype": "INT32", "data": [1,2,3,4,5,6,'
    b'7.5]}]}': 400,
    b'{"inputs": [{"name": "x", "shape": [1, 7], "datatype": "BOOL", "data": [1,2,3,4,5,6,7]'
    b'}]}': 400,
    b'{"inputs": [{"name": "feat_0", "shape": [1], "datatype": "FP32", "data": [1]}, '
    b'{"name": "feat_0", "shape": [1], "datatype": "FP32", "data": [1]}]}': 400,
    b'{"inputs": [{"name": "feat_0", "shape": [1], "datatype": "FP32", "data": [1]}, '
    b'{"name": "feat_1", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}': 400,
    b'{"inputs": [{"name": "feat_0", "shape": [1], "datatype": "FP32", "data": [1]}, '
    b'{"name": "nofeature", "shape": [1], "datatype": "FP32", "data": [1]}]}': 400,
    b'{"inputs": [{"name": "x", "shape": [9999999, 7], "datatype": "FP32", "data": []}]}':
        413,
    b'{"inputs": [{"name": "x", "shape": [1, 7], "datatype": "FP32", "data": [[1,2,3,4,5,6,'
    b'[7]]]}]}': 400,
    b'{"inputs": [{"name": "x", "shape": [1, 7], "datatype": "FP32", "data": [1,2,3,4,5,6,7]}]'
    b', "outputs": [{"name": "nonesuch"}]}': 400,
    b'{"inputs": [{"name": "x", "shape": [1, 7], "datatype": "FP32", "data": [1,2,3,4,5,6,7]}]'
    b', "parameters": {"top_k": 0}}': 400,
    b"[" * 100_000 + b"]" * 100_000: 400,
}


def test_malformed_requests_get_400_and_the_server_keeps_serving(server):
    for body, want in BAD_BODIES.items():
        status, _, out = post(server, "/v2/models/binary/infer", body)
        assert status == want, (body[:120], out)
        assert "error" in json.loads(out)
    status, _, _ = post(server, "/v2/models/nonesuch/infer", b"{}")
    assert status == 404
    assert get(server, "/v2/models/binary/infer")[0] == 405
    assert get(server, "/v2/nonesuch")[0] == 404
    status, _, _ = post(server, "/v2/models/binary/infer", b"{}",
                        {"Content-Encoding": "gzip"})
    assert status == 415
    assert server.proc.poll() is None
    ok = b'{"inputs": [{"name": "x", "shape": [1, 7], "datatype": "FP32", ' \
         b'"data": [1,2,3,4,5,6,7]}]}'
    assert post(server, "/v2/models/binary/infer", ok)[0] == 200


def test_binary_tensor_sizes_are_checked_against_the_body(server):
    X = np.ones((2, M.N_FEATURES), np.float32).tobytes()

    def send(size, data, hlen=None, shape=(2, M.N_FEATURES)):
        head = json.dumps({"inputs": [{"name": "x", "shape": list(shape), "datatype": "FP32",
                                       "parameters": {"binary_data_size": size}}]}).encode()
        n = len(head) if hlen is None else hlen
        return post(server, "/v2/models/binary/infer", head + data,
                    {"Inference-Header-Content-Length": str(n),
                     "Content-Type": "application/octet-stream"})

    assert send(len(X), X)[0] == 200
    for size, data, hlen in [(len(X), X[:-1], None), (len(X) - 4, X, None),
                             (len(X), X + b"\0", None), (2**63 - 1, X, None), (-1, X, None),
                             (2**32, X, None), (len(X), X, 10**12), (len(X), X, -5),
                             (len(X), X, 3)]:
        status, _, out = send(size, data, hlen)
        assert status == 400, (size, len(data), hlen, out)
    for shape in [(2**31, M.N_FEATURES), (2**63 - 1, M.N_FEATURES), (2, 2**32)]:
        status, _, out = send(len(X), X, shape=shape)
        assert status in (400, 413), (shape, out)
    status, _, out = post(server, "/v2/models/binary/infer", b"{}",
                          {"Inference-Header-Content-Length": "x1"})
    assert status == 400


def test_an_oversized_body_is_refused_before_it_is_sent(server):
    """Content-Length over serve.max_body_bytes: 413 at once, the body never read."""
    t0 = time.monotonic()
    out = raw_http(server, b"POST /v2/models/binary/infer HTTP/1.1\r\nHost: x\r\n"
                   b"Content-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n",
                   timeout=5)
    assert out.startswith(b"HTTP/1.1 413"), out[:200]
    assert time.monotonic() - t0 < 4
    # chunked, no length: refused once it passes the limit
    chunk = b"x" * 65536
    data = b"".join(b"%x\r\n" % len(chunk) + chunk + b"\r\n" for _ in range(20))
    out = raw_http(server, b"POST /v2/models/binary/infer HTTP/1.1\r\nHost: x\r\n"
                   b"Transfer-Encoding: chunked\r\n\r\n" + data, timeout=5)
    assert out.startswith(b"HTTP/1.1 413"), out[:200]


def test_malformed_http_and_huge_headers(server):
    assert raw_http(server, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert raw_http(server, b"GET /v2 HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 40000 +
                    b"\r\n\r\n").startswith(b"HTTP/1.1 431")
    assert raw_http(server, b"GET /" + b"a" * 40000 + b" HTTP/1.1\r\n\r\n").startswith(
        b"HTTP/1.1 414")
    assert get(server, "/v2/health/live")[0] == 200


def test_headers_at_serve_max_header_bytes(server):
    """serve.max_header_bytes (16 KiB, its default): the request line's target and each
    header's name and value plus 4 (": " and CRLF) count; at the limit the request is
    answered, one byte past it 431."""
    limit = 16 << 10
    url, host = b"/v2/health/live", (b"Host", b"x")
    close = (b"Connection", b"close")
    fixed = len(url) + sum(len(k) + len(v) + 4 for k, v in (host, close)) + len(b"X") + 4
    for n, want in ((limit - fixed, b"HTTP/1.1 200"), (limit - fixed + 1, b"HTTP/1.1 431")):
        out = raw_http(server, b"GET " + url + b" HTTP/1.1\r\nHost: x\r\nConnection: close"
                       b"\r\nX: " + b"a" * n + b"\r\n\r\n", timeout=5)
        assert out.startswith(want), (n, out[:200])


def test_slow_and_idle_clients_are_bounded(server):
    """A request that trickles in past serve.request_timeout_ms gets 408 and is closed; idle
    connections beyond serve.max_connections are answered 503 and closed as they arrive;
    service goes on."""
    with socket.create_connection((server.host, server.port), timeout=10) as s:
        s.sendall(b"POST /v2/models/binary/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100"
                  b"\r\n\r\n{")
        t0 = time.monotonic()
        got = s.recv(4096)
        assert got.startswith(b"HTTP/1.1 408"), got
        assert 1.0 < time.monotonic() - t0 < 8
    idle = []
    try:
        for _ in range(200):  # max_connections is 64
            idle.append(socket.create_connection((server.host, server.port), timeout=5))
        time.sleep(0.3)
        closed = 0
        for s in idle:
            s.setblocking(False)
            try:
                if s.recv(1) in (b"", b"H"):  # closed, or 503 then closed
                    closed += 1
            except BlockingIOError:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed >= 200 - 64
    finally:
        for s in idle:
            s.close()
    time.sleep(0.2)
    assert get(server, "/v2/health/ready")[0] == 200
    text = get(server, "/metrics")[1].decode()
    assert re.search(r"serve_connections_refused_total [1-9]", text), text[-2000:]
    assert 'serve_requests_total{route="http",status="408"}' in text


def test_metrics(server):
    assert post(server, "/v2/models/binary/infer", b"{")[0] == 400
    text = get(server, "/metrics")[1].decode()
    for name in ("serve_request_seconds_bucket", "serve_rows_total", "serve_ready 1.0",
                 'serve_requests_total{route="infer",status="400"}', "serve_model_info"):
        assert name in text, name


# ---- the model's life ----------------------------------------------------------------------------

def test_readiness_is_false_until_the_model_is_loaded(artifacts):
    s = load_settings(None, defaults={"source": {"type": "file", "path": os.devnull}},
                      model={"path": str(artifacts["binary"])})
    svc = Service(s, str(artifacts["binary"]), "binary")
    assert svc.handle(b"GET", b"/v2/health/live", {}, b"")[0] == 200
    assert svc.handle(b"GET", b"/v2/health/ready", {}, b"")[0] == 503
    assert svc.handle(b"GET", b"/v2/models/binary/ready", {}, b"")[0] == 503
    assert svc.handle(b"POST", b"/v2/models/binary/infer", {}, b"{}")[0] == 503
    svc.load()
    assert svc.handle(b"GET", b"/v2/health/ready", {}, b"")[0] == 200


def test_hot_swap_between_requests(artifacts, tmp_path):
    path = tmp_path / "live.model"
    path.write_bytes(artifacts["binary"].read_bytes())
    s = Server(path, tmp_path, {"model": {"reload": True, "reload_interval_ms": 50}},
               "--name", "live")
    try:
        body = json.dumps({"inputs": [{"name": "x", "shape": [1, M.N_FEATURES],
                                       "datatype": "FP32", "data": [0.5] * M.N_FEATURES}]}
                          ).encode()
        first = json.loads(post(s, "/v2/models/live/infer", body)[2])["model_version"]
        new = worker.load_model(artifacts["other"])
        new.save(path)
        deadline = time.monotonic() + 20
        while True:
            status, headers, out = post(s, "/v2/models/live/infer", body)
            assert status == 200
            got = json.loads(out)
            assert got["model_version"] == headers["model-id"]
            if got["model_version"] == new.model_id:
                break
            assert got["model_version"] == first
            assert time.monotonic() < deadline
            time.sleep(0.05)
        score = got["outputs"][0]["data"][0]
        assert score == pytest.approx(float(new.score_batch(
            np.full((1, M.N_FEATURES), 0.5, np.float32)).score[0]), abs=1e-12)
    finally:
        assert s.stop() == 0, s.output()[-3000:]


def test_workers_share_the_port_and_stop_together(artifacts, tmp_path):
    s = Server(artifacts["binary"], tmp_path, None, "--workers", "2")
    try:
        children = subprocess.run(["pgrep", "-P", str(s.proc.pid)], capture_output=True,
                                  text=True).stdout.split()
        assert len(children) == 2
        deadline = time.monotonic() + 60  # both loaded (each listens once it has)
        while not re.search(r"^serve_ready 1\.0$", get(s, "/metrics")[1].decode(), re.M):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        body = json.dumps({"inputs": [{"name": "x", "shape": [1, M.N_FEATURES],
                                       "datatype": "FP32",
                                       "data": [None] + [0.5] * (M.N_FEATURES - 1)}]}).encode()
        for _ in range(20):
            assert post(s, "/v2/models/binary/infer", body)[0] == 200
        # whichever process answers /metrics counts both processes' requests, the missing
        # values with them (review: added up each second, a page read at once showed 11 of
        # the 20 rows' missing values)
        for _ in range(4):
            text = get(s, "/metrics")[1].decode()
            assert re.search(r"^serve_rows_total 20\.0$", text, re.M), text[-3000:]
            assert re.search(r'^serve_feature_missing_total{feature="feat_0"} 20\.0$', text,
                             re.M), text[-3000:]
    finally:
        assert s.stop() == 0, s.output()[-3000:]


def test_bad_model_and_bad_config_exit_2(tmp_path, artifacts):
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"\0not a model" * 50)
    for args in (["--model", str(bad)], ["--model", str(tmp_path / "missing.model")],
                 ["--model", str(artifacts["binary"]), "--port", "70000"],
                 ["--model", str(artifacts["binary"]), "--workers", "0"]):
        r = subprocess.run([sys.executable, "-m", "worker.cli", "serve", "--port", "0", *args]
                           if "--port" not in args else
                           [sys.executable, "-m", "worker.cli", "serve", *args],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (args, r.stderr)
        assert "Traceback" not in r.stderr
        assert "error" in r.stderr


def test_parse_infer_edges():
    """The parser alone, at integer edges, without a server."""
    index = {f: j for j, f in enumerate(NAMES)}
    F = M.N_FEATURES
    for shape in ([2**31, F], [2**32, F], [2**63 - 1, F], [0, F]):
        body = json.dumps({"inputs": [{"name": "x", "shape": shape, "datatype": "FP32",
                                       "data": []}]}).encode()
        with pytest.raises(oip.RequestError) as e:
            oip.parse_infer(body, None, index, 100, True, False)
        # no rows: 400, as an Arrow body of none (issue 50: JSON answered 200)
        assert e.value.status == (400 if shape[0] == 0 else 413)
    # an FP64 tensor's numbers are float64s (as its binary form is), then float32
    edge = [2**53 + 1, 2**62 + 3, 2**63 - 1, -2**63, 2**64 - 1, 16777217, 1e39, -1e39,
            2**53 + 2**29 + 1]
    body = json.dumps({"inputs": [{"name": "feat_0", "shape": [len(edge)], "datatype": "FP64",
                                   "data": edge}]}).encode()
    X = oip.parse_infer(body, None, index, 100, True, False).X
    for v, got in zip(edge, X[:, 0], strict=True):
        with np.errstate(over="ignore"):
            ref = np.float32(np.float64(v))
        assert got == ref, v
    assert X[-1, 0] == np.float32(2**53)  # through float64; in one rounding 2^53 + 2^30
    assert np.isnan(X[:, 1:]).all()


# ---- what an attacker's review found (each failed before its fix) -------------------------------

def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def tight(artifacts, tmp_path_factory):
    s = Server(artifacts["binary"], tmp_path_factory.mktemp("serve-tight"),
               {"serve": {"max_connections": 6, "keepalive_timeout_ms": 1000,
                          "request_timeout_ms": 3000, "max_json_bytes": 4096}})
    yield s
    assert s.stop() == 0, s.output()


def _nonreading_socket(server) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((server.host, server.port))
    s.settimeout(0.2)
    return s


def test_connections_at_serve_max_connections(tight):
    """serve.max_connections (6 here): six connections are each answered, a seventh is
    closed unanswered, and once one of the six closes a new one is answered again."""
    live = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"

    def answered(s) -> bool:
        try:
            s.sendall(live)
            return s.recv(4096).startswith(b"HTTP/1.1 200")
        except OSError:  # reset: closed at once
            return False

    time.sleep(1.5)  # the other tests' keep-alive connections closed (keepalive 1 s)
    held = [socket.create_connection((tight.host, tight.port), timeout=5) for _ in range(6)]
    try:
        assert all(answered(s) for s in held)
        with socket.create_connection((tight.host, tight.port), timeout=5) as extra:
            assert not answered(extra)
        held.pop().close()
        time.sleep(0.2)
        with socket.create_connection((tight.host, tight.port), timeout=5) as again:
            assert answered(again)
            # the refusal is counted and said (issue 50: nothing was counted or logged)
            again.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            page = b""
            while chunk := again.recv(65536):
                page += chunk
        refused = re.search(rb"^serve_connections_refused_total (\S+)$", page, re.M)
        assert refused and float(refused.group(1)) >= 1, page[-2000:]
        deadline = time.monotonic() + 5
        while "connection refused: serve.max_connections are open" not in tight.output():
            assert time.monotonic() < deadline, tight.output()[-3000:]
            time.sleep(0.1)
    finally:
        for s in held:
            s.close()


def test_json_at_serve_max_json_bytes(tight):
    """serve.max_json_bytes (4,096 here): a JSON request of exactly that many bytes is scored,
    one byte more is 413 naming the bound and the way out (binary tensors or Arrow)."""
    req = b'{"inputs": [{"name": "x", "shape": [1, 7], "datatype": "FP32", ' \
          b'"data": [1,2,3,4,5,6,7]}]}'
    for size, want in ((4096, 200), (4097, 413)):
        status, _, out = post(tight, "/v2/models/binary/infer",
                              req + b" " * (size - len(req)))
        assert status == want, (size, out[:200])
    assert b"serve.max_json_bytes" in out and b"binary tensors" in out


def test_pipelining_without_reading_the_answers_is_bounded(tight):
    """Requests sent without their answers being read: the server stops reading from the
    client (its memory does not grow with what is sent), and drops it when idle."""
    before = _rss_mb(tight.proc.pid)
    req = b"GET /v2/models/binary HTTP/1.1\r\nHost: x\r\n\r\n" * 2000
    s = _nonreading_socket(tight)
    sent, t0 = 0, time.monotonic()
    try:
        while time.monotonic() - t0 < 4:
            try:
                sent += s.send(req)
            except (TimeoutError, BlockingIOError):
                pass
            except (BrokenPipeError, ConnectionResetError):
                break
        assert _rss_mb(tight.proc.pid) - before < 100
    finally:
        s.close()
    assert get(tight, "/v2/health/live")[0] == 200


def test_clients_that_stop_reading_do_not_keep_their_slots(tight):
    socks = []
    try:
        for _ in range(6):  # every slot: each with answers it does not read
            s = _nonreading_socket(tight)
            with contextlib.suppress(OSError):  # a timeout, or dropped already
                s.send(b"GET /v2/models/binary HTTP/1.1\r\nHost: x\r\n\r\n" * 8000)
            socks.append(s)
        time.sleep(2.5)  # the keep-alive timeout (1 s) aborts them
        assert get(tight, "/v2/health/live")[0] == 200
    finally:
        for s in socks:
            s.close()


def send_endless(server, head: bytes, pieces: int) -> bytes:
    """``head``, then a value that never ends (``pieces`` of 16 KiB): the first bytes of
    the answer, if any came before the server closed."""
    got = b""
    with socket.create_connection((server.host, server.port), timeout=10) as s:
        s.sendall(head)
        with contextlib.suppress(OSError):  # the server closed, or reset
            for _ in range(pieces):
                s.sendall(b"a" * 16384)
        with contextlib.suppress(OSError):
            got = s.recv(4096)
    return got


def test_a_header_value_that_never_ends_gets_431_with_bounded_memory(tight):
    before = _rss_mb(tight.proc.pid)
    got = send_endless(tight, b"GET /v2 HTTP/1.1\r\nHost: x\r\nX: ", 2000)
    assert got == b"" or got.startswith(b"HTTP/1.1 431"), got[:100]
    assert _rss_mb(tight.proc.pid) - before < 100
    assert get(tight, "/v2/health/live")[0] == 200


def test_upgrades_get_one_answer(server):
    out = raw_http(server, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                   b"Upgrade: h2c\r\n\r\nGET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    assert out.count(b"HTTP/1.1 ") == 1 and out.startswith(b"HTTP/1.1 400"), out[:300]
    out = raw_http(server, b"POST /v2/models/binary/infer HTTP/1.1\r\nHost: x\r\n"
                   b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 501"), out[:200]


@pytest.mark.parametrize("body", [
    # lone surrogates through the NaN-literal reader: a name, an id
    b'{"inputs":[{"name":"\\ud800","datatype":"FP32","shape":[1,7],"data":[1,2,3,4,5,6,NaN]}]}',
    b'{"id":"\\ud800","inputs":[{"name":"x","datatype":"FP32","shape":[1,7],'
    b'"data":[1,2,3,4,5,6,NaN]}]}',
    # rows of the wrong widths that add up to the right count
    b'{"inputs":[{"name":"x","datatype":"FP32","shape":[2,7],"data":[[1],[2,3,4,5,6,7,8,9,10,'
    b'11,12,13,14]]}]}',
    b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,7],"data":[[],[1,2,3,4,5,6,7]]}]}',
    # values outside their declared type
    b'{"inputs":[{"name":"feat_0","datatype":"UINT8","shape":[1],"data":[-1]}]}',
    b'{"inputs":[{"name":"feat_0","datatype":"INT8","shape":[1],"data":[300]}]}',
], ids=["surrogate-name", "surrogate-id", "uneven-rows", "empty-row", "uint8", "int8"])
def test_review_findings_are_400(server, body):
    status, _, out = post(server, "/v2/models/binary/infer", body)
    assert status == 400, out


def test_an_integer_beyond_float64_with_nan_literals_is_scored(server):
    body = (b'{"inputs":[{"name":"x","datatype":"FP64","shape":[1,7],"data":[1' + b"0" * 400
            + b',2,3,4,5,6,NaN]}]}')
    status, _, out = post(server, "/v2/models/binary/infer", body)
    assert status == 200, out


def test_the_lazy_policy_and_thresholds_are_the_workers(artifacts, tmp_path):
    """scoring.lazy and scoring.thresholds apply to requests: certified stopping evaluates
    fewer trees on some rows and never changes a decision band against full evaluation."""
    booster = M.xgboost_models()["xgb-binary-logistic"]
    X = _hostile(booster, n=500, seed=21)
    s = Server(artifacts["binary"], tmp_path,
               {"scoring": {"thresholds": [0.3, 0.7], "lazy": {"mode": "certified"}}})
    try:
        c = httpclient.InferenceServerClient(url=s.url)
        inp = httpclient.InferInput("input-0", list(X.shape), "FP32")
        inp.set_data_from_numpy(X, binary_data=True)
        res = c.infer("binary", [inp])
        c.close()
    finally:
        assert s.stop() == 0, s.output()[-3000:]
    full = worker.load_model(artifacts["binary"]).score_batch(X, thresholds=[0.3, 0.7])
    np.testing.assert_array_equal(res.as_numpy("decision"), full.decision)
    assert set(np.unique(full.decision)) == {0, 1, 2}
    work = res.as_numpy("work_units")
    assert (work <= 25).all() and (work < 25).any()
    stops = {x.decode() if isinstance(x, bytes) else x for x in res.as_numpy("stop_reason")}
    assert stops - {"full"}


# ---- what mutation testing found unheld ---------------------------------------------------------

_INDEX = {f: j for j, f in enumerate(NAMES)}


def _binary_post(server, inputs: list[dict], chunks: list[bytes], trailing: bytes = b""):
    head = json.dumps({"inputs": inputs}).encode()
    return post(server, "/v2/models/binary/infer", head + b"".join(chunks) + trailing,
                {"Inference-Header-Content-Length": str(len(head)),
                 "Content-Type": "application/octet-stream"})


def _error(out: bytes) -> str:
    return json.loads(out)["error"]


def _parse(inputs: list[dict], contract=_INDEX) -> np.ndarray:
    body = json.dumps({"inputs": inputs}).encode()
    return oip.parse_infer(body, None, contract, 100, True, False).X


def test_a_matrix_narrower_than_the_models_features_is_refused(server):
    """[7, 6] with 49 values (7 rows of the model's 7) is not [n, 7]: refused, not reshaped."""
    F = M.N_FEATURES
    body = {"inputs": [{"name": "x", "shape": [7, F - 1], "datatype": "FP32",
                        "data": [1.0] * (7 * F)}]}
    status, _, out = post(server, "/v2/models/binary/infer", json.dumps(body).encode())
    assert status == 400 and f"[7, {F - 1}]" in _error(out), out
    X = np.ones((2, F), np.float32).tobytes()
    status, _, out = _binary_post(server, [{"name": "x", "shape": [2, F - 1], "datatype": "FP32",
                                            "parameters": {"binary_data_size": len(X)}}], [X])
    assert status == 400 and f"[2, {F - 1}]" in _error(out), out


def test_binary_bytes_no_input_claims_are_refused_counting_them(server):
    F = M.N_FEATURES
    X = np.ones((2, F), np.float32).tobytes()
    matrix = [{"name": "x", "shape": [2, F], "datatype": "FP32",
               "parameters": {"binary_data_size": len(X)}}]
    status, _, out = _binary_post(server, matrix, [X], trailing=b"\0\0\0")
    assert status == 400 and re.search(r"(?<![\d.])3 bytes of binary data", _error(out)), out
    # every input JSON: all of the binary part is unclaimed
    json_only = [{"name": "x", "shape": [1, F], "datatype": "FP32", "data": [1.0] * F}]
    status, _, out = _binary_post(server, json_only, [], trailing=b"\1" * 5)
    assert status == 400 and re.search(r"(?<![\d.])5 bytes of binary data", _error(out)), out


def test_one_binary_input_per_feature_scores_as_xgboost(client):
    """Seven binary tensors one after another (FP32 and FP64 alternating): each read at its
    own offset, NaN and +-inf included."""
    xgb = pytest.importorskip("xgboost")
    booster = M.xgboost_models()["xgb-binary-logistic"]
    X = _hostile(booster, n=64, seed=11, inf=True)
    inputs = []
    for j, name in enumerate(NAMES):
        dt, col = ("FP64", X[:, j].astype(np.float64)) if j % 2 else ("FP32", X[:, j])
        t = httpclient.InferInput(name, [len(X)], dt)
        t.set_data_from_numpy(col, binary_data=True)
        inputs.append(t)
    res = client.infer("binary", inputs)
    want = booster.predict(xgb.DMatrix(M.finite_for_library(X), feature_names=NAMES))
    np.testing.assert_allclose(res.as_numpy("score"), want, rtol=0, atol=2e-7)


def test_nested_json_rows_score_as_xgboost(server):
    """The protocol's nested form: [[row], [row], ...] for shape [n, 7]."""
    xgb = pytest.importorskip("xgboost")
    booster = M.xgboost_models()["xgb-binary-logistic"]
    X = _hostile(booster, n=40, seed=12, inf=False)
    rows = [[None if np.isnan(v) else float(v) for v in row] for row in X]
    body = {"inputs": [{"name": "x", "shape": list(X.shape), "datatype": "FP32", "data": rows}]}
    status, _, out = post(server, "/v2/models/binary/infer", json.dumps(body).encode())
    assert status == 200, out
    want = booster.predict(xgb.DMatrix(X, feature_names=NAMES))
    np.testing.assert_allclose(json.loads(out)["outputs"][0]["data"], want, rtol=0, atol=2e-7)


def test_bool_inputs_score_as_one_and_zero(server):
    """feat_6 (a boolean feature) as BOOL: JSON true/false (no null needed), and binary, where
    any nonzero byte is true (numpy's cast of the bytes to bool)."""
    xgb = pytest.importorskip("xgboost")
    booster = M.xgboost_models()["xgb-binary-logistic"]
    X = _hostile(booster, n=32, seed=13, inf=False)
    flags = np.array([0, 1, 2, 255, 128, 1, 0, 7] * 4, np.uint8)
    X[:, 6] = flags.astype(bool).astype(np.float32)
    want = booster.predict(xgb.DMatrix(X, feature_names=NAMES))
    inputs = [{"name": n, "shape": [len(X)], "datatype": "FP64",
               "data": [None if np.isnan(v) else float(v) for v in X[:, j]]}
              for j, n in enumerate(NAMES[:6])]
    as_json = [*inputs, {"name": "feat_6", "shape": [len(X)], "datatype": "BOOL",
                         "data": [bool(v) for v in flags]}]
    status, _, out = post(server, "/v2/models/binary/infer",
                          json.dumps({"inputs": as_json}).encode())
    assert status == 200, out
    np.testing.assert_allclose(json.loads(out)["outputs"][0]["data"], want, rtol=0, atol=2e-7)
    status, _, out = _binary_post(server, [*inputs, {
        "name": "feat_6", "shape": [len(X)], "datatype": "BOOL",
        "parameters": {"binary_data_size": len(flags)}}], [flags.tobytes()])
    assert status == 200, out
    np.testing.assert_allclose(json.loads(out)["outputs"][0]["data"], want, rtol=0, atol=2e-7)


def test_integers_beyond_2_53_round_once_to_float32_with_nulls_beside_them():
    """2^60 + 2^36 + 1 through float64 lands on a float32 tie and rounds down; Arrow's int64
    cast rounds it once, up: an INT64 tensor's are cast so. A null beside integers is a
    missing value, not an error."""
    edge = [2**60 + 2**36 + 1, -(2**60 + 2**36 + 1), 2**53 + 1, 7]
    X = _parse([{"name": "feat_0", "shape": [len(edge) + 1], "datatype": "INT64",
                 "data": [*edge, None]}])
    want = pa.array(edge, pa.int64()).cast(pa.float32(), safe=False).to_numpy()
    np.testing.assert_array_equal(X[:-1, 0], want)
    assert np.isnan(X[-1, 0])
    X = _parse([{"name": "feat_0", "shape": [2], "datatype": "INT32", "data": [1, None]}])
    np.testing.assert_array_equal(X[:, 0], [1.0, np.nan])


def test_whole_floats_in_an_integer_tensor_are_its_integers():
    whole = [3.0, -2.0, 0.0, 2147483647.0]
    X = _parse([{"name": "feat_0", "shape": [5], "datatype": "INT32", "data": [*whole, None]}])
    np.testing.assert_array_equal(X[:4, 0], np.array(whole).astype(np.int32).astype(np.float32))
    assert np.isnan(X[4, 0])
    with pytest.raises(oip.RequestError, match="integers"):
        _parse([{"name": "feat_0", "shape": [2], "datatype": "INT32", "data": [3.0, 7.5]}])


def test_the_missing_features_message_lists_twenty_names_then_an_ellipsis():
    names = [f"f{i:02d}" for i in range(25)]
    contract = oip.Contract({f: j for j, f in enumerate(names)}, {}, False)
    for given in (24, 5, 4):  # 1, 20 and 21 left out
        inputs = [{"name": f, "shape": [1], "datatype": "FP32", "data": [1.0]}
                  for f in names[:given]]
        with pytest.raises(oip.RequestError) as e:
            _parse(inputs, contract)
        msg, missing = e.value.message, names[given:]
        assert msg.startswith(f"{len(missing)} of the model's 25 features"), msg
        assert all(f in msg for f in missing[:20]), msg
        assert (" ..." in msg) == (len(missing) > 20), msg
        if len(missing) > 20:
            assert missing[20] not in msg, msg


def test_the_output_specs_are_constants():
    """One REASON_OUTPUTS serves every model's metadata: it cannot be changed in place."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        oip.REASON_OUTPUTS[0].name = "renamed"
    with pytest.raises(dataclasses.FrozenInstanceError):
        oip.output_specs(True)[0].datatype = "FP32"


# BYTES category names: an XGBoost model with categorical features
COUNTRY = ["US", "GB", "DE", "NG", "IN"]
MCC = ["5411", "5812", "5999", "7995", "4829"]
CAT_FEATURES = ["amount", "hour", "country", "mcc"]


def _cat_frame(n: int, seed: int, with_unseen: bool) -> dict:
    rng = np.random.default_rng(seed)
    country = list(rng.choice(COUNTRY, n))
    mcc = list(rng.choice(MCC, n))
    if with_unseen:  # names the model never saw, the empty name, a non-ASCII one
        for i, v in zip(range(0, n, 5), ["ZZ", "", "Ü", "us", "ZZ"], strict=False):
            country[i] = v
        for i, v in zip(range(2, n, 6), ["9999", "", "7995 ", "x"], strict=False):
            mcc[i] = v
    amount = rng.lognormal(3.5, 1.4, n).astype(np.float32)
    amount[::7] = np.nan
    return {"amount": amount, "hour": rng.integers(0, 24, n).astype(np.float32),
            "country": country, "mcc": mcc}


@pytest.fixture(scope="module")
def cat_model(tmp_path_factory):
    pd = pytest.importorskip("pandas")
    xgb = pytest.importorskip("xgboost")
    cols = _cat_frame(1500, 0, with_unseen=False)
    df = pd.DataFrame({**cols, "country": pd.Categorical(cols["country"], categories=COUNTRY),
                       "mcc": pd.Categorical(cols["mcc"], categories=MCC)})
    y = ((df.mcc == "7995") | (df.amount > 300) | (df.country == "NG")).astype(int)
    est = xgb.XGBClassifier(n_estimators=20, max_depth=4, enable_categorical=True,
                            tree_method="hist", max_cat_to_onehot=1).fit(df, y)
    model = worker.compile_model(est)
    assert model.categories == {"country": COUNTRY, "mcc": MCC}
    assert model.feature_names == CAT_FEATURES
    path = tmp_path_factory.mktemp("serve-cat") / "cat.model"
    model.save(path)
    return est, path


@pytest.fixture(scope="module")
def cat_server(cat_model, tmp_path_factory):
    s = Server(cat_model[1], tmp_path_factory.mktemp("serve-cat-srv"), {})
    yield s
    assert s.stop() == 0, s.output()


def _cat_rows(est, n=24, seed=3):
    """Rows with hostile category names, and XGBoost's scores of them: a name not among the
    model's categories is missing (README), as the library reads an unseen category."""
    pd = pytest.importorskip("pandas")
    cols = _cat_frame(n, seed, with_unseen=True)
    df = pd.DataFrame({**cols, **{k: pd.Categorical([v if v in cats else None for v in cols[k]],
                                                    categories=cats)
                                  for k, cats in (("country", COUNTRY), ("mcc", MCC))}})
    return cols, est.predict_proba(df)[:, 1]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_category_names_as_bytes_score_as_xgboost_scores_the_frame(cat_model, cat_server,
                                                                    binary):
    # small tensors, the BYTES ones last: the last chunk ends the body exactly
    est, _ = cat_model
    cols, want = _cat_rows(est)
    c = httpclient.InferenceServerClient(url=cat_server.url)
    try:
        inputs = []
        for name in CAT_FEATURES:
            if name in ("country", "mcc"):
                t = httpclient.InferInput(name, [len(want)], "BYTES")
                t.set_data_from_numpy(np.array([v.encode() for v in cols[name]], dtype=object),
                                      binary_data=binary)
            else:
                t = httpclient.InferInput(name, [len(want)], "FP32")
                t.set_data_from_numpy(cols[name], binary_data=binary)
            inputs.append(t)
        res = c.infer("cat", inputs)
    finally:
        c.close()
    np.testing.assert_allclose(res.as_numpy("score"), want, rtol=0, atol=1e-6)


def test_category_names_may_be_nested_rows_of_one_with_nulls(cat_model, cat_server):
    est, _ = cat_model
    cols, want = _cat_rows(est, seed=4)
    inputs = [{"name": n, "shape": [len(want)], "datatype": "FP32",
               "data": [None if np.isnan(v) else float(v) for v in cols[n]]}
              for n in ("amount", "hour")]
    for n in ("country", "mcc"):
        inputs.append({"name": n, "shape": [len(want), 1], "datatype": "BYTES",
                       "data": [[None if v == "" else v] for v in cols[n]]})
    status, _, out = post(cat_server, "/v2/models/cat/infer",
                          json.dumps({"inputs": inputs}).encode())
    assert status == 200, out
    np.testing.assert_allclose(json.loads(out)["outputs"][0]["data"], want, rtol=0, atol=1e-6)


def test_a_binary_bytes_tensor_must_fill_its_binary_data_size_exactly(cat_server):
    """Each element a 4-byte little-endian length and its bytes (Triton's layout): bytes
    after the last element inside binary_data_size, or a size past the body, are refused."""
    names = [b"US", b"NG", b"DE"]
    elements = b"".join(len(s).to_bytes(4, "little") + s for s in names)

    def send(size: int, data: bytes):
        inputs = [{"name": n, "shape": [3], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}
                  for n in ("amount", "hour")]
        inputs += [{"name": "country", "shape": [3], "datatype": "BYTES",
                    "parameters": {"binary_data_size": size}},
                   {"name": "mcc", "shape": [3], "datatype": "BYTES",
                    "data": ["5411", "7995", "4829"]}]
        head = json.dumps({"inputs": inputs}).encode()
        return post(cat_server, "/v2/models/cat/infer", head + data,
                    {"Inference-Header-Content-Length": str(len(head)),
                     "Content-Type": "application/octet-stream"})

    assert send(len(elements), elements)[0] == 200
    status, _, out = send(len(elements) + 2, elements + b"\0\0")
    assert status == 400 and re.search(r"(?<![\d.])2 bytes after its 3 BYTES", _error(out)), out
    status, _, out = send(len(elements) + 10, elements)
    assert status == 400 and f"binary_data_size {len(elements) + 10}" in _error(out), out


def test_integers_at_the_ends_of_int64_and_uint64_are_held_to_them():
    # past 2^53 a JSON integer is rounded on its way to float64 (2^63 - 1 and 2^63 are one
    # float): each is judged as the integer sent, a whole float as the float it is (a hostile
    # review found INT64 2^63 and UINT64 2^64 accepted)
    def parse(datatype, v):
        return _parse([{"name": "feat_0", "shape": [2], "datatype": datatype,
                        "data": [v, None]}])[0, 0]

    for datatype, v in (("INT64", 2**63 - 1), ("INT64", -(2**63)), ("UINT64", 2**64 - 1),
                        ("UINT64", 0), ("INT64", -9.223372036854776e18)):
        want = pa.array([int(v)], pa.int64() if datatype == "INT64" else pa.uint64()) \
            .cast(pa.float32(), safe=False).to_numpy()[0]
        assert parse(datatype, v) == want, (datatype, v)
    for datatype, v in (("INT64", 2**63), ("INT64", 2**63 + 2**39), ("UINT64", 2**64),
                        ("UINT64", -1), ("INT64", 9.223372036854776e18), ("INT32", 2**31),
                        ("INT32", 2147483648.0), ("UINT8", 256)):
        with pytest.raises(oip.RequestError, match=f"outside {datatype}'s range"):
            parse(datatype, v)


@pytest.mark.parametrize("datatype,data", [
    ("UINT8", [1, math.nan, 300.0]), ("UINT8", [1, math.nan, -1.0]),
    ("INT8", [0, math.nan, -1000.0]), ("INT32", [math.nan, 3e9, 1]),
    ("INT64", [1, math.nan, 1e19]), ("INT64", [2**60, math.nan, math.inf]),
    ("UINT64", [2**64 - 1, math.nan, 1.8446744073709552e19]),
    ("UINT64", [2**60, math.nan, -math.inf])])
def test_a_nan_beside_integers_does_not_open_the_range(datatype, data):
    # found by a hostile review of the range fix: a NaN (as tritonclient writes a missing
    # value) beside an integer let every float past the range
    body = json.dumps({"inputs": [{"name": "feat_0", "shape": [3], "datatype": datatype,
                                   "data": data}]}).encode()
    with pytest.raises(oip.RequestError, match=f"outside {datatype}'s range"):
        oip.parse_infer(body, None, _INDEX, 100, True, False)


def test_bytes_elements_and_binary_sizes_that_overrun_say_by_how_much():
    # an element claiming more bytes than its tensor has left, and a tensor claiming more
    # than the body has left: refused, each naming the figures a client needs
    cats = oip.Contract({"amount": 0, "country": 1}, {1: {"US": 0.0, "GB": 1.0}}, False)
    ok = (2).to_bytes(4, "little") + b"US"
    over = ok + (9).to_bytes(4, "little") + b"GB"  # 9 claimed, 2 left
    head = json.dumps({"inputs": [
        {"name": "amount", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]},
        {"name": "country", "shape": [2], "datatype": "BYTES",
         "parameters": {"binary_data_size": len(over)}}]}).encode()
    with pytest.raises(oip.RequestError, match="element 1 claims 9 bytes, more than are left"):
        oip.parse_infer(head + over, len(head), cats, 10, True, False)
    x = np.ones(4, np.float32).tobytes()
    head = json.dumps({"inputs": [
        {"name": "feat_0", "shape": [4], "datatype": "FP32", "data": [1.0] * 4},
        {"name": "feat_1", "shape": [4], "datatype": "FP32",
         "parameters": {"binary_data_size": 16}}]}).encode()
    with pytest.raises(oip.RequestError, match="binary_data_size 16, but only 12 bytes"):
        oip.parse_infer(head + x[:12], len(head), _INDEX, 10, True, False)


def test_unseen_category_names_are_counted_apart_from_nulls():
    cats = oip.Contract({"country": 0}, {0: {"US": 0.0, "GB": 1.0}}, False)
    body = json.dumps({"inputs": [{"name": "country", "shape": [5], "datatype": "BYTES",
                                   "data": ["US", "ZZ", None, "XX", None]}]}).encode()
    req = oip.parse_infer(body, None, cats, 10, True, False)
    assert req.unseen == {0: 2}  # ZZ and XX; the nulls are missing, not unseen
    assert np.isnan(req.X[:, 0]).sum() == 4


def test_more_outputs_than_a_request_may_name_are_refused_by_the_bound():
    outputs = [{"name": "score"}] * (oip.MAX_TENSORS + 1)
    body = json.dumps({"inputs": [{"name": "feat_0", "shape": [1], "datatype": "FP32",
                                   "data": [1.0]}], "outputs": outputs}).encode()
    with pytest.raises(oip.RequestError, match=f"at most {oip.MAX_TENSORS} objects"):
        oip.parse_infer(body, None, _INDEX, 10, True, False)


def test_top_k_at_its_edges():
    # parameters.top_k: 1 to 64 reason codes a row (README)
    def parse(top_k):
        body = json.dumps({"inputs": [{"name": "feat_0", "shape": [1], "datatype": "FP32",
                                       "data": [1.0]}],
                           "parameters": {"top_k": top_k}}).encode()
        return oip.parse_infer(body, None, _INDEX, 10, True, True).top_k

    assert (parse(1), parse(64)) == (1, 64)
    for bad_k in (0, 65):
        with pytest.raises(oip.RequestError, match="top_k"):
            parse(bad_k)


def test_bytes_rows_nested_or_not_are_one_form_or_the_other():
    cats = oip.Contract({"country": 0}, {0: {"US": 0.0, "GB": 1.0}}, False)
    body = json.dumps({"inputs": [{"name": "country", "shape": [2, 1], "datatype": "BYTES",
                                   "data": [["US"], "GB"]}]}).encode()
    with pytest.raises(oip.RequestError, match="nested data must be rows of one value"):
        oip.parse_infer(body, None, cats, 10, True, False)


def test_an_integer_of_2_64_in_a_float_tensor_is_its_float():
    # with NaN in the body (tritonclient's missing value) the json module reads it, exactly
    body = json.dumps({"inputs": [{"name": "feat_0", "shape": [2], "datatype": "FP32",
                                   "data": [2**64, math.nan]}]}).encode()
    assert b"NaN" in body
    X = oip.parse_infer(body, None, _INDEX, 10, True, False).X
    assert X[0, 0] == np.float32(2.0**64) and np.isnan(X[1, 0])


def test_a_version_is_answered_by_that_version_or_refused_naming_the_one_served(artifacts):
    # issue 50: with a swap prepared, a request for the old version was scored by the new
    # model, and the new version's URL answered 404 until an unversioned request came
    s = load_settings(None, defaults={"source": {"type": "file", "path": os.devnull}},
                      model={"path": str(artifacts["binary"])})
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, M.N_FEATURES],
                                   "datatype": "FP32", "data": [0.5] * M.N_FEATURES}]}
                      ).encode()
    new = worker.load_model(artifacts["other"])
    for first in ("old", "new"):
        svc = Service(s, str(artifacts["binary"]), "m")
        svc.load()
        old_id = svc.current.model.model_id
        svc._staged = svc._prepare(new)  # prepared off the request path, not yet in
        if first == "old":
            status, _, out, _ = svc.handle(b"POST", f"/v2/models/m/versions/{old_id}/infer"
                                           .encode(), {}, body)
            assert status == 404, out
            assert f"has no version '{old_id}' (it serves {new.model_id})" in \
                json.loads(out)["error"]
        status, _, out, _ = svc.handle(b"POST", f"/v2/models/m/versions/{new.model_id}/infer"
                                       .encode(), {}, body)
        assert status == 200, out
        assert json.loads(out)["model_version"] == new.model_id
        svc.close()


def test_reason_codes_are_bounded_before_they_are_found(artifacts):
    # issue 50: rows x top_k reason codes were found and answered whatever their number
    s = load_settings(None, defaults={"source": {"type": "file", "path": os.devnull}},
                      model={"path": str(artifacts["binary"])}, serve={"max_explain_rows": 5})
    svc = Service(s, str(artifacts["binary"]), "m")
    svc.load()

    def ask(rows, outputs, top_k=None):
        doc = {"inputs": [{"name": "x", "shape": [rows, M.N_FEATURES], "datatype": "FP32",
                           "data": [0.5] * (rows * M.N_FEATURES)}],
               "outputs": [{"name": o} for o in outputs]}
        if top_k is not None:
            doc["parameters"] = {"top_k": top_k}
        status, _, out, _ = svc.handle(b"POST", b"/v2/models/m/infer", {},
                                       json.dumps(doc).encode())
        return status, json.loads(out)

    reasons = ["score", "reason_feature", "reason_value"]
    status, out = ask(5, reasons)
    assert status == 200 and len(out["outputs"][1]["data"]) == 5 * 3  # the default top_k
    status, out = ask(6, reasons)
    assert status == 413 and "serve.max_explain_rows (5)" in out["error"]
    assert ask(6, ["score"])[0] == 200  # rows without reason codes: serve.max_rows holds
    status, out = ask(1, reasons, top_k=M.N_FEATURES)
    assert status == 200 and len(out["outputs"][1]["data"]) == M.N_FEATURES
    # a top_k past the features costs nothing more: every feature (the model caps it, as it
    # caps a configured one), not a refusal a client sending one top_k to models of several
    # sizes would meet on the smaller ones (a hostile review)
    status, out = ask(1, reasons, top_k=M.N_FEATURES + 1)
    assert status == 200 and len(out["outputs"][1]["data"]) == M.N_FEATURES
    svc.close()


def test_an_arrow_body_is_held_to_the_reason_code_bound_when_every_row_is_explained(
        artifacts):
    s = load_settings(None, defaults={"source": {"type": "file", "path": os.devnull}},
                      model={"path": str(artifacts["binary"])}, serve={"max_explain_rows": 5},
                      scoring={"explain": {"top_k": 2, "min_score": -1e9}})
    svc = Service(s, str(artifacts["binary"]), "m")
    svc.load()
    head = {b"content-type": b"application/vnd.apache.arrow.stream"}
    for rows, want in ((5, 200), (6, 413)):
        batch = pa.RecordBatch.from_arrays(
            [pa.array(np.full(rows, 0.5, np.float32)) for _ in NAMES], names=list(NAMES))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as w:
            w.write_batch(batch)
        status, _, out, _ = svc.handle(b"POST", b"/v2/models/m/infer", head,
                                       sink.getvalue().to_pybytes())
        assert status == want, out
    assert b"serve.max_explain_rows (5)" in out
    svc.close()
