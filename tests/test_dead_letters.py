"""`scoring-worker dead-letters`: the letters a real worker wrote, listed by reason with their
originals readable; `--requeue` puts the originals back on the input topic exactly as they came
(key, value, partition, timestamp, headers, the renamed ones restored) with a header naming the
letter, each once across runs and through a requeue killed mid-way; the fixed worker then scores
them. File sinks list too. Broker tests on the real local broker."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml
from confluent_kafka import Producer

from tests import kafka_util as K
from tests import models as M
from worker.deadletters import Selection, _iso, _preview, _safe, parse_since
from worker.io.records import RESERVED_HEADERS, original_headers
from worker.pipeline import forwarded

REPO = K.REPO


def run_cli(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "worker.cli", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


# --- no broker ------------------------------------------------------------------------------

def test_forwarded_headers_are_restored_exactly():
    """Every name the worker renames (its own, in any case, and names already starting with
    input-) comes back as it was: a requeue gives the input its own headers."""
    names = sorted(RESERVED_HEADERS) + ["ERROR", "Model_ID", "input-error", "INPUT-x",
                                        "input-input-a", "input-", "trace", "", "inputx"]
    headers = [(n, f"v{i}".encode()) for i, n in enumerate(names)]
    carried = forwarded(headers)
    assert not any(k.lower() in RESERVED_HEADERS for k, _ in carried)
    assert original_headers(carried) == headers
    assert dict(carried)["input-ERROR"] == dict(headers)["ERROR"]


def test_since_reads_times_and_ages():
    assert parse_since("2026-01-02T03:04:05Z") == 1767323045000
    assert parse_since("2026-01-02T03:04:05+01:00") == 1767323045000 - 3600_000
    assert parse_since("2026-01-02T03:04:05") == 1767323045000  # UTC unless it says
    assert parse_since("2h", now=10_000.0) == (10_000 - 7200) * 1000
    assert parse_since("1.5d", now=200_000.0) == int((200_000 - 129_600) * 1000)
    for bad in ("yesterday", "2h ago", "-3h", "", "12"):
        with pytest.raises(ValueError, match="--since"):
            parse_since(bad)


def test_payload_preview_never_parses_binary():
    assert _preview(None) == "(none)"
    assert _preview(b'{"a":\n 1}') == '{"a": 1}'
    long = ("x" * 1000).encode()
    assert _preview(long).endswith("... (1,000 bytes)") and len(_preview(long)) < 300
    arrow = b"\xff\xff\xff\xff" + bytes(range(60))
    assert _preview(arrow).startswith("<64 bytes, arrow IPC stream> ff ff ff ff 00 01")
    assert _preview(b"\x00\x00\x00\x00\x07\x02ab").startswith("<8 bytes, avro")
    assert _preview(b"\x1b[31mred").startswith("<8 bytes, binary>")  # no terminal escapes
    assert _preview("é".encode() * 2000).endswith("(4,000 bytes)")  # a character cut in two


def _jsonl_worker(tmp_path, model_path) -> tuple:
    good = {f"feat_{j}": 0.5 for j in range(M.N_FEATURES)}
    lines = [json.dumps({**good, "txn_id": 1}), '{"feat_0": 1', json.dumps({"txn_id": 3}),
             json.dumps({**good, "txn_id": 4})]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({
        "source": {"type": "file", "path": str(src), "format": "json"},
        "sink": {"type": "file", "path": str(tmp_path / "scores.arrows")},
        "model": {"path": str(model_path)}, "scoring": {"id_column": "txn_id"},
        "logging": {"progress": False}}))
    return cfg, lines


def test_file_sink_dead_letters_listed(tmp_path, model_path):
    cfg, lines = _jsonl_worker(tmp_path, model_path)
    r = run_cli("dead-letters", "--config", cfg)
    assert r.returncode == 1 and "does not exist (no dead letters written yet)" in r.stderr
    r = subprocess.run([sys.executable, "-m", "worker.cli", "--config", str(cfg)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli("dead-letters", "--config", cfg)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "scores-dlq.arrows: 2 dead letters, 2 selected" in out
    assert out.count("bad_json") == 2 and out.count("missing_field") == 2  # table + letter
    assert "'feat_0' (feat_0) is absent from the event" in out and '{"txn_id": 3}' in out
    r = run_cli("dead-letters", "--config", cfg, "--json", "--reason", "bad_json")
    views = [json.loads(x) for x in r.stdout.splitlines()]
    assert [(v["reason"], v["value"], v["source_offset"]) for v in views] == \
        [("bad_json", lines[1], 1)]
    r = run_cli("dead-letters", "--config", cfg, "--since", "nonsense")
    assert r.returncode == 2 and "--since" in r.stderr
    r = run_cli("dead-letters", "--config", cfg, "--requeue")
    assert r.returncode == 2 and "source.type, sink.type" in r.stderr


def test_selection():
    from worker.deadletters import parse_letter

    letter = parse_letter(0, 5, 1000, None, b"x", [("error_code", b"bad_json"),
                                                     ("error", b"e")])
    assert Selection().takes(letter)
    assert Selection(frozenset({"bad_json"}), 1000).takes(letter)
    assert not Selection(frozenset({"missing_field"})).takes(letter)
    assert not Selection(since_ms=1001).takes(letter)
    marker = parse_letter(1, 9, 0, None, None, [("requeued", b"5")])
    assert tuple(marker) == (1, 5)
    # a letter's input may carry a header named requeued: kept, never read as a marker
    kept = parse_letter(1, 9, 0, None, None, [("error_code", b"x"), ("requeued", b"5"),
                                              ("null", None)])
    assert kept.carried == [("requeued", b"5"), ("null", None)]
    for garbage in (b"", b"x", None):
        assert parse_letter(1, 9, 0, None, None, [("requeued", garbage)]).reason == "?"
    # a record carrying a requeued header and a worker's header is a letter, not a marker
    assert parse_letter(1, 9, 0, None, None, [("error_code", b"x"),
                                              ("requeued", b"5")]).reason == "x"


# --- the real broker ------------------------------------------------------------------------

N_GOOD, N_MISSING, N_BAD = 120, 24, 5


def _input_headers(i: int) -> list[tuple[str, bytes]]:
    # a trace header, names the worker writes itself (forwarded renamed), one already renamed
    return [("traceparent", f"00-{i:032x}-01".encode()), ("error", b"forged"),
            ("Model_ID", b"m"), ("input-error", b"pre-renamed"), ("empty", b"")]


def _produce(bootstrap, topic):
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    rng = np.random.default_rng(7)
    X = rng.normal(size=(N_GOOD + N_MISSING, M.N_FEATURES)).astype(np.float32)
    sent = {}
    for i in range(N_GOOD + N_MISSING):
        event = {"txn": {"id": f"t{i}"}, **{f"feat_{j}": float(X[i, j])
                                            for j in range(M.N_FEATURES)}}
        if i >= N_GOOD:  # upstream forgot feat_3
            del event["feat_3"]
            X[i, 3] = np.nan
        value = json.dumps(event).encode()
        key = f"card-{i}".encode()
        headers = _input_headers(i) if i >= N_GOOD else []
        ts = 1_700_000_000_000 + i
        p.produce(topic, value=value, key=key, partition=i % 2, headers=headers, timestamp=ts)
        if i >= N_GOOD:
            sent[key] = (value, i % 2, headers, ts)
    for k in range(N_BAD):
        p.produce(topic, value=b'{"feat_0": 1', key=f"bad-{k}".encode(), partition=k % 2)
    assert p.flush(60) == 0
    return X, sent


def _config(tmp_path, bootstrap, model_path, topics, name, optional=False):
    path = K.write_config(tmp_path / f"{name}.yaml", bootstrap, model_path, topics["in"],
                          topics["out"], topics["dlq"], group=f"g-{topics['in']}")
    cfg = yaml.safe_load(path.read_text())
    fields = {"txn_id": "txn.id"}
    if optional:  # the fix: feat_3 may be absent (scored as missing)
        fields["feat_3"] = {"path": "feat_3", "optional": True}
    cfg["source"].update({"format": "json", "fields": fields})
    cfg["sink"]["format"] = "json"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _ids(m):
    doc = json.loads(m.value())
    return [r["txn_id"] for r in ([doc] if isinstance(doc, dict) else doc)]


@pytest.mark.kafka
def test_list_requeue_each_once_and_score_after_the_fix(tmp_path, kafka_bootstrap,
                                                        topic_factory, model_path):
    topics = {"in": topic_factory(partitions=2, prefix="in"),
              "out": topic_factory(partitions=2, prefix="scores"),
              "dlq": topic_factory(partitions=2, prefix="dlq")}
    X, sent = _produce(kafka_bootstrap, topics["in"])
    cfg = _config(tmp_path, kafka_bootstrap, model_path, topics, "broken")
    proc = K.start_worker(cfg, tmp_path / "w1.log")
    try:
        K.wait_for_ids(kafka_bootstrap, topics["out"], N_GOOD, proc=proc, ids_of=_ids)
        K.read_topic(kafka_bootstrap, topics["dlq"], expect_messages=N_MISSING + N_BAD)
    finally:
        assert K.stop_worker(proc) == 0, (tmp_path / "w1.log").read_text()[-3000:]

    r = run_cli("dead-letters", "--config", cfg, "--limit", "2")
    assert r.returncode == 0, r.stderr
    assert f"{topics['dlq']}: {N_MISSING + N_BAD} dead letters, {N_MISSING + N_BAD} selected" \
        in r.stdout
    rows = {line.split()[0]: line.split()[1:3] for line in r.stdout.splitlines()[1:4]}
    assert rows["missing_field"] == [str(N_MISSING), "0"] and rows["bad_json"] == [str(N_BAD),
                                                                                    "0"]
    assert f"({N_MISSING + N_BAD - 2} more" in r.stdout

    r = run_cli("dead-letters", "--config", cfg, "--json", "--reason", "missing_field")
    views = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(views) == N_MISSING
    for v in views:
        value, part, headers, _ts = sent[v["key"].encode()]
        assert v["value"] == value.decode() and v["source_partition"] == part
        assert v["headers"] == [[k, h.decode()] for k, h in headers]
        assert v["source_topic"] == topics["in"] and not v["requeued"]

    r = run_cli("dead-letters", "--config", cfg, "--requeue", "--reason", "missing_field")
    assert r.returncode == 0, r.stderr
    assert f"requeued {N_MISSING} letters" in r.stdout
    again = run_cli("dead-letters", "--config", cfg, "--requeue", "--reason", "missing_field")
    assert again.returncode == 0, again.stderr
    assert "requeued 0 letters" in again.stdout and \
        f"not requeued: {N_MISSING} (requeued before)" in again.stdout

    msgs = K.read_topic(kafka_bootstrap, topics["in"],
                        expect_messages=N_GOOD + N_MISSING * 2 + N_BAD)
    copies = [m for m in msgs if any(k == "requeued_from" for k, _ in m.headers() or [])]
    assert len(copies) == N_MISSING
    origins = set()
    for v in views:  # the letters keep the input's own time
        assert v["source_timestamp"] == _iso(sent[v["key"].encode()][3])
    for m in copies:
        value, part, headers, ts = sent[m.key()]
        # stamped now: an input's old time would put the copy under retention at once
        assert m.value() == value and m.partition() == part and m.timestamp()[1] > ts
        *rest, (name, origin) = m.headers()
        assert rest == headers and name == "requeued_from"
        origins.add(origin)
        assert origin.decode().startswith(f"{topics['dlq']}:")
    assert len(origins) == N_MISSING

    r = run_cli("dead-letters", "--config", cfg)
    rows = {line.split()[0]: line.split()[1:3] for line in r.stdout.splitlines()[1:4]}
    assert rows["missing_field"] == [str(N_MISSING), str(N_MISSING)]
    assert rows["bad_json"] == [str(N_BAD), "0"]

    # the fix deployed: the worker resumes where it stopped and scores the copies
    fixed = _config(tmp_path, kafka_bootstrap, model_path, topics, "fixed", optional=True)
    proc = K.start_worker(fixed, tmp_path / "w2.log")
    try:
        out = K.wait_for_ids(kafka_bootstrap, topics["out"], N_GOOD + N_MISSING, proc=proc,
                             ids_of=_ids)
    finally:
        assert K.stop_worker(proc) == 0, (tmp_path / "w2.log").read_text()[-3000:]
    scores = {}
    for m in out:
        doc = json.loads(m.value())
        for row in [doc] if isinstance(doc, dict) else doc:
            scores.setdefault(row["txn_id"], []).append(row["score"])
    assert all(len(v) == 1 for v in scores.values())  # exactly once, the copies included
    ref = M.xgboost_models()["xgb-binary-logistic"].inplace_predict(X)
    got = [scores[f"t{i}"][0] for i in range(N_GOOD + N_MISSING)]
    np.testing.assert_allclose(got, ref, rtol=2e-7)
    assert all(math.isfinite(s) for s in got)


@pytest.mark.kafka
def test_a_requeue_killed_mid_way_then_rerun_copies_each_once(tmp_path, kafka_bootstrap,
                                                             topic_factory, model_path):
    n = 2600  # three transactions of up to 1,000
    topics = {"in": topic_factory(partitions=2, prefix="in"),
              "out": topic_factory(partitions=1, prefix="scores"),
              "dlq": topic_factory(partitions=2, prefix="dlq")}
    p = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True,
                  "linger.ms": 5})
    for k in range(n):
        p.produce(topics["in"], value=b'{"feat_0": 1', key=f"bad-{k}".encode(), partition=k % 2)
    assert p.flush(60) == 0
    cfg = _config(tmp_path, kafka_bootstrap, model_path, topics, "w")
    proc = K.start_worker(cfg, tmp_path / "w.log")
    try:
        K.read_topic(kafka_bootstrap, topics["dlq"], expect_messages=n)
    finally:
        assert K.stop_worker(proc) == 0, (tmp_path / "w.log").read_text()[-3000:]

    killed = subprocess.Popen([sys.executable, "-m", "worker.cli", "dead-letters", "--config",
                               str(cfg), "--requeue"], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    first = killed.stderr.readline()  # "requeued 1,000": the first transaction committed
    assert first.startswith("requeued 1,000"), first + killed.stderr.read()
    killed.send_signal(signal.SIGKILL)  # wherever the second one is
    killed.wait(30)
    time.sleep(0.5)
    r = run_cli("dead-letters", "--config", cfg, "--requeue", timeout=300)
    assert r.returncode == 0, r.stderr
    done_before = int(r.stdout.split("not requeued: ")[1].split()[0].replace(",", ""))
    assert 1000 <= done_before < n
    assert f"requeued {n - done_before:,} letters" in r.stdout

    msgs = K.read_topic(kafka_bootstrap, topics["in"], expect_messages=2 * n)
    origins = [dict(m.headers() or [])["requeued_from"] for m in msgs
               if any(k == "requeued_from" for k, _ in m.headers() or [])]
    assert len(origins) == n and len(set(origins)) == n
    keys = sorted(m.key() for m in msgs if m.headers())
    assert keys == sorted(f"bad-{k}".encode() for k in range(n))


# --- hostile letters, topics and stops (what a review found) --------------------------------

def test_terminal_sequences_in_a_letter_are_escaped():
    from worker.deadletters import describe, parse_letter

    evil = "esc\x1b[2J\x1b]0;title\x07\nforged [0:99] line"
    letter = parse_letter(0, 1, 0, b"k", b"v", [("error_code", evil.encode()),
                                                ("error", evil.encode()),
                                                ("model_id", evil.encode()),
                                                ("x\x1b[5mblink", b"\x1b[31m")])
    text = "\n".join(describe(letter, False))
    assert "\x1b" not in text and "\x07" not in text and text.count("\n") == 4
    assert "\\x1b[2J" in text and "x\\x1b[5mblink=<" in text
    assert _safe("plain text") == "plain text"


def _forged(tmp_path, kafka_bootstrap, topics, model_path, **kafka):
    path = K.write_config(tmp_path / "forged.yaml", kafka_bootstrap, model_path, topics["in"],
                          topics["out"], topics["dlq"], group=f"g-{topics['in']}", kafka=kafka)
    return path


def _letter(topic_in: str, i: int, value: bytes, code=b"bad_json") -> dict:
    return {"key": f"k{i}".encode(), "value": value,
            "headers": [("error", b"e"), ("error_code", code), ("source_topic", topic_in.encode()),
                        ("source_partition", b"0"), ("source_offset", str(i).encode()),
                        ("model_id", b"m" * 64), ("source_timestamp", b"1")]}


@pytest.mark.kafka
def test_a_copy_the_broker_refuses_is_skipped_and_the_rest_requeued(tmp_path, kafka_bootstrap,
                                                                     topic_factory,
                                                                     model_path):
    topics = {"in": topic_factory(partitions=1, prefix="in",
                                  config={"max.message.bytes": "4000"}),
              "out": topic_factory(partitions=1, prefix="scores"),
              "dlq": topic_factory(partitions=1, prefix="dlq")}
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for i, value in enumerate([b"a", b"x" * 20000, b"c"]):
        p.produce(topics["dlq"], **_letter(topics["in"], i, value))
    assert p.flush(30) == 0
    cfg = _forged(tmp_path, kafka_bootstrap, topics, model_path)
    r = run_cli("dead-letters", "--config", cfg, "--requeue")
    assert r.returncode == 0, r.stderr
    assert "requeued 2 letters" in r.stdout
    assert "not requeued: 1 (the broker refused its copy: " in r.stdout and \
        "the first: letter 0:1)" in r.stdout
    msgs = K.read_topic(kafka_bootstrap, topics["in"], expect_messages=2)
    assert sorted(m.value() for m in msgs) == [b"a", b"c"]
    again = run_cli("dead-letters", "--config", cfg, "--requeue")
    assert "requeued 0 letters" in again.stdout and "2 (requeued before)" in again.stdout


@pytest.mark.kafka
def test_an_open_transaction_on_the_topic_stops_a_requeue_and_is_said(tmp_path,
                                                                     kafka_bootstrap,
                                                                     topic_factory, model_path):
    topics = {"in": topic_factory(partitions=1, prefix="in"),
              "out": topic_factory(partitions=1, prefix="scores"),
              "dlq": topic_factory(partitions=1, prefix="dlq")}
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(3):
        p.produce(topics["dlq"], **_letter(topics["in"], i, b"v"))
    assert p.flush(30) == 0
    cfg = _forged(tmp_path, kafka_bootstrap, topics, model_path, connect_timeout_s=2)
    assert run_cli("dead-letters", "--config", cfg, "--requeue").returncode == 0
    # (offsets 0-2 letters, 3-5 markers, 6 their commit) a producer that began a transaction
    # on the dead-letter topic and never ended it: the
    # markers written after it are hidden from read-committed readers until it ends
    stuck = Producer({"bootstrap.servers": kafka_bootstrap,
                      "transactional.id": f"stuck-{topics['dlq']}"})
    stuck.init_transactions(10)
    stuck.begin_transaction()
    stuck.produce(topics["dlq"], value=b"open")
    stuck.flush(10)
    more = Producer({"bootstrap.servers": kafka_bootstrap})
    more.produce(topics["dlq"], **_letter(topics["in"], 3, b"v"))
    assert more.flush(30) == 0
    r = run_cli("dead-letters", "--config", cfg, "--requeue")
    assert r.returncode == 1 and "has a transaction open since offset 7" in r.stderr, r.stderr
    listing = run_cli("dead-letters", "--config", cfg)
    assert listing.returncode == 0 and "3 dead letters" in listing.stdout
    assert "a transaction open since offset 7 hides 2 records" in listing.stderr
    stuck.abort_transaction(10)
    r = run_cli("dead-letters", "--config", cfg, "--requeue")
    assert r.returncode == 0 and "requeued 1 letters" in r.stdout, r.stderr
    msgs = K.read_topic(kafka_bootstrap, topics["in"], expect_messages=4)
    assert len(msgs) == 4  # each once


def test_unreachable_brokers_are_one_line(tmp_path, model_path):
    topics = {"in": "i", "out": "o", "dlq": "d"}
    port = K.free_port()  # nothing listens there
    cfg = _forged(tmp_path, f"127.0.0.1:{port}", topics, model_path, connect_timeout_s=2)
    for extra in ([], ["--requeue"]):
        t0 = time.monotonic()
        r = run_cli("dead-letters", "--config", cfg, *extra)
        assert r.returncode == 1 and time.monotonic() - t0 < 20, r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert "Traceback" not in r.stderr and f"127.0.0.1:{port}" in last, r.stderr


def test_a_file_that_is_not_whole_is_said_in_one_line(tmp_path, model_path):
    cfg, _lines = _jsonl_worker(tmp_path, model_path)
    dlq = tmp_path / "scores-dlq.arrows"
    dlq.write_bytes(b"not arrow at all")
    r = run_cli("dead-letters", "--config", cfg)
    assert r.returncode == 1 and "is not a readable recorded topic" in r.stderr
    assert "Traceback" not in r.stderr
    dlq.unlink()
    dlq.mkdir()
    r = run_cli("dead-letters", "--config", cfg)
    assert r.returncode == 1 and "is a folder" in r.stderr
    dlq.rmdir()
    from worker.io.records import Record, RecordWriter

    with RecordWriter(dlq) as w:  # four batches, as a sink writes them batch by batch
        for b in range(4):
            w.write([Record("in", 0, i, None, b"x" * 5000, 0, [("error_code", b"bad_json")])
                     for i in range(b * 100, b * 100 + 100)])
    whole = dlq.read_bytes()
    dlq.write_bytes(whole[: len(whole) * 2 // 3])  # a write cut short
    r = run_cli("dead-letters", "--config", cfg, "--limit", "0")
    assert r.returncode == 0, r.stderr
    assert "warning:" in r.stderr and "a write cut short?" in r.stderr
    assert "200 dead letters" in r.stdout  # the whole batches before the cut


def test_requeue_refuses_listing_flags(tmp_path, model_path):
    cfg, _ = _jsonl_worker(tmp_path, model_path)
    r = run_cli("dead-letters", "--config", cfg, "--requeue", "--json")
    assert r.returncode == 2 and "--json and --limit are for listing" in r.stderr


@pytest.mark.kafka
def test_a_requeue_stopped_by_sigterm_aborts_and_says_so(tmp_path, kafka_bootstrap,
                                                         topic_factory, model_path):
    topics = {"in": topic_factory(partitions=1, prefix="in"),
              "out": topic_factory(partitions=1, prefix="scores"),
              "dlq": topic_factory(partitions=1, prefix="dlq")}
    n = 6000
    p = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(topics["dlq"], **_letter(topics["in"], i, b"v" * 2000))
        p.poll(0)
    assert p.flush(60) == 0
    cfg = _forged(tmp_path, kafka_bootstrap, topics, model_path)
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "dead-letters", "--config",
                             str(cfg), "--requeue"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    first = proc.stderr.readline()
    assert first.startswith("requeued 1,000"), first + proc.stderr.read()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(60)
    rest = proc.stderr.read()
    assert rc == 128 + signal.SIGTERM and "stopped" in rest, rest
    t0 = time.monotonic()  # the aborted transaction holds no reader back
    r = run_cli("dead-letters", "--config", cfg, "--requeue", timeout=300)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 60
    msgs = K.read_topic(kafka_bootstrap, topics["in"], expect_messages=n)
    origins = [dict(m.headers())["requeued_from"] for m in msgs]
    assert len(origins) == n and len(set(origins)) == n
