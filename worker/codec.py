"""Arrow IPC in and out: decode and validate one message, encode one output stream."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .model.compiled import feature_type_problem
from .model.result import STOP_REASONS, ScoreResult

CONTENT_TYPE = "application/vnd.apache.arrow.stream"
_REASON_DICTIONARY = pa.array(STOP_REASONS.tolist(), type=pa.string())


class InvalidMessage(ValueError):
    """A message that cannot be decoded or validated; ``code`` names the kind of error."""

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


_CONTINUATION = b"\xff\xff\xff\xff"
_MAX_CACHED_SCHEMA = 64 << 10  # schema bytes (metadata included) worth keeping per key


class Decoder:
    """Decodes the messages of one model's input. What a schema allows (the feature and id
    columns present once each, of usable types) is worked out once per distinct schema and
    cached by the stream's schema bytes; a message whose schema is cached has only its record
    batches read, against the known schema. Every message's columns are fully validated."""

    def __init__(self, feature_names: list[str], id_column: str | None,
                 max_rows: int | None = None, cache_size: int = 256):
        self.feature_names, self.id_column, self.max_rows = feature_names, id_column, max_rows
        self._plans: dict[bytes, tuple[pa.Schema, list[int]]] = {}
        self._cache_size = cache_size

    def decode(self, value: bytes | None) -> pa.RecordBatch:
        """One self-contained Arrow IPC stream -> one RecordBatch of the columns read, fully
        validated: nothing native reads a buffer whose size pyarrow has not checked against
        the lengths, offsets and null counts the message claims."""
        return self.decode_keyed(value)[0]

    def decode_keyed(self, value: bytes | None) -> tuple[pa.RecordBatch, object]:
        """``decode``, with a key equal for messages whose batches can be concatenated (the
        stream's schema bytes, or the schema itself when the framing is unusual)."""
        if not value:
            raise InvalidMessage("empty", "the message has no value")
        key = _schema_bytes(value)
        plan = self._plans.get(key) if key is not None else None
        try:
            if plan is not None:
                schema, keep = plan
                batch = _read_batches(value, len(key), schema, keep)
            else:
                reader = pa.ipc.open_stream(pa.py_buffer(value))
                table = reader.read_all()
                schema = table.schema
                dictionaries = reader.stats.num_dictionary_batches
                schema.names  # noqa: B018 (field names are UTF-8, or the decode fails here)
                batch = None
        except (pa.ArrowException, OSError, MemoryError, ValueError, EOFError) as exc:
            raise InvalidMessage("not_arrow", f"not a readable Arrow IPC stream: "
                                 f"{_short(exc)}") from None
        if plan is None:
            keep = self._plan(schema)  # raises InvalidMessage for a schema that cannot be used
            # cached: schemas read without dictionary batches, of a sensible size
            if key is not None and len(key) <= _MAX_CACHED_SCHEMA and not dictionaries \
                    and not _has_dictionaries(schema):
                if len(self._plans) >= self._cache_size:
                    self._plans.clear()
                self._plans[key] = (schema, keep)
            n = table.num_rows
        else:
            n = batch.num_rows if batch is not None else 0
        if n == 0:
            raise InvalidMessage("empty_batch", "the Arrow stream has no rows")
        if self.max_rows is not None and n > self.max_rows:
            raise InvalidMessage("too_large", f"{n} rows, more than "
                                 f"delivery.max_message_rows ({self.max_rows})")
        try:
            # only the columns read from here on (the others are neither validated nor read)
            if batch is None:
                if len(keep) != len(schema):
                    table = table.select(keep)
                # validated before anything concatenates the stream's batches
                table.validate(full=True)
                batches = table.to_batches()
                batch = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
            else:
                if len(keep) != len(schema):
                    batch = batch.select(keep)
                batch.validate(full=True)
        except (pa.ArrowException, ValueError) as exc:
            raise InvalidMessage("invalid_arrow", f"buffers fail validation: {_short(exc)}") \
                from None
        return batch, (key if key is not None else schema)

    def _plan(self, schema: pa.Schema) -> list[int]:
        """The indices of the columns to keep, in the message's order; InvalidMessage when the
        schema lacks a feature column, names one twice or has one of an unusable type."""
        names = schema.names
        present = set(names)
        wanted = list(self.feature_names) + ([self.id_column] if self.id_column else [])
        dup = sorted({n for n in wanted if schema.get_all_field_indices(n)[1:]})
        if dup:
            raise InvalidMessage("duplicate_column", "column(s) named more than once: "
                                 + ", ".join(dup[:10]))
        missing = [f for f in self.feature_names if f not in present]
        if missing:
            raise InvalidMessage("missing_column", "missing feature column(s): "
                                 + ", ".join(missing[:10]))
        if self.id_column and self.id_column not in present:
            raise InvalidMessage("missing_column", f"missing id column {self.id_column!r}")
        for f in self.feature_names:
            problem = feature_type_problem(f, schema.field(f).type)
            if problem:
                raise InvalidMessage("bad_type", problem)
        keep = set(wanted)
        return [i for i, n in enumerate(names) if n in keep]


