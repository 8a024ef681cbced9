"""record (topic -> file), replay (file -> pipeline -> file or topic) and golden comparison."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from .io.records import Record, RecordWriter, read_records


def record_topic(bootstrap: str, topic: str, output: str | Path, *, from_offset: str = "earliest",
                 from_timestamp_ms: int | None = None, max_messages: int | None = None,
                 max_seconds: float | None = None, client: dict | None = None,
                 progress=None) -> int:
    """Copy a topic's messages (committed only) into a recorded-topic file. Ends at the end of
    every partition, after ``max_messages``, or after ``max_seconds``, whichever comes first."""
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition

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
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            live.discard(m.partition())
                            continue
                        raise RuntimeError(f"consume error: {err}")
                    ts_type, ts = m.timestamp()
                    buf.append(Record(m.topic(), m.partition(), m.offset(), m.key(), m.value(),
                                      ts if ts_type else 0,
                                      [(k, v or b"") for k, v in (m.headers() or [])]))
                w.write(buf)
                n += len(buf)
                if progress and buf:
                    progress(len(buf))
        return n
    finally:
        c.close()


def produce_records(bootstrap: str, topic: str, path: str | Path, keep_partition: bool = True
                    ) -> int:
    """Publish a recorded topic's messages to ``topic`` (same keys, headers, partitions)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    n = 0
    for r in read_records(path):
        kw = {"partition": r.partition} if keep_partition and r.partition >= 0 else {}
        p.produce(topic, value=r.value, key=r.key, headers=r.headers, **kw)
        p.poll(0)
        n += 1
    if p.flush(60):
        raise RuntimeError("could not deliver every recorded message")
    return n


def scores_table(path: str | Path) -> pa.Table:
    """Every output row of a scores file (recorded topic of Arrow streams), in file order."""
    tables = [pa.ipc.open_stream(r.value).read_all().replace_schema_metadata(None)
              for r in read_records(path)]
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables)


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
    """Id-by-id comparison of two scores files; floats within atol + rtol*|golden|."""
    out, gold = scores_table(output), scores_table(golden)
    res = Comparison(rows=out.num_rows, golden_rows=gold.num_rows)
    if gold.num_rows == 0 and out.num_rows == 0:
        return res
    oid = _ids(out)
    gid = _ids(gold)
    u, c = np.unique(oid, return_counts=True)
    res.duplicated = u[c > 1].tolist()
    res.missing = np.setdiff1d(gid, oid).tolist()
    res.extra = np.setdiff1d(oid, gid).tolist()
    common, oi, gi = np.intersect1d(oid, gid, return_indices=True)
    for col in gold.column_names:
        if col == "id":
            continue
        if col not in out.column_names:
            res.differences[col] = [(None, "absent", "present")]
            continue
        a = out.column(col).to_numpy(zero_copy_only=False)[oi]
        b = gold.column(col).to_numpy(zero_copy_only=False)[gi]
        if a.dtype.kind == "f":
            bad = ~(np.isclose(a, b, atol=atol, rtol=rtol) | (np.isnan(a) & np.isnan(b)))
        else:
            bad = a != b
        res.differences[col] = [(common[k].item(), _py(a[k]), _py(b[k]))
                                for k in np.flatnonzero(bad)]
    return res


def _ids(table: pa.Table) -> np.ndarray:
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    return table.column("id").to_numpy(zero_copy_only=False)


def _py(v):
    return v.item() if isinstance(v, np.generic) else v
