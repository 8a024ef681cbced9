"""`scoring-worker serve`'s HTTP/1.1 as RFC 9110/9112 and a hostile client see it (issue 50):
each test here failed on the hand-written server of c5ba4df (its fault number in the issue
beside it) and passes on the server that carries the service now."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time

import numpy as np
import pytest

from tests import models as M
from tests.test_serve import (  # noqa: F401 (artifacts: a fixture)
    Server,
    _rss_mb,
    artifacts,
    get,
    post,
    raw_http,
    send_endless,
)

_LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
_INDEX = {f"feat_{i}": i for i in range(M.N_FEATURES)}
_INFER = b"POST /v2/models/binary/infer HTTP/1.1\r\nHost: x\r\n"


def _one_row(n: int = 1) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": [n, M.N_FEATURES], "datatype": "FP32",
                                   "data": [0.5] * (n * M.N_FEATURES)}]}).encode()


def _binary_request(rows: int) -> bytes:
    """A whole HTTP request of ``rows`` rows as binary tensors (JSON answer)."""
    X = np.full((rows, M.N_FEATURES), 0.5, np.float32).tobytes()
    head = json.dumps({"inputs": [{"name": "x", "shape": [rows, M.N_FEATURES],
                                   "datatype": "FP32",
                                   "parameters": {"binary_data_size": len(X)}}]}).encode()
    return (_INFER + b"Content-Type: application/octet-stream\r\n"
            b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
            % (len(head), len(head) + len(X)) + head + X)


def _zeros_arrow(rows: int) -> bytes:
    """An Arrow IPC stream of ``rows`` rows of zeros, one column a feature."""
    import pyarrow as pa

    batch = pa.RecordBatch.from_arrays(
        [pa.array(np.zeros(rows, np.float32)) for _ in range(M.N_FEATURES)],
        names=[f"feat_{i}" for i in range(M.N_FEATURES)])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _read_response(s: socket.socket, timeout: float = 10.0) -> tuple[bytes, bytes]:
    """One whole response from ``s`` (Content-Length framed): (head, body)."""
    s.settimeout(timeout)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, buf[:300]
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    n = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))
    while len(rest) < n:
        chunk = s.recv(1 << 20)
        assert chunk, (head, len(rest), n)
        rest += chunk
    return head, rest[:n]


@pytest.fixture(scope="module")
def http(artifacts, tmp_path_factory):  # noqa: F811
    s = Server(artifacts["binary"], tmp_path_factory.mktemp("serve-http"),
               {"serve": {"max_body_bytes": 64 << 20, "max_rows": 1_000_000,
                          "request_timeout_ms": 1500, "keepalive_timeout_ms": 5000,
                          "max_header_bytes": 4096}})
    yield s
    assert s.stop() == 0, s.output()


# ---- fault 2: answers of any admitted size arrive whole -------------------------------------

def test_an_answer_over_16_mib_arrives_whole(http):
    """Fault 2: a 200 with the full Content-Length was cut off past 16 MiB of answer."""
    rows = 520_000
    with socket.create_connection((http.host, http.port), timeout=30) as s:
        s.sendall(_binary_request(rows))
        h, body = _read_response(s, 60)
    assert h.startswith(b"HTTP/1.1 200"), h
    assert len(body) > 16 << 20
    out = json.loads(body)
    assert len(out["outputs"][0]["data"]) == rows


# ---- fault 3: a JSON body's parse cost is bounded before objects are built -----------------

def test_nested_empty_arrays_are_refused_before_they_are_built(http):
    """Fault 3: 16 MiB of ``[[],[],...]`` (inside serve.max_json_bytes) took ~3 s and
    ~674 MiB before its 400."""
    n = (16 << 20) // 3 - 40
    body = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,7],"data":[' + \
        b",".join([b"[]"] * n) + b"]}]}"
    assert len(body) <= 16 << 20
    before = _rss_mb(http.proc.pid)
    t0 = time.monotonic()
    status, _, out = post(http, "/v2/models/binary/infer", body)
    took = time.monotonic() - t0
    assert status == 400, out[:300]
    assert b"arrays and objects (2 x serve.max_rows" in out, out[:300]
    assert took < 1.5, took  # (sent, read and scanned: ~0.3 s here alone)
    # the body's 16 MiB (and a copy as it is joined), not the 674 MiB its parse built
    assert _rss_mb(http.proc.pid) - before < 64


def test_json_nested_deeper_than_a_request_is_refused(http):
    body = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,7],"data":' + \
        b"[" * 100 + b"]" * 100 + b"}]}"
    status, _, out = post(http, "/v2/models/binary/infer", body)
    assert status == 400 and b"deep" in out, out[:300]


# ---- faults 4 and 8: trailers are bounded and never headers ---------------------------------

def test_an_endless_trailer_is_bounded(http):
    """Fault 4: a trailer value that never ends was held in memory whole."""
    before = _rss_mb(http.proc.pid)
    got = send_endless(http, _INFER + b"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n0\r\n"
                       b"X-T: ", 2048)  # 32 MiB
    assert got == b"" or got.startswith(b"HTTP/1.1 431"), got[:200]
    assert _rss_mb(http.proc.pid) - before < 16
    assert get(http, "/v2/health/live")[0] == 200


def test_trailer_fields_are_not_headers(http):
    """Fault 8: a trailer Content-Type changed how the body was read (RFC 9110 6.5.1)."""
    body = _one_row()
    req = (_INFER + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
           + b"%x\r\n" % len(body) + body + b"\r\n0\r\n"
           b"Content-Type: application/vnd.apache.arrow.stream\r\n"
           b"Inference-Header-Content-Length: 3\r\n\r\n")
    with socket.create_connection((http.host, http.port), timeout=10) as s:
        s.sendall(req)
        h, out = _read_response(s)
    assert h.startswith(b"HTTP/1.1 200"), (h, out[:300])
    assert json.loads(out)["outputs"][0]["name"] == "score"


def test_chunk_extensions_count_against_a_bound(http):
    """Fault 12: chunk extensions were read and dropped whatever their size."""
    ext = b";x=" + b"a" * 60000
    data = b"".join(b"1" + ext + b"\r\n{\r\n" for _ in range(200))  # 12 MB of extensions
    got = b""
    with socket.create_connection((http.host, http.port), timeout=10) as s:
        s.sendall(_INFER + b"Transfer-Encoding: chunked\r\n\r\n")
        with contextlib.suppress(OSError):
            s.sendall(data)
        with contextlib.suppress(OSError):
            got = s.recv(4096)
    assert re.match(rb"HTTP/1.1 (400|413|431)", got), got[:200]


# ---- faults 6, 7, 10: Expect, no unsolicited answers, silent connections ----------------------

def test_expect_100_continue(http):
    """Fault 6: Expect: 100-continue was ignored (curl waits ~1 s for it on large bodies);
    a body over the bound gets its 413 without the 100."""
    body = _one_row()
    with socket.create_connection((http.host, http.port), timeout=5) as s:
        s.sendall(_INFER + b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body))
        s.settimeout(0.5)
        first = s.recv(4096)
        assert first.startswith(b"HTTP/1.1 100"), first
        s.sendall(body)
        rest = first.split(b"\r\n\r\n", 1)[1]
        if not rest:
            rest = s.recv(65536)
        assert rest.startswith(b"HTTP/1.1 200"), rest[:200]
    out = raw_http(http, _INFER + b"Expect: 100-continue\r\nContent-Length: 1073741824\r\n\r\n",
                   timeout=3)
    assert out.startswith(b"HTTP/1.1 413") and b"100 Continue" not in out, out[:200]


def test_no_408_after_an_answer_read_slowly(http):
    """Fault 7: an answer read slowly was followed by a 408 no request asked for."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((http.host, http.port))
    try:
        s.sendall(_binary_request(300_000))
        time.sleep(2.0)  # past request_timeout_ms with the answer unread
        h, body = _read_response(s, 10)
        assert h.startswith(b"HTTP/1.1 200")
        s.settimeout(2.5)  # past request_timeout_ms again, idle below keep-alive's
        with contextlib.suppress(TimeoutError):
            extra = s.recv(4096)
            assert extra == b"", extra[:200]
    finally:
        s.close()