def _schema_bytes(value: bytes) -> bytes | None:
    """The stream's schema message (continuation marker, length, flatbuffer), or None."""
    if len(value) < 8 or value[:4] != _CONTINUATION:
        return None
    n = int.from_bytes(value[4:8], "little", signed=True)
    if n <= 0 or 8 + n > len(value):
        return None
    return value[:8 + n]


def _read_batches(value: bytes, start: int, schema: pa.Schema,
                  keep: list[int]) -> pa.RecordBatch | None:
    """The record batches after the schema message, read against the known schema; several
    are cut to the columns ``keep`` and validated before they are concatenated. None when
    there are none."""
    reader = pa.BufferReader(pa.py_buffer(value))
    reader.seek(start)
    batches = []
    while True:
        try:
            message = pa.ipc.read_message(reader)
        except EOFError:  # the end-of-stream marker, or the end of the bytes
            break
        if message.type != "record batch":
            raise ValueError(f"unexpected {message.type} message in the stream")
        batches.append(pa.ipc.read_record_batch(message, schema))
        pos = reader.tell()  # the usual stream: one batch, then the end
        if len(value) - pos <= 8 and value[pos:] in _STREAM_ENDS:
            break
    if len(batches) > 1:
        if len(keep) != len(schema):
            batches = [b.select(keep) for b in batches]
        for b in batches:
            b.validate(full=True)
        return pa.concat_batches(batches)
    return batches[0] if batches else None


_STREAM_ENDS = (b"", b"\xff\xff\xff\xff\x00\x00\x00\x00", b"\x00\x00\x00\x00")


def _has_dictionaries(schema: pa.Schema) -> bool:
    """Dictionary-encoded columns need the stream's dictionary batches: no cached path."""
    return any(_nested_dictionary(f.type) for f in schema)


def _nested_dictionary(t) -> bool:
    if pa.types.is_dictionary(t):
        return True
    if isinstance(t, pa.ExtensionType):
        return _nested_dictionary(t.storage_type)
    return any(_nested_dictionary(t.field(i).type) for i in range(t.num_fields)) \
        if hasattr(t, "num_fields") else False


def decode(value: bytes | None, feature_names: list[str], id_column: str | None,
           max_rows: int | None = None) -> pa.Table:
    """``Decoder(feature_names, id_column, max_rows).decode(value)``, without a cache."""
    return Decoder(feature_names, id_column, max_rows).decode(value)


def _short(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:limit]


class ResultColumns:
    """The output columns of a whole score result, built once; ``batch`` takes one message's
    rows as zero-copy slices, with that message's ids."""

    def __init__(self, r: ScoreResult, classifier: bool):
        cols = {"score": pa.array(r.score, type=pa.float64())}
        if classifier:
            cols["label"] = pa.array(r.label, type=pa.int32())
        cols.update({
            "decision": pa.array(r.decision, type=pa.int8()),
            "work_units": pa.array(r.work_units, type=pa.int32()),
            "stop_reason": pa.DictionaryArray.from_arrays(pa.array(r.stop_code, type=pa.int8()),
                                                          _REASON_DICTIONARY),
            "score_lo": pa.array(r.score_lo, type=pa.float64()),
            "score_hi": pa.array(r.score_hi, type=pa.float64()),
        })
        self.names = ["id", *cols]
        self.columns = list(cols.values())
        self._schemas: dict[pa.DataType, pa.Schema] = {}

    def batch(self, ids: pa.Array | None, rows: slice | None = None) -> pa.RecordBatch:
        """Rows ``rows`` (default: all); ``ids`` those rows' ids, or None for each row's
        index among them."""
        rows = rows or slice(0, len(self.columns[0]))
        n = rows.stop - rows.start
        ids = ids if ids is not None else pa.array(np.arange(n, dtype=np.int64))
        schema = self._schemas.get(ids.type)
        # DataType equality ignores nested field metadata: reuse only an exact match
        if schema is None or not schema.field(0).type.equals(ids.type, check_metadata=True):
            types = [ids.type] + [c.type for c in self.columns]
            schema = self._schemas[ids.type] = pa.schema(list(zip(self.names, types,
                                                                  strict=True)))
        cols = self.columns if (rows.start, n) == (0, len(self.columns[0])) else \
            [c.slice(rows.start, n) for c in self.columns]
        return pa.RecordBatch.from_arrays([ids] + cols, schema=schema)


