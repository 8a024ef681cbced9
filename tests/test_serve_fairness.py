"""No request starves the others (issue 50): a client sending one-row requests on a kept-alive
connection is timed alone, then while each attack the issue reproduced runs against the same
`scoring-worker serve` (explanations at serve.max_explain_rows, JSON at serve.max_json_bytes,
16 MiB of nested empty arrays, endless trailers, a thousand silent connections, clients that
pipeline and never read): its p99 stays within 10x its idle p99 (or 5 ms, whichever is
more), and none of its requests fails.

The attacks run in a process of their own at the lowest CPU priority (an attacker is another
machine; here it shares the two cores), the server as it runs in production."""

from __future__ import annotations

import contextlib
import http.client
import json
import multiprocessing
import os
import resource
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from tests.test_serve import Server

pytestmark = pytest.mark.alone  # timed: nothing runs beside it (tests/run.sh)

N_FEATURES = 32
IDLE_S, ATTACK_S = 3.0, 4.0
FLOOR_S = 0.005


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    xgb = pytest.importorskip("xgboost")
    import worker

    rng = np.random.default_rng(7)
    X = rng.normal(size=(4000, N_FEATURES)).astype(np.float32)
    y = (X[:, :4].sum(1) + rng.normal(size=4000) > 0).astype(int)
    booster = xgb.train({"objective": "binary:logistic", "max_depth": 6, "eta": 0.1,
                         "base_score": 0.5}, xgb.DMatrix(X, y), 200)
    path = tmp_path_factory.mktemp("fair") / "m.model"
    worker.compile_model(booster).save(path)
    return path


def _one_row() -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": [1, N_FEATURES], "datatype": "FP32",
                                   "data": [0.25] * N_FEATURES}]}).encode()


def _good_client(host: str, port: int, seconds: float) -> tuple[list[float], int]:
    """One-row requests, one after the other, on one kept-alive connection: latencies (s)
    and failures."""
    body = _one_row()
    conn = http.client.HTTPConnection(host, port, timeout=30)
    lat, failed = [], 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        try:
            conn.request("POST", "/v2/models/m/infer", body,
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            ok = r.status == 200
        except (OSError, http.client.HTTPException):
            ok = False
            conn.close()
            conn = http.client.HTTPConnection(host, port, timeout=30)
        lat.append(time.perf_counter() - t0)
        failed += not ok
        time.sleep(0.002)  # a client at ~400 requests/s, not a load generator
    conn.close()
    return lat, failed


# ---- the attacks (each in a process of its own, at nice 19) --------------------------------

def _post(host, port, body: bytes, headers: dict) -> None:
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request("POST", "/v2/models/m/infer", body, headers)
        conn.getresponse().read()
    except (OSError, http.client.HTTPException):
        pass
    finally:
        conn.close()


def _explain_body() -> tuple[bytes, dict]:
    rows = 10_000  # serve.max_explain_rows
    X = np.random.default_rng(1).normal(size=(rows, N_FEATURES)).astype(np.float32).tobytes()
    head = json.dumps({"inputs": [{"name": "x", "shape": [rows, N_FEATURES],
                                   "datatype": "FP32",
                                   "parameters": {"binary_data_size": len(X)}}],
                       "outputs": [{"name": "score"}, {"name": "reason_feature"},
                                   {"name": "reason_value"}],
                       "parameters": {"top_k": N_FEATURES}}).encode()
    return head + X, {"Content-Type": "application/octet-stream",
                      "Inference-Header-Content-Length": str(len(head))}


def _big_json() -> bytes:
    rows = ((16 << 20) - 100) // (N_FEATURES * 6)  # inside serve.max_json_bytes
    head = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[%d,%d],"data":[' % (
        rows, N_FEATURES)
    body = head + b",".join([b"0.125"] * (rows * N_FEATURES)) + b"]}]}"
    assert len(body) < 16 << 20
    return body


def _nested() -> bytes:
    n = (16 << 20) // 3 - 40
    return b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,7],"data":[' + \
        b",".join([b"[]"] * n) + b"]}]}"


def _attack(kind: str, host: str, port: int, seconds: float, ready) -> None:
    import threading

    os.nice(19)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    end = time.monotonic() + seconds
    socks: list[socket.socket] = []

    def loop(fn):
        while time.monotonic() < end:
            fn()

    threads = []
    if kind == "explain":
        body, headers = _explain_body()
        threads = [lambda: loop(lambda: _post(host, port, body, headers))] * 4
    elif kind == "big_json":
        body = _big_json()
        threads = [lambda: loop(lambda: _post(host, port, body,
                                              {"Content-Type": "application/json"}))] * 2
    elif kind == "nested":
        body = _nested()
        threads = [lambda: loop(lambda: _post(host, port, body,
                                              {"Content-Type": "application/json"}))] * 8
    elif kind == "trailers":
        def trailer():
            with contextlib.suppress(OSError), \
                    socket.create_connection((host, port), timeout=10) as s:
                s.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n"
                          b"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n0\r\nX-T: ")
                while time.monotonic() < end:
                    s.sendall(b"a" * 16384)
        threads = [trailer] * 40
    elif kind == "silent":
        for _ in range(1000):
            with contextlib.suppress(OSError):
                socks.append(socket.create_connection((host, port), timeout=5))
    elif kind == "pipeline":
        def pipeline():
            with contextlib.suppress(OSError):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.connect((host, port))
                s.settimeout(0.2)
                socks.append(s)
                req = b"GET /v2/models/m HTTP/1.1\r\nHost: x\r\n\r\n" * 100
                while time.monotonic() < end:
                    with contextlib.suppress(TimeoutError, BlockingIOError):
                        s.send(req)
        threads = [pipeline] * 6
    ts = [threading.Thread(target=t, daemon=True) for t in threads]
    for t in ts:
        t.start()
    ready.set()
    for t in ts:
        t.join(seconds + 60)
    while time.monotonic() < end:
        time.sleep(0.05)
    for s in socks:
        s.close()