def test_a_silent_connection_is_closed_at_the_request_timeout(http):
    """Fault 10: a connection that sends nothing was held for keepalive_timeout_ms (5 s
    here), not request_timeout_ms (1.5 s)."""
    with socket.create_connection((http.host, http.port), timeout=10) as s:
        t0 = time.monotonic()
        with contextlib.suppress(ConnectionResetError):
            assert s.recv(4096) == b""
        took = time.monotonic() - t0
    assert 1.2 < took < 3.5, took


# ---- fault 9: the connection cap acts below the open-file limit ------------------------------

def test_the_connection_cap_fits_the_open_file_limit(artifacts, tmp_path):  # noqa: F811
    """Fault 9: with 1,024 descriptors, 1,010 idle connections exhausted them: new clients
    were reset and nothing was counted. The cap is kept below the limit (said at start-up),
    and a client past it is answered 503."""
    s = Server(artifacts["binary"], tmp_path, {"serve": {"max_connections": 100_000}},
               open_files=256)
    held = []
    try:
        _cap_refuses(s, held)
    finally:
        for c in held:
            c.close()
        time.sleep(0.3)
        text = get(s, "/metrics")[1].decode()
        assert s.stop() == 0
    assert re.search(r"serve_connections_refused_total [1-9]", text)


