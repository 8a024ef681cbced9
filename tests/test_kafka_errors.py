"""Transaction error policy for faults a broker cannot produce on demand (stub producer).

Everything else about delivery runs against the real broker in test_worker_kafka.py."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from worker.io.kafka import FatalKafkaError, KafkaSink, TransactionAborted
from worker.io.records import Record


class StubProducer:
    def __init__(self, fail_on: str | None = None, error: KafkaError | None = None,
                 fail_times: int = 1):
        self.calls: list[str] = []
        self.fail_on, self.error, self.fail_times = fail_on, error, fail_times

    def _maybe_fail(self, name):
        self.calls.append(name)
        if name == self.fail_on and self.fail_times > 0:
            self.fail_times -= 1
            raise KafkaException(self.error)

    def begin_transaction(self):
        self._maybe_fail("begin")

    def produce(self, topic, **kw):
        self.calls.append(f"produce:{topic}")

    def poll(self, timeout):
        return 0

    def send_offsets_to_transaction(self, offsets, meta, *args):
        self._maybe_fail("send_offsets")

    def commit_transaction(self, *args):
        self._maybe_fail("commit")

    def abort_transaction(self, *args):
        self.calls.append("abort")


class StubConsumer:
    def consumer_group_metadata(self):
        return object()


class StubSource:
    consumer = StubConsumer()

    def __init__(self):
        self.rewound = 0

    @staticmethod
    def next_offsets(batch):
        return []

    def rewind(self):
        self.rewound += 1


def sink_with(producer) -> KafkaSink:
    sink = KafkaSink.__new__(KafkaSink)  # no network: wire the stub in directly
    sink.producer, sink.topic, sink.dlq_topic = producer, "scores", "scores-dlq"
    sink.transactional, sink._errors = True, []
    return sink


BATCH = [Record("in", 0, 5, b"k", b"v")]
OUT = [Record("scores", -1, -1, b"k", b"o")]


def test_commit_happy_path_order():
    p = StubProducer()
    sink_with(p).commit_transaction(StubSource(), BATCH, OUT, [])
    assert p.calls == ["begin", "produce:scores", "send_offsets", "commit"]


def test_abortable_error_aborts_and_rewinds():
    err = KafkaError(KafkaError._STATE, "abortable", txn_requires_abort=True)
    p, src = StubProducer("commit", err), StubSource()
    with pytest.raises(TransactionAborted):
        sink_with(p).commit_transaction(src, BATCH, OUT, [])
    assert p.calls[-1] == "abort" and src.rewound == 1


def test_retriable_error_is_retried_then_commits():
    err = KafkaError(KafkaError._TIMED_OUT, "slow", retriable=True)
    p, src = StubProducer("commit", err, fail_times=2), StubSource()
    sink_with(p).commit_transaction(src, BATCH, OUT, [])
    assert p.calls.count("commit") == 3 and "abort" not in p.calls and src.rewound == 0


@pytest.mark.parametrize("err", [
    KafkaError(KafkaError._FENCED, "fenced"),
    KafkaError(KafkaError.PRODUCER_FENCED, "fenced by a newer instance"),
    KafkaError(KafkaError._FATAL, "fatal", fatal=True),
])
def test_fenced_or_fatal_errors_exit(err):
    p, src = StubProducer("send_offsets", err), StubSource()
    with pytest.raises(FatalKafkaError):
        sink_with(p).commit_transaction(src, BATCH, OUT, [])
    assert "commit" not in p.calls and src.rewound == 0
