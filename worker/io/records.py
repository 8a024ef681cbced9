"""Recorded topics: Kafka messages stored as rows of an Arrow IPC stream file (.arrows).

One row per message, in partition/offset order as recorded. ``value`` holds the message's own
bytes (itself an Arrow IPC stream for scoring input). The file source replays these rows as if
they were consumed; ``scoring-worker record`` writes them from a topic.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
RECORD_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp_ms", pa.int64()),
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("headers", HEADER_TYPE),
])


@dataclass
class Record:
    """One message, from Kafka or a recording."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int = 0
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    # an output or dead letter: the (topic, partition, offset) of the input it answers, so a
    # message the broker refuses is traced back to the input that produced it
    origin: tuple[str, int, int] | None = None


def to_batch(records: list[Record]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "topic": [r.topic for r in records],
        "partition": [r.partition for r in records],
        "offset": [r.offset for r in records],
        "timestamp_ms": [r.timestamp_ms for r in records],
        "key": [r.key for r in records],
        "value": [r.value for r in records],
        "headers": [[{"key": k, "value": v} for k, v in r.headers] for r in records],
    }, schema=RECORD_SCHEMA)


class RecordWriter:
    """Append records to a .arrows file in batches."""

    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "wb")  # noqa: SIM115 (closed by close())
        self._writer = pa.ipc.new_stream(self._file, RECORD_SCHEMA)
        self.count = 0

    def write(self, records: list[Record]) -> None:
        if records:
            self._writer.write_batch(to_batch(records))
            self.count += len(records)

    def sync(self) -> None:
        """Make what was written durable (fsync) before the input is committed."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._writer.close()
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_records(path: str | Path, records: Iterable[Record], batch: int = 1000) -> int:
    with RecordWriter(path) as w:
        buf: list[Record] = []
        for r in records:
            buf.append(r)
            if len(buf) >= batch:
                w.write(buf)
                buf = []
        w.write(buf)
        return w.count


def read_records(path: str | Path) -> Iterator[Record]:
    with pa.memory_map(str(path)) as src:
        reader = pa.ipc.open_stream(src)
        if not reader.schema.equals(RECORD_SCHEMA, check_metadata=False):
            missing = set(RECORD_SCHEMA.names) - set(reader.schema.names)
            if missing:
                raise ValueError(f"{path} is not a recorded topic (missing {sorted(missing)})")
        for batch in reader:
            d = batch.to_pydict()
            for i in range(batch.num_rows):
                yield Record(
                    topic=d["topic"][i], partition=d["partition"][i], offset=d["offset"][i],
                    key=d["key"][i], value=d["value"][i], timestamp_ms=d["timestamp_ms"][i],
                    headers=[(h["key"], h["value"]) for h in (d["headers"][i] or [])],
                )


def read_outputs(path: str | Path) -> Iterator[tuple[Record, pa.Table | None]]:
    """Each message of a scores file with its value read as an Arrow IPC stream (None: the
    value is not one). The one reader of output files (summaries, replay comparisons)."""
    for rec in read_records(path):
        try:
            table = pa.ipc.open_stream(pa.py_buffer(rec.value or b"")).read_all()
        except (pa.ArrowInvalid, OSError):
            table = None
        yield rec, table