def _cap_refuses(s, held: list) -> None:
    assert re.search(r"serve\.max_connections.*open-file limit", s.output()), s.output()
    for _ in range(300):
        with contextlib.suppress(OSError):
            held.append(socket.create_connection((s.host, s.port), timeout=5))
    time.sleep(1.0)  # those answered 503 closed (their lingering is short)
    with socket.create_connection((s.host, s.port), timeout=5) as c:
        c.sendall(_LIVE)
        got = c.recv(4096)
    assert got.startswith(b"HTTP/1.1 503"), got[:200]


# ---- fault 11: RFC 9112 --------------------------------------------------------------------

@pytest.mark.parametrize("head", [
    b"GET /v2/health/live HTTP/1.1\r\n\r\n",
    b"GET /v2/health/live HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
], ids=["no-host", "two-hosts"])
def test_host_must_be_sent_once(http, head):
    assert raw_http(http, head, timeout=3).startswith(b"HTTP/1.1 400")


def test_an_absolute_form_target_is_routed(http):
    out = raw_http(http, b"GET http://x/v2/health/live HTTP/1.1\r\nHost: x\r\n"
                   b"Connection: close\r\n\r\n", timeout=3)
    assert out.startswith(b"HTTP/1.1 200"), out[:200]


@pytest.mark.parametrize("method,path,allow", [
    (b"POST", b"/v2/health/live", b"GET, HEAD"),
    (b"GET", b"/v2/models/binary/infer", b"POST"),
])
def test_405_says_what_is_allowed(http, method, path, allow):
    out = raw_http(http, method + b" " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 0"
                   b"\r\nConnection: close\r\n\r\n", timeout=3)
    assert out.startswith(b"HTTP/1.1 405"), out[:200]
    assert re.search(rb"(?im)^allow: " + re.escape(allow) + rb"\r$", out), out[:300]


def test_a_long_target_is_414(http):
    out = raw_http(http, b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", timeout=3)
    assert out.startswith(b"HTTP/1.1 414"), out[:200]


def test_http_1_0_keep_alive_is_said_or_closed(http):
    with socket.create_connection((http.host, http.port), timeout=3) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
        head, _ = _read_response(s)
        if not re.search(rb"(?im)^connection: keep-alive", head):
            s.settimeout(2)
            assert s.recv(10) == b"", head  # closed: the client knows the answer ended


# ---- fault 12: the body kinds agree ---------------------------------------------------------

def test_zero_rows_are_answered_alike_in_json_and_arrow(http):

    status_json, _, out = post(http, "/v2/models/binary/infer", json.dumps(
        {"inputs": [{"name": "x", "shape": [0, M.N_FEATURES], "datatype": "FP32",
                     "data": []}]}).encode())
    status_arrow, _, out_arrow = post(http, "/v2/models/binary/infer", _zeros_arrow(0),
                                      {"Content-Type": "application/vnd.apache.arrow.stream"})
    assert status_json == status_arrow == 400, (status_json, out, status_arrow, out_arrow)


def test_an_arrow_body_of_two_streams_is_refused_not_scored_from_the_first(http):
    # before: 200 with the first stream's rows; the second's were never read
    one = _zeros_arrow(3)
    status, _, out = post(http, "/v2/models/binary/infer", one + _zeros_arrow(4),
                          {"Content-Type": "application/vnd.apache.arrow.stream"})
    assert status == 400 and b"bytes after the end-of-stream" in out, (status, out)
    status, _, _ = post(http, "/v2/models/binary/infer", one,
                        {"Content-Type": "application/vnd.apache.arrow.stream"})
    assert status == 200


def test_an_integer_in_an_fp64_tensor_is_read_as_binary_fp64_reads_it(http):
    """Fault 12: JSON rounded 2^53 + 1 once to float32, binary FP64 through float64."""
    from worker.serve import oip

    v = 2**53 + 2**29 + 1  # one rounding: 2^53 + 2^30; through float64: 2^53
    js = oip.parse_infer(json.dumps({"inputs": [{"name": "x", "datatype": "FP64",
                                                 "shape": [1, 7], "data": [v] * 7}]}).encode(),
                         None, _INDEX, 10, True, False).X
    raw = np.full(7, v, np.float64).tobytes()
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP64", "shape": [1, 7],
                                   "parameters": {"binary_data_size": 56}}]}).encode()
    bi = oip.parse_infer(head + raw, len(head), _INDEX, 10, True, False).X
    np.testing.assert_array_equal(js, bi)


