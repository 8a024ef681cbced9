"""`scoring-worker dead-letters`: what the worker dead-lettered, by reason, and the originals
sent back to the input once their cause is fixed.

A dead letter is the input message unchanged (key and value; stamped when it was
dead-lettered) with the worker's headers (error, error_code, source_topic, source_partition,
source_offset, model_id, source_timestamp: the input's own time; value_dropped or
input_dropped when the letter could not carry it all) before the input's own headers (a name
the worker writes, or one starting with input-, carried as input-NAME).

A requeue copies the selected originals back to their input topic (same partition, key,
value and headers, plus ``requeued_from: <dead-letter topic>:<partition>:<offset>``; stamped
now: the input's own time, in the letter's source_timestamp, could be older than the input
topic's retention, which would delete the copy at once) and in the same Kafka transaction
appends a marker to the dead letter's partition (no key, no value, one header
``requeued: <offset>``). Listings read the markers: a letter requeued once is shown as requeued
and never requeued again, whatever ran before (a killed requeue's transaction is aborted,
copies and markers together). Each requeue uses one transactional id per dead-letter topic, so
two at once fence each other rather than both copy, and it reads the topic only once every
transaction on it has ended (a marker behind an open transaction is not yet readable).
"""

from __future__ import annotations

import base64
import contextlib
import re
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import NamedTuple

from .io.records import RESERVED_HEADERS, original_headers, read_records

MARKER = "requeued"  # header of a marker: the offset (in its partition) of the letter requeued
ORIGIN = "requeued_from"  # header of a requeued copy: <dead-letter topic>:<partition>:<offset>
PREVIEW = 240  # characters of a payload shown in a listing
TXN_MESSAGES = 1000  # copies (and as many markers) per transaction


class Marker(NamedTuple):
    """A requeue marker: the letter at (partition, offset) of the dead-letter topic was sent
    back."""

    partition: int
    offset: int


class DeadLetterError(Exception):
    """A dead-letter topic or file that cannot be read or requeued (said in one line)."""


@dataclass
class Letter:
    """One dead letter as read back."""

    partition: int  # in the dead-letter topic (file: -1)
    offset: int  # in the dead-letter topic (file: row number)
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    own: dict[str, str]  # the worker's headers
    carried: list[tuple[str, bytes]]  # the input's headers as the letter carries them

    @property
    def reason(self) -> str:
        return self.own.get("error_code", "?")

    def requeueable(self) -> str | None:
        """Why this letter cannot be sent back (None: it can)."""
        if "value_dropped" in self.own:
            return "the letter does not carry the input's value (too large for the topic)"
        if "input_dropped" in self.own:
            return "the letter does not carry the input's key and headers"
        if not self.own.get("source_topic"):
            return "the letter names no source topic"
        return None

    def view(self) -> dict:
        """The letter as one JSON object (bytes that are not UTF-8 as base64)."""
        return {"partition": self.partition, "offset": self.offset,
                "timestamp": _iso(self.timestamp_ms), "reason": self.reason,
                "error": self.own.get("error"), "model_id": self.own.get("model_id"),
                "source_topic": self.own.get("source_topic"),
                "source_partition": _int(self.own.get("source_partition")),
                "source_offset": _int(self.own.get("source_offset")),
                "source_timestamp": _iso(_int(self.own.get("source_timestamp")), None),
                "key": _text_or_b64(self.key),
                "value_bytes": None if self.value is None else len(self.value),
                "value": _text_or_b64(self.value),
                "headers": [[k, _text_or_b64(v)] for k, v in original_headers(self.carried)],
                **({"value_dropped": True} if "value_dropped" in self.own else {})}


