"""record (topic -> file), replay (file -> pipeline -> file or topic) and golden comparison."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .io.records import RecordWriter, read_outputs, read_records


def record_topic(bootstrap: str, topic: str, output: str | Path, *, from_offset: str = "earliest",
                 from_timestamp_ms: int | None = None, max_messages: int | None = None,
                 max_seconds: float | None = None, client: dict | None = None,
                 progress=None) -> int:
    """Copy a topic's messages (committed only) into a recorded-topic file. Ends at the end of
    every partition, after ``max_messages``, or after ``max_seconds``, whichever comes first."""
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

    from .io.kafka import reader_event, to_record

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"record-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "enable.partition.eof": True,
                  "isolation.level": "read_committed", **(client or {})})
    try:
        meta = c.list_topics(topic, timeout=30).topics.get(topic)
        if meta is None or meta.error is not None:
            raise ValueError(f"topic {topic!r} does not exist")
        parts = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
        if from_timestamp_ms is not None:
            for tp in parts:
                tp.offset = from_timestamp_ms
            parts = c.offsets_for_times(parts, timeout=30)
        else:
            start = {"earliest": OFFSET_BEGINNING, "latest": OFFSET_END}.get(from_offset)
            for tp in parts:
                tp.offset = start if start is not None else int(from_offset)
        live = {tp.partition for tp in parts}
        # a partition already at its end reports EOF at once; one with no message at the
        # timestamp has offset -1 (end) and does the same
        c.assign(parts)
        deadline = time.monotonic() + max_seconds if max_seconds else None
        n = 0
        with RecordWriter(output) as w:
            while live and (max_messages is None or n < max_messages):
                if deadline is not None and time.monotonic() > deadline:
                    break
                want = 500 if max_messages is None else min(500, max_messages - n)
                buf = []
                for m in c.consume(want, 0.5):
                    if reader_event(m, live):
                        continue
                    if m.error() is not None:
                        raise RuntimeError(f"consume error: {m.error()}")
                    buf.append(to_record(m))
                w.write(buf)
                n += len(buf)
                if progress and buf:
                    progress(len(buf))
        return n
    finally:
        c.close()


def produce_records(bootstrap: str, topic: str, path: str | Path, keep_partition: bool = True,
                    client: dict | None = None) -> int:
    """Publish a recorded topic's messages to ``topic`` (same keys, headers, partitions);
    ``client``: more librdkafka settings (security)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                  **(client or {})})
    n = 0
    for r in read_records(path):
        kw = {"partition": r.partition} if keep_partition and r.partition >= 0 else {}
        p.produce(topic, value=r.value, key=r.key, headers=r.headers, **kw)
        p.poll(0)
        n += 1
    if p.flush(60):
        raise RuntimeError("could not deliver every recorded message")
    return n


@dataclass
class _Rows:
    keys: list  # one hashable key per row (see _key)
    columns: dict[str, list]  # column -> values, row order as keys
    messages: int = 0


def _key(value, where, row: int):
    """An id as a key that keeps its type (1, 1.0 and "1" are different ids); a row without a
    usable id (null, NaN) is keyed by its place: input partition, offset and row."""
    if value is None or (isinstance(value, float) and value != value):
        return ("row", *where, row)
    return (type(value).__name__, _hashable(value))


def _hashable(value):
    """Nested ids (lists, structs, maps) as tuples: comparable and usable as keys."""
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _show(key) -> str:
    if key[0] == "row":
        return f"<no id: partition {key[1]} offset {key[2]} row {key[3]}>"
    return repr(key[1])


def _rows(path: str | Path) -> _Rows:
    rows = _Rows([], {})
    for m, (_rec, t) in enumerate(read_outputs(path)):
        if t is None:
            raise ValueError(f"{path}: message {m} is not an Arrow IPC stream")
        meta = t.schema.metadata or {}
        where = ((meta.get(b"input_partition", b"?").decode(),
                  meta.get(b"input_offset", b"?").decode())
                 if b"input_offset" in meta else ("?", str(m)))
        ids = t.column("id").to_pylist() if "id" in t.schema.names else [None] * t.num_rows
        rows.keys.extend(_key(v, where, r) for r, v in enumerate(ids))
        have = len(rows.keys) - t.num_rows
        for name in t.schema.names:
            if name == "id":
                continue
            col = rows.columns.setdefault(name, [None] * have)
            col.extend(t.column(name).to_pylist())
        for col in rows.columns.values():  # columns absent from this message
            col.extend([None] * (len(rows.keys) - len(col)))
        rows.messages += 1
    return rows


