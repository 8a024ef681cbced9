"""KafkaSource's rule for rebalances inside a poll (issue 37): a record is dropped as revoked
only if it was fetched under an assignment that has ended since. The consumer is a stand-in
that runs the rebalance callbacks inside consume() in a chosen order (a broker cannot be made
to lose and give back a partition inside one given poll); tests/test_chaos.py does it on the
real broker with pauses."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition

from tests.kafka_util import arrow_bytes, input_table
from tests.test_batches import RecordingSink, _worker


class Msg:
    def __init__(self, partition, offset):
        self._p, self._o = partition, offset
        self._v = arrow_bytes(input_table(100 * partition + offset, 2, seed=offset))

    def error(self):
        return None

    def topic(self):
        return "in"

    def partition(self):
        return self._p

    def offset(self):
        return self._o

    def key(self):
        return b"k"

    def value(self):
        return self._v

    def timestamp(self):
        return (1, 1)

    def headers(self):
        return None


class CallbackConsumer:
    """consume() behaves as librdkafka's does for the script: fetched messages wait in a
    queue and each call delivers at most ``num_messages`` of them (none dropped); once the
    queue is empty, a call runs the next step: its rebalance callbacks, then its messages
    join the queue (issue 55: a fake that returned ``msgs[:num_messages]`` and dropped the
    rest never delivered a revoked partition's record, so the revocation rule went
    untested)."""

    def __init__(self, steps):
        self.steps = list(steps)
        self.assigned = []
        self.queue = []

    def subscribe(self, topics, on_assign, on_revoke, on_lost):
        self.cb = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}

    def consume(self, num_messages, timeout):
        assert num_messages >= 1
        if not self.queue and self.steps:
            events, msgs = self.steps.pop(0)
            for kind, parts in events:
                self.cb[kind](self, [TopicPartition("in", p) for p in parts])
            self.queue += msgs
        out, self.queue = self.queue[:num_messages], self.queue[num_messages:]
        return out

    def committed(self, partitions, timeout):
        return [TopicPartition(tp.topic, tp.partition, 0) for tp in partitions]

    def incremental_assign(self, start):
        self.assigned += start


def _source(monkeypatch, steps):
    from worker.io import kafka

    monkeypatch.setattr(kafka, "Consumer", lambda conf: CallbackConsumer(steps))
    return kafka.KafkaSource({}, ["in"])


def test_a_partition_lost_and_given_back_inside_a_poll_keeps_its_new_records(monkeypatch):
    # poll 1: both partitions assigned, (0, 0) and (1, 0) fetched; poll 2: a pause past the
    # session timeout: both lost and given back at the committed offset, then (0, 0) and
    # (0, 1) fetched under the new assignment. The records of poll 1 go (fetched under the
    # lost assignment; the new one fetched (0, 0) again, and will fetch (1, 0)); poll 2's stay
    steps = [([("assign", [0, 1])], [Msg(0, 0), Msg(1, 0)]),
             ([("lost", [0, 1]), ("assign", [0, 1])], [Msg(0, 0), Msg(0, 1)])]
    w = _worker(_source(monkeypatch, steps), RecordingSink(), max_wait_ms=10_000)
    items = w._collect()
    assert [(r.partition, r.offset) for r, _ in items] == [(0, 0), (0, 1)]


def test_a_revoked_partition_not_given_back_loses_its_records_to_the_next_owner(monkeypatch):
    # cooperative: partition 1 revoked (given to another member), partition 0 stays ours
    steps = [([("assign", [0, 1])], [Msg(0, 0), Msg(1, 0)]),
             ([("revoke", [1])], [Msg(0, 1)])]
    src = _source(monkeypatch, steps)
    items = _worker(src, RecordingSink(), max_wait_ms=10_000)._collect()
    assert [(r.partition, r.offset) for r, _ in items] == [(0, 0), (0, 1)]
    assert src.assigned == {("in", 0)}


def test_records_read_before_a_rewind_are_not_ours(monkeypatch):
    # a rewind (after an abort) seeks back to the committed offset: what was fetched before
    # it comes again, under a new epoch
    steps = [([("assign", [0])], [Msg(0, 0)])]
    src = _source(monkeypatch, steps)
    first = src.poll(10, 0.1)
    assert src.owns(first[0])
    src.consumer.assignment = lambda: [TopicPartition("in", 0)]
    src.consumer.seek = lambda tp: None
    src.rewind()
    assert not src.owns(first[0])


@pytest.mark.parametrize("asked", [1, 2, 5, 9])
def test_a_poll_returns_what_is_fetched_up_to_what_it_asked_for(monkeypatch, asked):
    # one message to wake the poll, then whatever else is already fetched, up to max_messages
    src = _source(monkeypatch, [([("assign", [0])], [Msg(0, k) for k in range(6)])])
    got = src.poll(asked, 0.1)
    assert [r.offset for r in got] == list(range(min(asked, 6)))


def test_a_message_without_a_timestamp_is_read_with_timestamp_0():
    from worker.io.kafka import to_record

    class Untimed(Msg):
        def timestamp(self):
            return (0, -1)  # TIMESTAMP_NOT_AVAILABLE

    assert to_record(Untimed(0, 3)).timestamp_ms == 0
    assert to_record(Msg(0, 3)).timestamp_ms == 1