def parse_letter(partition: int, offset: int, timestamp_ms: int, key, value,
                 headers) -> Letter | Marker:
    """A record of the dead-letter topic: a Letter, or a requeue marker (no key, no value, the
    one header ``requeued``)."""
    headers = list(headers or ())
    if key is None and value is None and len(headers) == 1 and headers[0][0] == MARKER:
        try:
            return Marker(partition, int(headers[0][1] or b""))
        except ValueError:
            pass
    own: dict[str, str] = {}
    carried: list[tuple[str, bytes | None]] = []
    for k, v in headers:
        if k in RESERVED_HEADERS:
            own.setdefault(k, (v or b"").decode("utf-8", "replace"))
        else:
            carried.append((k, v))
    return Letter(partition, offset, timestamp_ms, key, value, own, carried)


@dataclass
class Selection:
    """Which letters a listing or requeue takes."""

    reasons: frozenset[str] = frozenset()  # empty: every reason
    since_ms: int | None = None

    def takes(self, letter: Letter) -> bool:
        return (not self.reasons or letter.reason in self.reasons) and \
            (self.since_ms is None or letter.timestamp_ms >= self.since_ms)


@dataclass
class Summary:
    letters: int = 0
    selected: int = 0
    by_reason: Counter = field(default_factory=Counter)
    requeued_by_reason: Counter = field(default_factory=Counter)
    first_ms: dict[str, int] = field(default_factory=dict)
    last_ms: dict[str, int] = field(default_factory=dict)
    models: dict[str, set] = field(default_factory=dict)
    markers: int = 0
    shown: int = 0

    def add(self, letter: Letter) -> None:
        r = letter.reason
        self.selected += 1
        self.by_reason[r] += 1
        t = letter.timestamp_ms
        self.first_ms[r] = min(self.first_ms.get(r, t), t)
        self.last_ms[r] = max(self.last_ms.get(r, t), t)
        self.models.setdefault(r, set()).add(letter.own.get("model_id", "?")[:12])

    def lines(self, where: str) -> list[str]:
        out = [f"{where}: {self.letters:,} dead letters, {self.selected:,} selected"]
        if not self.selected:
            return out
        rows = [("reason", "letters", "requeued", "first", "last", "model")]
        for r, n in self.by_reason.most_common():
            rows.append((_safe(r), f"{n:,}", f"{self.requeued_by_reason[r]:,}",
                         _iso(self.first_ms[r]), _iso(self.last_ms[r]),
                         _safe(",".join(sorted(self.models[r])))))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            out.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        return out


def parse_since(text: str, now: float | None = None) -> int:
    """--since: an ISO 8601 time (UTC unless it says), or an age (30m, 2h, 7d): Unix ms."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if m:
        seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return int(((now if now is not None else time.time()) - seconds) * 1000)
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--since: {text!r} is neither an ISO 8601 time nor an age like "
                         "30m, 2h or 7d") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return int(t.timestamp() * 1000)


def _safe(text: str) -> str:
    """A letter's text for a terminal: every character that is not printable escaped (a
    letter's error, reason or header name could carry control sequences)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def describe(letter: Letter, requeued: bool) -> list[str]:
    """A letter for a reader: where it came from, why, and its payload."""
    own = {k: _safe(v) for k, v in letter.own.items()}
    at = "" if letter.partition < 0 else f"{letter.partition}:"
    head = (f"[{at}{letter.offset}] {_iso(letter.timestamp_ms)}  {_safe(letter.reason)}"
            f"  from {own.get('source_topic', '?')}:{own.get('source_partition', '?')}:"
            f"{own.get('source_offset', '?')}  model {own.get('model_id', '?')[:12]}"
            + ("  (requeued)" if requeued else ""))
    out = [head, f"    error: {own.get('error', '')}"]
    if letter.key is not None:
        out.append(f"    key: {_preview(letter.key)}")
    if "value_dropped" in own:
        out.append(f"    value: not kept ({own['value_dropped']})")
    else:
        out.append(f"    value: {_preview(letter.value)}")
    if letter.carried:
        hs = ", ".join(f"{_safe(k)}={_preview(v, 40)}"
                       for k, v in original_headers(letter.carried))
        out.append(f"    headers: {hs}")
    return out


