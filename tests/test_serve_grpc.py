"""`scoring-worker serve --grpc-port`: the Open Inference Protocol's gRPC half (KServe v2),
checked with Triton's own gRPC client (tritonclient.grpc) and its stubs against the real
server process: the messages' wire description equals the client's, scores equal XGBoost's
on hostile rows (raw tensors and typed contents), every bound answers its gRPC code, versions
and hot swap as over HTTP (issue 50)."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import worker
from tests import models as M
from tests.test_serve import NAMES, Server, _rss_mb, artifacts, get  # noqa: F401 (fixture)

grpcclient = pytest.importorskip("tritonclient.grpc")
import grpc  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402
from tritonclient.grpc import service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from worker.serve import kserve_grpc  # noqa: E402


def _grpc_url(server: Server) -> str:
    m = re.search(r"grpc on ([0-9.]+:\d+)", server.output())
    assert m, server.output()
    return m.group(1)


@pytest.fixture(scope="module")
def gserver(artifacts, tmp_path_factory):  # noqa: F811
    s = Server(artifacts["binary"], tmp_path_factory.mktemp("serve-grpc"),
               {"serve": {"max_rows": 5000, "max_explain_rows": 50,
                          "grpc_max_message_bytes": 1 << 20}}, "--grpc-port", "0")
    s.grpc = _grpc_url(s)
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def client(gserver):
    c = grpcclient.InferenceServerClient(gserver.grpc)
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub(gserver):
    channel = grpc.insecure_channel(gserver.grpc)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def test_the_messages_are_the_clients_on_the_wire():
    """Every message the server reads or writes: the same field names, numbers, types,
    repetition and nesting as the stubs tritonclient ships (the protocol's proto)."""
    def shape(d):
        fields = {}
        for f in d.fields:
            sub = f.message_type
            kind = (("map", shape(sub)) if sub is not None and sub.GetOptions().map_entry
                    else ("message", shape(sub)) if sub is not None else f.type)
            fields[f.number] = (f.name, kind, f.is_repeated,
                                f.containing_oneof.name if f.containing_oneof else None)
        return fields

    assert len(kserve_grpc.M) == 18
    for path, cls in kserve_grpc.M.items():
        theirs = pb.DESCRIPTOR.message_types_by_name[path.split(".")[0]]
        for part in path.split(".")[1:]:
            theirs = theirs.nested_types_by_name[part]
        ours = shape(cls.DESCRIPTOR)
        want = shape(theirs)
        # ours describe what the protocol's messages carry; Triton's InferParameter has
        # the same five choices; nothing of ours is missing from theirs
        assert ours == {n: want[n] for n in ours}, path
        assert set(want) == set(ours), (path, set(want) - set(ours))
    methods = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name
    ours = kserve_grpc._FILE.services_by_name["GRPCInferenceService"].methods_by_name
    assert set(ours) == set(kserve_grpc.METHODS)
    for name in kserve_grpc.METHODS:
        assert methods[name].input_type.name == ours[name].input_type.name == f"{name}Request"
        assert methods[name].output_type.name == ours[name].output_type.name


def test_health_and_metadata(client, gserver, artifacts):  # noqa: F811
    m = worker.load_model(artifacts["binary"])
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("binary")
    assert client.is_model_ready("binary", m.model_id[:8])
    assert not client.is_model_ready("binary", "0000000")
    assert not client.is_model_ready("nonesuch")
    meta = client.get_model_metadata("binary", as_json=True)
    http = json.loads(get(gserver, "/v2/models/binary")[1])
    assert meta["name"] == "binary" and meta["versions"] == [m.model_id] == http["versions"]
    for key in ("inputs", "outputs"):  # as HTTP's (int64 shapes: strings in proto's JSON)
        assert [{**t, "shape": [int(d) for d in t["shape"]]} for t in meta[key]] == \
            http[key], key
    assert meta["inputs"][0]["name"] == "input-0"
    server = client.get_server_metadata(as_json=True)
    assert server["name"] == "scoring-worker" and "binary_tensor_data" in server["extensions"]
    with pytest.raises(InferenceServerException, match="unknown model") as e:
        client.get_model_metadata("nonesuch")
    assert "NOT_FOUND" in str(e.value.status())


def test_scores_equal_xgboost_on_hostile_rows(client):
    xgb = pytest.importorskip("xgboost")
    booster = M.xgboost_models()["xgb-binary-logistic"]
    X = M.hostile_rows(400, M.xgboost_thresholds(booster), 0)
    inp = grpcclient.InferInput("input-0", list(X.shape), "FP32")
    inp.set_data_from_numpy(X)
    names = ("score", "label", "decision", "work_units", "stop_reason")
    res = client.infer("binary", [inp], outputs=[grpcclient.InferRequestedOutput(n)
                                                 for n in names], request_id="g-1")
    want = booster.predict(xgb.DMatrix(M.finite_for_library(X), feature_names=NAMES))
    score = res.as_numpy("score")
    assert score.dtype == np.float64
    np.testing.assert_allclose(score, want, rtol=0, atol=2e-7)
    assert (res.as_numpy("label") == (want > 0.5)).all()
    assert (res.as_numpy("stop_reason") == b"full").all()
    r = res.get_response()
    assert r.id == "g-1" and r.model_name == "binary"
    assert r.parameters["model_id"].string_param == r.model_version


def test_typed_contents_score_as_raw_ones(stub, client):
    """Per-feature inputs in typed contents (fp32, fp64, int64, bool) score as the same
    values sent raw; typed and raw together, the wrong typed field, or raw for fewer
    inputs are INVALID_ARGUMENT."""
    X = np.array([[0.5, -1.0, 0.0, 3.0, 7.0, 1.0, 0.25],
                  [np.nan, 2.0, 1.0, -3.0, 0.0, 0.0, 1e30]], np.float32)
    raw = grpcclient.InferInput("input-0", list(X.shape), "FP32")
    raw.set_data_from_numpy(X)
    want = client.infer("binary", [raw]).as_numpy("score")
    req = pb.ModelInferRequest(model_name="binary")
    kinds = ["FP32", "FP64", "INT64", "FP32", "INT64", "BOOL", "FP64"]
    for j, kind in enumerate(kinds):
        t = req.inputs.add(name=NAMES[j], datatype=kind, shape=[2])
        col = X[:, j]
        if kind == "FP32":
            t.contents.fp32_contents.extend(col.tolist())
        elif kind == "FP64":
            t.contents.fp64_contents.extend(col.astype(np.float64).tolist())
        elif kind == "INT64":
            t.contents.int64_contents.extend(col.astype(np.int64).tolist())
        else:
            t.contents.bool_contents.extend((col != 0).tolist())
    req.outputs.add(name="score")
    out = stub.ModelInfer(req)
    got = np.frombuffer(out.raw_output_contents[0], "<f8")
    np.testing.assert_array_equal(got, want)
    for breaking in ("both", "wrong field", "raw count"):
        bad = pb.ModelInferRequest()
        bad.CopyFrom(req)
        if breaking == "both":
            bad.raw_input_contents.extend([b"\0" * 8] * len(kinds))
        elif breaking == "wrong field":
            bad.inputs[0].contents.int_contents.append(1)
        else:
            bad.ClearField("inputs")
            bad.inputs.add(name="input-0", datatype="FP32", shape=[1, M.N_FEATURES])
            bad.inputs.add(name="input-1", datatype="FP32", shape=[1, M.N_FEATURES])
            bad.raw_input_contents.append(b"\0" * 4 * M.N_FEATURES)
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(bad)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (breaking, e.value)


def _matrix(rows: int) -> grpcclient.InferInput:
    inp = grpcclient.InferInput("input-0", [rows, M.N_FEATURES], "FP32")
    inp.set_data_from_numpy(np.full((rows, M.N_FEATURES), 0.5, np.float32))
    return inp


def test_every_bound_answers_its_code(client):
    def code(*args, **kw):
        with pytest.raises(InferenceServerException) as e:
            client.infer(*args, **kw)
        return e.value.status(), e.value.message()

    assert client.infer("binary", [_matrix(5000)]).as_numpy("score").shape == (5000,)
    # serve.max_rows (5,000)
    status, msg = code("binary", [_matrix(5001)])
    assert status == "StatusCode.RESOURCE_EXHAUSTED" and "serve.max_rows" in msg
    # serve.grpc_max_message_bytes (1 MiB): refused by grpc core before it is read whole
    status, msg = code("binary", [_matrix(40_000)])
    assert status == "StatusCode.RESOURCE_EXHAUSTED", msg
    # serve.max_explain_rows (50)
    reasons = [grpcclient.InferRequestedOutput("reason_feature")]
    assert client.infer("binary", [_matrix(50)], outputs=reasons).as_numpy(
        "reason_feature").shape == (50, 3)
    status, msg = code("binary", [_matrix(51)], outputs=reasons)
    assert status == "StatusCode.RESOURCE_EXHAUSTED" and "serve.max_explain_rows" in msg
    # malformed, unknown model, unknown version
    bad = grpcclient.InferInput("input-0", [1, 3], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 3), np.float32))
    status, msg = code("binary", [bad])
    assert status == "StatusCode.INVALID_ARGUMENT" and "expected [n, 7]" in msg
    status, _ = code("nonesuch", [_matrix(1)])
    assert status == "StatusCode.NOT_FOUND"
    status, msg = code("binary", [_matrix(1)], model_version="0000000")
    assert status == "StatusCode.NOT_FOUND" and "it serves" in msg
    # the server goes on serving
    assert client.infer("binary", [_matrix(1)]).as_numpy("score").shape == (1,)