_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_OFFSET_SLOT = b"\x01" * 20  # room for any int64 offset; no topic name holds \x01


class StreamEncoder:
    """One output stream per input message: schema (with the model's metadata and the input's
    topic, partition and offset), dictionaries, that message's rows, end of stream. The schema
    and dictionary messages are serialized once per output schema, topic and partition; each
    message only writes its offset into its copy and serializes its slice of the batch."""

    def __init__(self, metadata: dict[bytes, bytes], cache_size: int = 4096):
        self.metadata = metadata
        self._heads: dict[tuple, tuple[bytes, int, bytes] | None] = {}
        self._cache_size = cache_size

    def encode(self, batch: pa.RecordBatch, rows: slice, topic: str, partition: int,
               offset: int, schema_key: object = None) -> bytes:
        """The stream of ``batch``'s rows ``rows``; ``schema_key`` names ``batch.schema``
        (equal keys: identical schemas), None to always serialize the schema."""
        head = None
        if schema_key is not None:
            key = (schema_key, topic, partition)
            head = self._heads.get(key, False)
            if head is False:
                head = self._head(batch, topic, partition)
                if len(self._heads) >= self._cache_size:
                    self._heads.clear()
                self._heads[key] = head
        n = rows.stop - rows.start
        if head is None:
            return encode(batch.slice(rows.start, n), {
                **self.metadata, b"input_topic": topic.encode(),
                b"input_partition": str(partition).encode(),
                b"input_offset": str(offset).encode()})
        template, pos, dictionaries = head
        schema_msg = bytearray(template)
        text = str(offset).encode()
        schema_msg[pos - 4:pos] = len(text).to_bytes(4, "little")
        schema_msg[pos:pos + len(text)] = text  # the rest of the slot stays zero
        return b"".join((schema_msg, dictionaries, batch.slice(rows.start, n).serialize(),
                         _EOS))

    def _head(self, batch: pa.RecordBatch, topic: str, partition: int):
        """(schema message with an offset slot, slot position, dictionary messages), or None
        where the dictionaries are not the same for every message (a dictionary id column)."""
        schema = batch.schema
        if any(_nested_dictionary(f.type) for f in schema if f.name != "stop_reason"):
            return None
        meta = {**self.metadata, b"input_topic": topic.encode(),
                b"input_partition": str(partition).encode(), b"input_offset": _OFFSET_SLOT}
        template = schema.with_metadata(meta).serialize().to_pybytes()
        pos = template.find(_OFFSET_SLOT)
        if template.count(_OFFSET_SLOT) != 1 or \
                int.from_bytes(template[pos - 4:pos], "little") != len(_OFFSET_SLOT):
            return None
        template = template.replace(_OFFSET_SLOT, b"\x00" * len(_OFFSET_SLOT))
        # the dictionary messages a stream writer puts between the schema and the first batch
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema, options=_WRITE_OPTIONS) as writer:
            writer.write_batch(batch.slice(0, 0))  # no rows; the dictionaries in full
        stream = sink.getvalue()
        start = 8 + int.from_bytes(stream.slice(4, 4).to_pybytes(), "little")
        reader = pa.BufferReader(stream)
        reader.seek(start)
        end = start
        while True:
            message = pa.ipc.read_message(reader)
            if message.type != "dictionary":
                break
            end = reader.tell()
        return template, pos, stream.slice(start, end - start).to_pybytes()


def result_batch(ids: pa.Array | None, r: ScoreResult, classifier: bool,
                 slice_: slice | None = None) -> pa.RecordBatch:
    """The output columns (README: Messages) for rows ``slice_`` of a score result; ``ids``
    are those rows' ids (one message's id column), or None for each row's index in its
    message."""
    return ResultColumns(r, classifier).batch(ids, slice_)


def output_metadata(model, **extra) -> dict[bytes, bytes]:
    meta = {"model_id": model.model_id, "work_total": str(model.work_total)}
    meta.update({k: str(v) for k, v in extra.items() if v is not None})
    return {k.encode(): v.encode() for k, v in meta.items()}


_WRITE_OPTIONS = pa.ipc.IpcWriteOptions()  # explicit: pyarrow reads no environment per call


def encode(batch: pa.RecordBatch, metadata: dict[bytes, bytes]) -> bytes:
    """One IPC stream (schema with ``metadata``, dictionaries, the batch, end of stream)."""
    batch = batch.replace_schema_metadata(metadata)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=_WRITE_OPTIONS) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()
