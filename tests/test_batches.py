"""Batches: prompt, bounded from above, held messages kept across batches and dropped when
their partition is revoked or the batch rolls back; input headers reach the score message."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from tests.kafka_util import arrow_bytes, input_table
from tests.stubs import ScriptedSource
from worker.io import BatchRolledBack
from worker.io.records import Record

GOLDEN = Path(__file__).resolve().parent / "golden"


class RecordingSink:
    topic = "scores"

    def __init__(self, fail_first=False):
        self.batches: list[list[Record]] = []
        self.outputs: list[Record] = []
        self.fail_first = fail_first

    def deliver(self, source, batch, outputs, dead):
        if self.fail_first:
            self.fail_first = False
            source.rewind()
            raise BatchRolledBack("simulated", transaction=False)
        self.batches.append(list(batch))
        self.outputs.extend(outputs)
        source.commit(batch)

    def close(self):
        pass


def _worker(source, sink, **delivery):
    import worker
    from tests import models as M
    from worker.config import load_settings
    from worker.loop import Worker

    model = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    settings = load_settings(None, delivery={"mode": "at_least_once", "max_wait_ms": 50,
                                             **delivery},
                             model={"path": "m.model"}, source={"type": "kafka", "topic": "in"},
                             logging={"progress": False})
    return Worker(settings, model, source, sink)


def _rec(partition, offset, rows=2, headers=()):
    return Record("in", partition, offset, b"k", arrow_bytes(input_table(offset, rows, seed=1)),
                  1, list(headers))


def test_row_and_byte_bounds_are_upper_bounds():
    recs = [_rec(0, i, rows=1000) for i in range(7)]
    src, sink = ScriptedSource([recs]), RecordingSink()
    w = _worker(src, sink, max_batch_rows=2500)
    assert w.run() == 0
    sizes = [len(b) for b in sink.batches]
    assert sizes == [2, 2, 2, 1]  # 2,000 rows each; the third message waited
    assert [r.offset for b in sink.batches for r in b] == list(range(7))  # order kept
    one_big = [_rec(0, 0, rows=3000), _rec(0, 1, rows=10)]
    src, sink = ScriptedSource([one_big]), RecordingSink()
    assert _worker(src, sink, max_batch_rows=2500).run() == 0
    assert [len(b) for b in sink.batches] == [1, 1]  # larger than a bound: a batch of its own
    # a message counts its decoded rows and what scoring and writing them take
    nbytes = _worker(ScriptedSource([]), RecordingSink()).pipeline.decode(recs[0]).nbytes
    src, sink = ScriptedSource([recs[:5]]), RecordingSink()
    assert _worker(src, sink, max_batch_bytes=max(1024, 3 * nbytes + 1)).run() == 0
    assert [len(b) for b in sink.batches] == [3, 2]


def test_row_and_byte_bounds_at_their_edge():
    """A batch holds exactly max_batch_rows rows and max_batch_bytes bytes; one row or one
    byte less and the last message waits (tests/BOUNDS.md)."""
    recs = [_rec(0, i, rows=1000) for i in range(4)]
    for bound, sizes in ((2000, [2, 2]), (1999, [1, 1, 1, 1])):
        src, sink = ScriptedSource([recs]), RecordingSink()
        assert _worker(src, sink, max_batch_rows=bound).run() == 0
        assert [len(b) for b in sink.batches] == sizes, bound
    w = _worker(ScriptedSource([]), RecordingSink())
    each = {max(len(r.value), w.pipeline.decode(r).nbytes) for r in recs}
    assert len(each) == 1  # the four messages count alike
    n = each.pop()
    for bound, sizes in ((2 * n, [2, 2]), (2 * n - 1, [1, 1, 1, 1])):
        src, sink = ScriptedSource([recs]), RecordingSink()
        assert _worker(src, sink, max_batch_bytes=max(1024, bound)).run() == 0
        assert [len(b) for b in sink.batches] == sizes, bound


def test_message_bound_limits_each_poll():
    src, sink = ScriptedSource([[_rec(0, i) for i in range(3)], [_rec(0, 3), _rec(0, 4)]]), \
        RecordingSink()
    assert _worker(src, sink, max_batch_messages=3).run() == 0
    assert [len(b) for b in sink.batches] == [3, 2]
    assert max(src.asked) <= 3


def test_held_messages_of_a_revoked_partition_are_dropped():
    # poll 1: (0, 0); poll 2 returns (1, 0) and (0, 1), which pass the row bound and are held,
    # and revokes partition 0 (rebalances run inside a poll): (0, 0) leaves the batch and
    # (0, 1) the held messages; (1, 0) stays held for the next batch
    polls = [[_rec(0, 0, rows=1000)], [_rec(1, 0, rows=1000), _rec(0, 1, rows=1000)]]
    src = ScriptedSource(polls, revoke_after_poll=2, revoked={("in", 0)})
    w = _worker(src, RecordingSink(), max_batch_rows=1500)
    assert w._collect() == []
    assert [(r.partition, r.offset) for r, _ in w._held] == [(1, 0)]
    assert [(r.partition, r.offset) for r, _ in w._collect()] == [(1, 0)]


def test_a_partition_lost_and_given_back_in_one_poll_keeps_what_came_after():
    # issue 37: a pause past the session timeout; poll 2 loses partition 0 and is given it
    # back at the committed offset (0), then returns (0, 0) and (0, 1) fetched under the new
    # assignment. Only the record fetched under the lost assignment, poll 1's (0, 0), goes:
    # the new assignment read it again. A filter by partition dropped all three (lost records)
    polls = [[_rec(0, 0), _rec(1, 0)], [_rec(0, 0), _rec(0, 1)]]
    src = ScriptedSource(polls, regain_in_poll=2, revoked={("in", 0)})
    items = _worker(src, RecordingSink())._collect()
    assert [(r.partition, r.offset) for r, _ in items] == [(1, 0), (0, 0), (0, 1)]


class RewindableSource(ScriptedSource):
    """One partition's records; commit moves the committed offset, rewind goes back to it."""

    def __init__(self, records):
        super().__init__([])
        self.records, self.pos, self.committed_pos = list(records), 0, 0

    @property
    def exhausted(self):
        return self.pos >= len(self.records)

    def poll(self, max_messages, timeout_s):
        out = self.records[self.pos:self.pos + max_messages]
        self.pos += len(out)
        return out

    def commit(self, batch):
        self.committed_pos = batch[-1].offset + 1

    def rewind(self):
        self.rewound += 1
        self.pos = self.committed_pos


