"""Configuration that cannot weaken the guarantees or destroy data, and start-up errors that
are one line and exit 2 (bad configuration) or 1 (a dependency down), never a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from worker.config import ConfigError, load_settings

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
MINIMAL = {"model": {"path": str(GOLDEN / "fraud-xgb.model")},  # the sections without defaults
           "source": {"type": "file", "path": str(GOLDEN / "input.arrows")}}


def cli(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "worker.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _file_config(tmp_path, **sections) -> Path:
    doc = {"model": {"path": str(GOLDEN / "fraud-xgb.model")},
           "source": {"type": "file", "path": str(GOLDEN / "input.arrows")},
           "sink": {"type": "file", "path": str(tmp_path / "out.arrows")},
           "logging": {"progress": False}}
    for k, v in sections.items():
        doc[k] = {**doc.get(k, {}), **v}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("key", ["isolation.level", "enable.auto.commit", "enable.idempotence",
                                 "transactional.id", "enable.auto.offset.store", "acks",
                                 "group.id", "Isolation.Level"])
def test_client_cannot_override_what_delivery_depends_on(tmp_path, key):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"kafka": {"client": {key: "x"}}}))
    with pytest.raises(ConfigError, match=r"kafka\.client"):
        load_settings(path)
    proc = cli("--config", path)
    assert proc.returncode == 2 and key in proc.stderr and "Traceback" not in proc.stderr


def test_client_settings_still_pass_through_and_guarantees_come_last():
    s = load_settings(None, kafka={"client": {"fetch.wait.max.ms": 5, "linger.ms": 1}},
                      **MINIMAL)
    c, p = s.consumer_config(), s.producer_config(transactional=True)
    assert c["fetch.wait.max.ms"] == 5 and p["linger.ms"] == 1
    assert c["isolation.level"] == "read_committed" and c["enable.auto.commit"] is False
    assert p["enable.idempotence"] is True


@pytest.mark.parametrize("thresholds", [[float("nan")], [0.2, float("inf")], [float("-inf")]])
def test_thresholds_must_be_finite(tmp_path, thresholds):
    # before: [.nan] was accepted and rows with score >= 0.5 got decision 0
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"scoring": {"thresholds": thresholds}}))
    with pytest.raises(ConfigError, match=r"scoring\.thresholds"):
        load_settings(path)


@pytest.mark.parametrize("which", ["sink", "dlq", "sink_is_dlq", "model"])
def test_outputs_cannot_alias_inputs(tmp_path, which):
    rec = tmp_path / "input.arrows"
    rec.write_bytes((GOLDEN / "input.arrows").read_bytes())
    before = rec.read_bytes()
    sink = {"sink": {"path": str(rec)},
            "dlq": {"path": str(tmp_path / "o.arrows"), "dead_letter_path": str(rec)},
            "sink_is_dlq": {"path": str(tmp_path / "o.arrows"),
                            "dead_letter_path": str(tmp_path / "sub" / ".." / "o.arrows")},
            "model": {"path": str(tmp_path / "m.model")}}[which]
    model = tmp_path / "m.model"
    model.write_bytes((GOLDEN / "fraud-xgb.model").read_bytes())
    cfg = _file_config(tmp_path, source={"path": str(rec)}, sink=sink,
                       model={"path": str(model)})
    proc = cli("--config", cfg)
    assert proc.returncode == 2, proc.stderr
    assert "the same file" in proc.stderr and "Traceback" not in proc.stderr
    assert rec.read_bytes() == before  # before: truncated (sink) or SIGBUS (dead letters)


def test_password_in_the_file_is_refused_unless_allowed(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"kafka": {"sasl_password": "hunter2"}}))
    with pytest.raises(ConfigError, match=r"kafka\.sasl_password.*environment"):
        load_settings(path)
    path.write_text(yaml.safe_dump({"kafka": {"client": {"ssl.key.password": "x"}}}))
    with pytest.raises(ConfigError, match=r"kafka\.client\.ssl\.key\.password"):
        load_settings(path)
    path.write_text(yaml.safe_dump({"kafka": {"sasl_password": "hunter2",
                                              "allow_secrets_in_file": True}, **MINIMAL}))
    s = load_settings(path)
    assert s.consumer_config()["sasl.password"] == "hunter2" and "hunter2" not in repr(s)


@pytest.mark.parametrize("var", ["SCORING_WORKER__BOGUS__X", "SCORING_WORKER__KAFKA__BOGUS"])
def test_unknown_environment_settings_are_refused(tmp_path, monkeypatch, var):
    monkeypatch.setenv(var, "1")
    with pytest.raises(ConfigError, match="bogus|BOGUS"):
        load_settings(None)
    proc = cli("--config", _file_config(tmp_path), env={var: "1"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_command_line_flags_win_over_the_environment(tmp_path):
    out = tmp_path / "cli.arrows"
    env = {"SCORING_WORKER__SINK__PATH": str(tmp_path / "env.arrows"),
           "SCORING_WORKER__MODEL__PATH": str(tmp_path / "absent.model")}
    proc = cli("replay", GOLDEN / "input.arrows", "--config", GOLDEN / "config.yaml",
               "--model", GOLDEN / "fraud-xgb.model", "--output", out, env=env)
    assert proc.returncode == 0, proc.stderr
    assert out.exists() and not (tmp_path / "env.arrows").exists()


def test_startup_errors_are_one_line(tmp_path):
    # a model path that is a directory
    d = tmp_path / "dir.model"
    d.mkdir()
    proc = cli("--config", _file_config(tmp_path, model={"path": str(d)}))
    assert proc.returncode == 2 and "model.path" in proc.stderr
    # a truncated recording
    rec = tmp_path / "cut.arrows"
    rec.write_bytes((GOLDEN / "input.arrows").read_bytes()[:5000])
    proc = cli("--config", _file_config(tmp_path, source={"path": str(rec)}))
    assert proc.returncode == 2 and "source.path" in proc.stderr, proc.stderr
    # a busy metrics port, and a host that is not an address
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = cli("--config", _file_config(tmp_path, metrics={"port": port}))
        assert proc.returncode == 2 and "metrics" in proc.stderr, proc.stderr
    proc = cli("--config", _file_config(tmp_path, metrics={"port": 9, "host": "no such host"}))
    assert proc.returncode == 2 and "metrics" in proc.stderr
    # an unknown librdkafka property
    cfg = _file_config(tmp_path, source={"type": "kafka", "topic": "t", "path": None},
                       kafka={"client": {"no.such.property": 1}})
    proc = cli("--config", cfg)
    assert proc.returncode == 2 and "no.such.property" in proc.stderr, proc.stderr
    # ... said before the access check waits for the (absent) brokers: librdkafka reads the
    # settings first (before: 30 s of connection errors, then the line)
    assert "kafka access" not in proc.stderr and "Connect to" not in proc.stderr, proc.stderr
    # a bad value of a known property, for the sink's producer (a file source)
    cfg = _file_config(tmp_path, sink={"type": "kafka", "topic": "o", "path": None},
                       kafka={"client": {"linger.ms": "soon"}})
    proc = cli("--config", cfg)
    assert proc.returncode == 2 and "linger.ms" in proc.stderr, proc.stderr
    assert "kafka access" not in proc.stderr and "Connect to" not in proc.stderr, proc.stderr
    for p in (proc,):
        assert "Traceback" not in p.stderr


def test_metrics_server_is_bounded():
    from worker.metrics import Metrics

    m = Metrics()
    server = m.serve("127.0.0.1", 0, max_connections=8, timeout_s=1.0)
    port = server.server_address[1]
    base = threading.active_count()
    socks = []
    try:
        for _ in range(200):  # idle, half-sent requests (the issue held 200 threads this way)
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /metr")
            socks.append(s)
        time.sleep(0.3)
        assert threading.active_count() <= base + 8
        time.sleep(1.5)  # their read timeout frees the slots
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            assert r.status == 200
    finally:
        for s in socks:
            s.close()
        server.shutdown()


@pytest.mark.parametrize("source,sink,why", [
    ("kafka", "file", "fsynced before the offsets commit"),
    ("file", "kafka", "a rerun publishes it again")])
def test_exactly_once_only_where_it_holds(tmp_path, source, sink, why):
    # before: a Kafka source with a file sink (or a recording published to Kafka) under
    # exactly_once silently ran at least once
    cfg = {"model": MINIMAL["model"],
           "source": {"type": "kafka", "topic": "in"} if source == "kafka"
           else MINIMAL["source"],
           "sink": {"type": "file", "path": str(tmp_path / "o.arrows")} if sink == "file"
           else {"type": "kafka", "topic": "out"},
           "kafka": {"bootstrap_servers": "127.0.0.1:1"}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**cfg, "delivery": {"mode": "exactly_once"}}))
    r = cli("--config", path, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("config error: delivery.mode: exactly_once needs") and why in \
        r.stderr, r.stderr
    # unset, the mode is what holds for the pair (at least once), and says so in the settings
    assert load_settings(None, **cfg).delivery.mode == "at_least_once"
    # Kafka to Kafka and file to file keep exactly once
    both = {**cfg, "source": MINIMAL["source"], "sink": {"type": "file",
                                                         "path": str(tmp_path / "o.arrows")}}
    assert load_settings(None, **both).delivery.mode == "exactly_once"
