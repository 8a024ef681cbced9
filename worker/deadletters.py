"""`scoring-worker dead-letters`: what the worker dead-lettered, by reason, and the originals
sent back to the input once their cause is fixed.

A dead letter is the input message unchanged (key and value; stamped when it was
dead-lettered) with the worker's headers (error, error_code, source_topic, source_partition,
source_offset, model_id, source_timestamp: the input's own time; value_dropped or
input_dropped when the letter could not carry it all) before the input's own headers (a name
the worker writes, or one starting with input-, carried as input-NAME).

A requeue copies the selected originals back to their input topic (same partition, key,
value, timestamp and headers, plus ``requeued_from: <dead-letter topic>:<partition>:<offset>``)
and in the same Kafka transaction appends a marker to the dead letter's partition (no key, no
value, header ``requeued: <offset>``). Listings read the markers: a letter requeued once is
shown as requeued and never requeued again, whatever ran before (a killed requeue's
transaction is aborted, copies and markers together). Each requeue uses one transactional id
per dead-letter topic, so two at once fence each other rather than both copy.
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
                "source_timestamp": _iso(_int(self.own.get("source_timestamp"))),
                "key": _text_or_b64(self.key),
                "value_bytes": None if self.value is None else len(self.value),
                "value": _text_or_b64(self.value),
                "headers": [[k, _text_or_b64(v)] for k, v in original_headers(self.carried)],
                **({"value_dropped": True} if "value_dropped" in self.own else {})}


def parse_letter(partition: int, offset: int, timestamp_ms: int, key, value,
                 headers) -> Letter | Marker:
    """A record of the dead-letter topic: a Letter, or a requeue marker."""
    own: dict[str, str] = {}
    carried: list[tuple[str, bytes]] = []
    marker = None
    for k, v in headers or ():
        if k == MARKER and value is None and key is None:
            marker = v
        elif k in RESERVED_HEADERS:
            own.setdefault(k, (v or b"").decode("utf-8", "replace"))
        else:
            carried.append((k, v if v is not None else b""))
    if marker is not None and not own:
        try:
            return Marker(partition, int(marker))
        except ValueError:
            pass
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
            rows.append((r, f"{n:,}", f"{self.requeued_by_reason[r]:,}", _iso(self.first_ms[r]),
                         _iso(self.last_ms[r]), ",".join(sorted(self.models[r]))))
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


def describe(letter: Letter, requeued: bool) -> list[str]:
    """A letter for a reader: where it came from, why, and its payload."""
    own = letter.own
    at = "" if letter.partition < 0 else f"{letter.partition}:"
    head = (f"[{at}{letter.offset}] {_iso(letter.timestamp_ms)}  {letter.reason}"
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
        hs = ", ".join(f"{k}={_preview(v, 40)}" for k, v in original_headers(letter.carried))
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


def _iso(ms: int) -> str:
    if ms is None or ms < 0:
        return "-"
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


# --- reading --------------------------------------------------------------------------------

def file_letters(path: str | Path):
    """A file sink's dead letters (a recorded topic): (letter or marker) in order."""
    p = Path(path)
    if not p.is_file():
        raise DeadLetterError(f"sink.dead_letter_path: {p} does not exist (no dead letters "
                              "written yet)")
    for i, r in enumerate(read_records(p)):
        yield parse_letter(-1, i, r.timestamp_ms, r.key, r.value, r.headers)


class TopicReader:
    """The dead-letter topic's committed records, from the beginning to each partition's end as
    it was when the read began, without a consumer group (nothing is committed)."""

    def __init__(self, client: dict, topic: str, timeout_s: float):
        from confluent_kafka import Consumer

        self.topic = topic
        self.timeout_s = timeout_s
        self.consumer = Consumer({**client, "group.id": f"dead-letters-{uuid.uuid4().hex}",
                                  "enable.auto.commit": False, "enable.partition.eof": True,
                                  "isolation.level": "read_committed",
                                  "auto.offset.reset": "earliest"})
        meta = self.consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            why = meta.error.str() if meta is not None and meta.error is not None else ""
            self.consumer.close()
            raise DeadLetterError(f"sink.dead_letter_topic: topic {topic!r} cannot be read"
                                  + (f" ({why})" if why else ""))
        self.partitions = sorted(meta.partitions)

    def __iter__(self):
        from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

        c = self.consumer
        ends = {}
        for p in self.partitions:
            _lo, hi = c.get_watermark_offsets(TopicPartition(self.topic, p),
                                              timeout=self.timeout_s)
            ends[p] = hi
        live = {p for p in self.partitions if ends[p] > 0}
        c.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in live])
        quiet_since = time.monotonic()
        while live:
            msgs = c.consume(500, 0.5)
            if not msgs and time.monotonic() - quiet_since > self.timeout_s:
                raise DeadLetterError(f"sink.dead_letter_topic: {self.topic!r} gave nothing "
                                      f"for {self.timeout_s:.0f} s before its end")
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        live.discard(m.partition())
                        continue
                    if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                        continue  # no group is used: the lookup's refusal is harmless
                    raise DeadLetterError(f"reading {self.topic!r}: {err.str()}")
                quiet_since = time.monotonic()
                p, off = m.partition(), m.offset()
                if off >= ends[p]:
                    live.discard(p)
                    continue
                _kind, ts = m.timestamp()
                yield parse_letter(p, off, ts, m.key(), m.value(), m.headers())
                if off + 1 >= ends[p]:
                    live.discard(p)

    def close(self) -> None:
        self.consumer.close()


