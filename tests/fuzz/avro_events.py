"""Avro messages for the fuzzer: records of the golden model's features in writer schemas that
add, drop and reorder fields (nullable unions, nested records, arrays, maps, enums, fixed),
written by fastavro in Confluent's wire format, then mutated as bytes (truncated, flipped,
inserted, varints at integer edges, the schema id and magic byte changed). The oracle is
fastavro's own reader: an unmutated record must be scored with the rows fastavro reads (cast
as Arrow casts them); a mutated one the worker scores must be one fastavro reads the same,
to its last byte; a refusal of what fastavro reads is allowed only where the worker is
stricter by design (an int over 32 bits, a boolean byte other than 0 or 1, a double float32
cannot hold)."""

from __future__ import annotations

import io
import json
import math
import struct
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import strategies as st

from worker import demo

from .messages import pack, through

FEATURES = demo.FEATURES
ID = demo.ID_COLUMN


def _schemas() -> dict[int, dict]:
    nullable = [{"name": f, "type": ["null", "double"], "default": None} for f in FEATURES]
    s1 = {"type": "record", "name": "Txn", "fields": [{"name": ID, "type": "long"}, *nullable]}
    s2 = {"type": "record", "name": "Txn2", "fields": [
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        *({"name": f, "type": t} for f, t in zip(
            reversed(FEATURES), ["float", "int", "long", "boolean"] * 10, strict=False)),
        {"name": "meta", "type": {"type": "map", "values": ["null", "long", "string"]}},
        {"name": ID, "type": "string"},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["a", "b", "c"]}},
        {"name": "f", "type": {"type": "fixed", "name": "F", "size": 4}},
        {"name": "inner", "type": {"type": "record", "name": "In", "fields": [
            {"name": "xs", "type": {"type": "array", "items": "null"}},
            {"name": "d", "type": "double"}]}}]}
    s3 = {"type": "record", "name": "Txn3", "fields": [
        {"name": f, "type": ["null", "float"]} for f in FEATURES[::2]]}
    return {1: s1, 2: s2, 3: s3}


SCHEMAS = _schemas()
_PARSED: dict = {}


def parsed(sid: int):
    import fastavro

    if sid not in _PARSED:
        _PARSED[sid] = fastavro.parse_schema(SCHEMAS[sid])
    return _PARSED[sid]


_LONGS = st.one_of(st.integers(-2**63, 2**63 - 1),
                   st.sampled_from([0, -1, 2**31 - 1, -2**31, 2**53 + 1, 2**63 - 1, -2**63]))
_INTS = st.integers(-2**31, 2**31 - 1)
_DOUBLES = st.one_of(st.floats(), st.sampled_from([3.4028235677973362e38, 1e39, 5e-324, -0.0]))


@st.composite
def _record(draw, sid: int) -> dict:
    rec = {}
    for f in SCHEMAS[sid]["fields"]:
        t = f["type"]
        if t == ["null", "double"]:
            rec[f["name"]] = draw(st.one_of(st.none(), _DOUBLES))
        elif t == ["null", "float"]:
            rec[f["name"]] = draw(st.one_of(st.none(), st.floats(width=32)))
        elif t == "long":
            rec[f["name"]] = draw(_LONGS)
        elif t == "int":
            rec[f["name"]] = draw(_INTS)
        elif t == "float":
            rec[f["name"]] = draw(st.floats(width=32))
        elif t == "boolean":
            rec[f["name"]] = draw(st.booleans())
        elif t == "string":
            rec[f["name"]] = draw(st.text(max_size=6))
        elif t == "double":
            rec[f["name"]] = draw(_DOUBLES)
        else:
            kind = t["type"]
            if kind == "array":
                rec[f["name"]] = draw(st.lists(st.text(max_size=3), max_size=3))
            elif kind == "map":
                rec[f["name"]] = draw(st.dictionaries(st.text(max_size=3), st.one_of(
                    st.none(), _LONGS, st.text(max_size=3)), max_size=3))
            elif kind == "enum":
                rec[f["name"]] = draw(st.sampled_from(t["symbols"]))
            elif kind == "fixed":
                rec[f["name"]] = draw(st.binary(min_size=4, max_size=4))
            elif kind == "record":
                rec[f["name"]] = {"xs": [None] * draw(st.integers(0, 3)), "d": draw(_DOUBLES)}
    return rec


