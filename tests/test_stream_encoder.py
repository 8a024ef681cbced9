"""The batch-level message path: output streams built from cached schema bytes plus each
message's slice are the streams pyarrow's own writer produces; batches of one schema are
scored in one kernel call and each message gets exactly its rows back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from worker import codec
from worker.model.result import ScoreResult

GOLDEN = Path(__file__).resolve().parent / "golden"


def _result(n: int, seed: int = 0) -> ScoreResult:
    rng = np.random.default_rng(seed)
    score = rng.random(n)
    return ScoreResult(score=score, label=(score > 0.5).astype(np.int32),
                       decision=(score > 0.5).astype(np.int8),
                       work_units=rng.integers(1, 300, n).astype(np.int32),
                       stop_code=rng.integers(0, 6, n).astype(np.int8),
                       score_lo=score - 0.01, score_hi=score + 0.01)


def _reference(batch: pa.RecordBatch, rows: slice, meta: dict) -> pa.Table:
    """What pyarrow's stream writer makes of the same rows and metadata."""
    part = batch.slice(rows.start, rows.stop - rows.start).replace_schema_metadata(meta)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, part.schema) as w:
        w.write_batch(part)
    return pa.ipc.open_stream(sink.getvalue()).read_all()


IDS = {
    "int64": pa.array(np.arange(50, dtype=np.int64) * 7),
    "string": pa.array([f"txn-{i}" if i % 5 else None for i in range(50)]),
    "dictionary": pa.DictionaryArray.from_arrays(pa.array(np.arange(50) % 3, pa.int32()),
                                                 pa.array(["a", "b", "c"])),
    "uint8 with nulls": pa.array([i if i % 4 else None for i in range(50)], pa.uint8()),
}


@pytest.mark.parametrize("kind", list(IDS))
def test_streams_equal_the_writers_streams(kind):
    r = _result(50)
    out = codec.ResultColumns(r, classifier=True).batch(IDS[kind])
    meta = {b"model_id": b"ab" * 32, b"work_total": b"300"}
    enc = codec.StreamEncoder(meta)
    key = out.schema.serialize().to_pybytes()
    pieces = [slice(0, 1), slice(1, 11), slice(11, 11 + 38), slice(49, 50)]
    for topic, partition, offset in [("in", 0, 0), ("in", 0, 9), ("in", 3, -1),
                                     ("other.topic-x", 2**31 - 1, 2**63 - 1),
                                     ("in", 0, -(2**63))]:
        for rows in pieces:
            value = enc.encode(out, rows, topic, partition, offset, key)
            got = pa.ipc.open_stream(value).read_all()
            got.validate(full=True)
            want = _reference(out, rows, {**meta, b"input_topic": topic.encode(),
                                          b"input_partition": str(partition).encode(),
                                          b"input_offset": str(offset).encode()})
            assert got.equals(want, check_metadata=True), (kind, topic, offset, rows)
            assert got.column("stop_reason").to_pylist() == \
                [codec.STOP_REASONS[c] for c in r.stop_code[rows]]
    # the fast path was taken wherever the dictionaries are the same for every message
    heads = list(enc._heads.values())
    assert all(h is None for h in heads) == (kind == "dictionary")


def test_without_a_schema_key_every_stream_is_written_in_full():
    out = codec.ResultColumns(_result(5), classifier=False).batch(None)
    enc = codec.StreamEncoder({b"model_id": b"m"})
    value = enc.encode(out, slice(2, 4), "t", 1, 5)
    got = pa.ipc.open_stream(value).read_all()
    assert got.column("id").to_pylist() == [2, 3] and not enc._heads
    assert got.schema.metadata[b"input_offset"] == b"5"


def test_a_batch_of_many_messages_gives_each_message_its_own_rows():
    # messages of one schema scored together (one concatenation, one kernel call) give what
    # each message gets alone, with its own ids and offsets, across block edges (64 rows)
    from worker import demo
    from worker.config import load_settings
    from worker.io.records import Record
    from worker.model.compiled import load_model
    from worker.pipeline import Pipeline

    model_path = GOLDEN / "fraud-xgb.model"
    settings = load_settings(None, scoring={"threads": 1}, model={"path": str(model_path)},
                             source={"type": "file", "path": "x.arrows"})
    pipe = Pipeline(load_model(model_path), settings, "scores")
    sizes = [1, 3, 1, 64, 65, 2, 127, 1]
    table = demo.generate(sum(sizes), seed=9).select([demo.ID_COLUMN, *demo.FEATURES])
    recs, start = [], 0
    for i, n in enumerate(sizes):
        part = table.slice(start, n)
        start += n
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, part.schema) as w:
            w.write_table(part)
        recs.append(Record("in", i % 3, 100 + i, b"k", sink.getvalue().to_pybytes(), 1, []))
    together, dead, stats = pipe.process([(r, pipe.decode(r)) for r in recs])
    assert not dead and stats.rows == sum(sizes) and len(together) == len(recs)
    for rec, out in zip(recs, together, strict=True):
        (alone,), _, _ = pipe.process([(rec, pipe.decode(rec))])
        a = pa.ipc.open_stream(out.value).read_all()
        b = pa.ipc.open_stream(alone.value).read_all()
        assert a.equals(b, check_metadata=True)
        ids = pa.ipc.open_stream(rec.value).read_all().column(demo.ID_COLUMN)
        assert a.column("id").to_pylist() == ids.to_pylist()
        assert a.schema.metadata[b"input_offset"] == str(rec.offset).encode()
        assert a.schema.metadata[b"input_partition"] == str(rec.partition).encode()


def test_observe_many_counts_like_observe():
    from prometheus_client import CollectorRegistry, generate_latest

    from worker.metrics import Metrics, observe_many

    ages = [0.0, 0.0005, 0.0004, 0.001, 0.7, 2.5, 2.6, 59.9, 60.0, 61.0, 1e9, 0.02, 0.025]
    one, many = Metrics(CollectorRegistry()), Metrics(CollectorRegistry())
    for a in ages:
        one.end_to_end_seconds.observe(a)
    observe_many(many.end_to_end_seconds, ages)

    def samples(m):
        return [line for line in generate_latest(m.registry).decode().splitlines()
                if line.startswith("scoring_end_to_end_seconds") and "_created" not in line]

    assert samples(one) == samples(many) and len(samples(one)) == 19  # 17 buckets, count, sum
