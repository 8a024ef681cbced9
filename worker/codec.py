"""Arrow IPC in and out: decode and validate one message, encode one output stream."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pyarrow as pa

from . import _ipc
from .formats.base import InvalidMessage
from .model.compiled import (
    category_codes,
    category_sets,
    feature_type_problem,
    is_category_type,
    unseen_categories,
)
from .model.result import STOP_REASONS, ScoreResult

CONTENT_TYPE = "application/vnd.apache.arrow.stream"
_REASON_DICTIONARY = pa.array(STOP_REASONS.tolist(), type=pa.string())


_CONTINUATION = b"\xff\xff\xff\xff"
_MAX_CACHED_SCHEMA = 64 << 10  # schema bytes (metadata included) worth keeping per key


class Raw:
    """A message read in C (``_ipc.Plan``): valid, in the usual form, not yet gathered. The
    features are read from ``value`` when its batch is scored."""

    __slots__ = ("value", "num_rows", "plan", "start")

    def __init__(self, value: bytes, num_rows: int, plan, start: int):
        self.value, self.num_rows, self.plan, self.start = value, num_rows, plan, start


class Decoder:
    """Decodes the messages of one model's input. What a schema allows (the feature and id
    columns present once each, of usable types) is worked out once per distinct schema and
    cached by the stream's schema bytes; a message whose schema is cached is read in C
    (``_ipc.Plan``: one uncompressed record batch, every buffer checked) and becomes a
    ``Raw``, or, in any other form, has its record batches read by pyarrow against the known
    schema. Every message's columns are fully validated either way."""

    def __init__(self, feature_names: list[str], id_column: str | None,
                 max_rows: int | None = None, cache_size: int = 256, native: bool = True,
                 categories: dict[str, list[str]] | None = None, max_bytes: int | None = None,
                 category_hashes: dict[str, list[int]] | None = None):
        self.feature_names, self.id_column, self.max_rows = feature_names, id_column, max_rows
        # what compressed buffers may decompress to (delivery.max_message_bytes)
        self.max_bytes = max_bytes if max_bytes is not None else 1 << 62
        # features whose strings are mapped to codes (the model's categories); a message's
        # dictionary-encoded strings become float32 codes as it is decoded
        self.categories = category_sets(categories or {})  # built once, not per message
        # features with hashed categories (CatBoost's): strings and numbers are both read
        # through their hashes, by the model's columns() (model/compiled.py), never here and
        # never by the C reader, which would stage a number as a category code
        self.hashed = set(category_hashes or {})
        self._plans: dict[bytes, tuple[pa.Schema, list[int], object]] = {}
        self._cache_size = cache_size
        self.native = native  # False: pyarrow reads every message (tests compare the two)
        self.unseen: dict[str, int] = {}  # the last message's unseen categories (_codes)

    def decode(self, value: bytes | None) -> pa.RecordBatch:
        """One self-contained Arrow IPC stream -> one RecordBatch of the columns read, fully
        validated: nothing native reads a buffer whose size pyarrow has not checked against
        the lengths, offsets and null counts the message claims."""
        out, key = self.decode_keyed(value)
        if isinstance(out, Raw):  # read here in C: the same rows as a RecordBatch
            schema, keep = self._plans[key][:2]
            try:
                out = _read_batches(value, out.start, schema, keep)
                if len(keep) != len(schema):
                    out = out.select(keep)
                out.validate(full=True)
            except (pa.ArrowException, OSError, ValueError, EOFError) as exc:
                raise InvalidMessage("not_arrow", f"not a readable Arrow IPC stream: "
                                     f"{_short(exc)}") from None
        return out

    def decode_keyed(self, value: bytes | None) -> tuple[pa.RecordBatch | Raw, object]:
        """``decode`` (or a ``Raw`` message where it is read in C), with a key equal for
        messages that can be scored together: the stream's schema bytes for ``Raw``
        messages, a 1-tuple of them for messages pyarrow read, or the schema itself when the
        framing is unusual."""
        if not value:
            raise InvalidMessage("empty", "the message has no value")
        head = _schema_bytes(value)
        if head is not None and len(head) - 8 > header_cap(self.max_bytes):  # (not hashed)
            raise InvalidMessage("too_large", _HEADER.format(
                length=len(head) - 8, cap=header_cap(self.max_bytes)))
        # cached by a digest of the schema message: 16 bytes a schema, whatever its size
        key = hashlib.blake2b(head, digest_size=16).digest() if head is not None else None
        plan = self._plans.get(key) if key is not None else None
        group = (key,) if key is not None else None  # read by pyarrow: not with Raw messages
        if plan is not None and plan[2] is not None:
            n = plan[2].rows(value, len(head))
            if n < 0:
                cap = self.max_rows if self.max_rows is not None else 2**31 - 1
                raise InvalidMessage("too_large", "the record batch declares more rows than "
                                     f"delivery.max_message_rows ({cap})")
            if n:
                return Raw(value, n, plan[2], len(head)), key
        try:
            inflated, work = _headers_walk(value, self.max_bytes)
        except _Framing as exc:
            raise InvalidMessage("not_arrow", f"not an Arrow IPC stream: {exc}") from None
        except _TooMuch as exc:
            raise InvalidMessage("too_large", str(exc)) from None
        except _Aliased as exc:
            raise InvalidMessage("invalid_arrow", str(exc)) from None
        # the stream reader (the first message of a schema, compressed bodies, schemas that
        # are not cached), else batches read against the cached schema; the reader reads only
        # the columns kept: the others are never decompressed, their dictionaries never built
        full = plan is None or not plan[3] or inflated > 0
        if full:
            schema = plan[0] if plan is not None else _schema_only(value)
            # several fields may name one dictionary: each validates it
            if work and work * max(1, sum(_dictionary_fields(f.type) for f in schema)) > \
                    self.max_bytes:
                raise InvalidMessage("too_large", _SHARED.format(limit=self.max_bytes))
            keep = plan[1] if plan is not None else self._plan(schema)
        try:
            if not full:
                schema, keep = plan[0], plan[1]
                batch = _read_batches(value, len(head), schema, keep, self._check_views)
            else:
                reader = pa.ipc.open_stream(pa.py_buffer(value),
                                            options=pa.ipc.IpcReadOptions(included_fields=keep))
                table = reader.read_all()
                dictionaries = reader.stats.num_dictionary_batches
                batch = None
        except InvalidMessage:
            raise
        except (pa.ArrowException, OSError, MemoryError, ValueError, EOFError) as exc:
            raise InvalidMessage("not_arrow", f"not a readable Arrow IPC stream: "
                                 f"{_short(exc)}") from None
        if full:
            # cached: schemas read without dictionary batches or compression, of a sensible
            # size and little-endian: pyarrow's stream reader byte-swaps a big-endian stream,
            # the C reader and batches read against a cached schema do not
            if plan is None and key is not None and len(head) <= _MAX_CACHED_SCHEMA and \
                    not dictionaries and not inflated and not _has_dictionaries(schema) and \
                    _little_endian(head):
                if len(self._plans) >= self._cache_size:
                    self._plans.clear()
                native = _ipc.Plan.build(schema, self.feature_names, self.id_column,
                                         self.max_rows) if self.native and not self.hashed \
                    else None
                # null-type columns: pyarrow's stream reader ignores the null count a
                # message claims for them, reading batches against the schema does not
                # (and full validation then refuses a lie): such schemas keep the reader
                self._plans[key] = (schema, keep, native, not _has_null_type(schema))
            schema = table.schema  # the columns kept, in the message's order
            keep = list(range(len(schema)))
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
            if full:
                if len(keep) != len(schema):
                    table = table.select(keep)
                self._check_views(table)
                # validated before anything concatenates the stream's batches
                table.validate(full=True)
                batches = table.to_batches()
                batch = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
            else:
                if len(keep) != len(schema):
                    batch = batch.select(keep)
                self._check_views(batch)
                batch.validate(full=True)
        except InvalidMessage:
            raise
        except (pa.ArrowException, ValueError) as exc:
            raise InvalidMessage("invalid_arrow", f"buffers fail validation: {_short(exc)}") \
                from None
        self.unseen = {}
        if self.categories:
            batch = self._codes(batch)
        return batch, (group if group is not None else schema)

    def _check_views(self, data: pa.Table | pa.RecordBatch) -> None:
        """Full validation checks the UTF-8 of every string view, and views may all point at
        the same bytes: the bytes they point at, summed, are held to the decode limit (after a
        cheap validation has checked the views buffers' sizes)."""
        parts = data if isinstance(data, list) else [data]
        if not parts or not any(_is_string_view(t) for t in parts[0].schema.types):
            return
        total = 0
        for part in parts:
            part.validate()
            for column, t in zip(part.columns, part.schema.types, strict=True):
                if _is_string_view(t):
                    total = self._view_bytes(column, total)

    def _view_bytes(self, column, total: int) -> int:
        """``total`` plus the bytes ``column``'s views point at, out of line (too_large past
        max_bytes)."""
        for chunk in getattr(column, "chunks", [column]):
            views = chunk.buffers()[1]
            if views is None or not len(chunk):
                continue
            lengths = np.frombuffer(views, np.int32, 4 * len(chunk), 16 * chunk.offset)[::4]
            total += int(lengths[lengths > 12].sum(dtype=np.int64))
            if total > self.max_bytes:
                raise InvalidMessage("too_large", "its string views point at more than "
                                     f"delivery.max_message_bytes ({self.max_bytes})")
        return total

    def _codes(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Dictionary-encoded strings of features with categories as float32 codes; the
        strings the model does not know (values that are not null), per feature, in
        ``unseen``."""
        self.unseen = {}
        for name, cats in self.categories.items():
            i = batch.schema.get_field_index(name)
            if i >= 0 and is_category_type(batch.schema.field(i).type):
                col = batch.column(i)
                unseen = unseen_categories(col, cats)
                if unseen:
                    self.unseen[name] = unseen
                batch = batch.set_column(i, name, category_codes(col, cats))
        return batch

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
        if self.id_column:
            t = schema.field(self.id_column).type
            if not _is_string_view(t) and _nested(t, _is_view):
                raise InvalidMessage("bad_type", f"id column {self.id_column!r} has type {t}: "
                                     "views inside another type are not read")
        for f in self.feature_names:
            t = schema.field(f).type
            problem = feature_type_problem(f, t, f in self.categories or f in self.hashed)
            if problem:
                raise InvalidMessage("bad_type", problem, f)
            if f in self.categories and not (is_category_type(t) or pa.types.is_null(t)):
                # a code means another category once the model is retrained: by name only
                raise InvalidMessage("bad_type", f"feature column {f!r} has type {t}; the "
                                     f"model knows {f!r} by its category names: send "
                                     "dictionary-encoded strings", f)
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


class _Framing(ValueError):
    """The stream's message framing or flatbuffers are not as an Arrow writer makes them."""


def _fb_field(fb: bytes, table: int, i: int) -> int:
    """The position of field ``i`` of the flatbuffer table at ``table`` (0: absent)."""
    vt = table - struct.unpack_from("<i", fb, table)[0]
    if vt < 0 or 4 + 2 * i + 2 > struct.unpack_from("<H", fb, vt)[0]:
        return 0
    off = struct.unpack_from("<H", fb, vt + 4 + 2 * i)[0]
    return table + off if off else 0


def _fb_ref(fb: bytes, table: int, i: int) -> int:
    """Where offset field ``i`` points (0: absent)."""
    p = _fb_field(fb, table, i)
    return p + struct.unpack_from("<I", fb, p)[0] if p else 0


# the most record batches and dictionary batches one message may hold: the stream reader builds
# a dictionary anew for every delta (memory growing with their square) and validation reads a
# shared dictionary once per batch
MAX_BATCHES = 1024
MAX_DICTIONARY_BATCHES = 16
# a message header (a schema's, a batch's flatbuffer) is at most this share of
# delivery.max_message_bytes, and never less than MIN_HEADER_CAP: pyarrow builds ~7 bytes of
# objects a byte of schema (a hostile review's one-row message of 500,000 null columns, 30 MB
# inside a 32 MB max_message_bytes, took the worker from 162 to 371 MB and 3.6 s of CPU a
# message), where the columns read are bounded by their own decoded size
HEADER_SHARE = 16
MIN_HEADER_CAP = 4 << 20
# and a schema names at most max(MIN_FIELDS, limit // FIELD_BYTES) fields, counted as pyarrow
# builds them: a table referenced twice is two fields (a review's 1 MB header of one struct of
# 2,000 references to one struct of 2,000 references to one leaf built 4 million fields,
# +1.5 GB); pyarrow's objects take a few hundred bytes a field
FIELD_BYTES = 400
MIN_FIELDS = 1 << 16


def header_cap(limit: int) -> int:
    """The largest message header a message of ``limit`` decoded bytes may carry."""
    return max(MIN_HEADER_CAP, limit // HEADER_SHARE)


def fields_cap(limit: int) -> int:
    """The most fields (nested ones included, as often as referenced) a schema may have."""
    return max(MIN_FIELDS, limit // FIELD_BYTES)


def _count_fields(fb: bytes, schema: int, cap: int) -> int:
    """The fields of the Schema table at ``schema`` (Schema.fields, then each Field's
    children, every reference counted), _TooMuch past ``cap``: the walk stops there, so it
    costs at most ``cap`` steps whatever the tables' sharing."""
    stack, seen = [_fb_ref(fb, schema, 1)], 0
    while stack:
        vec = stack.pop()
        if not vec:
            continue
        count = struct.unpack_from("<I", fb, vec)[0]
        seen += count
        if seen > cap:
            raise _TooMuch(f"its schema has more than {cap:,} fields (nested ones counted as "
                           "often as referenced)")
        if 4 + 4 * count > len(fb) - vec:
            raise _Framing("a field list longer than its message")
        for k in range(count):
            at = vec + 4 + 4 * k
            stack.append(_fb_ref(fb, at + struct.unpack_from("<I", fb, at)[0], 5))
    return seen


_EXPERIMENTAL_COMPRESSION = b"ARROW:experimental_compression"


class _TooMuch(ValueError):
    """More batches, or more decompressed bytes, than a message may hold."""


def _headers_walk(value: bytes, limit: int) -> int:
    """The bytes the stream's compressed buffers decompress to, as they declare it (0: no
    body is compressed), read from the message headers alone, before anything is
    decompressed; _TooMuch past ``limit``, past MAX_BATCHES record batches or
    MAX_DICTIONARY_BATCHES dictionary batches, or for a header past ``header_cap(limit)``.
    A compressed buffer declares its size in its first 8 bytes (-1: stored as it is). An
    uncompressed body is read where it lies, never copied. _Framing when the stream is not
    framed as an Arrow writer frames it: struct reads are bounds-checked, every length and
    offset is checked against the bytes, and sizes are Python integers, so nothing wraps."""
    total, pos, n = 0, 0, len(value)
    cap, most_fields = header_cap(limit), fields_cap(limit)
    counts, messages = {2: 0, 3: 0}, 0
    dictionaries: dict[int, int] = {}  # dictionary id -> its decoded bytes, deltas summed
    work = 0  # dictionary bytes in effect, summed over the record batches
    try:
        while pos + 4 <= n:
            length = struct.unpack_from("<i", value, pos)[0]
            pos += 4
            if length == -1:  # the continuation marker, then the length
                length = struct.unpack_from("<i", value, pos)[0]
                pos += 4
            if length == 0:  # end of stream: the message ends with it (a second stream
                # after it, or any other bytes, would go unread: refused, not dropped)
                if pos != n:
                    raise _Framing(f"{n - pos} bytes after the end-of-stream marker (one "
                                   "stream a message)")
                break
            if length < 0 or length > n - pos:
                raise _Framing("a message is longer than the stream")
            if length > cap:
                raise _TooMuch(_HEADER.format(length=length, cap=cap))
            messages += 1
            if messages > MAX_BATCHES + MAX_DICTIONARY_BATCHES + 1:  # the schema, the batches
                raise _TooMuch(f"more than {MAX_BATCHES} record batches or "
                               f"{MAX_DICTIONARY_BATCHES} dictionary batches")
            fb = value[pos:pos + length]
            pos += length
            msg = struct.unpack_from("<I", fb, 0)[0]
            p = _fb_field(fb, msg, 1)
            kind = fb[p] if p else 0
            p = _fb_field(fb, msg, 3)
            body = struct.unpack_from("<q", fb, p)[0] if p else 0
            if body < 0 or body > n - pos:
                raise _Framing("a message body is longer than the stream")
            if kind == 1:  # a schema: its fields counted before pyarrow builds them
                table = _fb_ref(fb, msg, 2)
                if table:
                    _count_fields(fb, table, most_fields)
            if kind in (2, 3):  # a dictionary batch (its data), a record batch
                counts[kind] += 1
                if counts[3] > MAX_BATCHES or counts[2] > MAX_DICTIONARY_BATCHES:
                    raise _TooMuch(f"more than {MAX_BATCHES} record batches or "
                                   f"{MAX_DICTIONARY_BATCHES} dictionary batches")
                # Arrow 0.17's compression, named in a batch's custom metadata (a key is a
                # flatbuffer string: its bytes lie together): its buffers declare sizes the
                # count below would not see
                if _EXPERIMENTAL_COMPRESSION in fb:
                    raise _Framing("compressed the pre-1.0 way (ARROW:experimental_compression)")
                table = _fb_ref(fb, msg, 2)
                rb = _fb_ref(fb, table, 1) if kind == 2 and table else table
                if not rb:
                    raise _Framing("a batch message without its batch")
                decoded = body
                _disjoint(fb, _fb_ref(fb, rb, 2), body)
                if _fb_ref(fb, rb, 3):  # BodyCompression: each buffer says its size
                    decoded = 0
                    vec = _fb_ref(fb, rb, 2)
                    count = struct.unpack_from("<I", fb, vec)[0] if vec else 0
                    for k in range(count):
                        off, ln = struct.unpack_from("<qq", fb, vec + 4 + 16 * k)
                        if off < 0 or ln < 0 or off > body or ln > body - off:
                            raise _Framing("a buffer outside its message body")
                        if ln == 0:
                            continue
                        if ln < 8:
                            raise _Framing("a compressed buffer without its size")
                        size = struct.unpack_from("<q", value, pos + off)[0]
                        total += ln - 8 if size == -1 else size
                        decoded += ln - 8 if size == -1 else size
                        if size < -1:
                            raise _Framing("a compressed buffer of a negative size")
                        if total > limit:
                            raise _TooMuch(f"its compressed buffers declare more than "
                                           f"delivery.max_message_bytes ({limit}) decoded")
                if kind == 2:  # a delta adds to its dictionary, else replaces it
                    p = _fb_field(fb, table, 0)
                    ident = struct.unpack_from("<q", fb, p)[0] if p else 0
                    p = _fb_field(fb, table, 2)
                    delta = bool(fb[p]) if p else False
                    dictionaries[ident] = decoded + (dictionaries.get(ident, 0) if delta else 0)
                elif dictionaries:
                    # validation reads, and concatenation unifies, each batch's dictionaries
                    work += sum(dictionaries.values())
                    if work > limit:
                        raise _TooMuch(_SHARED.format(limit=limit))
            pos += body
        else:
            if pos != n:  # 1-3 bytes left: not a message's length
                raise _Framing(f"{n - pos} bytes after the last message")
    except (struct.error, IndexError):
        raise _Framing("a message header outside the stream") from None
    return total, work


_HEADER = ("a message header (schema or record batch) of {length:,} bytes, more than "
           "{cap:,} (a sixteenth of delivery.max_message_bytes, at least 4 MiB): too many "
           "fields or buffers")
_SHARED = ("its record batches share dictionaries read once a batch and a field: more than "
           "delivery.max_message_bytes ({limit}) to check")


def _disjoint(fb: bytes, vec: int, body: int) -> None:
    """_Aliased when two of a batch's buffers (of any length) share bytes of its body: every
    writer lays them one after another; aliased, a body of a few bytes validates and writes
    out as many times over as the buffers that point at it."""
    if not vec:
        return
    count = struct.unpack_from("<I", fb, vec)[0]
    if 4 + 16 * count > len(fb) - vec:
        raise _Framing("a buffer list longer than its message")
    spans = sorted(s for s in struct.iter_unpack("<qq", fb[vec + 4:vec + 4 + 16 * count])
                   if s[1] > 0)
    if any(off < 0 or off > body or ln > body - off for off, ln in spans):
        raise _Framing("a buffer outside its message body")
    end = 0
    for off, ln in spans:
        if off < end:
            raise _Aliased("two buffers share bytes of the message body")
        end = off + ln
    if end > body:
        raise _Framing("a buffer outside its message body")


class _Aliased(ValueError):
    """Buffers that share bytes."""


def _schema_only(value: bytes) -> pa.Schema:
    """The stream's schema, its batches not read; InvalidMessage when it has none."""
    try:
        schema = pa.ipc.open_stream(pa.py_buffer(value)).schema
        schema.names  # noqa: B018 (field names are UTF-8, or the decode fails here)
        return schema
    except (pa.ArrowException, OSError, ValueError, EOFError) as exc:
        raise InvalidMessage("not_arrow", f"not a readable Arrow IPC stream: "
                             f"{_short(exc)}") from None


def _little_endian(schema_message: bytes) -> bool:
    """The schema message says little-endian (Schema.endianness, field 0, absent: Little).
    Called only on a message pyarrow has read (its flatbuffer verified); anything unexpected
    answers False (the stream reader then reads every message of that schema)."""
    try:
        fb = schema_message[8:]
        schema = _fb_ref(fb, struct.unpack_from("<I", fb, 0)[0], 2)
        end = _fb_field(fb, schema, 0) if schema else 0
        return bool(schema) and (not end or struct.unpack_from("<h", fb, end)[0] == 0)
    except (struct.error, IndexError):
        return False


def _read_batches(value: bytes, start: int, schema: pa.Schema, keep: list[int],
                  check=None) -> pa.RecordBatch | None:
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
        if check is not None:  # bounds the work of the validation (string views)
            check(batches)
        for b in batches:
            b.validate(full=True)
        return pa.concat_batches(batches)
    return batches[0] if batches else None


_STREAM_ENDS = (b"", b"\xff\xff\xff\xff\x00\x00\x00\x00", b"\x00\x00\x00\x00")


def _has_dictionaries(schema: pa.Schema) -> bool:
    """Dictionary-encoded columns need the stream's dictionary batches: no cached path."""
    return any(_nested_dictionary(f.type) for f in schema)


def _has_null_type(schema: pa.Schema) -> bool:
    return any(_nested(f.type, pa.types.is_null) for f in schema)


def _nested(t, test) -> bool:
    """``test`` holds for ``t`` or for a type nested in it."""
    if test(t):
        return True
    if isinstance(t, pa.ExtensionType):
        return _nested(t.storage_type, test)
    if pa.types.is_dictionary(t):
        return _nested(t.index_type, test) or _nested(t.value_type, test)
    return any(_nested(t.field(i).type, test) for i in range(t.num_fields)) \
        if hasattr(t, "num_fields") else False


def _is_string_view(t) -> bool:
    return pa.types.is_string_view(t) or pa.types.is_binary_view(t)


def _is_view(t) -> bool:
    return _is_string_view(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t)


def _dictionary_fields(t) -> int:
    """The dictionary-encoded types in ``t`` and the types nested in it."""
    if isinstance(t, pa.ExtensionType):
        return _dictionary_fields(t.storage_type)
    if pa.types.is_dictionary(t):
        return 1 + _dictionary_fields(t.value_type)
    return sum(_dictionary_fields(t.field(i).type) for i in range(t.num_fields)) \
        if hasattr(t, "num_fields") else 0


def _nested_dictionary(t) -> bool:
    return _nested(t, pa.types.is_dictionary)


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

    def __init__(self, r: ScoreResult, classifier: bool, feature_names: list[str] | None = None):
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
        if r.reason_feature is not None:
            cols.update(reason_columns(r, feature_names or []))
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


def reason_columns(r: ScoreResult, feature_names: list[str]) -> dict[str, pa.Array]:
    """reason_feature (list of dictionary-encoded feature names), reason_value (list of
    float32 attributions, same order) and reason_bias (float64): null where a row was not
    explained."""
    feat, val = r.reason_feature, r.reason_value
    n, k = feat.shape
    explained = feat[:, 0] >= 0 if k else np.zeros(n, dtype=bool)
    counts = np.where(explained, k, 0)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    mask = pa.array(~explained)
    names = pa.DictionaryArray.from_arrays(pa.array(feat[explained].ravel(), type=pa.int32()),
                                           pa.array(feature_names, type=pa.string()))
    return {
        "reason_feature": pa.ListArray.from_arrays(pa.array(offsets), names, mask=mask),
        "reason_value": pa.ListArray.from_arrays(
            pa.array(offsets), pa.array(val[explained].ravel(), type=pa.float32()), mask=mask),
        "reason_bias": pa.array(r.reason_bias, type=pa.float64(), mask=~explained),
    }


_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_OFFSET_SLOT = b"\x01" * 20  # room for any int64 offset; no topic name holds \x01


class StreamEncoder:
    """One output stream per input message: schema (with the model's metadata and the input's
    topic, partition and offset), dictionaries, that message's rows, end of stream. The schema
    and dictionary messages are serialized once per output schema, topic and partition; each
    message only writes its offset into its copy and serializes its slice of the batch."""

    def __init__(self, metadata: dict[bytes, bytes], cache_size: int = 4096,
                 native: bool = True):
        self.metadata = metadata
        self._heads: dict[tuple, tuple[bytes, int, bytes] | None] = {}
        self._cache_size = cache_size
        self.native = native  # encode_numpy's C writer may be used
        self._native_heads: dict[tuple, _ipc.Head] = {}
        self._shapes: dict[tuple, _ipc.Shape] = {}

    def encode_numpy(self, ids: np.ndarray, r: ScoreResult, classifier: bool,
                     rows: np.ndarray, recs: list) -> list[bytes]:
        """Every message's stream at once, written in C (``_ipc.write_streams``) from the
        whole batch's result: message ``k`` is rows ``rows[k]:rows[k + 1]`` with ``recs[k]``'s
        topic, partition and offset. The same bytes as ``encode`` (tests compare them);
        ValueError where the schema head cannot be cached (then ``encode`` serves)."""
        cols = [np.ascontiguousarray(ids), np.ascontiguousarray(r.score, np.float64)]
        if classifier:
            cols.append(np.ascontiguousarray(r.label, np.int32))
        cols += [np.ascontiguousarray(r.decision, np.int8),
                 np.ascontiguousarray(r.work_units, np.int32),
                 np.ascontiguousarray(r.stop_code, np.int8),
                 np.ascontiguousarray(r.score_lo, np.float64),
                 np.ascontiguousarray(r.score_hi, np.float64)]
        widths = [c.dtype.itemsize for c in cols]
        kind = (ids.dtype.str, classifier)
        heads, shapes, last, head = [], [], None, None
        for rec in recs:
            if (rec.topic, rec.partition) != last:
                last = (rec.topic, rec.partition)
                head = self._native_head(kind, ids.dtype, classifier, *last)
            heads.append(head)
        for n in np.diff(rows).tolist():
            shape = self._shapes.get((kind, n))
            if shape is None:
                if len(self._shapes) >= self._cache_size:
                    self._shapes.clear()
                template = _template(ids.dtype, classifier, n)
                shape = self._shapes[(kind, n)] = _ipc.Shape.of(
                    template.serialize().to_pybytes(), n, widths)
            shapes.append(shape)
        offsets = np.fromiter((rec.offset for rec in recs), dtype=np.int64, count=len(recs))
        return _ipc.write_streams(heads, shapes, offsets, rows, cols)

    def _native_head(self, kind, dtype, classifier: bool, topic: str, partition: int):
        head = self._native_heads.get((kind, topic, partition))
        if head is None:
            parts = self._head(_template(dtype, classifier, 0), topic, partition)
            if parts is None:
                raise ValueError("this output schema's head cannot be cached")
            template, pos, dictionaries = parts
            if len(self._native_heads) >= self._cache_size:
                self._native_heads.clear()
            head = self._native_heads[(kind, topic, partition)] = _ipc.Head(
                template + dictionaries, pos)
        return head

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
                # bounded in bytes too: the id column's type is the input's, of any size
                if head is None or len(head[0]) + len(head[2]) <= _MAX_CACHED_SCHEMA:
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


def _template(dtype: np.dtype, classifier: bool, n: int) -> pa.RecordBatch:
    """An output batch of ``n`` rows (zeros) with ids of numpy type ``dtype``: the schema and
    the record-batch layout every output of that many rows has."""
    z = np.zeros(n)
    r = ScoreResult(z, z.astype(np.int32), z.astype(np.int8), z.astype(np.int32),
                    z.astype(np.int8), z, z)
    return ResultColumns(r, classifier).batch(pa.array(z.astype(dtype)))


def result_batch(ids: pa.Array | None, r: ScoreResult, classifier: bool,
                 slice_: slice | None = None,
                 feature_names: list[str] | None = None) -> pa.RecordBatch:
    """The output columns (docs/formats.md: Arrow IPC messages) for rows ``slice_`` of a score
    result; ``ids`` are those rows' ids (one message's id column), or None for each row's index
    in its message."""
    return ResultColumns(r, classifier, feature_names).batch(ids, slice_)


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