def _preview(data: bytes | None, limit: int = PREVIEW) -> str:
    """Text shown as text (on one line, cut at ``limit`` characters), anything else as its size,
    what it looks like and its first bytes: a payload is never parsed here (a dead letter is
    by definition what the worker's own checked readers refused)."""
    if data is None:
        return "(none)"
    head = data[: limit * 4]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:  # a character cut at the end of the slice is still text
        text = head[: exc.start].decode("utf-8") if len(head) - exc.start < 4 and \
            len(data) > len(head) else None
    if text is not None and all(c.isprintable() or c in "\t\r\n" for c in text):
        flat = " ".join(text.split())
        cut = len(flat) > limit or len(data) > len(head)
        return flat[:limit] + (f" ... ({len(data):,} bytes)" if cut else "")
    kind = "arrow IPC stream" if data[:4] == b"\xff\xff\xff\xff" else \
        "avro, Confluent framing" if data[:1] == b"\x00" and len(data) >= 5 else "binary"
    return f"<{len(data):,} bytes, {kind}> {data[:24].hex(' ')}" + \
        (" ..." if len(data) > 24 else "")


def _text_or_b64(data: bytes | None):
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def _iso(ms: int | None, unknown="-"):
    if ms is None or ms < 0:
        return unknown
    try:
        return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(
            timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return str(ms)


def _int(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


# --- reading ---------------------------------------------------------------------------------

class FileReader:
    """A file sink's dead letters (a recorded topic). A file cut short (a crash mid-write) is
    read up to its last whole batch, said in ``warnings``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.warnings: list[str] = []
        if self.path.is_dir():
            raise DeadLetterError(f"sink.dead_letter_path: {self.path} is a folder")
        if not self.path.is_file():
            raise DeadLetterError(f"sink.dead_letter_path: {self.path} does not exist (no dead "
                                  "letters written yet)")

    def records(self):
        import pyarrow as pa

        n = 0
        try:
            for r in read_records(self.path):
                yield parse_letter(-1, n, r.timestamp_ms, r.key, r.value, r.headers)
                n += 1
        except (pa.ArrowException, OSError, ValueError) as exc:
            why = _safe(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            if n == 0:
                raise DeadLetterError(f"sink.dead_letter_path: {self.path} is not a readable "
                                      f"recorded topic ({why})") from None
            warning = (f"{self.path}: unreadable after its first {n:,} records ({why}): a "
                       "write cut short? Those before are shown")
            if warning not in self.warnings:
                self.warnings.append(warning)

    def close(self) -> None:
        pass


def _kafka_error(exc: Exception) -> str:
    err = exc.args[0] if exc.args else None
    try:
        return err.str() if hasattr(err, "str") else str(exc)
    except Exception:  # noqa: BLE001 (a KafkaError whose str() itself failed)
        return str(exc) or type(exc).__name__


class TopicReader:
    """The dead-letter topic's committed records from the beginning of each partition to its
    end when the read began, without a consumer group (nothing is committed). Read committed:
    a partition's end is its last stable offset, so a transaction still open on it (the
    worker's, a killed producer's) hides what follows until it ends; ``bounds`` waits for that
    and says what it could not wait for."""

    def __init__(self, client: dict, topic: str, timeout_s: float):
        from confluent_kafka import Consumer, KafkaException

        self.topic = topic
        self.timeout_s = timeout_s
        self.warnings: list[str] = []
        self.where = client.get("bootstrap.servers", "?")
        conf = {**client, "group.id": f"dead-letters-{uuid.uuid4().hex}",
                "enable.auto.commit": False, "enable.partition.eof": True,
                "auto.offset.reset": "earliest", "queued.max.messages.kbytes": 16384}
        self.consumer = Consumer({**conf, "isolation.level": "read_committed"})
        self.uncommitted = Consumer({**conf, "isolation.level": "read_uncommitted"})
        try:
            meta = self.consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        except KafkaException as exc:
            self.close()
            raise DeadLetterError(f"the brokers ({self.where}) did not answer within "
                                  f"{timeout_s:.0f} s (kafka.connect_timeout_s): "
                                  f"{_kafka_error(exc)}") from None
        if meta is None or meta.error is not None:
            why = meta.error.str() if meta is not None and meta.error is not None else ""
            self.close()
            raise DeadLetterError(f"sink.dead_letter_topic: topic {topic!r} cannot be read"
                                  + (f" ({why})" if why else ""))
        self.partitions = sorted(meta.partitions)
        self.ends: dict[int, int] | None = None
        self.hidden: dict[int, tuple[int, int]] = {}

    def _offsets(self, consumer) -> dict[int, int]:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            return {p: consumer.get_watermark_offsets(TopicPartition(self.topic, p),
                                                      timeout=self.timeout_s)[1]
                    for p in self.partitions}
        except KafkaException as exc:
            raise DeadLetterError(f"reading {self.topic!r}: its offsets: "
                                  f"{_kafka_error(exc)}") from None

    def bounds(self, wait_s: float) -> dict[int, tuple[int, int]]:
        """Fix where the read ends: each partition's last stable offset once it has reached the
        high watermark seen now, waiting up to ``wait_s`` for open transactions to end.
        Returns the partitions still hidden in part: {partition: (stable end, high mark)}."""
        high = self._offsets(self.uncommitted)
        deadline = time.monotonic() + wait_s
        while True:
            stable = self._offsets(self.consumer)
            hidden = {p: (stable[p], high[p]) for p in self.partitions if stable[p] < high[p]}
            if not hidden or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        self.ends, self.hidden = stable, hidden
        for p, (end, hi) in sorted(hidden.items()):
            self.warnings.append(
                f"{self.topic} partition {p}: a transaction open since offset {end:,} hides "
                f"{hi - end:,} records after it (not shown): it ends when its producer commits "
                "or aborts, or after its transaction timeout")
        return hidden

    def records(self):
        """One pass over the topic up to the bounds (a Letter or a Marker each record)."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        from .io.kafka import reader_event

        if self.ends is None:
            self.bounds(0)
        ends = self.ends
        live = {p for p in self.partitions if ends[p] > 0}
        c = self.consumer
        c.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in live])
        quiet_since = time.monotonic()
        try:
            while live:
                msgs = c.consume(500, 0.5)
                if not msgs and time.monotonic() - quiet_since > self.timeout_s:
                    raise DeadLetterError(f"sink.dead_letter_topic: {self.topic!r} gave "
                                          f"nothing for {self.timeout_s:.0f} s before its end")
                for m in msgs:
                    if reader_event(m, live):
                        continue
                    if m.error() is not None:
                        raise DeadLetterError(f"reading {self.topic!r}: {m.error().str()}")
                    quiet_since = time.monotonic()
                    p, off = m.partition(), m.offset()
                    if p not in live:
                        continue
                    if off >= ends[p]:
                        live.discard(p)
                        continue
                    _kind, ts = m.timestamp()
                    yield parse_letter(p, off, ts, m.key(), m.value(), m.headers())
                    if off + 1 >= ends[p]:
                        live.discard(p)
        finally:
            c.unassign()

    def close(self) -> None:
        for c in (getattr(self, "consumer", None), getattr(self, "uncommitted", None)):
            if c is not None:
                c.close()


