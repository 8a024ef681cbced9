"""Logs and exits an operator can act on (issue 52, item 3): a wrong broker address exits 1
within kafka.connect_timeout_s with one line naming the addresses and why; librdkafka's own
lines go through the worker's logger (JSON with logging.format: json), deduplicated and
rate-limited (worker/kafkalog.py); an absent topic is named as absent, with the setting that
names it."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from worker import kafkalog

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "tests" / "golden" / "fraud-xgb.model"


def _config(tmp_path, bootstrap: str, fmt: str = "json", extra: str = "",
            sink_topic: str = "out") -> Path:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "source: {type: kafka, topic: in}\n"
        f"sink: {{type: kafka, topic: {sink_topic}, dead_letter_topic: {sink_topic}-dlq}}\n"
        f"kafka: {{bootstrap_servers: '{bootstrap}', group_id: g, connect_timeout_s: 3}}\n"
        f"model: {{path: {MODEL}}}\n"
        "scoring: {id_column: txn_id}\n"
        f"logging: {{progress: false, format: {fmt}}}\n" + extra)
    return cfg


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_an_unreachable_bootstrap_exits_1_within_the_bound_naming_the_addresses(tmp_path, fmt):
    # before (issue 52): 102-131 s to exit 1, 234-2,451 raw librdkafka lines among the JSON
    # lines, and a plain fatal line that did not name the address
    cfg = _config(tmp_path, "127.0.0.1:1,127.0.0.1:2", fmt)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "worker.cli", "--config", str(cfg)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    assert took < 3 + 8, f"{took:.1f} s to exit (connect_timeout_s 3, plus the start-up)"
    lines = [x for x in text.splitlines() if x.strip()]
    assert not any(x.startswith("%") for x in lines), "raw librdkafka lines:\n" + text
    assert len(lines) < 40, f"{len(lines)} lines:\n{text}"
    fatal = [x for x in lines if "no Kafka broker answered" in x]
    assert len(fatal) == 1, text
    assert "127.0.0.1:1, 127.0.0.1:2" in fatal[0] and "Connection refused" in fatal[0], fatal
    if fmt == "json":
        events = [json.loads(x) for x in lines]  # every line is JSON
        assert json.loads(fatal[0])["level"] == "error"
        said = [e for e in events if e.get("event") == "librdkafka"]
        assert said and all(e["facility"] and e["client"].startswith("rdkafka#")
                            for e in said), events
    else:
        assert fatal[0].startswith("error: kafka: no Kafka broker answered"), fatal


def _record(fac: str, text: str, level=logging.ERROR) -> logging.LogRecord:
    # as confluent-kafka hands librdkafka's lines over: logger.log(level, "%s [%s] %s", ...)
    return logging.LogRecord("rdk", level, __file__, 1, "%s [%s] %s",
                             (fac, "rdkafka#consumer-1", text), None)


@pytest.fixture
def json_events():
    """The structlog events logged during the test (``level`` as a JSON line has it)."""
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        yield lambda: [{**e, "level": e["log_level"]} for e in logs]


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_the_bridge_says_a_repeated_line_once_then_how_often_it_came():
    clock = Clock()
    b = kafkalog.Bridge(clock)
    first = b.admit("FAIL", "Connect to ipv4#127.0.0.1:1 failed (after 0ms)")
    assert first == (0, 0)
    for ms in range(1, 50):  # the same failure, other numbers: one key
        clock.t += 0.1
        assert b.admit("FAIL", f"Connect to ipv4#127.0.0.1:1 failed (after {ms}ms)") is None
    assert b.admit("FAIL", "another failure") == (0, 0)  # another key is said at once
    clock.t += kafkalog.REPEAT_S
    assert b.admit("FAIL", "Connect to ipv4#127.0.0.1:1 failed (after 7ms)") == (49, 0)


def test_the_bridge_keeps_lines_about_different_brokers_and_clients_apart():
    # review: with every digit taken out, three brokers' failures were one line, and a
    # second broker failing stayed unsaid for a minute
    b = kafkalog.Bridge(Clock())
    said = [b.admit("FAIL", f"kafka-{n}:9092/{n}: Connect to ipv4#10.0.0.{n}:9092 failed "
                            f"(after {n * 7}ms in state CONNECT)") for n in (0, 1, 2)]
    assert said == [(0, 0)] * 3
    assert b.admit("FAIL", "kafka-0:9092/0: Connect to ipv4#10.0.0.0:9092 failed "
                           "(after 3ms in state CONNECT)") is None  # a repeat
    assert b.admit("FAIL", "kafka-0:9092/0: Connect to ipv4#10.0.0.0:9092 failed "
                           "(after 3ms in state CONNECT)", client="rdkafka#producer-2") == (0, 0)


def test_lines_below_the_level_do_not_use_up_the_rate(json_events):
    b = kafkalog.Bridge(Clock())
    b.setLevel(logging.INFO)
    for k in range(500):  # kafka.client debug: all, at logging.level INFO
        b.handle(_record("BROKER", f"debug line {k} of {'x' * (k % 50)}", logging.DEBUG))
    b.handle(_record("FAIL", "127.0.0.1:1/bootstrap: Connection refused"))
    # a setting every client gets, the other kind's: not a warning
    b.handle(_record("CONFWARN", "Configuration property fetch.min.bytes is a consumer "
                                 "property and will be ignored by this producer instance",
                     logging.WARNING))
    events = json_events()
    assert [(e["facility"], e["level"]) for e in events] == [("FAIL", "warning")], events
    assert "suppressed_lines" not in events[0]


def test_an_empty_or_impossible_bootstrap_is_a_config_error(tmp_path):
    for bad, says in (("' , '", "names no broker"), ("'h:99999'", "port 99999")):
        cfg = _config(tmp_path, "x", "console")
        cfg.write_text(cfg.read_text().replace("'x'", bad))
        proc = subprocess.run([sys.executable, "-m", "worker.cli", "--config", str(cfg)],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "kafka.bootstrap_servers" in proc.stderr and says in proc.stderr, proc.stderr


def test_the_bridge_limits_the_rate_and_says_what_it_dropped():
    clock = Clock()
    b = kafkalog.Bridge(clock)
    said = [b.admit("FAIL", f"line {chr(65 + k % 26) * (k // 26 + 1)}")
            for k in range(kafkalog.BURST + 30)]
    assert sum(x is not None for x in said) == kafkalog.BURST
    clock.t += kafkalog.WINDOW_S
    assert b.admit("FAIL", "a new line") == (0, 30)


def test_the_bridge_forgets_the_oldest_keys_first():
    clock = Clock()
    b = kafkalog.Bridge(clock)
    for k in range(kafkalog.KEYS + 100):
        clock.t += 1.0  # (past the rate window's share)
        b.admit("F", "x" * (k % 7) + chr(65 + k % 26) * (k // 26 + 1))
    assert len(b._seen) == kafkalog.KEYS


def test_the_bridge_renders_through_structlog(json_events):
    b = kafkalog.Bridge(Clock())
    b.emit(_record("FAIL", "Connect failed"))
    b.emit(_record("FAIL", "Connect failed"))  # a repeat: not said
    b.emit(_record("CONFWARN", "a setting ignored", logging.WARNING))
    b.emit(_record("INIT", "started", logging.INFO))
    events = json_events()
    assert [(e["facility"], e["level"]) for e in events] == [
        ("FAIL", "warning"), ("CONFWARN", "warning"), ("INIT", "info")]
    assert events[0]["message"] == "Connect failed" and events[0]["event"] == "librdkafka"


@pytest.mark.kafka
def test_an_absent_topic_is_named_as_absent_with_its_setting(tmp_path, kafka_bootstrap,
                                                             topic_factory):
    # before: "kafka access not verified (the brokers did not say)", as for a broker that
    # did not answer
    topic_in = topic_factory(partitions=1, prefix="in")
    cfg = _config(tmp_path, kafka_bootstrap, "json", sink_topic=f"absent-{topic_in}")
    cfg.write_text(cfg.read_text().replace("topic: in}", f"topic: {topic_in}}}"))
    log = tmp_path / "w.log"
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "--config", str(cfg)],
                            cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    try:
        deadline = time.monotonic() + 60
        while "worker started" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(60)
    events = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    absent = [e for e in events if e["event"].startswith("kafka topic does not exist")]
    assert len(absent) == 1, events
    assert absent[0]["topics"] == [f"absent-{topic_in} (sink.topic)",
                                   f"absent-{topic_in}-dlq (sink.dead_letter_topic)"], absent
    assert not any("not verified" in e["event"] and f"absent-{topic_in}" in str(e)
                   for e in events), events
