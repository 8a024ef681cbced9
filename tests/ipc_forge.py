"""Forge record-batch messages: find the fields of a pyarrow-written stream's flatbuffers and
write lies into them (row counts, node lengths and null counts), as an attacker would. Reads
the flatbuffers by their layout (Message -> RecordBatch), with no flatbuffers package."""

from __future__ import annotations

import struct


def _u16(b: bytes, p: int) -> int:
    return struct.unpack_from("<H", b, p)[0]


def _u32(b: bytes, p: int) -> int:
    return struct.unpack_from("<I", b, p)[0]


def _i32(b: bytes, p: int) -> int:
    return struct.unpack_from("<i", b, p)[0]


def _field(b: bytes, table: int, i: int) -> int | None:
    """The position of field ``i`` of the table at ``table`` (None: absent)."""
    vt = table - _i32(b, table)
    if 4 + 2 * i + 2 > _u16(b, vt):
        return None
    off = _u16(b, vt + 4 + 2 * i)
    return table + off if off else None


def messages(data: bytes) -> list[tuple[int, int]]:
    """(flatbuffer start, flatbuffer length) of each encapsulated message, body skipped."""
    out, pos = [], 0
    while pos + 8 <= len(data) and _u32(data, pos) == 0xFFFFFFFF:
        n = _i32(data, pos + 4)
        if n == 0:
            break
        meta = pos + 8
        msg = meta + _u32(data, meta)
        body = _field(data, msg, 3)
        body_len = struct.unpack_from("<q", data, body)[0] if body else 0
        out.append((meta, n))
        pos = meta + n + body_len
    return out


def record_batch(data: bytes, k: int = 1) -> dict:
    """Positions in ``data`` of message ``k``'s RecordBatch fields: ``length`` (int64), and
    ``nodes``: (length, null_count) int64 pairs, one per field node."""
    meta, _n = messages(data)[k]
    msg = meta + _u32(data, meta)
    hdr = _field(data, msg, 2)
    rb = hdr + _u32(data, hdr)
    length = _field(data, rb, 0)
    nodes = _field(data, rb, 1)
    vec = nodes + _u32(data, nodes)
    count = _u32(data, vec)
    return {"length": length, "nodes": [(vec + 4 + 16 * j, vec + 12 + 16 * j)
                                        for j in range(count)]}


def lie(data: bytes, length: int | None = None, node_lengths: int | None = None,
        null_counts: dict[int, int] | None = None, k: int = 1) -> bytes:
    """``data`` with message ``k``'s row count, every node's length and some nodes' null
    counts replaced."""
    out = bytearray(data)
    rb = record_batch(data, k)
    if length is not None:
        struct.pack_into("<q", out, rb["length"], length)
    for j, (ln, nulls) in enumerate(rb["nodes"]):
        if node_lengths is not None:
            struct.pack_into("<q", out, ln, node_lengths)
        if null_counts and j in null_counts:
            struct.pack_into("<q", out, nulls, null_counts[j])
    return bytes(out)


# ---------------------------------------------------------------- big-endian streams
# pyarrow writes little-endian only; a big-endian stream is the same messages with a schema
# that says so (Schema.endianness = Big) and every fixed-width value byte-swapped.


class _Builder:
    """A flatbuffer laid out front to back: every object a table refers to is written after
    it, so each uoffset is positive; each table's vtable sits just before it."""

    def __init__(self):
        self.b = bytearray(4)  # the root offset, patched by finish()

    def _align(self, n: int) -> None:
        self.b.extend(b"\0" * (-len(self.b) % n))

    def table(self, scalars: dict[int, tuple[str, object]], refs: dict[int, object]) -> int:
        """scalars: field -> (struct format, value); refs: field -> a writer called after
        the table, returning the position of what it wrote."""
        fields = sorted(set(scalars) | set(refs))
        layout, off = {}, 4
        for i in fields:
            size = struct.calcsize(scalars[i][0]) if i in scalars else 4
            off += -off % size
            layout[i] = off
            off += size
        size = off + (-off % 4)
        n = fields[-1] + 1 if fields else 0
        self._align(2)
        vt = len(self.b)
        self.b += struct.pack(f"<HH{n}H", 4 + 2 * n, size, *[layout.get(i, 0) for i in range(n)])
        self._align(8)
        pos = len(self.b)
        self.b += b"\0" * size
        struct.pack_into("<i", self.b, pos, pos - vt)
        for i, (fmt, v) in scalars.items():
            struct.pack_into("<" + fmt, self.b, pos + layout[i], v)
        for i, write in refs.items():
            target = write()
            struct.pack_into("<I", self.b, pos + layout[i], target - (pos + layout[i]))
        return pos

    def string(self, s: str) -> int:
        self._align(4)
        pos = len(self.b)
        data = s.encode()
        self.b += struct.pack("<I", len(data)) + data + b"\0"
        return pos

    def tables(self, writers: list) -> int:
        self._align(4)
        pos = len(self.b)
        self.b += struct.pack("<I", len(writers)) + b"\0" * (4 * len(writers))
        for k, write in enumerate(writers):
            slot = pos + 4 + 4 * k
            struct.pack_into("<I", self.b, slot, write() - slot)
        return pos

    def longs(self, values) -> int:
        """A vector of int64: its elements start on 8 bytes."""
        self.b.extend(b"\0" * ((4 - len(self.b)) % 8))
        pos = len(self.b)
        self.b += struct.pack(f"<I{len(values)}q", len(values), *values)
        return pos

    def finish(self, root: int) -> bytes:
        struct.pack_into("<I", self.b, 0, root)
        self._align(8)
        return bytes(self.b)


