"""JSON and Avro events through the worker on the real broker, both delivery modes: every
event scored once (exactly once) or at least once, scores equal to XGBoost's own, malformed
messages in the dead-letter topic with their reasons and counted by reason in the metrics; a
SIGKILL and a restart in exactly-once lose and duplicate nothing."""

from __future__ import annotations

import json
import math
import signal
import socket
import urllib.request

import numpy as np
import pytest
import yaml
from confluent_kafka import Producer

from tests import kafka_util as K
from tests import models as M

pytestmark = pytest.mark.kafka

N_EVENTS = 600


def _events(n: int, seed: int = 3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, M.N_FEATURES)).astype(np.float32)
    X[rng.random(X.shape) < 0.1] = np.nan
    events = [{"txn": {"id": f"t{i}"}, **{f"feat_{j}": (None if math.isnan(v) else v)
                                          for j, v in enumerate(X[i].tolist())}}
              for i in range(n)]
    return X, events


def _produce(bootstrap: str, topic: str, events: list[dict], bad: dict[str, bytes]) -> int:
    """Half the events one a message, the rest in arrays of 10; then the bad ones."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    half = len(events) // 2
    values = [json.dumps(e).encode() for e in events[:half]]
    values += [json.dumps(events[i:i + 10]).encode() for i in range(half, len(events), 10)]
    for k, v in enumerate(values):
        p.produce(topic, value=v, key=f"card-{k}".encode(), partition=k % 2)
    for name, v in bad.items():
        p.produce(topic, value=v, key=name.encode(), partition=0)
    assert p.flush(60) == 0
    return len(values)


def _rows_of(m) -> list[dict]:
    doc = json.loads(m.value())
    return [doc] if isinstance(doc, dict) else doc


def _read_rows(bootstrap: str, topic: str, n_ids: int, timeout: float = 120, proc=None):
    """(every output row, every output message) of a topic, read committed, until n_ids
    distinct ids arrived."""
    msgs = K.wait_for_ids(bootstrap, topic, n_ids, timeout, proc,
                          ids_of=lambda m: [r["txn_id"] for r in _rows_of(m)])
    return [r for m in msgs for r in _rows_of(m)], msgs


def _config(tmp_path, bootstrap, model_path, topics, mode, port=0):
    path = K.write_config(tmp_path / f"json-{mode}.yaml", bootstrap, model_path, topics["in"],
                          topics["out"], topics["dlq"], group=f"g-{topics['in']}", mode=mode,
                          metrics_port=port)
    cfg = yaml.safe_load(path.read_text())
    cfg["source"].update({"format": "json", "fields": {"txn_id": "txn.id"}})
    cfg["sink"]["format"] = "json"
    path.write_text(yaml.safe_dump(cfg))
    return path


BAD = {"bad_type": b'{"feat_0": "high", "txn": {"id": "x"}}', "bad_json": b'{"feat_0": 1',
       "too_deep": b"[" * 1000 + b"]" * 1000}


@pytest.mark.parametrize("mode", ["at_least_once", "exactly_once"])
def test_json_events_on_the_broker(tmp_path, kafka_bootstrap, topic_factory, model_path, mode):
    topics = {"in": topic_factory(partitions=2, prefix="in"),
              "out": topic_factory(partitions=2, prefix="scores"),
              "dlq": topic_factory(partitions=1, prefix="dlq")}
    X, events = _events(N_EVENTS)
    n_msgs = _produce(kafka_bootstrap, topics["in"], events, BAD)
    with socket.socket() as s:  # a port the system says is free (a random one in the
        s.bind(("127.0.0.1", 0))  # ephemeral range collided with a client's, CI 2026-12-04)
        port = s.getsockname()[1]
    proc = K.start_worker(_config(tmp_path, kafka_bootstrap, model_path, topics, mode, port),
                          tmp_path / "w.log")
    try:
        rows, msgs = _read_rows(kafka_bootstrap, topics["out"], N_EVENTS, proc=proc)
        dlq = K.read_topic(kafka_bootstrap, topics["dlq"], expect_messages=len(BAD))
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                         timeout=5).read().decode()
    finally:
        rc = K.stop_worker(proc)
    log = (tmp_path / "w.log").read_text()
    assert rc == 0, log[-3000:]
    ids = [r["txn_id"] for r in rows]
    assert set(ids) == {f"t{i}" for i in range(N_EVENTS)}, log[-2000:]
    if mode == "exactly_once":
        assert len(ids) == N_EVENTS and len(msgs) == n_msgs
    # scores: XGBoost's own, by id
    booster = M.xgboost_models()["xgb-binary-logistic"]
    ref = booster.inplace_predict(X)
    by_id = {r["txn_id"]: r["score"] for r in rows}
    np.testing.assert_allclose([by_id[f"t{i}"] for i in range(N_EVENTS)], ref, rtol=2e-7)
    # one object out for an object in, an array for an array; key and headers kept
    singles = [m for m in msgs if isinstance(json.loads(m.value()), dict)]
    assert len(singles) >= N_EVENTS // 2
    assert all(dict(m.headers())["content-type"] == b"application/json" for m in msgs)
    assert all(m.key().startswith(b"card-") for m in msgs)
    # dead letters with their reasons, and counted by reason
    assert sorted(dict(m.headers())["error_code"].decode() for m in dlq) == sorted(BAD)
    for reason in BAD:
        assert f'scoring_dead_letters_total{{reason="{reason}"}} 1.0' in metrics, reason


def test_json_sigkill_and_restart_lose_and_duplicate_nothing(tmp_path, kafka_bootstrap,
                                                             topic_factory, model_path):
    topics = {"in": topic_factory(partitions=2, prefix="in"),
              "out": topic_factory(partitions=2, prefix="scores"),
              "dlq": topic_factory(partitions=1, prefix="dlq")}
    _, events = _events(N_EVENTS, seed=4)
    cfg = _config(tmp_path, kafka_bootstrap, model_path, topics, "exactly_once")
    proc = K.start_worker(cfg, tmp_path / "w1.log")
    _produce(kafka_bootstrap, topics["in"], events[:N_EVENTS // 2], {})
    first, _ = _read_rows(kafka_bootstrap, topics["out"], 50, timeout=60, proc=proc)
    assert len(first) >= 50, (tmp_path / "w1.log").read_text()[-3000:]
    proc.send_signal(signal.SIGKILL)  # wherever it is now: mid-batch, mid-transaction
    proc.wait(30)
    _produce(kafka_bootstrap, topics["in"], events[N_EVENTS // 2:], {})
    proc = K.start_worker(cfg, tmp_path / "w2.log")
    try:
        rows, _ = _read_rows(kafka_bootstrap, topics["out"], N_EVENTS, proc=proc)
    finally:
        rc = K.stop_worker(proc)
    assert rc == 0, (tmp_path / "w2.log").read_text()[-3000:]
    ids = sorted(r["txn_id"] for r in rows)
    assert ids == sorted({r["txn"]["id"] for r in events}), "lost or duplicated events"


@pytest.mark.parametrize("mode", ["at_least_once", "exactly_once"])
def test_avro_events_on_the_broker(tmp_path, kafka_bootstrap, topic_factory, model_path, mode):
    import io
    import struct

    fastavro = pytest.importorskip("fastavro")
    topics = {"in": topic_factory(partitions=2, prefix="in"),
              "out": topic_factory(partitions=2, prefix="scores"),
              "dlq": topic_factory(partitions=1, prefix="dlq")}
    schema = {"type": "record", "name": "Txn", "fields": [
        {"name": "txn", "type": {"type": "record", "name": "T",
                                 "fields": [{"name": "id", "type": "string"}]}},
        *({"name": f"feat_{j}", "type": ["null", "float"]} for j in range(M.N_FEATURES))]}
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "12.avsc").write_text(json.dumps(schema))
    parsed = fastavro.parse_schema(schema)
    X, events = _events(300, seed=6)
    p = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for k, ev in enumerate(events):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, ev)
        p.produce(topics["in"], value=b"\0" + struct.pack(">I", 12) + buf.getvalue(),
                  key=f"card-{k}".encode(), partition=k % 2)
    for value in (b"\0\0\0\0\x63\x00", b"\x07notavro"):  # an unknown schema, a bad magic byte
        p.produce(topics["in"], value=value, partition=0)
    assert p.flush(60) == 0
    cfg = _config(tmp_path, kafka_bootstrap, model_path, topics, mode)
    doc = yaml.safe_load(cfg.read_text())
    doc["source"].update({"format": "avro", "schemas_dir": str(tmp_path / "schemas")})
    cfg.write_text(yaml.safe_dump(doc))
    proc = K.start_worker(cfg, tmp_path / "w.log")
    try:
        rows, msgs = _read_rows(kafka_bootstrap, topics["out"], len(events), proc=proc)
        dlq = K.read_topic(kafka_bootstrap, topics["dlq"], expect_messages=2)
    finally:
        rc = K.stop_worker(proc)
    assert rc == 0, (tmp_path / "w.log").read_text()[-3000:]
    ids = [r["txn_id"] for r in rows]
    assert set(ids) == {f"t{i}" for i in range(len(events))}
    if mode == "exactly_once":
        assert len(ids) == len(events)
    ref = M.xgboost_models()["xgb-binary-logistic"].inplace_predict(X)
    by_id = {r["txn_id"]: r["score"] for r in rows}
    np.testing.assert_allclose([by_id[f"t{i}"] for i in range(len(events))], ref, rtol=2e-7)
    assert sorted(dict(m.headers())["error_code"] for m in dlq) == [b"bad_magic",
                                                                    b"unknown_schema"]


def test_json_topic_recorded_and_replayed(tmp_path, kafka_bootstrap, topic_factory, model_path):
    """`record` keeps JSON messages as they are on the topic; `replay` of the recording
    scores them as the worker does (XGBoost's own scores), and --expect passes against it."""
    import subprocess
    import sys

    from worker.io.records import read_outputs

    topics = {"in": topic_factory(partitions=2, prefix="in"), "out": "unused",
              "dlq": "unused-dlq"}
    X, events = _events(200, seed=5)
    n_msgs = _produce(kafka_bootstrap, topics["in"], events, {})
    rec = tmp_path / "json.arrows"
    cli = [sys.executable, "-m", "worker.cli"]
    r = subprocess.run([*cli, "record", "--bootstrap-servers", kafka_bootstrap, "--topic",
                        topics["in"], "--output", str(rec), "--max-messages", str(n_msgs),
                        "--max-seconds", "60"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    cfg = _config(tmp_path, kafka_bootstrap, model_path, topics, "at_least_once")
    out = tmp_path / "replayed.arrows"
    r = subprocess.run([*cli, "replay", str(rec), "--config", str(cfg), "--output", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    tables = [t for _, t in read_outputs(out)]
    ids = [i for t in tables for i in t.column("id").to_pylist()]
    scores = [s for t in tables for s in t.column("score").to_pylist()]
    assert sorted(ids) == sorted(f"t{i}" for i in range(200))
    ref = M.xgboost_models()["xgb-binary-logistic"].inplace_predict(X)
    by_id = dict(zip(ids, scores, strict=True))
    np.testing.assert_allclose([by_id[f"t{i}"] for i in range(200)], ref, rtol=2e-7)
    r = subprocess.run([*cli, "replay", str(rec), "--config", str(cfg), "--output",
                        str(tmp_path / "again.arrows"), "--expect", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
