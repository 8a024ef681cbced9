"""Thin confluent-kafka wrappers: consumer source, producer sink, transactions.

The sink owns delivery (``KafkaSink.deliver``): exactly once as one transaction, at least once
as produce, flush, commit. Errors reach the run loop as the types of ``io.base``:
``BatchRolledBack`` (rolled back and rewound: process again), ``FatalError`` (exit 1 for a
restart), ``StartupError`` (a setting librdkafka refuses, or a broker that does not answer).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial

import structlog
from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from .. import chaos
from .access import AuthWatch, NotAuthorized, admin_config, principal_of, refusal
from .base import BatchRolledBack, FatalError, StartupError
from .records import RESERVED_HEADERS, Record

log = structlog.get_logger("worker.kafka")


# Errors that belong to one message (the broker will refuse it every time), not to the broker
# or the network: such a message is dead-lettered rather than retried.
MESSAGE_ERRORS = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE,
                            KafkaError.INVALID_RECORD, KafkaError.INVALID_MSG,
                            KafkaError.INVALID_MSG_SIZE})
SIZE_ERRORS = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE,
                         KafkaError.INVALID_MSG_SIZE})


class FatalKafkaError(FatalError):
    """Unrecoverable: fenced by a newer instance, or a fatal librdkafka error."""


class ProducerStuck(KafkaException):
    """A transactional call that has not returned long after its own timeout: the producer
    is wedged (librdkafka #5456: a coordinator request can ignore its timeout; #5511: a
    coordinator that went away may never be looked up again). The sink replaces it."""

    def __init__(self, call: str, waited_s: float):
        super().__init__(KafkaError(KafkaError._TIMED_OUT,
                                    f"{call} has not returned in {waited_s:.0f} s"))
        self.call, self.waited_s = call, waited_s


class _CallThread:
    """One daemon thread that runs a client's blocking calls (a producer's transactional
    calls, a consumer's offset commits), so a call that never returns strands this thread,
    not the run loop (which waits with a bound, or until a stop's grace has passed). A thread
    per client: calls stay in order, as librdkafka requires of the transactional API."""

    def __init__(self, name: str = "kafka-transactions"):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            call, args, future = item
            item = None
            try:
                future.set_result(call(*args))
            except BaseException as exc:  # noqa: BLE001 (raised on the caller's thread)
                future.set_exception(exc)
            call = args = future = None  # an abandoned producer is freed when its call ends

    def call(self, call, args: tuple, bound_s: float, stopping):
        """``call(*args)`` on this thread; ProducerStuck after ``bound_s`` (or at a stop)."""
        future: Future = Future()
        self._queue.put((call, args, future))
        t0 = time.monotonic()
        while True:
            try:
                return future.result(timeout=0.2)
            except FutureTimeout:
                waited = time.monotonic() - t0
                if waited >= bound_s or stopping():
                    raise ProducerStuck(getattr(call, "__name__", "call"), waited) from None

    def abandon(self) -> None:
        """No more calls: the thread ends once the call it is stuck in returns, if ever."""
        self._queue.put(None)


class TransactionAborted(BatchRolledBack):
    """The transaction was aborted; the consumer was rewound to the committed offsets."""

    def __init__(self, reason: str, refused: dict | None = None, retriable: bool = True):
        super().__init__(reason, transaction=True, refused=refused, retriable=retriable)


def _startup_error(exc: KafkaException) -> StartupError:
    """librdkafka refusing a setting is bad configuration (exit 2); anything else at start-up
    (a broker or coordinator that does not answer) is a dependency down (exit 1)."""
    err = exc.args[0] if exc.args else None
    if isinstance(err, KafkaError) and err.code() == KafkaError._INVALID_ARG:
        return StartupError("kafka.client", err.str())
    text = err.str() if isinstance(err, KafkaError) else str(exc)
    return StartupError("kafka", f"Kafka is not available: {text}", exit_code=1)


def validate_client_config(conf: dict) -> None:
    """Have librdkafka read every setting of ``conf`` (unknown properties, bad values) on a
    handle that connects nowhere, so a bad setting is one line at once, not after the access
    check has waited for brokers. Without the brokers and the security protocol the handle
    opens nothing: no TLS context, no SASL or OIDC token fetch (the clients load those).
    Raises StartupError."""
    offline = {k: v for k, v in conf.items()
               if k not in ("bootstrap.servers", "security.protocol") and not callable(v)}
    try:
        Producer({**offline, "log_level": 0})  # consumer-only settings: warnings, not logged
    except KafkaException as exc:
        raise _startup_error(exc) from None


def reader_event(msg, live: set[int]) -> bool:
    """For a reader that assigns partitions and joins no group (record, dead-letters): True
    when ``msg`` is an event to pass over, not a record: a partition's end (taken off
    ``live``), or the refusal of the group lookup librdkafka still makes (no group is used:
    it needs no ACL). False for a record, and for an error the caller raises."""
    from confluent_kafka import KafkaError

    err = msg.error()
    if err is None:
        return False
    if err.code() == KafkaError._PARTITION_EOF:
        live.discard(msg.partition())
        return True
    return err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED


def to_record(msg) -> Record:
    """A consumed confluent-kafka message as a Record (the one conversion)."""
    ts_type, ts = msg.timestamp()
    headers = [(k, v if isinstance(v, bytes) else (v or b"")) for k, v in (msg.headers() or [])]
    return Record(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                  ts if ts_type else 0, headers)


def _never() -> bool:
    return False


class KafkaSource:
    """A consumer-group member; every batch is committed before the next poll.

    Ownership is per assignment, not per partition: every assignment of a partition (and every
    seek back to its committed offset) opens a new *epoch*, and each record carries the epoch
    it was fetched under (``Record.epoch``). A record is dropped as revoked only when its epoch
    is no longer the partition's (``owns``): its partition was revoked or lost since, and
    whoever owns the partition now reads it again from the committed offset. A partition lost
    and given back inside one poll (a session timeout after a pause, a cooperative rebalance)
    keeps what was fetched under its new assignment."""

    # (class defaults too: a source a test builds without __init__ closes like any other)
    stopping = staticmethod(_never)  # the run loop's "give up" (a stop asked for, grace passed)
    commit_in_flight = False  # a commit is inside the consumer on the commit thread
    _callback_depth = 0  # inside a rebalance callback (inside this thread's consume)
    _committer: _CallThread | None = None  # where offset commits run (commit)

    def __init__(self, conf: dict, topics: list[str]):
        self.principal, self.group = principal_of(conf), conf.get("group.id")
        self.topics = topics
        self._conf = conf  # (the stall watch's own client for high watermarks)
        self._probe = None
        # (topic, partition) -> the next offset to read: the committed offset at assignment,
        # then past each message read (what the lag is counted from, beside the loop)
        self.read_to: dict[tuple[str, int], int] = {}
        try:
            self.consumer = Consumer({**conf, "error_cb": AuthWatch(self.principal)})
        except KafkaException as exc:
            raise _startup_error(exc) from None
        self.revoked = False  # an assignment was revoked or lost since the last take_revoked()
        # called first when partitions are revoked or lost: the run loop settles a batch whose
        # commit is still in flight, so the next owner starts after it
        self.before_revoke = None
        self.exhausted = False  # a topic never ends
        self.total = None
        self.assigned: set[tuple[str, int]] = set()  # the partitions this member owns now
        # (topic, partition) -> the epoch of its present assignment
        self._epoch: dict[tuple[str, int], int] = {}
        self._epochs = itertools.count(1)  # 0 is no assignment's
        self.stopping = _never  # the run loop's "give up" (a stop asked for, grace passed)
        self.closing = False  # close() has begun: an assignment it serves is not taken
        self.lost: list[str] = []  # partitions lost (not revoked) and not assigned since
        self.consumer.subscribe(topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)

    # Rebalance callbacks run inside poll/consume, on the loop's thread. A batch whose commit
    # is in flight (overlapped with the next poll) is settled first (before_revoke); within
    # a batch, the worker drops the records fetched under a revoked assignment (take_revoked,
    # owns) before delivering.
    def _on_assign(self, consumer, partitions):
        self._callback_depth += 1
        try:
            self._assigned(consumer, partitions)
        finally:
            self._callback_depth -= 1

    def _assigned(self, consumer, partitions):
        if self.closing:
            # close() serves an assignment that no poll took yet (a stop during start-up):
            # nothing will be read from these partitions, and the handle is being destroyed,
            # so reading their committed offsets would only fail (_DESTROY) until its bound
            return
        log.info("partitions assigned", partitions=[f"{p.topic}[{p.partition}]"
                                                   for p in partitions])
        self.lost = []
        if partitions:
            for tp in self._assign_at_committed(consumer, partitions):
                self._epoch[(tp.topic, tp.partition)] = next(self._epochs)
                if tp.offset >= 0:
                    self.read_to[(tp.topic, tp.partition)] = tp.offset
        self.assigned |= {(p.topic, p.partition) for p in partitions}

    def _assign_at_committed(self, consumer, partitions, timeout_s: float = 180.0) -> None:
        """Start each new partition at its committed offset, read here. While a transaction
        of the partition's previous owner is still open (a worker killed mid-batch: up to
        transaction.timeout.ms), the broker answers "unstable offsets"; librdkafka, left to
        itself, may then fall back to auto.offset.reset at the next rebalance and read the
        partition again from its start (found by bench/soak.py: 755 messages delivered twice
        under exactly_once; reproduced with confluent-kafka alone). ``committed()`` waits for
        stable offsets, so the partitions are assigned where the last commit left them. Returns
        the partitions as assigned."""
        deadline = time.monotonic() + timeout_s
        told = False
        while True:
            try:
                committed = consumer.committed(partitions, timeout=10)
                failed = [c for c in committed if c.error is not None]
                if not failed:
                    break
                # a partition's error (not an exception): not yet known, never "none"
                raise KafkaException(failed[0].error)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else exc
                self._refused(err, partitions[0].topic)
                if self.stopping() or self.closing:
                    return []  # exiting: nothing is read from these partitions
                if time.monotonic() >= deadline or (isinstance(err, KafkaError)
                                                     and err.fatal()):
                    raise FatalKafkaError(f"cannot read the committed offsets of newly "
                                          f"assigned partitions: {err}") from exc
                if not told:
                    told = True
                    log.info("waiting for the committed offsets of assigned partitions (a "
                             "transaction of their previous owner may still be open)",
                             error=str(err))
        start = []
        for tp, c in zip(partitions, committed, strict=True):
            # no commit yet: OFFSET_INVALID, and auto.offset.reset (earliest) applies
            start.append(TopicPartition(tp.topic, tp.partition,
                                        c.offset if c.offset >= 0 else OFFSET_INVALID))
        try:
            consumer.incremental_assign(start)
        except KafkaException:  # an eager assignment strategy (set in kafka.client)
            consumer.assign(start)
        return start

    def _on_revoke(self, consumer, partitions):
        self._callback_depth += 1
        try:
            self._end(partitions)
        finally:
            self._callback_depth -= 1
        log.info("partitions revoked", partitions=[f"{p.topic}[{p.partition}]"
                                                  for p in partitions])

    def _on_lost(self, consumer, partitions):
        self._callback_depth += 1
        try:
            self._end(partitions)
        finally:
            self._callback_depth -= 1
        # lost, not revoked: the group's coordinator did not answer; until partitions are
        # assigned again the worker waits on it (the stall watch says so)
        self.lost = [f"{p.topic}[{p.partition}]" for p in partitions]
        log.warning("partitions lost", partitions=[f"{p.topic}[{p.partition}]"
                                                  for p in partitions])

    def _end(self, partitions) -> None:
        """Revoked or lost, the same for the records: their assignment's epoch ends."""
        if self.before_revoke is not None:
            self.before_revoke()
        for p in partitions:
            key = (p.topic, p.partition)
            self._epoch.pop(key, None)
            self.read_to.pop(key, None)
            self.assigned.discard(key)
        self.revoked = True

    def take_revoked(self) -> bool:
        """Whether an assignment was revoked or lost since the last call (rebalances run
        inside poll): records fetched before may no longer be ours (``owns``)."""
        revoked, self.revoked = self.revoked, False
        return revoked

    def owns(self, rec: Record) -> bool:
        """``rec`` was fetched under its partition's present assignment."""
        return rec.epoch != 0 and self._epoch.get((rec.topic, rec.partition)) == rec.epoch

    def poll(self, max_messages: int, timeout_s: float) -> list[Record]:
        """Returns as soon as one message is there (waiting at most timeout_s), with whatever
        else is already fetched, up to max_messages. Each record carries the epoch of the
        assignment it was fetched under."""
        out = self._consume(1, timeout_s)
        if out and max_messages > 1:
            out += self._consume(max_messages - 1, 0)
        return out

    def _consume(self, n: int, timeout_s: float) -> list[Record]:
        """One consume() call, each record tagged with its partition's epoch as the call
        returns. A rebalance inside the call cannot mix assignments in what it returns:
        librdkafka pauses a partition's fetcher (a new version) before it serves the
        rebalance, drops fetched messages of an older version as they are dequeued, and
        purges those already gathered for the call when the version barrier arrives (1.7.0
        on, #3340); confluent-kafka's consume() returns the first chunk that has messages.
        So a record of a partition assigned during the call was fetched under that
        assignment."""
        chaos.point("poll")
        msgs = self.consumer.consume(num_messages=n, timeout=timeout_s)
        epoch = self._epoch
        out = []
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                self._refused(err, msg.topic())
                if err.fatal():
                    raise FatalKafkaError(str(err))
                log.warning("consumer error", error=str(err))
                continue
            rec = to_record(msg)
            rec.epoch = epoch.get((rec.topic, rec.partition), 0)
            out.append(rec)
        if out:
            read_to = self.read_to
            for rec in out:
                read_to[(rec.topic, rec.partition)] = rec.offset + 1
        return out

    principal, group, topics = "User:ANONYMOUS", None, ()

    def _refused(self, err, topic: str | None) -> None:
        """An authorization error is fatal, named (NotAuthorized), never retried."""
        denied = refusal(err, self.principal, topic=topic or ",".join(self.topics),
                         group=self.group)
        if denied is not None:
            raise denied

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
        offsets = self.next_offsets(batch)
        try:
            if self._in_rebalance:
                # inside a rebalance callback, i.e. inside this thread's consume(): the
                # consumer serves one thread at a time, so a commit handed to another thread
                # would wait for that consume to return, which waits for the commit (the
                # group hung at the first revoke with a backlog: found by review)
                self.consumer.commit(offsets=offsets, asynchronous=False)
                return
            if self._committer is None:
                self._committer = _CallThread("offset-commit")
            # librdkafka's synchronous commit has no timeout: while the group's coordinator
            # does not answer it waits for ever. It runs on a thread of its own, so a stop can
            # give it up once its grace has passed (issue 53: the hard-exit watchdog ended it)
            self._committer.call(self._commit_now, (offsets,), math.inf, self.stopping)
        except ProducerStuck as stuck:
            log.warning("stopping: the offset commit did not return within the stop's grace "
                        "(delivery.stop_timeout_ms); given up, so these messages may be read "
                        "again by the partitions' next owner (if the brokers took the request "
                        "already, it still lands)",
                        partitions=[f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in offsets],
                        waited_s=round(stuck.waited_s, 1))
        except KafkaException as exc:
            self._refused(exc.args[0] if exc.args else exc, batch[0].topic)
            log.warning("offset commit failed: these messages may be delivered again",
                        error=str(exc))

    def _commit_now(self, offsets: list[TopicPartition]) -> None:
        """On the commit thread: ``commit_in_flight`` holds while a commit is inside the
        consumer (close() does not touch a consumer a commit is still in)."""
        self.commit_in_flight = True
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        finally:
            self.commit_in_flight = False

    @property
    def _in_rebalance(self) -> bool:
        return self._callback_depth > 0

    def rewind(self, timeout_s: float = 30.0) -> None:
        """Seek every assigned partition back to its committed offset (after an abort). While
        the group coordinator is away (a broker restarting) the committed offsets cannot be
        read: retried for ``timeout_s``; after that where the consumer stands is unknown:
        FatalKafkaError, exit 1, and the restart reads from the committed offsets."""
        self.read_to = {}  # (read again from the committed offsets: no lag until then)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                assignment = self.consumer.assignment()
                if not assignment:
                    return
                committed = self.consumer.committed(assignment, timeout=10)
                failed = [tp for tp in committed if tp.error is not None]
                if failed:  # a partition's offset not known: never seek to its start
                    raise KafkaException(failed[0].error)
                for tp in committed:
                    if tp.offset == OFFSET_INVALID:
                        lo, _hi = self.consumer.get_watermark_offsets(tp, timeout=10)
                        tp.offset = lo
                    self.consumer.seek(tp)
                    # what was fetched before the seek is not read from here: a new epoch
                    key = (tp.topic, tp.partition)
                    if key in self._epoch:
                        self._epoch[key] = next(self._epochs)
                return
            except KafkaException as exc:
                err = exc.args[0] if exc.args else exc
                if self.stopping():  # exiting: the next owner reads from the committed
                    return           # offsets anyway
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

    def fresh_lag(self, timeout_s: float = 2.0) -> tuple[dict[str, int], dict[str, int],
                                                        list[str]]:
        """(per-partition lag, per-partition end offset, partitions whose end did not come),
        asked of the brokers now in one ListOffsets (read_committed: the last stable
        offset), never the consumer's cache (it keeps its last value while a leader does not
        answer). The lag counts from what the loop has read (``read_to``; none reported
        where nothing was read or committed yet). For the stall watch's thread: it asks
        through an admin client of its own (no group: no ACL beyond the topic's DESCRIBE,
        and a call on the loop's consumer waits while the loop is in consume())."""
        from confluent_kafka import IsolationLevel
        from confluent_kafka.admin import AdminClient, OffsetSpec

        lags: dict[str, int] = {}
        ends: dict[str, int] = {}
        unknown: list[str] = []
        owned = sorted(self.assigned)
        if not owned or self.closing:
            return lags, ends, unknown
        if self._probe is None:
            from .access import admin_config

            self._probe = AdminClient(admin_config(self._conf))
        probe = self._probe  # (close_probe may drop it while this waits)
        futures = probe.list_offsets(
            {TopicPartition(t, p): OffsetSpec.latest() for t, p in owned},
            isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout_s)
        deadline = time.monotonic() + timeout_s + 1
        for tp, fut in futures.items():
            name = f"{tp.topic}[{tp.partition}]"
            try:
                end = fut.result(timeout=max(deadline - time.monotonic(), 0.01)).offset
            except Exception:  # noqa: BLE001 (no answer in time, a leader away: unknown)
                unknown.append(name)
                continue
            if end < 0:  # (a request that timed out answers -1001, not an error)
                unknown.append(name)
                continue
            ends[name] = end
            at = self.read_to.get((tp.topic, tp.partition))
            if at is not None:
                lags[name] = max(end - at, 0)
        probe.poll(0)  # (serves its log lines: worker/kafkalog.py)
        if unknown:  # its connections may hold timed-out requests: the next ask, a new one
            self._probe = None
        return lags, ends, unknown

    def close_probe(self) -> None:
        self._probe = None  # (an admin client is destroyed with its last reference)

    def close(self, timeout_s: float = 10.0) -> None:
        """Leave the group. With the brokers gone librdkafka's close never returns: it runs
        in a thread of its own, and after ``timeout_s`` the worker exits without it (the
        group expels this member after its session timeout). Once a stop's grace has passed
        (the brokers did not answer within it) the bound is CLOSE_AFTER_GRACE_S, so the worker
        exits within delivery.stop_timeout_ms plus about that; after a commit was given up
        (it may still be inside the consumer) the group is not left at all."""
        self.closing = True
        if self.commit_in_flight:  # given up at the stop and still inside the consumer
            log.warning("exiting without leaving the group: an offset commit is still in "
                        "flight (the group expels this member after its session timeout)")
            return
        if self.stopping():
            timeout_s = min(timeout_s, CLOSE_AFTER_GRACE_S)
        t = threading.Thread(target=self.consumer.close, name="consumer-close", daemon=True)
        t.start()
        t.join(timeout_s)
        if t.is_alive():
            log.warning("the consumer did not close within its bound (the brokers are "
                        "away): exiting without leaving the group", waited_s=timeout_s)