def _long(v: int) -> bytes:
    u = ((v << 1) ^ (v >> 63)) & ((1 << 64) - 1)
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7f) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


@st.composite
def one(draw) -> tuple[bytes, str]:
    import fastavro

    sid = draw(st.sampled_from(sorted(SCHEMAS)))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed(sid), draw(_record(sid)))
    data = b"\0" + struct.pack(">I", sid) + buf.getvalue()
    how = draw(st.sampled_from(["plain", "plain", "truncate", "flip", "insert", "varint",
                                "schema", "magic"]))
    if how == "truncate":
        data = data[:draw(st.integers(0, len(data) - 1))]
    elif how == "flip":
        i = draw(st.integers(5, len(data) - 1)) if len(data) > 5 else 0
        data = data[:i] + bytes([data[i] ^ (1 << draw(st.integers(0, 7)))]) + data[i + 1:]
    elif how == "insert":
        i = draw(st.integers(5, len(data)))
        data = data[:i] + draw(st.binary(min_size=1, max_size=3)) + data[i:]
    elif how == "varint":
        i = draw(st.integers(5, len(data)))
        v = draw(st.sampled_from([2**31, 2**32, 2**62, 2**63 - 1, -2**63, -1, 1 << 40]))
        data = data[:i] + _long(v) + data[i:]
    elif how == "schema":
        data = data[:1] + struct.pack(">I", draw(st.sampled_from([0, 4, 2**32 - 1]))) + data[5:]
    elif how == "magic":
        data = bytes([draw(st.integers(1, 255))]) + data[1:]
    return data, how


@st.composite
def cases(draw) -> tuple[bytes, str]:
    n = draw(st.sampled_from([1, 1, 1, 3]))
    values = [draw(one()) for _ in range(n)]
    return pack([v for v, _ in values]), "+".join(w for _, w in values)


def _f32(v) -> float:
    if v is None:
        return math.nan
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int):
        return float(pa.array([v], pa.int64()).cast(pa.float32(), safe=False)[0].as_py())
    with np.errstate(over="ignore"):
        x = np.float32(v)
    if np.isinf(x) and math.isfinite(v):
        raise ValueError("a double float32 cannot hold")
    return float(x)


def reference(value: bytes):
    """(row, id) as fastavro reads the record (ValueError where it cannot, or leaves bytes)."""
    import fastavro

    if len(value) < 5 or value[0] != 0:
        raise ValueError("not the wire format")
    sid = int.from_bytes(value[1:5], "big")
    if sid not in SCHEMAS:
        raise ValueError("unknown schema")
    body = io.BytesIO(value[5:])
    try:
        rec = fastavro.schemaless_reader(body, parsed(sid))
    except Exception as exc:  # noqa: BLE001 (whatever fastavro refuses)
        raise ValueError(f"fastavro: {type(exc).__name__}") from None
    if body.tell() != len(value) - 5:
        raise ValueError("bytes after the record")
    return np.array([[_f32(rec.get(f)) for f in FEATURES]], np.float32), rec.get(ID)


# (fastavro reads varints longer than the spec's 10 bytes, ints over 32 bits, boolean bytes
# other than 0 and 1, a block count of -2^63 as an empty block, a negative union branch or
# enum index as one counted from the end (Python's negative index: found by make fuzz's
# 100,000 cases, 2026-12-04), a block whose byte size is wrong; the worker refuses them)
_STRICTER = ("an int outside 32 bits", "a boolean that is not 0 or 1", "float32 cannot hold",
             "a varint over 64 bits", "a bad block count", "a union branch out of range",
             "a negative length", "a block's byte size over the bytes left",
             "an enum index out of range")