def test_a_swap_with_two_workers_leaves_one_model_info_at_1_and_no_warning(artifacts,  # noqa: F811
                                                                          tmp_path):
    """Fault 12: with --workers 2, each swap printed prometheus_client's raw "Removal of
    labels has not been implemented in multi-process mode" warning."""
    import worker

    path = tmp_path / "live.model"
    path.write_bytes(artifacts["binary"].read_bytes())
    s = Server(path, tmp_path, {"model": {"reload": True, "reload_interval_ms": 50}},
               "--name", "live", "--workers", "2")
    try:
        old = worker.load_model(path).model_id
        new = worker.load_model(artifacts["other"])
        new.save(path)
        deadline = time.monotonic() + 30
        while True:  # until both processes have swapped (each at its next request)
            assert post(s, "/v2/models/live/infer", _one_row())[0] == 200
            text = get(s, "/metrics")[1].decode()
            if not re.search(rf'^serve_model_info{{model_id="{old}"}} 1\.0$', text, re.M) \
                    and new.model_id in text:
                break
            assert time.monotonic() < deadline, s.output()[-2000:]
            time.sleep(0.05)
        text = get(s, "/metrics")[1].decode()
        assert re.search(rf'^serve_model_info{{model_id="{new.model_id}"}} 1\.0$', text, re.M)
        assert not re.search(rf'^serve_model_info{{model_id="{old}"}} 1\.0$', text, re.M)
    finally:
        assert s.stop() == 0
    assert "Removal of labels" not in s.output(), s.output()[-2000:]


def test_the_uvicorn_internals_the_bounds_use_are_there():
    """worker/serve/http.py subclasses uvicorn's httptools protocol (pinned to a minor
    release): what it overrides and reads must still be what it was written against."""
    import inspect

    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

    from worker.serve.http import BoundedProtocol

    for name in ("connection_made", "connection_lost", "data_received", "pause_writing",
                 "resume_writing", "on_message_begin", "on_url", "on_header",
                 "on_headers_complete", "on_body", "on_message_complete",
                 "on_response_complete", "shutdown", "_unset_keepalive_if_required"):
        assert callable(getattr(HttpToolsProtocol, name)), name
        assert name in vars(BoundedProtocol) or name in ("shutdown",
                                                         "_unset_keepalive_if_required"), name
    init = inspect.getsource(HttpToolsProtocol.__init__)
    for attr in ("self.parser", "self.pipeline", "self.cycle", "self.flow", "self.transport",
                 "self.access_log", "self.headers"):
        assert attr in init, attr
    cycle = inspect.getsource(RequestResponseCycle)
    for attr in ("self.disconnected", "self.message_event", "self.response_complete"):
        assert attr in cycle, attr


# ---- fault 2 (second half): an answer's size is bounded before it is built -----------------

def _service(artifacts, **serve):  # noqa: F811
    import os

    from worker.config import load_settings
    from worker.serve.service import Service

    s = load_settings(None, defaults={"source": {"type": "file", "path": os.devnull}},
                      model={"path": str(artifacts["binary"])}, serve=serve)
    svc = Service(s, str(artifacts["binary"]), "m")
    svc.load()
    return svc