def test_a_version_is_answered_by_that_version_across_a_hot_swap(artifacts, tmp_path):  # noqa: F811
    path = tmp_path / "live.model"
    path.write_bytes(artifacts["binary"].read_bytes())
    old = worker.load_model(path)
    s = Server(path, tmp_path, {"model": {"reload": True, "reload_interval_ms": 50}},
               "--name", "live", "--grpc-port", "0")
    c = grpcclient.InferenceServerClient(_grpc_url(s))
    try:
        assert c.infer("live", [_matrix(1)], model_version=old.model_id[:8]).get_response(
        ).model_version == old.model_id
        new = worker.load_model(artifacts["other"])
        new.save(path)
        deadline = time.monotonic() + 20
        while c.infer("live", [_matrix(1)]).get_response().model_version != new.model_id:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        r = c.infer("live", [_matrix(1)], model_version=new.model_id)
        assert r.as_numpy("score")[0] == pytest.approx(float(new.score_batch(
            np.full((1, M.N_FEATURES), 0.5, np.float32)).score[0]), abs=1e-12)
        with pytest.raises(InferenceServerException, match=f"it serves {new.model_id}"):
            c.infer("live", [_matrix(1)], model_version=old.model_id)
    finally:
        c.close()
        assert s.stop() == 0