@dataclass
class Comparison:
    rows: int = 0
    golden_rows: int = 0
    missing: list = field(default_factory=list)  # ids in golden, not in output
    extra: list = field(default_factory=list)  # ids in output, not in golden
    duplicated: list = field(default_factory=list)
    differences: dict[str, list] = field(default_factory=dict)  # column -> [(id, out, golden)]

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.duplicated
                    or any(self.differences.values()))

    def summary(self, limit: int = 10) -> str:
        lines = [f"compared {self.rows} output rows with {self.golden_rows} golden rows: "
                 + ("identical within tolerance" if self.ok else "DIFFERENCES")]
        for name, ids in (("missing", self.missing), ("extra", self.extra),
                          ("duplicated", self.duplicated)):
            if ids:
                lines.append(f"  {len(ids)} ids {name}: {ids[:limit]}"
                             + (" ..." if len(ids) > limit else ""))
        for col, diffs in self.differences.items():
            if diffs:
                lines.append(f"  {col}: {len(diffs)} rows differ")
                for i, a, b in diffs[:limit]:
                    lines.append(f"    id {i}: output {a!r} golden {b!r}")
        return "\n".join(lines)


def compare(output: str | Path, golden: str | Path, atol: float = 1e-9, rtol: float = 0.0
            ) -> Comparison:
    """Row-by-row comparison of two scores files, rows matched by id (of any type, mixed
    types too); rows without an id by their input partition, offset and row. Floats match
    within atol + rtol*|golden|, NaN matches NaN."""
    out, gold = _rows(output), _rows(golden)
    res = Comparison(rows=len(out.keys), golden_rows=len(gold.keys))
    where_out: dict = {}
    dup = set()
    for i, k in enumerate(out.keys):
        if k in where_out:
            dup.add(k)
        where_out[k] = i
    where_gold = {k: i for i, k in enumerate(gold.keys)}
    res.duplicated = sorted(_show(k) for k in dup)
    res.missing = [_show(k) for k in gold.keys if k not in where_out]
    res.extra = [_show(k) for k in out.keys if k not in where_gold]
    common = [k for k in gold.keys if k in where_out]
    oi = np.asarray([where_out[k] for k in common], dtype=np.int64)
    gi = np.asarray([where_gold[k] for k in common], dtype=np.int64)
    for col, gvals in gold.columns.items():
        if col not in out.columns:
            res.differences[col] = [(None, "absent", "present")]
            continue
        ovals = out.columns[col]
        a = [ovals[i] for i in oi]
        b = [gvals[i] for i in gi]
        bad = [k for k, (x, y) in enumerate(zip(a, b, strict=True)) if not _same(x, y, atol,
                                                                                  rtol)]
        res.differences[col] = [(_show(common[k]), a[k], b[k]) for k in bad]
    return res


def _same(x, y, atol: float, rtol: float) -> bool:
    if isinstance(x, float) and isinstance(y, float):
        if x != x or y != y:
            return x != x and y != y
        return abs(x - y) <= atol + rtol * abs(y)
    return x == y


def agreement(live: str | Path, shadow: str | Path, bands: int) -> str:
    """The decision agreement of two scores files of the same input (a live model and its
    shadow), rows matched by id: a table of row counts per (live band, shadow band), the
    agreement rate and the score differences."""
    a, b = _rows(live), _rows(shadow)
    where = {k: i for i, k in enumerate(b.keys)}
    pairs = [(i, where[k]) for i, k in enumerate(a.keys) if k in where]
    table = np.zeros((bands, bands), dtype=np.int64)
    diffs = []
    for i, j in pairs:
        table[a.columns["decision"][i], b.columns["decision"][j]] += 1
        diffs.append(b.columns["score"][j] - a.columns["score"][i])
    n = int(table.sum())
    lines = [f"decisions of {n} rows (live rows down, shadow columns across; "
             f"{len(a.keys) - n} live rows without a shadow row)",
             "live\\shadow " + "".join(f"{f'band {k}':>12}" for k in range(bands))]
    for k in range(bands):
        lines.append(f"{f'band {k}':<12}" + "".join(f"{int(v):>12,}" for v in table[k]))
    if n:
        d = np.abs(np.asarray(diffs, dtype=np.float64))
        lines.append(f"agreement {np.trace(table) / n:.4%}; |score difference| mean "
                     f"{np.nanmean(d):.4g}, p99 {np.nanpercentile(d, 99):.4g}, max "
                     f"{np.nanmax(d):.4g}")
    return "\n".join(lines)
