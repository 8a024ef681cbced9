"""Thin confluent-kafka wrappers: consumer source, producer sink, transactions.

The sink owns delivery (``KafkaSink.deliver``): exactly once as one transaction, at least once
as produce, flush, commit. Errors reach the run loop as the types of ``io.base``:
``BatchRolledBack`` (rolled back and rewound: process again), ``FatalError`` (exit 1 for a
restart), ``StartupError`` (a setting librdkafka refuses, or a broker that does not answer).
"""

from __future__ import annotations

import time

import structlog
from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from .base import BatchRolledBack, FatalError, StartupError
from .records import Record

log = structlog.get_logger("worker.kafka")


class FatalKafkaError(FatalError):
    """Unrecoverable: fenced by a newer instance, or a fatal librdkafka error."""


class TransactionAborted(BatchRolledBack):
    """The transaction was aborted; the consumer was rewound to the committed offsets."""

    def __init__(self, reason: str):
        super().__init__(reason, transaction=True)


def _startup_error(exc: KafkaException) -> StartupError:
    """librdkafka refusing a setting is bad configuration (exit 2); anything else at start-up
    (a broker or coordinator that does not answer) is a dependency down (exit 1)."""
    err = exc.args[0] if exc.args else None
    if isinstance(err, KafkaError) and err.code() == KafkaError._INVALID_ARG:
        return StartupError("kafka.client", err.str())
    text = err.str() if isinstance(err, KafkaError) else str(exc)
    return StartupError("kafka", f"Kafka is not available: {text}", exit_code=1)


def to_record(msg) -> Record:
    """A consumed confluent-kafka message as a Record (the one conversion)."""
    ts_type, ts = msg.timestamp()
    headers = [(k, v if isinstance(v, bytes) else (v or b"")) for k, v in (msg.headers() or [])]
    return Record(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                  ts if ts_type else 0, headers)