def _type(t):
    """(Type union tag, table writer) of a flat type, for the schema message."""
    import pyarrow as pa

    if pa.types.is_integer(t):
        return 2, ({0: ("i", t.bit_width), 1: ("B", int(pa.types.is_signed_integer(t)))}, {})
    if pa.types.is_floating(t):
        return 3, ({0: ("h", {16: 0, 32: 1, 64: 2}[t.bit_width])}, {})
    if pa.types.is_boolean(t):
        return 6, ({}, {})
    raise ValueError(f"no big-endian forge for {t}")


def _flat_field(fb: _Builder, f):
    """A writer of flat field ``f``'s Field table (name, nullable, type, no children)."""
    tag, (scalars, refs) = _type(f.type)
    return lambda: fb.table({1: ("B", int(f.nullable)), 2: ("B", tag)},
                            {0: lambda: fb.string(f.name),
                             3: lambda: fb.table(scalars, refs),
                             5: lambda: fb.tables([])})


def schema_message(schema, big_endian: bool = True, features=None) -> bytes:
    """An encapsulated schema message for ``schema`` (integer, float and boolean fields);
    ``features``: the Schema.features flags to declare (pyarrow's writer declares none)."""
    fb = _Builder()

    def schema_table():
        refs = {1: lambda: fb.tables([_flat_field(fb, f) for f in schema])}
        if features is not None:
            refs[3] = lambda: fb.longs(list(features))
        return fb.table({0: ("h", 1 if big_endian else 0)}, refs)

    root = fb.table({0: ("h", 4), 1: ("B", 1), 3: ("q", 0)}, {2: schema_table})
    meta = fb.finish(root)
    return b"\xff\xff\xff\xff" + struct.pack("<i", len(meta)) + meta


def big_endian(data: bytes, schema) -> bytes:
    """The pyarrow-written stream ``data`` (flat fixed-width and boolean fields, no
    dictionaries) as a big-endian writer would have written it."""
    out = bytearray(schema_message(schema))
    for k, (meta, n) in enumerate(messages(data)):
        if k == 0:
            continue
        end = meta + n
        msg = meta + _u32(data, meta)
        body = struct.unpack_from("<q", data, _field(data, msg, 3))[0]
        hdr = _field(data, msg, 2)
        rb = hdr + _u32(data, hdr)
        bufs = _field(data, rb, 2)
        vec = bufs + _u32(data, bufs)
        body_bytes = bytearray(data[end:end + body])
        for j, f in enumerate(schema):  # two buffers a field: validity, values
            if f.type.bit_width <= 8 or str(f.type) == "bool":
                continue
            off, ln = struct.unpack_from("<qq", data, vec + 4 + 16 * (2 * j + 1))
            w = f.type.bit_width // 8
            vals = body_bytes[off:off + ln]
            body_bytes[off:off + ln] = b"".join(vals[i:i + w][::-1]
                                                for i in range(0, len(vals), w))
        out += data[meta - 8:end] + body_bytes
    return bytes(out) + b"\xff\xff\xff\xff\0\0\0\0"


def shift(value: bytes, k: int = 1, by: int = 4) -> bytes:
    """Message ``k``'s flatbuffer with every table moved ``by`` bytes on (the root offset grows
    by ``by``, ``by`` zero bytes follow it): the same message, its fields aligned only when
    ``by`` is a multiple of 8."""
    meta, n = messages(value)[k]
    fb = value[meta:meta + n]
    root = struct.unpack_from("<I", fb, 0)[0]
    new = struct.pack("<I", root + by) + b"\0" * by + fb[4:]
    new += b"\0" * (-len(new) % 8)
    return value[:meta - 8] + b"\xff\xff\xff\xff" + struct.pack("<i", len(new)) + new + \
        value[meta + n:]


