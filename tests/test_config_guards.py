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
                                 "group.id", "Isolation.Level",
                                 # the security settings that have fields (a client key set
                                 # after them overrode the CA, the user, the key silently)
                                 "ssl.ca.location", "ssl.key.location", "sasl.username",
                                 "ssl.certificate.location", "sasl.oauthbearer.client.id"])
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


# ---- found by mutation testing (issue 55, mutation/RESULTS.md: worker/config.py) -----------

@pytest.mark.parametrize("budget_mb", [256, 1024, 4096, 65536])
def test_librdkafkas_queues_are_the_documented_fractions_of_the_memory_budget(budget_mb):
    # README (delivery.memory_budget_mb): the consumer's prefetch a sixteenth, the producer's
    # queue an eighth; librdkafka's own ceilings cap them (fetch.max.bytes at 50 MiB, the
    # prefetch at 2,097,151 KiB)
    s = load_settings(None, **MINIMAL, delivery={"memory_budget_mb": budget_mb,
                                                 "max_batch_bytes": 1 << 20})
    budget_kib = budget_mb * 1024
    consumer, producer = s.consumer_config(), s.producer_config(transactional=False)
    assert consumer["queued.max.messages.kbytes"] == min(2_097_151, budget_kib / 16)
    assert consumer["fetch.max.bytes"] == min(50 << 20, budget_kib * 1024 / 16)
    assert producer["queue.buffering.max.kbytes"] == budget_kib / 8


def test_a_json_lines_file_is_read_as_json_and_only_as_json():
    path = "events.jsonl"  # (read when the worker starts, not here)
    s = load_settings(None, model=MINIMAL["model"], source={"type": "file", "path": path,
                                                            "format": "json"})
    assert s.source.format == "json"
    for fmt in ("arrow", "avro"):
        with pytest.raises(ConfigError, match="holds JSON lines: set source.format to json"):
            load_settings(None, model=MINIMAL["model"],
                          source={"type": "file", "path": path, "format": fmt,
                                  **({"schemas_dir": "."} if fmt == "avro" else {})})


@pytest.mark.parametrize("written", ["sasl_ssl", " Sasl_Ssl "])
def test_protocol_and_mechanism_names_are_read_in_any_case(written, monkeypatch):
    monkeypatch.setenv("SCORING_WORKER__KAFKA__SASL_PASSWORD", "pw")
    s = load_settings(None, **MINIMAL, kafka={"security_protocol": written,
                                              "sasl_mechanism": "scram-sha-512",
                                              "sasl_username": "u"})
    assert (s.kafka.security_protocol, s.kafka.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")


def test_a_password_file_gone_when_the_clients_are_made_is_a_config_error_naming_it(
        tmp_path):
    # checked when the configuration is read, and read again when the clients are made (a
    # Secret volume unmounted or rotated in between): named, never a traceback
    path = tmp_path / "pw"
    path.write_text("secret\n")
    s = load_settings(None, **MINIMAL, kafka={"security_protocol": "SASL_SSL",
                                              "sasl_mechanism": "PLAIN", "sasl_username": "u",
                                              "sasl_password_file": str(path)})
    assert s.kafka.common()["sasl.password"] == "secret"
    path.unlink()
    with pytest.raises(ConfigError, match="kafka.sasl_password_file: cannot read"):
        s.kafka.common()


def test_a_validated_configuration_cannot_be_changed():
    # every section is frozen: a setting read at start-up is the one in force
    from pydantic import BaseModel, ValidationError

    s = load_settings(None, **MINIMAL, scoring={"lazy": {"mode": "certified", "tau": 0.9}})
    sections = [s]
    while sections:
        sec = sections.pop()
        for name, value in type(sec).model_fields.items():
            current = getattr(sec, name)
            if isinstance(current, BaseModel):
                sections.append(current)
            with pytest.raises((ValidationError, TypeError, AttributeError)):
                setattr(sec, name, current)
            del value


def test_dead_letters_and_shadow_scores_go_beside_the_scores_unless_named():
    s = load_settings(None, **MINIMAL, sink={"type": "kafka", "topic": "scores"})
    assert (s.sink.dead_letter_topic, s.sink.shadow_topic) == ("scores-dlq", "scores-shadow")
    s = load_settings(None, **MINIMAL, sink={"type": "kafka", "topic": "scores",
                                             "dead_letter_topic": "dlq.fraud"})
    assert s.sink.dead_letter_topic == "dlq.fraud"


@pytest.mark.parametrize("thresholds", [[0.5, 0.5], [0.2, 0.7, 0.7], [0.9, 0.1]])
def test_thresholds_must_be_strictly_increasing(thresholds):
    # README: "increasing; decision = how many the score is >= to": a repeated threshold is
    # a band no score can fall in
    with pytest.raises(ConfigError, match="scoring.thresholds.*strictly increasing"):
        load_settings(None, **MINIMAL, scoring={"thresholds": thresholds})


@pytest.mark.parametrize("budget_mb", [256, 1024, 3000])
def test_the_message_limit_defaults_to_an_eighth_of_the_memory_budget(budget_mb):
    s = load_settings(None, **MINIMAL, delivery={"memory_budget_mb": budget_mb,
                                                 "max_batch_bytes": 1 << 20})
    assert s.message_byte_limit == budget_mb * 1024 * 1024 / 8