def _request(rows: int, outputs: list[str], binary: bool, top_k: int | None, rid: str | None,
             seed: int) -> bytes:
    X = M.hostile_rows(rows, np.linspace(-2, 2, 9).astype(np.float32), seed)
    doc = {"inputs": [{"name": "x", "shape": [rows, M.N_FEATURES], "datatype": "FP32",
                       "data": [None if not np.isfinite(v) else float(v)
                                for v in X.reshape(-1)]}],
           "outputs": [{"name": o, "parameters": {"binary_data": binary}} for o in outputs]}
    if top_k is not None:
        doc["parameters"] = {"top_k": top_k}
    if rid is not None:
        doc["id"] = rid
    return json.dumps(doc).encode()


def test_the_answer_bound_is_never_below_the_answer(artifacts):  # noqa: F811
    from worker.serve import oip

    svc = _service(artifacts)
    m = svc.current
    rng = np.random.default_rng(50)
    every = ["score", "label", "decision", "work_units", "stop_reason", "reason_feature",
             "reason_value"]
    for i in range(60):
        outputs = [o for o in every if rng.random() < 0.6] or ["score"]
        rows = int(rng.choice([1, 2, 31, 257]))
        binary = bool(rng.random() < 0.5)
        top_k = int(rng.choice([1, 3, M.N_FEATURES, 64]))
        rid = None if rng.random() < 0.5 else '"\\\n\u2028' * int(rng.integers(0, 40))
        body = _request(rows, outputs, binary, top_k, rid, i)
        req = oip.parse_infer(body, None, m.contract, 1000, True, False)
        k = min(top_k, M.N_FEATURES) if req.explain else 0
        bound = oip.answer_bound(req, rows, k, m.stop_longest, m.feature_longest)
        status, _, out, _ = svc.handle(b"POST", b"/v2/models/m/infer", {}, body)
        assert status == 200, out[:300]
        assert len(out) <= bound, (outputs, rows, binary, top_k, len(out), bound)
    svc.close()


def test_serve_max_response_bytes_at_its_edge(artifacts):  # noqa: F811
    from worker.serve import oip

    body = _request(200, ["score", "stop_reason", "reason_feature"], False, 5, "r", 1)
    svc = _service(artifacts)
    req = oip.parse_infer(body, None, svc.current.contract, 1000, True, False)
    bound = oip.answer_bound(req, 200, 5, svc.current.stop_longest,
                             svc.current.feature_longest)
    svc.close()
    for limit, want in ((bound, 200), (bound - 1, 413)):
        svc = _service(artifacts, max_response_bytes=limit)
        status, _, out, _ = svc.handle(b"POST", b"/v2/models/m/infer", {}, body)
        assert status == want, out[:300]
        svc.close()
    assert b"serve.max_response_bytes" in out and b"binary outputs" in out


def test_an_arrow_answer_is_within_its_bound(artifacts):  # noqa: F811
    import os

    import pyarrow as pa

    from worker.config import load_settings
    from worker.serve import service as S

    s = load_settings(None, defaults={"source": {"type": "file", "path": os.devnull}},
                      model={"path": str(artifacts["binary"])},
                      scoring={"explain": {"top_k": 64, "min_score": -1e9},
                               "id_column": "event_id"})
    svc = S.Service(s, str(artifacts["binary"]), "m")
    svc.load()
    m = svc.current
    for rows in (1, 100, 4000):
        X = M.hostile_rows(rows, np.linspace(-2, 2, 9).astype(np.float32), rows)
        cols = [pa.array(X[:, j]) for j in range(M.N_FEATURES)]
        ids = pa.array([f"id-{i}-" + "x" * (i % 50) for i in range(rows)])
        batch = pa.RecordBatch.from_arrays([ids, *cols],
                                           names=["event_id", *[f"feat_{j}" for j in
                                                                range(M.N_FEATURES)]])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as w:
            w.write_batch(batch)
        body = sink.getvalue().to_pybytes()
        status, _, out, _ = svc.handle(b"POST", b"/v2/models/m/infer", {
            b"content-type": b"application/vnd.apache.arrow.stream"}, body)
        assert status == 200, out[:300]
        bound = S.arrow_answer_bound(m, rows, M.N_FEATURES, len(body))
        assert len(out) <= bound, (rows, len(out), bound)
    svc.close()
    # and the bound refuses: one byte under it, 413 naming the setting
    s2 = s.model_copy(update={"serve": s.serve.model_copy(update={
        "max_response_bytes": bound - 1})})
    svc = S.Service(s2, str(artifacts["binary"]), "m")
    svc.load()
    status, _, out, _ = svc.handle(b"POST", b"/v2/models/m/infer", {
        b"content-type": b"application/vnd.apache.arrow.stream"}, body)
    assert status == 413 and b"serve.max_response_bytes" in out, out[:300]
    svc.close()