def scan(reader, selection: Selection, show=None, limit: int | None = None) -> Summary:
    """Two passes: the requeue markers first (they follow their letters), then the selected
    letters, counted, and each of the first ``limit`` given to ``show(letter, requeued)`` as it
    is read. Holds the markers' offsets, never the letters."""
    requeued = {(m.partition, m.offset) for m in reader.records() if isinstance(m, Marker)}
    summary = Summary(markers=len(requeued))
    shown = 0
    for item in reader.records():
        if isinstance(item, Marker):
            continue
        summary.letters += 1
        if not selection.takes(item):
            continue
        summary.add(item)
        done = (item.partition, item.offset) in requeued
        if done:
            summary.requeued_by_reason[item.reason] += 1
        if show is not None and (limit is None or shown < limit):
            show(item, done)
            shown += 1
    summary.shown = shown
    return summary


# per-letter refusals of a copy by the broker (the copy is skipped, the rest requeued);
# any other error ends the requeue, its transaction aborted
_LETTER_ERRORS = {"MSG_SIZE_TOO_LARGE", "_MSG_SIZE_TOO_LARGE", "INVALID_RECORD",
                  "INVALID_TIMESTAMP", "CORRUPT_MESSAGE", "RECORD_LIST_TOO_LARGE",
                  "INVALID_RECORD_BATCH"}