def experimental_compression(data: bytes, k: int = 1) -> bytes:
    """Message ``k`` (written compressed, with custom metadata naming the codec under
    ``ARROW:experimental_compression``) as Arrow 0.17 wrote it: version V4, its RecordBatch's
    BodyCompression field absent (its vtable entry zeroed). pyarrow still decompresses it."""
    out = bytearray(data)
    meta, _n = messages(data)[k]
    msg = meta + _u32(data, meta)
    version = _field(data, msg, 0)
    struct.pack_into("<h", out, version, 3)  # MetadataVersion V4
    hdr = _field(data, msg, 2)
    rb = hdr + _u32(data, hdr)
    vt = rb - _i32(data, rb)
    struct.pack_into("<H", out, vt + 4 + 2 * 3, 0)  # RecordBatch.compression: absent
    return bytes(out)


def custom_metadata_offset(data: bytes, k: int = 1, value: int = 0x7FFFFFF0) -> bytes:
    """Message ``k``'s Message.custom_metadata offset replaced by ``value``."""
    out = bytearray(data)
    meta, _n = messages(data)[k]
    msg = meta + _u32(data, meta)
    p = _field(data, msg, 4)
    assert p is not None, "the message has no custom metadata"
    struct.pack_into("<I", out, p, value)
    return bytes(out)


def with_features(data: bytes, schema, features) -> bytes:
    """The pyarrow-written stream ``data`` (flat fixed-width and boolean fields) with a schema
    message declaring the Schema.features flags ``features``."""
    meta, n = messages(data)[0]
    return schema_message(schema, big_endian=False, features=features) + data[meta + n:]


def _ref(b: bytes, table: int, i: int) -> int | None:
    p = _field(b, table, i)
    return p + _u32(b, p) if p is not None else None


def share_dictionary_ids(data: bytes, ident: int = 1) -> bytes:
    """The stream with every dictionary-encoded field of its schema (nested ones too) naming
    dictionary ``ident``, and the dictionary batches of the other ids dropped: one dictionary
    that every field looks up (pyarrow's reader accepts it; its writer never writes it)."""
    meta, _n = messages(data)[0]
    out = bytearray(data)
    msg = meta + _u32(data, meta)
    schema = _ref(data, msg, 2)

    def walk(vec):
        if vec is None:
            return
        for k in range(_u32(data, vec)):
            slot = vec + 4 + 4 * k
            f = slot + _u32(data, slot)
            enc = _ref(data, f, 4)
            if enc is not None:
                p = _field(data, enc, 0)  # absent: id 0, the default
                assert p is not None or ident == 0, "no id field to write"
                if p is not None:
                    struct.pack_into("<q", out, p, ident)
            walk(_ref(data, f, 5))

    walk(_ref(data, schema, 1))
    parts = []
    for k, (meta, n) in enumerate(messages(data)):
        start = meta - 8
        msg = meta + _u32(data, meta)
        at = _field(data, msg, 3)
        body = struct.unpack_from("<q", data, at)[0] if at is not None else 0
        kind = data[_field(data, msg, 1)]
        end = meta + n + body
        if k and kind == 2:  # a dictionary batch: kept only for ``ident``
            p = _field(data, _ref(data, msg, 2), 0)
            if (struct.unpack_from("<q", data, p)[0] if p else 0) != ident:
                continue
        parts.append(bytes(out[start:end]))
    return b"".join(parts) + b"\xff\xff\xff\xff\0\0\0\0"


def _body_laid_out(data: bytes, k: int, place) -> bytes:
    """Message ``k`` with its body laid out anew: ``place(content, body)`` puts each buffer's
    bytes into ``body`` (a bytearray) as it will and gives its Buffer entry (offset, length)."""
    meta, n = messages(data)[k]
    msg = meta + _u32(data, meta)
    body_at = _field(data, msg, 3)
    body_len = struct.unpack_from("<q", data, body_at)[0]
    vec = _ref(data, _ref(data, msg, 2), 2)
    body0 = meta + n
    out = bytearray(data[:body0])
    body = bytearray()
    for j in range(_u32(data, vec)):
        p = vec + 4 + 16 * j
        off, ln = struct.unpack_from("<qq", data, p)
        struct.pack_into("<qq", out, p, *place(data[body0 + off:body0 + off + ln], body))
    struct.pack_into("<q", out, body_at, len(body))
    return bytes(out) + bytes(body) + data[body0 + body_len:]