def test_a_large_json_answer_written_in_pieces_is_the_same_bytes():
    """Outputs past oip.PIECE values are written a piece at a time (the loop gets the GIL
    between pieces): the same JSON as written whole, NaN, -0.0 and extremes included."""
    import orjson

    from worker.serve import oip

    rng = np.random.default_rng(3)
    for n in (oip.PIECE - 1, oip.PIECE, oip.PIECE + 1, 3 * oip.PIECE + 17):
        f64 = rng.normal(size=n) * 10.0 ** rng.integers(-300, 300, n)
        f64[:5] = [np.nan, -0.0, np.finfo(np.float64).max, -np.finfo(np.float64).tiny, 0.0]
        with np.errstate(over="ignore"):
            f32 = f64.astype(np.float32)
        i64 = rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64)
        text = [f"f\\\"{i % 97}\u2028" for i in range(n)]
        for values in (f64, f32, i64, i64.astype(np.int8)):
            want = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY)
            assert orjson.dumps(oip._pieces(values), option=orjson.OPT_SERIALIZE_NUMPY) == \
                want, (n, values.dtype)
        assert orjson.dumps(oip._pieces(text)) == orjson.dumps(text)


# ---- large requests are answered off the loop: the same answers --------------------------------

def test_large_requests_answered_off_the_loop_score_as_the_model(http, artifacts):  # noqa: F811
    """Bodies past 512 KiB are answered on the heavy lane, their JSON parsed in a process
    apart (issue 50): scores equal the model's on hostile rows, a refusal found there
    is the same 400, and a parsing process that died is started again."""
    import subprocess

    import worker
    from worker.serve.http import HEAVY_BODY
    from worker.serve.service import PARSE_APART

    model = worker.load_model(artifacts["binary"])
    rows = 9000
    X = M.hostile_rows(rows, np.linspace(-2, 2, 9).astype(np.float32), 5)
    body = json.dumps({"inputs": [{"name": "x", "shape": [rows, M.N_FEATURES],
                                   "datatype": "FP32",
                                   "data": [None if np.isnan(v) else float(v) if np.isfinite(v)
                                            else (3.4e38 if v > 0 else -3.4e38) * 10
                                            for v in X.reshape(-1)]}]}).encode()
    assert len(body) > max(PARSE_APART, HEAVY_BODY)
    want = model.score_batch(X).score  # (numbers past float32 are its infinities)
    for _ in range(2):
        status, _, out = post(http, "/v2/models/binary/infer", body)
        assert status == 200, out[:300]
        np.testing.assert_array_equal(np.array(json.loads(out)["outputs"][0]["data"]), want)
        # the parsing process killed: the next large request starts another
        children = subprocess.run(["pgrep", "-P", str(http.proc.pid)], capture_output=True,
                                  text=True).stdout.split()
        assert children, "no parsing process"
        for pid in children:
            subprocess.run(["kill", "-9", pid])
        time.sleep(0.2)
    bad = body.replace(b'"datatype": "FP32"', b'"datatype": "INT8"')
    status, _, out = post(http, "/v2/models/binary/infer", bad)
    assert status == 400 and b"INT8" in out, out[:300]


def test_pipelined_requests_at_the_bound(http):
    """http.MAX_PIPELINED (128) requests read ahead of their answers: one in flight and 128
    waiting are all answered, in order; one more and the connection is reset (an answer
    now would come before the earlier ones)."""
    from worker.serve.http import MAX_PIPELINED

    def send(n: int) -> int:
        got = b""
        with socket.create_connection((http.host, http.port), timeout=2) as s:
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n" * n)
            with contextlib.suppress(OSError):  # a timeout: all answered; a reset
                while got.count(b"HTTP/1.1 200") < n:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    got += chunk
        return got.count(b"HTTP/1.1 200")

    assert send(MAX_PIPELINED + 1) == MAX_PIPELINED + 1
    assert send(MAX_PIPELINED + 2) < MAX_PIPELINED + 2
    assert get(http, "/v2/health/live")[0] == 200