def test_grpc_with_two_workers(artifacts, tmp_path):  # noqa: F811
    s = Server(artifacts["binary"], tmp_path, None, "--grpc-port", "0", "--workers", "2")
    c = grpcclient.InferenceServerClient(_grpc_url(s))
    try:
        deadline = time.monotonic() + 60
        while True:  # each process listens once its model is loaded
            try:
                if c.is_model_ready("binary"):
                    break
            except InferenceServerException:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.1)
        for _ in range(20):
            assert c.infer("binary", [_matrix(3)]).as_numpy("score").shape == (3,)
    finally:
        c.close()
        assert s.stop() == 0


# ---- the gRPC request as the HTTP one: the same rows, or the same refusal ----------------------

_FIELD_VALUES = {
    "int_contents": st.integers(-2**31, 2**31 - 1),
    "int64_contents": st.integers(-2**63, 2**63 - 1),
    "uint_contents": st.integers(0, 2**32 - 1), "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32), "fp64_contents": st.floats(),
    "bool_contents": st.booleans()}
_EDGE = st.sampled_from([0, 1, -1, 127, 128, 255, 256, -129, 2**31 - 1, 2**31, 2**53 + 1,
                         2**63 - 1, -2**63, 2**64 - 1, 16777217])


@st.composite
def _typed_request(draw):
    """One input per feature, typed contents: a datatype, and the contents field its
    protocol's table gives it (or, in a fifth of the requests, another for one input)."""
    rows = draw(st.integers(1, 4))
    req = pb.ModelInferRequest(model_name="m")
    inputs = []
    wrong = draw(st.sampled_from([None] * 28 + NAMES))  # a fifth of the time, one input
    for name in NAMES:
        datatype = draw(st.sampled_from(sorted(kserve_grpc._CONTENTS.keys() - {"BYTES"})))
        field = kserve_grpc._CONTENTS[datatype]
        if name == wrong:
            field = draw(st.sampled_from(sorted(_FIELD_VALUES)))
        small = st.integers(0, 100) if field.startswith("uint") else st.integers(-100, 100)
        values = draw(st.lists(st.one_of(_FIELD_VALUES[field], _edges(field)) if
                               field in ("bool_contents", "fp32_contents", "fp64_contents")
                               else st.one_of(small, _FIELD_VALUES[field], _edges(field)),
                               min_size=rows, max_size=rows))
        t = req.inputs.add(name=name, datatype=datatype, shape=[rows])
        getattr(t.contents, field).extend(values)
        inputs.append((name, datatype, field, values))
    return req, inputs, rows