# refusals whose record fastavro may loop on (hostile counts): the oracle is not asked
_ORACLE_LOOPS = ("more items than the bytes left", "a negative length", "a bad block count")


def _values(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _values(v)
    elif isinstance(x, list):
        for v in x:
            yield from _values(v)
    else:
        yield x


def _stricter_justified(value: bytes, why: str) -> bool:
    """A refusal for a reason fastavro does not share, where fastavro reads the record: only
    if its cause is there (issue 55: these reasons were accepted unasked, so a worker that
    refused a canonical record would pass). A value reason is checked on the values fastavro
    read; an encoding reason (varint, boolean byte, block count, union branch, byte size)
    only if the record's bytes are not the canonical encoding fastavro writes for it."""
    import fastavro

    sid = int.from_bytes(value[1:5], "big")
    body = io.BytesIO(value[5:])
    rec = fastavro.schemaless_reader(body, parsed(sid))
    if "an int outside 32 bits" in why:
        return any(isinstance(v, int) and not isinstance(v, bool) and
                   not -2**31 <= v < 2**31 for v in _values(rec))
    if "float32 cannot hold" in why:
        return any(isinstance(v, float) and math.isfinite(v) and
                   abs(v) > float(np.finfo(np.float32).max) for v in _values(rec))
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed(sid), rec)
    return out.getvalue() != value[5:]


def check(pipeline, data: bytes, i: int) -> str:
    def refused(value: bytes, code: str, why: str) -> None:
        # fastavro must refuse it too (it may loop on hostile counts: not asked then)
        if code in ("bad_magic", "unknown_schema", "empty", "too_large") or \
                any(s in why for s in _ORACLE_LOOPS):
            return
        try:
            reference(value)
        except ValueError:
            return
        if any(s in why for s in _STRICTER):  # stricter than fastavro: its cause is there
            assert _stricter_justified(value, why), \
                f"refused ({code}: {why}) a canonical record fastavro reads: {value[:120]!r}"
            return
        raise AssertionError(f"refused ({code}: {why}) a record fastavro reads: "
                             f"{value[:120]!r}")

    def scored(value: bytes, output) -> None:
        try:
            X, rid = reference(value)
        except ValueError as exc:
            raise AssertionError(f"scored a record fastavro refuses ({exc})") from None
        out = json.loads(output.value)
        assert out[ID] == rid, "the id is not the record's"
        want = pipeline.model.predict_proba(X, n_threads=1)[:, 1]
        np.testing.assert_array_equal([out["score"]], want)

    return through(pipeline, data, i, refused, scored)


def check_factory(state):
    from worker.config import load_settings
    from worker.model.compiled import load_model
    from worker.pipeline import Pipeline

    from .runner import GOLDEN_MODEL

    schemas = Path(tempfile.mkdtemp(dir=state))
    for sid, s in SCHEMAS.items():
        (schemas / f"{sid}.avsc").write_text(json.dumps(s))
    model = load_model(GOLDEN_MODEL)
    settings = load_settings(None, scoring={"id_column": ID, "threads": 1},
                             model={"path": str(GOLDEN_MODEL)},
                             source={"type": "file", "path": "fuzz.arrows", "format": "avro",
                                     "schemas_dir": str(schemas),
                                     # schema 3 holds the others only
                                     "fields": {f: {"optional": True}
                                                for f in [*FEATURES[1::2], ID]}},
                             sink={"type": "file", "path": "out.arrows", "format": "json"})
    pipeline = Pipeline(model, settings, "scores")

    def run(value: bytes, what: str, i: int) -> str:
        return check(pipeline, value, i)

    return run