def requeue(client: dict, dead_topic: str, input_topics: list[str], selection: Selection,
            timeout_s: float, say=print) -> tuple[int, Counter]:
    """Copy the selected letters not requeued before back to their input topic, each once (see
    the module's docstring). Returns (copies written, letters skipped by why)."""
    from confluent_kafka import KafkaError, KafkaException, Producer

    where = client.get("bootstrap.servers", "?")
    # fence any requeue of this topic still running first, then read which letters were
    # requeued: a transaction of the fenced one is either committed (its markers read here)
    # or aborted (nothing of it visible)
    def transactional():
        p = Producer({**client, "transactional.id": f"scoring-worker-requeue-{dead_topic}",
                      "enable.idempotence": True, "linger.ms": 5,
                      "transaction.timeout.ms": 60000})
        try:
            p.init_transactions(timeout_s)
        except KafkaException as exc:
            raise DeadLetterError(f"requeue: no transaction could begin within "
                                  f"{timeout_s:.0f} s (the brokers: {where}): "
                                  f"{_kafka_error(exc)}") from None
        return p

    producer = transactional()
    reader = TopicReader(client, dead_topic, timeout_s)
    topics: dict[str, set[int]] = {}
    skipped: Counter = Counter()
    first: dict[str, str] = {}  # a refusal's first letter (partition:offset)
    written = 0
    pending: list[Letter] = []

    def why_not(exc_or_err) -> str:
        text = _kafka_error(exc_or_err) if isinstance(exc_or_err, Exception) else \
            exc_or_err.str()
        return f"the broker refused its copy: {text}"

    def attempt(batch: list[Letter]) -> dict[int, str]:
        """One transaction: the batch's copies and markers, committed; or, where the broker
        refused copies for what they are (too large, ...), aborted, and those returned (a
        refusal names a whole produce batch: the letter itself is found alone)."""
        refused: dict[int, str] = {}
        other: list[str] = []

        def delivered(err, _msg, i=None):
            if err is None:
                return
            if i is not None and err.name() in _LETTER_ERRORS:
                refused[i] = why_not(err)
            else:
                other.append(err.str())

        producer.begin_transaction()
        for i, letter in enumerate(batch):
            o = letter.own
            headers = original_headers(letter.carried) + [
                (ORIGIN, f"{dead_topic}:{letter.partition}:{letter.offset}".encode())]
            src, part = o["source_topic"], _int(o.get("source_partition"))
            kw = {"partition": part} if part is not None and part in topics[src] else {}
            while True:
                try:
                    producer.produce(src, value=letter.value, key=letter.key, headers=headers,
                                     on_delivery=partial(delivered, i=i), **kw)
                    break
                except BufferError:  # the local queue is full: let it drain
                    producer.poll(0.5)
                except KafkaException as exc:  # this copy alone (too large for the client)
                    refused[i] = why_not(exc)
                    break
            if i in refused:
                continue
            producer.produce(dead_topic, value=None, key=None, partition=letter.partition,
                             headers=[(MARKER, str(letter.offset).encode())],
                             on_delivery=delivered)
            producer.poll(0)
        left = producer.flush(timeout_s)
        if refused:  # the rest of the transaction failed with them (purged): nothing written
            retire()
            return refused
        if left or other:
            raise DeadLetterError(f"{left} copies undelivered within {timeout_s:.0f} s"
                                  if left else other[0])
        producer.commit_transaction(timeout_s)
        return refused

    def retire() -> None:
        """Abort, and go on with a new producer of the same transactional id: a refused
        batch left its sequence numbers behind (the next transaction would fail on them),
        and the new epoch fences the old."""
        nonlocal producer
        with contextlib.suppress(KafkaException):
            producer.abort_transaction(timeout_s)
        producer.flush(0)
        producer = transactional()

    def commit(batch: list[Letter]) -> None:
        nonlocal written
        try:
            refused = attempt(batch)
        except BaseException as exc:  # noqa: BLE001 (a stop too: abort, then say it)
            with contextlib.suppress(Exception):
                producer.abort_transaction(min(timeout_s, 10))
            if not isinstance(exc, Exception):
                raise
            text = _kafka_error(exc) if isinstance(exc, KafkaException) else str(exc)
            if isinstance(exc, KafkaException) and exc.args and \
                    getattr(exc.args[0], "code", lambda: None)() in (
                        KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                        KafkaError.INVALID_PRODUCER_EPOCH):
                text = "another requeue of this dead-letter topic took over (fenced)"
            raise DeadLetterError(f"requeue: {text}: the last {len(batch):,} copies were "
                                  f"not written ({written:,} before them were); run again "
                                  "to requeue the rest") from None
        if not refused:
            written += len(batch)
            say(f"requeued {written:,}")
            return
        if len(batch) == 1:
            why = refused[0]
            skipped[why] += 1
            first.setdefault(why, f"{batch[0].partition}:{batch[0].offset}")
            return
        ok = [letter for i, letter in enumerate(batch) if i not in refused]
        if ok:
            commit(ok)
        for i in sorted(refused):
            commit([batch[i]])

    try:
        hidden = reader.bounds(wait_s=timeout_s)
        if hidden:
            p, (end, hi) = min(hidden.items())
            raise DeadLetterError(
                f"requeue: {dead_topic} partition {p} has a transaction open since offset "
                f"{end:,} ({hi - end:,} records behind it, requeue markers perhaps among them): "
                f"waited {timeout_s:.0f} s; run again once it has ended (its producer commits "
                "or aborts, or its transaction timeout passes)")
        done = {(m.partition, m.offset) for m in reader.records() if isinstance(m, Marker)}
        for item in reader.records():
            if isinstance(item, Marker) or not selection.takes(item):
                continue
            if (item.partition, item.offset) in done:
                skipped["requeued before"] += 1
                continue
            why = item.requeueable()
            src = item.own.get("source_topic")
            if why is None and src not in input_topics:
                why = f"its source topic {_safe(str(src))!r} is not this config's source.topic"
            if why is None and src not in topics:
                try:
                    meta = reader.consumer.list_topics(src, timeout=timeout_s).topics.get(src)
                except KafkaException as exc:
                    raise DeadLetterError(f"requeue: the input topic {src!r}: "
                                          f"{_kafka_error(exc)}") from None
                if meta is None or meta.error is not None:
                    raise DeadLetterError(f"requeue: the input topic {src!r} cannot be read")
                topics[src] = set(meta.partitions)
            if why is not None:
                skipped[why] += 1
                continue
            pending.append(item)
            if len(pending) >= TXN_MESSAGES:
                commit(pending)
                pending.clear()
        if pending:
            commit(pending)
    finally:
        reader.close()
        producer.flush(1)
    return written, Counter({(f"{why}; the first: letter {first[why]}" if why in first else why): n
                             for why, n in skipped.items()})