def _edges(field: str):
    """Values at the edges the parser holds integers and floats to, as the field holds."""
    if field == "bool_contents":
        return st.booleans()
    if field in ("fp32_contents", "fp64_contents"):
        return st.sampled_from([0.0, -0.0, 16777217.0, 2.0**53 + 2.0, 3.4e38, -2.0**63,
                                2.0**64, 255.0, 256.0, 0.5])
    lo, hi = {"int_contents": (-2**31, 2**31 - 1), "int64_contents": (-2**63, 2**63 - 1),
              "uint_contents": (0, 2**32 - 1), "uint64_contents": (0, 2**64 - 1)}[field]
    return _EDGE.filter(lambda v: lo <= v <= hi)


def _outcome(fn):
    from worker.serve import oip

    try:
        return fn().X
    except oip.RequestError as exc:
        return exc.status


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_typed_request())
def test_typed_contents_read_as_the_same_json_values(case):
    """A gRPC request of typed contents reads as the HTTP JSON request of the same values
    (written by the test, not by the code under test): the same rows, or the same status."""
    import math

    from worker.serve import oip

    req, inputs, rows = case
    index = {f: j for j, f in enumerate(NAMES)}
    got = _outcome(lambda: oip.parse_doc(*kserve_grpc.to_doc(req), index, 100, True, False))
    if any(field != kserve_grpc._CONTENTS[dt] for _, dt, field, _ in inputs):
        assert got == 400  # values in the wrong field for their datatype
        event("wrong field")
        return
    js = [{"name": n, "datatype": dt, "shape": [rows],
           "data": [v if not (type(v) is float and not math.isfinite(v)) else None
                    for v in vals]} for n, dt, _, vals in inputs]
    if any(type(v) is float and not math.isfinite(v) for _, _, _, vals in inputs
           for v in vals):
        event("not finite")
        return  # JSON cannot say NaN or infinity as numbers (tested through binary below)
    want = _outcome(lambda: oip.parse_infer(json.dumps({"inputs": js}).encode(), None, index,
                                            100, True, False))
    event(f"compared: {'refused' if isinstance(want, int) else 'rows'}")
    if isinstance(want, int) or isinstance(got, int):
        assert got == want
    else:
        np.testing.assert_array_equal(got, want)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5), st.sampled_from(["FP32", "FP64", "INT32", "UINT8", "FP16", "BOOL",
                                           "INT64"]),
       st.binary(min_size=0, max_size=64), st.booleans())