def read_all(records, selection: Selection, limit: int | None):
    """The summary, the letters to show (at most ``limit``) and the set of those requeued."""
    summary = Summary()
    requeued: set[tuple[int, int]] = set()
    chosen: list[Letter] = []
    counted: list[tuple[str, int, int]] = []
    for item in records:
        if isinstance(item, Marker):
            requeued.add((item.partition, item.offset))
            continue
        summary.letters += 1
        if not selection.takes(item):
            continue
        counted.append((item.reason, item.partition, item.offset))
        summary.add(item)
        if limit is None or len(chosen) < limit:
            chosen.append(item)
    for reason, p, off in counted:  # markers come after their letters: counted at the end
        if (p, off) in requeued:
            summary.requeued_by_reason[reason] += 1
    summary.markers = len(requeued)
    return summary, chosen, requeued


def requeue(client: dict, dead_topic: str, input_topics: list[str], selection: Selection,
            timeout_s: float, say=print) -> tuple[int, Counter]:
    """Copy the selected letters not requeued before back to their input topic, each once (see
    the module's docstring). Returns (copies written, letters skipped by why)."""
    from confluent_kafka import KafkaException, Producer

    # fence any requeue of this topic still running first, then read which letters were
    # requeued: a transaction of the fenced one is either committed (its markers read here)
    # or aborted (nothing of it visible)
    producer = Producer({**client, "transactional.id": f"scoring-worker-requeue-{dead_topic}",
                         "enable.idempotence": True, "linger.ms": 5,
                         "transaction.timeout.ms": 60000})
    try:
        producer.init_transactions(timeout_s)
    except KafkaException as exc:
        raise DeadLetterError(f"requeue: cannot begin a transaction: {exc.args[0].str()}") \
            from None
    reader = TopicReader(client, dead_topic, timeout_s)
    try:
        _summary, _chosen, done = read_all(reader, selection, limit=0)
    finally:
        reader.close()
    topics: dict[str, set[int]] = {}
    skipped: Counter = Counter()
    written = 0
    pending: list[Letter] = []
    failed: list[str] = []

    def delivered(err, _msg):
        if err is not None:
            failed.append(err.str())

    def commit() -> None:
        nonlocal written
        if not pending:
            return
        producer.begin_transaction()
        for letter in pending:
            o = letter.own
            headers = original_headers(letter.carried) + [
                (ORIGIN, f"{dead_topic}:{letter.partition}:{letter.offset}".encode())]
            src, part = o["source_topic"], _int(o.get("source_partition"))
            kw = {"partition": part} if part is not None and part in topics[src] else {}
            ts = _int(o.get("source_timestamp"))
            if ts is not None and ts > 0:  # the input's own time (else the broker's now)
                kw["timestamp"] = ts
            producer.produce(src, value=letter.value, key=letter.key, headers=headers,
                             on_delivery=delivered, **kw)
            producer.produce(dead_topic, value=None, key=None, partition=letter.partition,
                             headers=[(MARKER, str(letter.offset).encode())],
                             on_delivery=delivered)
            producer.poll(0)
        try:
            left = producer.flush(timeout_s)
            if left or failed:
                raise DeadLetterError(f"requeue: {left} copies undelivered" if left else
                                      f"requeue: the broker refused a copy: {failed[0]}")
            producer.commit_transaction(timeout_s)
        except (KafkaException, DeadLetterError) as exc:
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(timeout_s)
            why = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
            raise DeadLetterError(f"{why.removeprefix('requeue: ')}: the last "
                                  f"{len(pending)} copies were not written (the "
                                  f"{written} before were); run again to requeue the "
                                  "rest") from None
        written += len(pending)
        say(f"requeued {written:,}")
        pending.clear()

    reader = TopicReader(client, dead_topic, timeout_s)
    try:
        for item in reader:
            if isinstance(item, Marker) or not selection.takes(item):
                continue
            if (item.partition, item.offset) in done:
                skipped["requeued before"] += 1
                continue
            why = item.requeueable()
            src = item.own.get("source_topic")
            if why is None and src not in input_topics:
                why = f"its source topic {src!r} is not this config's source.topic"
            if why is None and src not in topics:
                meta = reader.consumer.list_topics(src, timeout=timeout_s).topics.get(src)
                if meta is None or meta.error is not None:
                    raise DeadLetterError(f"requeue: the input topic {src!r} cannot be read")
                topics[src] = set(meta.partitions)
            if why is not None:
                skipped[why] += 1
                continue
            pending.append(item)
            if len(pending) >= TXN_MESSAGES:
                commit()
        commit()
    finally:
        reader.close()
        producer.flush(1)
    return written, skipped