@pytest.fixture(scope="module")
def server(model_path, tmp_path_factory):
    s = Server(model_path, tmp_path_factory.mktemp("fair-serve"), None, "--name", "m")
    yield s
    assert s.stop() == 0, s.output()[-3000:]


@pytest.fixture(scope="module")
def idle_p99(server) -> float:
    _good_client(server.host, server.port, 1.0)  # warm
    lat, failed = _good_client(server.host, server.port, IDLE_S)
    assert failed == 0
    return float(np.percentile(lat, 99))


@pytest.mark.parametrize("kind", ["explain", "big_json", "nested", "trailers", "silent",
                                  "pipeline"])
def test_a_good_client_is_answered_while_an_attack_runs(server, idle_p99, kind):
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_attack, args=(kind, server.host, server.port, ATTACK_S + 2, ready))
    p.start()
    try:
        assert ready.wait(60)
        time.sleep(1.0)  # the attack under way
        lat, failed = _good_client(server.host, server.port, ATTACK_S)
    finally:
        p.join(120)
        if p.is_alive():
            p.kill()
    p99 = float(np.percentile(lat, 99))
    print(f"{kind}: idle p99 {idle_p99 * 1e3:.2f} ms, under attack p99 {p99 * 1e3:.2f} ms "
          f"(max {max(lat) * 1e3:.1f} ms, {len(lat)} requests, {failed} failed)")
    assert failed == 0
    # 10x the idle p99, and no less than FLOOR_S: on a machine quicker at one-row requests the
    # fixed GIL holds of a large request (a 16 MiB body's copy, a few ms) would count against
    # a smaller idle figure (here the attacks measured 5-7x: bench/SERVE-FAIRNESS.md; before
    # issue 50, 900-11,000x)
    assert p99 <= max(10 * idle_p99, FLOOR_S), (kind, p99, idle_p99)