class KafkaSource:
    """A consumer-group member; every batch is committed before the next poll."""

    def __init__(self, conf: dict, topics: list[str]):
        try:
            self.consumer = Consumer(conf)
        except KafkaException as exc:
            raise _startup_error(exc) from None
        self.revoked: set[tuple[str, int]] = set()  # since the last take_revoked()
        # called first when partitions are revoked or lost: the run loop settles a batch whose
        # commit is still in flight, so the next owner starts after it
        self.before_revoke = None
        self.exhausted = False  # a topic never ends
        self.total = None
        self.consumer.subscribe(topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)

    # Rebalance callbacks run inside poll/consume, on the loop's thread. A batch whose commit
    # is in flight (overlapped with the next poll) is settled first (before_revoke); within
    # a batch, the worker drops the messages of revoked partitions (take_revoked) before
    # delivering.
    def _on_assign(self, consumer, partitions):
        log.info("partitions assigned", partitions=[f"{p.topic}[{p.partition}]"
                                                   for p in partitions])

    def _on_revoke(self, consumer, partitions):
        if self.before_revoke is not None:
            self.before_revoke()
        self.revoked |= {(p.topic, p.partition) for p in partitions}
        log.info("partitions revoked", partitions=[f"{p.topic}[{p.partition}]"
                                                  for p in partitions])

    def _on_lost(self, consumer, partitions):
        if self.before_revoke is not None:
            self.before_revoke()
        self.revoked |= {(p.topic, p.partition) for p in partitions}
        log.warning("partitions lost", partitions=[f"{p.topic}[{p.partition}]"
                                                  for p in partitions])

    def take_revoked(self) -> set[tuple[str, int]]:
        """Partitions revoked or lost since the last call (rebalances run inside poll)."""
        revoked, self.revoked = self.revoked, set()
        return revoked

    def poll(self, max_messages: int, timeout_s: float) -> list[Record]:
        """Returns as soon as one message is there (waiting at most timeout_s), with whatever
        else is already fetched, up to max_messages."""
        out = []
        msgs = self.consumer.consume(num_messages=1, timeout=timeout_s)
        if msgs and max_messages > 1:
            msgs += self.consumer.consume(num_messages=max_messages - 1, timeout=0)
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                if err.fatal():
                    raise FatalKafkaError(str(err))
                log.warning("consumer error", error=str(err))
                continue
            out.append(to_record(msg))
        return out

    @staticmethod
    def next_offsets(batch: list[Record]) -> list[TopicPartition]:
        """Offsets to commit: the next to consume (last + 1) for every partition in the batch."""
        last: dict[tuple[str, int], int] = {}
        for r in batch:
            key = (r.topic, r.partition)
            last[key] = max(last.get(key, -1), r.offset)
        return [TopicPartition(t, p, o + 1) for (t, p), o in sorted(last.items())]

    def commit(self, batch: list[Record]) -> None:
        """Commit the offsets after ``batch`` (at least once). A failure (e.g. a rebalance)
        is logged: the partition's next owner reads those messages again."""
        if not batch:
            return
        try:
            self.consumer.commit(offsets=self.next_offsets(batch), asynchronous=False)
        except KafkaException as exc:
            log.warning("offset commit failed: these messages may be delivered again",
                        error=str(exc))

    def rewind(self, timeout_s: float = 30.0) -> None:
        """Seek every assigned partition back to its committed offset (after an abort). While
        the group coordinator is away (a broker restarting) the committed offsets cannot be
        read: retried for ``timeout_s``; after that where the consumer stands is unknown:
        FatalKafkaError, exit 1, and the restart reads from the committed offsets."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                assignment = self.consumer.assignment()
                if not assignment:
                    return
                for tp in self.consumer.committed(assignment, timeout=10):
                    if tp.offset == OFFSET_INVALID:
                        lo, _hi = self.consumer.get_watermark_offsets(tp, timeout=10)
                        tp.offset = lo
                    self.consumer.seek(tp)
                return
            except KafkaException as exc:
                err = exc.args[0] if exc.args else exc
                if time.monotonic() >= deadline or (isinstance(err, KafkaError)
                                                     and err.fatal()):
                    raise FatalKafkaError(f"cannot rewind to the committed offsets: "
                                          f"{err}") from exc
                log.warning("cannot read the committed offsets yet: retrying", error=str(err))
                time.sleep(1.0)

    def lag(self) -> dict[str, int]:
        """Per-partition lag: high watermark minus position (>= 1 after transaction markers)."""
        out = {}
        assignment = self.consumer.assignment()
        if not assignment:
            return out
        for tp in self.consumer.position(assignment):
            try:
                _lo, hi = self.consumer.get_watermark_offsets(tp, timeout=1, cached=True)
            except KafkaException:
                continue
            if tp.offset >= 0 and hi >= 0:
                out[f"{tp.topic}[{tp.partition}]"] = max(hi - tp.offset, 0)
        return out

    def close(self) -> None:
        self.consumer.close()


def _never() -> bool:
    return False


class KafkaSink:
    """Producer for scores and dead letters; transactional in exactly-once mode."""

    def __init__(self, conf: dict, topic: str, dead_letter_topic: str, transactional: bool):
        try:
            self.producer = Producer(conf)
        except KafkaException as exc:
            raise _startup_error(exc) from None
        self.topic, self.dead_letter_topic = topic, dead_letter_topic
        self.transactional = transactional
        self.stopping = _never  # the run loop's stop flag (a full local queue waits on it)
        self._errors: list[KafkaError] = []
        if transactional:
            self._init_transactions(60.0)

    def _init_transactions(self, timeout_s: float) -> None:
        """Register the transactional id with its coordinator, in one-second attempts (a
        signal handler runs between them), saying what it waits for; a coordinator that does
        not answer within ``timeout_s`` is a dependency down (exit 1)."""
        deadline = time.monotonic() + timeout_s
        told = 0.0
        while True:
            try:
                self.producer.init_transactions(1.0)
                return
            except KafkaException as exc:
                err = exc.args[0]
                now = time.monotonic()
                if not (isinstance(err, KafkaError) and err.retriable()) or now >= deadline:
                    raise _startup_error(exc) from None
                if now - told >= 10:
                    told = now
                    log.info("waiting for the transaction coordinator", error=err.str(),
                             gives_up_in_s=round(deadline - now))

    def _on_delivery(self, err, msg):
        if err is not None:
            self._errors.append(err)

    def _produce(self, topic: str, r: Record) -> None:
        while True:
            try:
                self.producer.produce(topic, value=r.value, key=r.key, headers=r.headers,
                                      on_delivery=self._on_delivery)
                return
            except BufferError:  # local queue full: serve delivery reports, then retry
                if self.stopping():  # the broker is away and a stop was asked for
                    raise KafkaException(KafkaError(KafkaError._QUEUE_FULL,
                                                    "stopping with the local queue full")) \
                        from None
                self.producer.poll(0.1)
            except KafkaException as exc:
                too_large = exc.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
                if topic != self.dead_letter_topic or not too_large:
                    raise
                # a dead letter too large to carry its input: keep the headers (error, source
                # partition and offset), drop the value, say so
                r = Record(r.topic, r.partition, r.offset, r.key, None, r.timestamp_ms,
                           list(r.headers) + [("value_dropped", b"message too large")])

    def write(self, outputs: list[Record], dead: list[Record]) -> None:
        for r in outputs:
            self._produce(self.topic, r)
        for r in dead:
            self._produce(self.dead_letter_topic, r)
        self.producer.poll(0)

    def flush(self, timeout_s: float = 60.0) -> None:
        remaining = self.producer.flush(timeout_s)
        if remaining or self._errors:
            errs, self._errors = self._errors, []
            raise KafkaException(errs[0] if errs else KafkaError(KafkaError._MSG_TIMED_OUT))

    @staticmethod
    def _txn(call, *args):
        """Run a transactional API call; retriable errors are retried, the rest classified."""
        for attempt in range(10):
            try:
                return call(*args)
            except KafkaException as exc:
                err = exc.args[0]
                if err.fatal() or err.code() in (KafkaError._FENCED,
                                                 KafkaError.PRODUCER_FENCED):
                    raise FatalKafkaError(str(err)) from exc
                if err.txn_requires_abort():
                    raise
                if err.retriable() and attempt < 9:
                    time.sleep(min(0.1 * 2**attempt, 2.0))
                    continue
                raise

    def commit_transaction(self, source: KafkaSource, batch: list[Record],
                           outputs: list[Record], dead: list[Record]) -> None:
        """Steps, in order: 1 begin; 2 produce scores and dead letters; 3 add the input
        offsets (next to consume) with the group metadata; 4 commit. Output and input
        offsets become visible together or not at all."""
        assert self.transactional
        self.deliver(source, batch, outputs, dead)

    def _abort(self, source: KafkaSource, exc: KafkaException) -> TransactionAborted:
        log.warning("transaction aborted", error=str(exc.args[0]))
        try:
            self.producer.abort_transaction(60)
        except KafkaException as abort_exc:
            raise FatalKafkaError(f"abort failed: {abort_exc}") from abort_exc
        source.rewind()
        return TransactionAborted(str(exc.args[0]))

    def send(self, source: KafkaSource, batch: list[Record], outputs: list[Record],
             dead: list[Record]) -> KafkaDelivery:
        """The first part of a delivery: produce the batch (exactly once: begin, produce, add
        the input offsets to the transaction). The returned delivery's ``wait`` (the commit or
        the flush, which may run in another thread while the next batch is prepared) and
        ``finish`` (on the loop's thread) complete it."""
        self._errors = []
        if self.transactional:
            try:
                self._txn(self.producer.begin_transaction)
                self.write(outputs, dead)
                self._txn(self.producer.send_offsets_to_transaction,
                          source.next_offsets(batch), source.consumer.consumer_group_metadata())
            except FatalKafkaError:
                raise
            except KafkaException as exc:
                raise self._abort(source, exc) from exc
        else:
            try:
                self.write(outputs, dead)
            except KafkaException as exc:
                raise self._rolled_back(source, exc) from exc
        return KafkaDelivery(self, source, batch)

    @staticmethod
    def _rolled_back(source: KafkaSource, exc: KafkaException) -> BatchRolledBack:
        log.warning("delivery failed: the batch will be read again", error=str(exc))
        source.rewind()
        return BatchRolledBack(str(exc), transaction=False)

    def deliver(self, source, batch: list[Record], outputs: list[Record],
                dead: list[Record]) -> None:
        """One batch: a transaction with the input offsets (exactly once), or produce, flush,
        then commit the offsets (at least once)."""
        d = self.send(source, batch, outputs, dead)
        d.wait()
        d.finish()

    def close(self) -> None:
        self.producer.flush(10)


class KafkaDelivery:
    """A batch produced and not yet committed: ``wait`` blocks until the transaction commits
    (exactly once) or every message is acknowledged (at least once) and keeps any error; it
    touches only the producer, so it may run in another thread while the loop polls and
    scores the next batch. ``finish``, on the loop's thread, commits the consumer offsets (at
    least once) or, after an error, aborts, rewinds the source and raises BatchRolledBack."""

    def __init__(self, sink: KafkaSink, source: KafkaSource, batch: list[Record]):
        self.sink, self.source, self.batch = sink, source, batch
        self.error: BaseException | None = None
        self.offsets_committed = False

    def wait(self) -> None:
        try:
            if self.sink.transactional:
                self.sink._txn(self.sink.producer.commit_transaction, 60)
            else:
                self.sink.flush()
        except BaseException as exc:  # noqa: BLE001 (kept for finish, on the loop's thread)
            self.error = exc

    def commit_offsets(self) -> None:
        """At least once: the batch's offsets, once its messages are acknowledged."""
        if not self.sink.transactional and self.error is None and not self.offsets_committed:
            self.offsets_committed = True
            self.source.commit(self.batch)

    def finish(self) -> None:
        exc = self.error
        if exc is None:
            self.commit_offsets()
            return
        if isinstance(exc, FatalKafkaError) or not isinstance(exc, KafkaException):
            raise exc
        if self.sink.transactional:
            raise self.sink._abort(self.source, exc) from exc
        raise self.sink._rolled_back(self.source, exc) from exc
