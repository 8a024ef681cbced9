"""Replay tests: recorded topics through the worker, compared with committed golden files.

The golden files are regenerated only by `make golden` (tests/golden/__main__.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from worker.io.records import Record, read_records, write_records
from worker.replay import compare, produce_records

GOLDEN = Path(__file__).resolve().parent / "golden"
REPO = GOLDEN.parent.parent


def cli(*args, check=False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "worker.cli", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, check=check, timeout=300)


def replay(input_path, output, *extra) -> subprocess.CompletedProcess:
    return cli("replay", input_path, "--config", GOLDEN / "config.yaml", "--model",
               GOLDEN / "fraud-xgb.model", "--output", output, *extra)


def test_replay_matches_golden(tmp_path):
    out = tmp_path / "scores.arrows"
    proc = replay(GOLDEN / "input.arrows", out, "--expect", GOLDEN / "scores.arrows")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "identical within tolerance" in proc.stdout
    # the malformed messages of the recording land in the dead-letter file, unchanged
    dead = list(read_records(tmp_path / "scores-dlq.arrows"))
    golden_dead = list(read_records(GOLDEN / "scores-dlq.arrows"))
    assert [d.value for d in dead] == [d.value for d in golden_dead]
    assert len(dead) == 3
    assert {dict(d.headers)["error_code"] for d in dead} == \
        {b"not_arrow", b"missing_column", b"empty_batch"}


def _perturbed_golden(tmp_path: Path) -> Path:
    """The golden file with one score nudged and one row dropped."""
    recs = list(read_records(GOLDEN / "scores.arrows"))
    t = pa.ipc.open_stream(recs[4].value).read_all()
    score = t.column("score").to_pylist()
    score[0] += 1e-3
    t = t.set_column(t.schema.get_field_index("score"), "score", pa.array(score)).slice(0, 5)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    recs[4] = Record(recs[4].topic, recs[4].partition, recs[4].offset, recs[4].key,
                     sink.getvalue().to_pybytes(), recs[4].timestamp_ms, recs[4].headers)
    path = tmp_path / "golden-perturbed.arrows"
    write_records(path, recs)
    return path


def test_replay_reports_differences(tmp_path):
    golden = _perturbed_golden(tmp_path)
    proc = replay(GOLDEN / "input.arrows", tmp_path / "s.arrows", "--expect", golden)
    assert proc.returncode == 1
    assert "DIFFERENCES" in proc.stdout
    assert "score: 1 rows differ" in proc.stdout
    assert "ids extra" in proc.stdout
    result = compare(tmp_path / "s.arrows", golden)
    assert len(result.differences["score"]) == 1 and not result.missing
    assert len(result.extra) == 15


@pytest.mark.kafka
def test_recorded_topic_from_broker_replays_to_golden(tmp_path, kafka_bootstrap, topic_factory):
    topic = topic_factory(partitions=3, prefix="transactions")
    n = produce_records(kafka_bootstrap, topic, GOLDEN / "input.arrows")
    recorded = tmp_path / "recorded.arrows"
    proc = cli("record", "--bootstrap-servers", kafka_bootstrap, "--topic", topic, "--output",
               recorded)
    assert proc.returncode == 0, proc.stderr
    assert f"recorded {n} messages" in proc.stdout
    got = list(read_records(recorded))
    assert sorted(r.value for r in got) == sorted(r.value for r in read_records(
        GOLDEN / "input.arrows"))
    proc = replay(recorded, tmp_path / "scores.arrows", "--expect", GOLDEN / "scores.arrows")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.kafka
def test_record_bounds_and_replay_to_topic(tmp_path, kafka_bootstrap, topic_factory):
    from tests.kafka_util import output_ids, read_topic

    topic = topic_factory(partitions=3, prefix="transactions")
    produce_records(kafka_bootstrap, topic, GOLDEN / "input.arrows")
    part = tmp_path / "part.arrows"
    proc = cli("record", "--bootstrap", kafka_bootstrap, "--topic", topic, "--output", part,
               "--max-messages", 7)
    assert proc.returncode == 0, proc.stderr
    assert len(list(read_records(part))) == 7
    out_topic = topic_factory(partitions=1, prefix="scores")
    proc = cli("replay", GOLDEN / "input.arrows", "--config", GOLDEN / "config.yaml", "--model",
               GOLDEN / "fraud-xgb.model", "--topic", out_topic, "--bootstrap", kafka_bootstrap)
    assert proc.returncode == 0, proc.stderr
    msgs = read_topic(kafka_bootstrap, out_topic, expect_messages=57)
    golden_ids = compare(GOLDEN / "scores.arrows", GOLDEN / "scores.arrows")
    assert len(msgs) == 57 and golden_ids.ok
    assert len(output_ids(msgs)) == 1140