def test_a_rolled_back_batch_drops_the_held_messages_too():
    # the first delivery fails: the source goes back to offset 0, so the messages held past
    # the first batch's bound come again from the source and must not also come from the hold
    src = RewindableSource([_rec(0, i, rows=1000) for i in range(4)])
    sink = RecordingSink(fail_first=True)
    assert _worker(src, sink, max_batch_rows=1500).run() == 0
    assert src.rewound == 1
    assert [r.offset for b in sink.batches for r in b] == [0, 1, 2, 3]  # once each, in order


def test_input_headers_follow_the_workers_own():
    rec = _rec(0, 0, headers=[("traceparent", b"00-abc-def-01"), ("content-type", b"x")])
    src, sink = ScriptedSource([[rec]]), RecordingSink()
    assert _worker(src, sink).run() == 0
    (out,) = sink.outputs
    keys = [k for k, _ in out.headers]
    assert keys[:2] == ["content-type", "model_id"]
    assert ("traceparent", b"00-abc-def-01") in out.headers
    assert keys.count("content-type") == 1
    table = pa.ipc.open_stream(out.value).read_all()
    assert table.num_rows == 2


def test_a_file_source_rewinds_to_the_first_undelivered_message(tmp_path):
    # before: FileSource.rewind raised, so `replay --topic` died on a failed delivery
    from worker.io.files import FileSource
    from worker.io.records import write_records

    path = tmp_path / "rec.arrows"
    write_records(path, [_rec(0, i, rows=1) for i in range(9)])
    src, sink = FileSource(path), RecordingSink(fail_first=True)
    w = _worker(src, sink, max_batch_messages=4)
    assert w.run() == 0
    delivered = [r.offset for b in sink.batches for r in b]
    assert delivered == list(range(9))  # the failed batch came again, once, in order
    src.close()


def test_a_file_sink_fsyncs_before_a_kafka_source_commits(tmp_path, monkeypatch):
    import os

    from worker.io.files import FileSink

    events = []
    monkeypatch.setattr(os, "fsync", lambda fd: events.append("fsync"))

    class KafkaLike(ScriptedSource):
        consumer = object()  # what a Kafka source has

        def commit(self, batch):
            events.append("commit")

    sink = FileSink(tmp_path / "o.arrows", tmp_path / "d.arrows")
    sink.deliver(KafkaLike([]), [_rec(0, 0)], [_rec(0, 0)], [_rec(0, 1)])
    assert events == ["fsync", "fsync", "commit"]  # scores and dead letters, then offsets
    events.clear()
    sink.deliver(ScriptedSource([]), [_rec(0, 2)], [_rec(0, 2)], [])  # a file source: no fsync
    assert events == []
    sink.close()


def test_a_group_that_fails_to_gather_is_scored_message_by_message_and_said(monkeypatch):
    # each message is still scored (alone); the failure is a warning, not silence
    from structlog.testing import capture_logs

    from worker.formats.arrow import ArrowFormat

    real = ArrowFormat.gather

    def gather(self, messages):
        if len(messages) > 1:
            raise RuntimeError("planted: a group never gathers")
        return real(self, messages)

    monkeypatch.setattr(ArrowFormat, "gather", gather)
    recs = [_rec(0, i) for i in range(3)]
    src, sink = ScriptedSource([recs]), RecordingSink()
    with capture_logs() as logs:
        assert _worker(src, sink).run() == 0
    assert len(sink.outputs) == 3 and not [r for r in sink.outputs if r.topic != "scores"]
    said = [e for e in logs if "failed to gather" in e["event"]]
    assert said and said[0]["messages"] >= 2 and "planted" in said[0]["error"]