def test_raw_contents_read_as_the_same_binary_tensors(rows, datatype, noise, short):
    """A gRPC request of raw tensors reads as the HTTP binary-extension request of the same
    bytes: the same rows (NaN, infinities and all), or the same status."""
    from worker.serve import oip

    width = oip.DTYPES[datatype].itemsize * rows * M.N_FEATURES
    raw = (noise * (width // max(1, len(noise)) + 1))[:width] if noise else b"\0" * width
    if short:
        raw = raw[:-1]
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="input-0", datatype=datatype, shape=[rows, M.N_FEATURES])
    req.raw_input_contents.append(raw)
    index = {f: j for j, f in enumerate(NAMES)}
    got = _outcome(lambda: oip.parse_doc(*kserve_grpc.to_doc(req), index, 100, True, False))
    head = json.dumps({"inputs": [{"name": "input-0", "datatype": datatype,
                                   "shape": [rows, M.N_FEATURES],
                                   "parameters": {"binary_data_size": len(raw)}}]}).encode()
    want = _outcome(lambda: oip.parse_infer(head + raw, len(head), index, 100, True, False))
    if isinstance(want, int) or isinstance(got, int):
        assert got == want
    else:
        np.testing.assert_array_equal(got, want)


def test_a_grpc_port_taken_or_shared_with_http_exits_2_naming_it(artifacts, tmp_path):  # noqa: F811
    """A new user's walkthrough: a busy gRPC port gave a traceback and exit 1."""
    import socket
    import subprocess
    import sys

    from tests.test_serve import ROOT

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        for args, key in ((["--port", "0", "--grpc-port", str(port)], "serve.grpc_port: "
                           f"cannot listen on 127.0.0.1:{port}"),
                          (["--port", "18977", "--grpc-port", "18977"],
                           "serve.grpc_port (18977) is serve.port")):
            out = subprocess.run([sys.executable, "-m", "worker.cli", "serve", "--model",
                                  str(artifacts["binary"]), *args], cwd=ROOT,
                                 capture_output=True, text=True, timeout=120)
            assert out.returncode == 2, out.stderr
            assert key in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_hostile_messages_are_refused_cheaply(gserver):
    """From a hostile review: a message of empty tensors was read by grpc before the handler
    (44x its size) and turned into documents before the tensor count was checked (8 s and
    1.4 GiB a 4 MiB message); undecodable bytes got UNKNOWN and a traceback; a long name was
    echoed into a message past gRPC's metadata limit."""
    channel = grpc.insecure_channel(gserver.grpc)
    call = channel.unary_unary(f"/{kserve_grpc.SERVICE}/ModelInfer",
                               request_serializer=None, response_deserializer=None)
    try:
        before = _rss_mb(gserver.proc.pid)
        t0 = time.monotonic()
        empty = b"\x0a\x06binary" + b"\x2a\x00" * 500_000  # 500,000 empty inputs (1 MB)
        with pytest.raises(grpc.RpcError) as e:
            call(empty)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "at most 4096" in e.value.details()
        assert time.monotonic() - t0 < 2 and _rss_mb(gserver.proc.pid) - before < 200
        for raw in (b"\xff\xff\xff", b"\x0a\x02\xc3\x28"):  # truncated; invalid UTF-8
            with pytest.raises(grpc.RpcError) as e:
                call(raw)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
            assert "not a ModelInferRequest" in e.value.details()
        req = pb.ModelInferRequest(model_name="binary")
        req.inputs.add(name="x" * 20_000, datatype="FP32", shape=[1, M.N_FEATURES])
        req.raw_input_contents.append(b"\0" * 4 * M.N_FEATURES)
        with pytest.raises(grpc.RpcError) as e:
            call(req.SerializeToString())
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(e.value.details()) < 300
    finally:
        channel.close()
    assert "Traceback" not in gserver.output()

