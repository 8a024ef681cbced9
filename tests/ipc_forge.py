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