# How long a consumer may take to leave its group once a stop's grace has passed: the
# brokers did not answer within the grace, so the leave is tried briefly, then not waited for
CLOSE_AFTER_GRACE_S = 1.0


# What a record adds to its value in a record batch (batch header 61 bytes, record framing up to
# ~20, the key and headers counted separately): kept below a topic's max.message.bytes.
RECORD_OVERHEAD = 128
BROKER_DEFAULT_MAX_MESSAGE_BYTES = 1048588


def topic_max_bytes(conf: dict, topics: list[str]) -> dict[str, int]:
    """Each topic's ``max.message.bytes`` (a larger record batch is refused by the broker). A
    topic that does not exist yet, or a broker that does not let us read its configuration,
    gets the broker's default, and the refusal is still handled when it comes."""
    from concurrent.futures import TimeoutError as Pending

    from confluent_kafka.admin import AdminClient, ConfigResource

    out = dict.fromkeys(topics, BROKER_DEFAULT_MAX_MESSAGE_BYTES)
    admin = AdminClient(admin_config(conf))
    futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, t)
                                      for t in set(topics)], request_timeout=10)
    told = False
    for res, fut in futures.items():
        try:
            while True:
                try:
                    entry = fut.result(timeout=1.0).get("max.message.bytes")
                    break
                except Pending:
                    if not told:
                        told = True
                        log.info("waiting for the broker to read the topics' "
                                 "max.message.bytes", topics=sorted(set(topics)))
            if entry is not None and entry.value:
                out[res.name] = int(entry.value)
        except KafkaException as exc:
            denied = refusal(exc.args[0] if exc.args else exc, principal_of(conf),
                             topic=res.name, topic_operation="DESCRIBE_CONFIGS")
            if denied is not None:
                raise denied from None
            log.info("cannot read a topic's max.message.bytes: using the broker default",
                     topic=res.name, error=str(exc).splitlines()[0] if str(exc) else "")
        except Exception as exc:  # noqa: BLE001 (absent topic: keep the default)
            log.info("cannot read a topic's max.message.bytes: using the broker default",
                     topic=res.name, error=str(exc).splitlines()[0] if str(exc) else "")
    return out