def test_refusals_a_new_user_met_say_what_to_do(artifacts):  # noqa: F811
    """From a new user's walkthrough: an Arrow body over serve.max_rows named the stream's
    delivery.max_message_rows; a version prefix under 6 characters did not say why."""

    svc = _service(artifacts, max_rows=100)
    status, _, out, _ = svc.handle(b"POST", b"/v2/models/m/infer", {
        b"content-type": b"application/vnd.apache.arrow.stream"}, _zeros_arrow(101))
    assert status == 413 and b"serve.max_rows (100)" in out and b"delivery" not in out, out
    model_id = svc.current.model.model_id
    status, _, out, _ = svc.handle(b"POST", f"/v2/models/m/versions/{model_id[:4]}/infer"
                                   .encode(), {}, _one_row())
    assert status == 404 and b"a prefix of 6 or more" in out, out
    status, _, out, _ = svc.handle(b"POST", f"/v2/models/m/versions/{model_id[:6]}/infer"
                                   .encode(), {}, _one_row())
    assert status == 200, out
    svc.close()


# ---- what a hostile review of the new server found (each failed before its fix) ---------------

def test_a_body_in_tiny_chunks_is_refused_before_it_costs(http):
    """60 MiB of 2-byte chunks took 2 GiB (a bytes object a chunk) and froze the loop."""
    before = _rss_mb(http.proc.pid)
    got = b""
    with socket.create_connection((http.host, http.port), timeout=10) as s:
        s.sendall(_INFER + b"Content-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        with contextlib.suppress(OSError):
            s.sendall(b"2\r\n11\r\n" * 600_000)
        with contextlib.suppress(OSError):
            got = s.recv(4096)
    assert got.startswith(b"HTTP/1.1 400") and b"chunks are smaller" in got, got[:300]
    assert _rss_mb(http.proc.pid) - before < 32
    # chunks of a legitimate size: read, and small reads joined (not kept one by one)
    body = _one_row(50)
    data = b"".join(b"%x\r\n" % len(body[i:i + 100]) + body[i:i + 100] + b"\r\n"
                    for i in range(0, len(body), 100)) + b"0\r\n\r\n"
    with socket.create_connection((http.host, http.port), timeout=10) as s:
        s.sendall(_INFER + b"Content-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n" + data)
        head, out = _read_response(s)
    assert head.startswith(b"HTTP/1.1 200"), (head, out[:300])


def test_an_error_behind_pipelined_requests_is_answered_after_them(http):
    """A bad request pipelined behind a good one: the good one's 200 was lost and the error
    answered in its place (and a traceback logged a time)."""
    good = _one_row()
    with socket.create_connection((http.host, http.port), timeout=10) as s:
        s.sendall(_INFER + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                  % len(good) + good + _INFER + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n")
        out = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                out += chunk
    statuses = re.findall(rb"HTTP/1\.1 (\d{3})", out)
    assert statuses == [b"200", b"400"], out[:600]
    assert "write() after write_eof" not in http.output()


def test_a_client_that_half_closes_gets_its_answer(http):
    """uvicorn closed the connection at the client's FIN, losing the answer being found (a
    body past 512 KiB: answered on the heavy lane, after the FIN has been read)."""
    body = _one_row(20_000)
    with socket.create_connection((http.host, http.port), timeout=10) as s:
        s.sendall(_INFER + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                  % len(body) + body)
        s.shutdown(socket.SHUT_WR)
        head, out = _read_response(s)
    assert head.startswith(b"HTTP/1.1 200") and len(json.loads(out)["outputs"][0]["data"]) \
        == 20_000


def test_a_small_answer_is_one_write_and_head_answers_stay_whole(http):
    """A small answer's head and body leave in one write (uvicorn writes them apart: two
    segments, two wakeups of the client); HEAD answers (no body write) and Connection:
    close answers are still whole and in order."""
    body = _one_row()
    req = _INFER + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(
        body) + body
    whole = 0
    with socket.create_connection(("127.0.0.1", http.port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(10)
        for _ in range(40):
            s.sendall(req)
            first = s.recv(65536)  # blocked until the first segment arrives
            head, _, rest = first.partition(b"\r\n\r\n")
            n = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))
            whole += len(rest) == n
            while len(rest) < n:
                rest += s.recv(65536)
            assert json.loads(rest)["outputs"], rest[:200]
    assert whole >= 36, f"{whole} of 40 answers arrived whole in their first segment"
    with socket.create_connection(("127.0.0.1", http.port)) as s:
        s.sendall(b"HEAD /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n" + _LIVE +
                  b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        got = b""
        s.settimeout(10)
        while chunk := s.recv(65536):
            got += chunk
    assert got.count(b"HTTP/1.1 200 OK") == 3, got
    assert b"connection: close" in got.rpartition(b"HTTP/1.1 200 OK")[2].lower(), got


def test_the_parsing_process_closed_while_it_starts(monkeypatch):
    """A SIGTERM while the JSON parsing process was starting (serve starts it in a thread)
    found it unstarted: close() raised AttributeError and serve exited 1. Closed then, the
    process is killed once started."""
    import multiprocessing.context as mpc

    from worker.serve.apart import Parser

    p = Parser()
    started = []
    real = mpc.SpawnProcess.start

    def start(proc):  # the shutdown arrives while the process starts
        p.close()
        real(proc)
        started.append(proc)

    monkeypatch.setattr(mpc.SpawnProcess, "start", start)
    p.start()
    assert started and not started[0].is_alive()


def test_missing_values_are_counted_by_feature_when_metrics_are_read():
    """serve adds a request's missing values up in an array (a counter's inc a missing
    feature cost more than a one-row request's scoring) and into the counters each second
    and before /metrics answers: every value counted, under its own model's names."""
    from prometheus_client import generate_latest

    from worker.serve.service import ServeMetrics

    m = ServeMetrics()
    names_a, names_b = ["a0", "a1", "a2"], ["b0", "b1"]
    rng = np.random.default_rng(3)
    X = rng.normal(size=(50, 3)).astype(np.float32)
    X[rng.random((50, 3)) < 0.3] = np.nan
    m.count_features(names_a, X[:1], {})
    m.count_features(names_a, X[1:], {})
    m.count_features(names_a, X.astype(np.float64), {})  # (numpy counts what is not float32)
    m.count_features(names_b, np.full((2, 2), np.nan, np.float32), {})  # a swapped model
    m.flush_features()
    text = generate_latest(m.registry).decode()
    for j, name in enumerate(names_a):
        want = 2 * int(np.isnan(X[:, j]).sum())
        assert f'serve_feature_missing_total{{feature="{name}"}} {float(want)}' in text, text
    for name in names_b:
        assert f'serve_feature_missing_total{{feature="{name}"}} 2.0' in text, text
    m.flush_features()  # nothing counted twice
    assert generate_latest(m.registry).decode() == text


def test_a_requests_missing_values_show_in_metrics_at_once(http):
    """Through the server: the missing values of the requests answered so far are in the
    /metrics read right after them (added up, and flushed before the page is made)."""
    def missing(text: str, j: int) -> float:
        m = re.search(rf'^serve_feature_missing_total{{feature="feat_{j}"}} (\S+)$', text, re.M)
        return float(m.group(1)) if m else 0.0

    before = get(http, "/metrics")[1].decode()
    data = [None if j % 2 else 0.5 for j in range(M.N_FEATURES)]
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, M.N_FEATURES],
                                   "datatype": "FP32", "data": data}]}).encode()
    for _ in range(3):
        assert post(http, "/v2/models/binary/infer", body)[0] == 200
    after = get(http, "/metrics")[1].decode()
    for j in range(M.N_FEATURES):
        assert missing(after, j) - missing(before, j) == (3.0 if j % 2 else 0.0), j
    # an Arrow body's nulls and NaN too (they counted none before: review)
    import pyarrow as pa

    cols = [pa.array(np.zeros(4, np.float32)) for _ in range(M.N_FEATURES)]
    cols[0] = pa.array([None, 1.0, None, 2.0], pa.float32())
    cols[1] = pa.array([np.nan, 1.0, 2.0, 3.0], pa.float32())
    batch = pa.RecordBatch.from_arrays(cols, names=[f"feat_{i}" for i in range(M.N_FEATURES)])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    status, _, out = post(http, "/v2/models/binary/infer", sink.getvalue().to_pybytes(),
                          {"Content-Type": "application/vnd.apache.arrow.stream"})
    assert status == 200, out[:300]
    last = get(http, "/metrics")[1].decode()
    assert [missing(last, j) - missing(after, j) for j in range(M.N_FEATURES)] == \
        [2.0, 1.0] + [0.0] * (M.N_FEATURES - 2)
