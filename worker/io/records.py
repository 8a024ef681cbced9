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


# Header names the worker writes on outputs and dead letters (compared in any case): an input
# header of one of these names is forwarded as input-NAME (pipeline.forwarded), never before or
# instead of the worker's own.
RESERVED_HEADERS = frozenset({"content-type", "model_id", "role", "error", "error_code",
                              "source_topic", "source_partition", "source_offset",
                              "source_timestamp",
                              "value_dropped", "input_dropped"})


def original_headers(carried: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """The input's headers from those an output or dead letter carries after the worker's own
    (pipeline.forwarded undone: one input- prefix taken off)."""
    return [(k[6:] if k[:6].lower() == "input-" else k, v) for k, v in carried]


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
    # a consumed message: the epoch of the partition assignment it was fetched under
    # (io.kafka.KafkaSource.owns); 0 for a recording's
    epoch: int = 0


def to_batch(records: list[Record]) -> pa.RecordBatch:
    # headers as flat key and value columns plus list offsets: no dict per header
    offsets, keys, values = [0], [], []
    for r in records:
        for k, v in r.headers:
            keys.append(k)
            values.append(v)
        offsets.append(len(keys))
    headers = pa.ListArray.from_arrays(
        pa.array(offsets, type=pa.int32()),
        pa.StructArray.from_arrays([pa.array(keys, type=pa.string()),
                                    pa.array(values, type=pa.binary())],
                                   fields=list(HEADER_TYPE.value_type)))
    return pa.RecordBatch.from_arrays([
        pa.array([r.topic for r in records], type=pa.string()),
        pa.array([r.partition for r in records], type=pa.int32()),
        pa.array([r.offset for r in records], type=pa.int64()),
        pa.array([r.timestamp_ms for r in records], type=pa.int64()),
        pa.array([r.key for r in records], type=pa.binary()),
        pa.array([r.value for r in records], type=pa.binary()),
        headers,
    ], schema=RECORD_SCHEMA)


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
            cols = [batch.column(name).to_pylist() for name in
                    ("topic", "partition", "offset", "key", "value", "timestamp_ms")]
            yield from map(Record, *cols, _headers(batch.column("headers")))


JSON_LINES = (".jsonl", ".ndjson")  # one JSON message a line (a file source of JSON events)


def read_json_lines(path: str | Path) -> Iterator[Record]:
    """A file of JSON lines as the messages of a topic: one message a line (an event or an
    array of events), blank lines skipped, offsets the line numbers."""
    path = Path(path)
    with open(path, "rb") as f:
        for i, line in enumerate(f):
            value = line.rstrip(b"\r\n")
            if value.strip():
                yield Record(path.stem, 0, i, None, value, 0, [])


def read_messages(path: str | Path) -> Iterator[Record]:
    """A recorded topic (.arrows), or JSON lines (``JSON_LINES``)."""
    if Path(path).suffix in JSON_LINES:
        return read_json_lines(path)
    return read_records(path)


def _headers(col: pa.ListArray) -> list[list[tuple[str, bytes]]]:
    """Each row's headers as (key, value) pairs, from the flat key and value columns."""
    offsets = col.offsets.to_pylist()
    pairs = col.values
    keys, values = pairs.field("key").to_pylist(), pairs.field("value").to_pylist()
    rows = [list(zip(keys[a:b], values[a:b], strict=True))
            for a, b in zip(offsets, offsets[1:], strict=False)]
    if col.null_count:  # a null list of headers: none
        rows = [r if h is not None else [] for r, h in zip(rows, col.to_pylist(), strict=True)]
    return rows


def read_outputs(path: str | Path) -> Iterator[tuple[Record, pa.Table | None]]:
    """Each message of a scores file with its value read as a table: an Arrow IPC stream, or
    a JSON output (``content-type: application/json``: an object or an array of objects
    whose first key is the id, as ``id``); None where the value is neither. The one reader
    of output files (summaries, replay comparisons)."""
    for rec in read_records(path):
        if any(k.lower() == "content-type" and v == b"application/json"
               for k, v in rec.headers):
            yield rec, _json_table(rec.value)
            continue
        try:
            table = pa.ipc.open_stream(pa.py_buffer(rec.value or b"")).read_all()
        except (pa.ArrowInvalid, OSError):
            table = None
        yield rec, table


def _json_table(value: bytes | None) -> pa.Table | None:
    import json

    try:
        doc = json.loads(value or b"")
        rows = [doc] if isinstance(doc, dict) else doc
        out = []
        for row in rows:
            items = list(row.items())
            out.append({"id": items[0][1], **dict(items[1:])})
        return pa.Table.from_pylist(out)
    except (ValueError, TypeError, AttributeError, IndexError, pa.ArrowException):
        return None