def _append(content: bytes, body: bytearray) -> tuple[int, int]:
    at = len(body)
    body += content + b"\0" * (-len(content) % 8)
    return at, len(content)


def alias_buffers(data: bytes, k: int = 1) -> bytes:
    """Message ``k`` (uncompressed) with buffers of equal content stored once in its body and
    every Buffer entry of that content pointing at the one copy."""
    import hashlib

    placed: dict[bytes, int] = {}

    def place(content, body):
        h = hashlib.blake2b(content, digest_size=16).digest()
        if h not in placed:
            placed[h] = _append(content, body)[0]
        return placed[h], len(content)

    return _body_laid_out(data, k, place)


def body_buffers(data: bytes, k: int = 1) -> list[tuple[int, int]]:
    """(absolute start, length) in ``data`` of each body buffer of message ``k`` (its
    RecordBatch's field 2, offsets relative to the body after the metadata)."""
    meta, n = messages(data)[k]
    msg = meta + _u32(data, meta)
    hdr = _field(data, msg, 2)
    rb = hdr + _u32(data, hdr)
    buffers = _field(data, rb, 2)
    vec = buffers + _u32(data, buffers)
    count = _u32(data, vec)
    body = meta + n
    return [(body + struct.unpack_from("<q", data, vec + 4 + 16 * j)[0],
             struct.unpack_from("<q", data, vec + 12 + 16 * j)[0]) for j in range(count)]


def stored_uncompressed(data: bytes, k: int = 1, size: int = -1) -> bytes:
    """Message ``k`` (compressed with LZ4) with every compressed buffer stored as it is, its
    size prefix ``size`` (-1: the format's "not compressed", as Arrow writers other than
    pyarrow's store a buffer compression would not shrink) and its decompressed bytes after."""
    import pyarrow as pa

    def place(content, body):
        if content:
            want = struct.unpack_from("<q", content, 0)[0]
            raw = pa.decompress(content[8:], want, codec="lz4", asbytes=True)
            content = struct.pack("<q", size) + raw
        return _append(content, body)

    return _body_laid_out(data, k, place)


def padded_schema(schema, pad: int) -> bytes:
    """A schema message (then end of stream) of ``schema``'s flat fields with one custom
    metadata value of ``pad`` bytes: a header whose size the caller tunes."""
    fb = _Builder()

    def schema_table():
        return fb.table({0: ("h", 0)}, {
            1: lambda: fb.tables([_flat_field(fb, f) for f in schema]),
            2: lambda: fb.tables([lambda: fb.table({}, {0: lambda: fb.string("k"),
                                                         1: lambda: fb.string("z" * pad)})])})

    root = fb.table({0: ("h", 4), 1: ("B", 1), 3: ("q", 0)}, {2: schema_table})
    meta = fb.finish(root)
    return (b"\xff\xff\xff\xff" + struct.pack("<i", len(meta)) + meta +
            b"\xff\xff\xff\xff\x00\x00\x00\x00")


def shared_struct_schema(schema, fanout: int, depth: int = 2) -> bytes:
    """A schema message (then end of stream) of ``schema``'s flat fields and one struct
    field ``pad`` whose children are ``fanout`` references to one struct, whose children are
    ``fanout`` references to one ... (``depth`` levels) to one null leaf: a header of a few
    bytes a reference that pyarrow builds as fanout**depth fields (flatbuffers let a table be
    referenced many times)."""
    fb = _Builder()
    memo: dict[int, int] = {}

    def level(d: int):
        def write() -> int:
            if d not in memo:  # written once, referenced by every slot after
                if d == depth:  # the leaf: Null (Type tag 1)
                    memo[d] = fb.table({1: ("B", 1), 2: ("B", 1)},
                                       {0: lambda: fb.string("x"),
                                        3: lambda: fb.table({}, {}),
                                        5: lambda: fb.tables([])})
                else:  # a struct (Type tag 13) of fanout references to the next level
                    memo[d] = fb.table({1: ("B", 1), 2: ("B", 13)},
                                       {0: lambda: fb.string("pad" if d == 0 else "m"),
                                        3: lambda: fb.table({}, {}),
                                        5: lambda: fb.tables([level(d + 1)] * fanout)})
            return memo[d]
        return write

    def schema_table():
        return fb.table({0: ("h", 0)},
                        {1: lambda: fb.tables([_flat_field(fb, f) for f in schema] + [level(0)])})

    root = fb.table({0: ("h", 4), 1: ("B", 1), 3: ("q", 0)}, {2: schema_table})
    meta = fb.finish(root)
    return (b"\xff\xff\xff\xff" + struct.pack("<i", len(meta)) + meta +
            b"\xff\xff\xff\xff\x00\x00\x00\x00")