class KafkaSink:
    """Producer for scores and dead letters; transactional in exactly-once mode.

    ``max_bytes`` maps the scores and dead-letter topics to the largest value (key and headers
    included) the broker takes there: the topic's ``max.message.bytes`` (read at start) and the
    producer's ``message.max.bytes``, less the record overhead. The run loop dead-letters a
    larger output (``output_too_large``) and drops the value of a larger dead letter before
    producing; ``batch.size`` is kept under the smaller limit so the producer never packs
    small messages into a batch the broker refuses."""

    def __init__(self, conf: dict, topic: str, dead_letter_topic: str, transactional: bool,
                 topic_limits: dict[str, int] | None = None, shadow_topic: str | None = None,
                 transactional_id_acl=None):
        producer_max = int(conf.get("message.max.bytes", 1_000_000))
        limits = topic_limits or {}
        self.max_bytes = {t: min(limits.get(t, BROKER_DEFAULT_MAX_MESSAGE_BYTES), producer_max)
                          - RECORD_OVERHEAD for t in (topic, dead_letter_topic, shadow_topic)
                          if t}
        if "batch.size" not in conf:
            conf = {**conf, "batch.size": min(1_000_000, min(self.max_bytes.values()) +
                                              RECORD_OVERHEAD)}
        self.principal = principal_of(conf)
        conf = {**conf, "error_cb": AuthWatch(self.principal)}
        self._conf = conf
        self.transactional_id_acl = transactional_id_acl
        # a WRITE the broker refused during this delivery (NotAuthorized once it settles)
        self._denied: NotAuthorized | None = None
        try:
            self.producer = Producer(conf)
        except KafkaException as exc:
            raise _startup_error(exc) from None
        self._caller: _CallThread | None = None
        self.topic, self.dead_letter_topic = topic, dead_letter_topic
        self.transactional = transactional
        self.stopping = _never  # the run loop's stop flag (a full local queue waits on it)
        self._errors: list[KafkaError] = []
        # (error, record, topic) of messages the producer or broker refused, this delivery
        self._refused: list[tuple[KafkaError, Record, str]] = []
        if transactional:
            self._init_transactions(60.0)

    # A transactional call (given 1 s) that has not returned after this long is stuck, not
    # slow: the producer is replaced (see ProducerStuck). An attempt can legitimately take up
    # to socket.timeout.ms while a coordinator is away; replacing the producer then costs an
    # abort and a retry of the batch, as the error would.
    stuck_after_s = 30.0
    # an abort is given 60 s (the broker's own transaction timeout ends it by then); past this
    # bound it is stuck
    abort_stuck_after_s = 75.0

    def _blocking(self, call, *args, bound_s: float | None = None):
        """A blocking producer call on the sink's call thread, bounded (ProducerStuck)."""
        if self._caller is None:
            self._caller = _CallThread()
        return self._caller.call(call, args, bound_s or self.stuck_after_s, self.stopping)

    def _init_transactions(self, timeout_s: float) -> None:
        """Register the transactional id with its coordinator, in one-second attempts (a
        signal handler runs between them), saying what it waits for; a coordinator that does
        not answer within ``timeout_s`` is a dependency down (exit 1)."""
        deadline = time.monotonic() + timeout_s
        told = 0.0
        while True:
            try:
                self._blocking(self.producer.init_transactions, 1.0)
                return
            except KafkaException as exc:
                err = exc.args[0]
                now = time.monotonic()
                denied = self._refusal(err)
                if denied is not None:
                    raise denied from None
                if isinstance(exc, ProducerStuck) or \
                        not (isinstance(err, KafkaError) and err.retriable()) or \
                        now >= deadline or self.stopping():
                    raise _startup_error(exc) from None
                if now - told >= 10:
                    told = now
                    log.info("waiting for the transaction coordinator", error=err.str(),
                             gives_up_in_s=round(deadline - now))

    def _refusal(self, err, topic: str | None = None) -> NotAuthorized | None:
        if topic is None and isinstance(err, KafkaError) and \
                err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED and \
                getattr(self, "_conf", None):
            # refused without the topic named (adding partitions to a transaction): ask the
            # brokers which output topic this principal may no longer write
            from .access import Permission, missing_permissions

            try:
                missing = missing_permissions(
                    self._conf, [Permission("WRITE", "topic", t) for t in self.max_bytes],
                    timeout_s=10)
            except Exception:  # noqa: BLE001 (the refusal is reported anyway)
                missing = []
            if missing:
                return NotAuthorized(missing, self.principal, err.str())
        return refusal(err, self.principal, topic=topic, topic_operation="WRITE",
                       transactional_id=self.transactional_id_acl or (
                           getattr(self, "_conf", None) or {}).get("transactional.id"),
                       group=self._group)

    _group: str | None = None  # the consumer group whose offsets go into the transactions
    principal = "User:ANONYMOUS"
    _denied: NotAuthorized | None = None
    # the ACL that covers this worker's transactional ids (a prefix when they are generated)
    transactional_id_acl = None

    def _on_delivery(self, r: Record, topic: str, err, msg):
        if err is not None:
            self._errors.append(err)
            if self._denied is None:
                self._denied = self._refusal(err, topic)
            # a message's own error; and for a shadow model's output, any error (its topic
            # missing, not writable): the shadow output is dropped next time, never the live
            if r.origin is not None and (err.code() in MESSAGE_ERRORS
                                         or r.origin[0] == "shadow"):
                self._refused.append((err, r, topic))

    def _produce(self, topic: str, r: Record) -> None:
        while True:
            try:
                self.producer.produce(topic, value=r.value, key=r.key, headers=r.headers,
                                      on_delivery=partial(self._on_delivery, r, topic))
                return
            except BufferError:  # local queue full: serve delivery reports, then retry
                if self.stopping():  # the broker is away and a stop was asked for
                    raise KafkaException(KafkaError(KafkaError._QUEUE_FULL,
                                                    "stopping with the local queue full")) \
                        from None
                self.producer.poll(0.1)
            except KafkaException as exc:
                code = exc.args[0].code()
                if code in MESSAGE_ERRORS and r.origin is not None and \
                        topic != self.dead_letter_topic:
                    self._refused.append((exc.args[0], r, topic))  # dead-lettered next time
                if topic != self.dead_letter_topic or code not in SIZE_ERRORS or \
                        any(k == "input_dropped" for k, _v in r.headers):
                    raise
                # a dead letter too large to carry its input: without the value first, then
                # without the input's key and headers too, keeping the worker's own (error,
                # source partition and offset): each step is taken once, nothing loops
                if r.value is not None:
                    r = Record(r.topic, r.partition, r.offset, r.key, None, r.timestamp_ms,
                               list(r.headers) + [("value_dropped", b"message too large")],
                               r.origin)
                else:
                    own = [(k, v) for k, v in r.headers if k in RESERVED_HEADERS]
                    r = Record(r.topic, r.partition, r.offset, None, None, r.timestamp_ms,
                               own + [("input_dropped", b"key and headers too large")],
                               r.origin)

    def idle(self) -> None:
        """Nothing in flight: serve the producer's queued events (its log lines, said when
        they happen rather than at the next produce)."""
        self.producer.poll(0)

    def write(self, outputs: list[Record], dead: list[Record]) -> None:
        for r in outputs:  # scores, and a shadow model's scores to its own topic
            self._produce(r.topic or self.topic, r)
        for r in dead:
            self._produce(self.dead_letter_topic, r)
        self.producer.poll(0)

    def flush(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:  # in 1 s steps: a stop (with the broker away) ends the wait
            step = 0 if self.stopping() else min(1.0, max(deadline - time.monotonic(), 0))
            remaining = self.producer.flush(step)
            if not remaining or time.monotonic() >= deadline or self.stopping():
                break
        if remaining or self._errors:
            errs, self._errors = self._errors, []
            raise KafkaException(errs[0] if errs else KafkaError(KafkaError._MSG_TIMED_OUT))

    def _txn(self, call, *args):
        """Run a transactional API call; retriable errors are retried (not after a stop's
        grace), the rest classified."""
        for attempt in range(10):
            try:
                return call(*args)
            except KafkaException as exc:
                err = exc.args[0]
                denied = self._refusal(err) if err.fatal() else None
                if denied is not None:
                    raise denied from exc
                if err.fatal() or err.code() in (KafkaError._FENCED,
                                                 KafkaError.PRODUCER_FENCED):
                    raise FatalKafkaError(str(err)) from exc
                if err.txn_requires_abort():
                    raise
                if err.retriable() and attempt < 9 and not self.stopping():
                    time.sleep(min(0.1 * 2**attempt, 2.0))
                    continue
                raise

    def _txn_wait(self, call, *args, timeout_s: float = 60.0) -> None:
        """A blocking transactional call (commit, send offsets) in 1 s attempts (librdkafka
        resumes a call that timed out), so a stop with the broker away ends the wait after
        its grace; without a timeout librdkafka waits for ever."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                # one attempt per turn, not _txn's ten: an attempt can outlast its timeout
                # (up to socket.timeout.ms while a coordinator is down), and ten nested
                # retries per turn stalled a worker for minutes after a coordinator kill
                return self._blocking(call, *args, 1.0)
            except ProducerStuck:
                raise
            except KafkaException as exc:
                err = exc.args[0]
                denied = self._refusal(err) if isinstance(err, KafkaError) and err.fatal() \
                    else None
                if denied is not None:
                    raise denied from exc
                if isinstance(err, KafkaError) and (err.fatal() or err.code() in (
                        KafkaError._FENCED, KafkaError.PRODUCER_FENCED)):
                    raise FatalKafkaError(str(err)) from exc
                if not (isinstance(err, KafkaError) and err.retriable()) or \
                        err.txn_requires_abort() or time.monotonic() >= deadline or \
                        self.stopping():
                    raise
                time.sleep(0.1)

    def commit_transaction(self, source: KafkaSource, batch: list[Record],
                           outputs: list[Record], dead: list[Record]) -> None:
        """Steps, in order: 1 begin; 2 produce scores and dead letters; 3 add the input
        offsets (next to consume) with the group metadata; 4 commit. Output and input
        offsets become visible together or not at all."""
        assert self.transactional
        self.deliver(source, batch, outputs, dead)

    def _take_refused(self) -> dict:
        """The input whose output or dead letter was refused for what it is (see
        BatchRolledBack.refused), from this delivery's reports. The broker refuses a whole
        request: when messages of several inputs were refused together, which one is at fault
        is not known, and the run loop splits the batch to find it."""
        refused, self._refused = self._refused, []
        out = {}
        shadow = [x for x in refused if x[1].origin[0] == "shadow"]
        if shadow:  # a shadow output is dropped next time, whoever was at fault
            log.warning("the broker refused shadow outputs: they are dropped",
                        messages=len(shadow), error=shadow[0][0].str())
            out.update({r.origin: ("shadow_refused", False) for _e, r, _t in shadow})
        refused = [x for x in refused if x[1].origin[0] != "shadow"]
        origins = {r.origin for _err, r, _topic in refused}
        if len(origins) != 1:
            if origins:
                log.warning("the broker refused messages of several inputs together",
                            inputs=len(origins), error=refused[0][0].str())
            return out
        err, r, topic = refused[0]
        code = "output_too_large" if err.code() in SIZE_ERRORS else "output_refused"
        dead_letter = any(t == self.dead_letter_topic for _e, _r, t in refused)
        log.warning("the broker refused a message: its input will be dead-lettered",
                    topic=topic, error=err.str(), dead_letter=dead_letter,
                    source=f"{r.origin[0]}[{r.origin[1]}]@{r.origin[2]}")
        out[r.origin] = (code, dead_letter)
        return out

    @staticmethod
    def _retriable(exc: BaseException) -> bool:
        err = exc.args[0] if exc.args else None
        return not isinstance(err, KafkaError) or err.code() not in MESSAGE_ERRORS

    def _left_open(self, exc: KafkaException) -> TransactionAborted:
        """Exiting with the broker away: the open transaction is left to the broker."""
        log.warning("stopping with a transaction open: the broker aborts it (at "
                    "transaction.timeout.ms, or when this transactional id starts "
                    "again); nothing of it was committed")
        return TransactionAborted(str(exc.args[0]))

    def _take_denied(self, exc: BaseException) -> NotAuthorized | None:
        """A refusal of this delivery (an output topic, the group, the transactional id)."""
        denied, self._denied = self._denied, None
        if denied is None and isinstance(exc, KafkaException) and exc.args:
            denied = self._refusal(exc.args[0])
        return denied

    def _abort(self, source: KafkaSource, exc: KafkaException) -> TransactionAborted:
        denied = self._take_denied(exc)
        if denied is not None:  # aborted (a short try), then fatal: never retried
            with contextlib.suppress(KafkaException):
                self._blocking(self.producer.abort_transaction, 5, bound_s=10)
            raise denied from exc
        log.warning("transaction aborted", error=str(exc.args[0]))
        if self.stopping():  # exiting with the broker away: a short try, then leave it
            try:
                if not isinstance(exc, ProducerStuck):
                    self._blocking(self.producer.abort_transaction, 2, bound_s=5)
            except KafkaException:
                pass
            return self._left_open(exc)
        if not isinstance(exc, ProducerStuck):
            try:
                self._blocking(self.producer.abort_transaction, 60,
                               bound_s=self.abort_stuck_after_s)
            except ProducerStuck as stuck:
                exc = stuck
            except KafkaException as abort_exc:
                if self.stopping():  # the stop came during the abort
                    return self._left_open(abort_exc)
                raise FatalKafkaError(f"abort failed: {abort_exc}") from abort_exc
        if isinstance(exc, ProducerStuck):
            # a stop that came during the abort ends its wait (ProducerStuck): no new
            # producer then, the stop exits and the broker aborts the transaction
            if self.stopping() or not self._replace_producer(exc):
                return self._left_open(exc)
            source.rewind()
            return TransactionAborted(str(exc.args[0]))
        source.rewind()
        return TransactionAborted(str(exc.args[0]), self._take_refused(), self._retriable(exc))

    def _replace_producer(self, stuck: ProducerStuck) -> bool:
        """A producer stuck in a transactional call is left to its thread; a new one with
        the same transactional id takes over. Its registration fences the old one and makes
        the coordinator abort the old one's open transaction, so nothing of it is committed;
        the batch is read again from the committed offsets. False: a stop came while the new
        one waited for its coordinator (the worker exits; nothing was committed)."""
        log.error("a transactional call is stuck: the producer is replaced (the new one "
                  "fences it; its open transaction is aborted, the batch comes again)",
                  call=stuck.call, waited_s=round(stuck.waited_s, 1))
        if self._caller is not None:
            self._caller.abandon()
            self._caller = None
        self._errors, self._refused = [], []
        try:
            self.producer = Producer(self._conf)
            # the broker was away a moment ago: wait for its coordinator, as at start
            self._init_transactions(max(120.0, self.stuck_after_s))
        except (KafkaException, StartupError) as exc:
            if self.stopping():
                return False
            raise FatalKafkaError(f"the producer that replaced a stuck one cannot start: "
                                  f"{exc}") from exc
        return True

    def send(self, source: KafkaSource, batch: list[Record], outputs: list[Record],
             dead: list[Record]) -> KafkaDelivery:
        """The first part of a delivery: produce the batch (exactly once: begin, produce, add
        the input offsets to the transaction). The returned delivery's ``wait`` (the commit or
        the flush, which may run in another thread while the next batch is prepared) and
        ``finish`` (on the loop's thread) complete it."""
        self._errors, self._refused, self._denied = [], [], None
        self._group = getattr(source, "group", None)
        if self.transactional:
            try:
                self._txn(self.producer.begin_transaction)
                self.write(outputs, dead)
                self._txn_wait(self.producer.send_offsets_to_transaction,
                               source.next_offsets(batch),
                               source.consumer.consumer_group_metadata())
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

    def _rolled_back(self, source: KafkaSource, exc: KafkaException) -> BatchRolledBack:
        self.producer.poll(0)  # serve the reports already in (a refused message names itself)
        denied = self._take_denied(exc)
        if denied is not None:
            raise denied from exc
        log.warning("delivery failed: the batch will be read again", error=str(exc))
        if not self.stopping():  # exiting: the next owner reads from the committed offsets
            source.rewind()
        return BatchRolledBack(str(exc), transaction=False, refused=self._take_refused(),
                               retriable=self._retriable(exc))

    def deliver(self, source, batch: list[Record], outputs: list[Record],
                dead: list[Record]) -> None:
        """One batch: a transaction with the input offsets (exactly once), or produce, flush,
        then commit the offsets (at least once)."""
        d = self.send(source, batch, outputs, dead)
        d.wait()
        d.finish()

    def close(self) -> None:
        try:
            self.producer.flush(0 if self.stopping() else 10)
        except Exception as exc:  # noqa: BLE001 (a fatal producer, which said why already:
            # confluent-kafka raises its fatal error here, and then a SystemError from the
            # delivery callbacks it runs with that error set)
            log.info("the producer closed with an error",
                     error=(str(exc).splitlines() or [type(exc).__name__])[0])


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
        chaos.point("commit")
        try:
            if self.sink.transactional:
                self.sink._txn_wait(self.sink.producer.commit_transaction)
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
