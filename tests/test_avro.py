"""Avro events in Confluent's wire format (worker/formats/avro.py, cyext/avro_rows.h): records
written by fastavro read into the rows Arrow's casts make of fastavro's own reading, scores
equal to XGBoost's, schemas evolving by name, and every hostile message or schema a dead
letter with its reason."""

from __future__ import annotations

import io
import json
import math
import re
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import models as M
from tests.test_json import _hashed_text
from worker.formats import InvalidMessage, input_format
from worker.io.records import Record, read_records, write_records
from worker.model.compile import compile_model

fastavro = pytest.importorskip("fastavro")
ROOT = Path(__file__).resolve().parent.parent

TXN = {"type": "record", "name": "Txn", "namespace": "pay", "fields": [
    {"name": "txn_id", "type": "long"},
    {"name": "a", "type": ["null", "double"], "default": None},
    {"name": "b", "type": "float"},
    {"name": "c", "type": "int"},
    {"name": "flag", "type": "boolean"},
    {"name": "note", "type": "string"},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "extra", "type": {"type": "map", "values": ["null", "long"]}},
    {"name": "card", "type": {"type": "record", "name": "Card", "fields": [
        {"name": "age", "type": "long"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["x", "y", "z"]}},
        {"name": "raw", "type": {"type": "fixed", "name": "Raw", "size": 3}}]}},
]}


def _model(names=("a", "b", "c", "flag", "age"), categories=None):
    return SimpleNamespace(feature_names=list(names), categories=categories or {})


def _fmt(tmp_path, schemas: dict[int, object], model=None, id_column="txn_id", fields=None,
         max_bytes=1 << 20):
    d = tmp_path / "schemas"
    d.mkdir(exist_ok=True)
    for sid, schema in schemas.items():
        (d / f"{sid}.avsc").write_text(schema if isinstance(schema, str) else json.dumps(schema))
    fields = dict(fields or {})
    if id_column and id_column not in fields:  # records may leave the id out (a null id)
        fields[id_column] = {"optional": True}
    return input_format("avro", model or _model(), id_column, None, max_bytes, fields,
                        schemas_dir=str(d))


def wire(schema_id: int, schema, record) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return b"\0" + struct.pack(">I", schema_id) + buf.getvalue()


def _record(i: int, rng) -> dict:
    return {"txn_id": i, "a": None if i % 5 == 0 else float(rng.normal() * 1e3),
            "b": float(np.float32(rng.normal())), "c": int(rng.integers(-2**31, 2**31)),
            "flag": bool(i % 2), "note": "n" * (i % 7), "tags": ["t"] * (i % 3),
            "extra": {"k": i, "z": None}, "card": {"age": int(rng.integers(-2**63, 2**63)),
                                                   "kind": "xyz"[i % 3], "raw": b"abc"}}


def _reason(fmt, value: bytes) -> str:
    with pytest.raises(InvalidMessage) as e:
        fmt.decode(value)
    return e.value.code


def test_values_are_fastavros_cast_as_arrow_casts_them(tmp_path):
    fmt = _fmt(tmp_path, {7: TXN}, fields={"age": "card.age"})
    rng = np.random.default_rng(0)
    recs = [_record(i, rng) for i in range(300)]
    recs[1]["a"] = 3.4028235677973362e38  # rounds down to FLT_MAX
    recs[2]["a"] = -0.0
    recs[3]["a"] = 5e-324
    for i, rec in enumerate(recs):
        value = wire(7, TXN, rec)
        back = fastavro.schemaless_reader(io.BytesIO(value[5:]), fastavro.parse_schema(TXN))
        m = fmt.decode(value)
        X, ids = m.data
        ref = [pa.array([back["a"]], pa.float64()).cast(pa.float32(), safe=False),
               pa.array([back["b"]], pa.float32()),
               pa.array([back["c"]], pa.int64()).cast(pa.float32(), safe=False),
               pa.array([float(back["flag"])], pa.float32()),
               pa.array([back["card"]["age"]], pa.int64()).cast(pa.float32(), safe=False)]
        want = np.array([r.to_numpy(zero_copy_only=False)[0] for r in ref], np.float32)
        assert np.array_equal(X[0].view(np.uint32), np.where(np.isnan(want), np.float32(np.nan),
                                                              want).view(np.uint32)) or \
            np.array_equal(X[0], want, equal_nan=True), (i, X[0], want)
        assert ids.tolist() == [back["txn_id"]]


def test_schemas_evolve_by_name_and_categories_read_enums_and_strings(tmp_path):
    v2 = {"type": "record", "name": "Txn", "fields": [
        {"name": "new_field", "type": {"type": "array", "items": "double"}},
        {"name": "c", "type": "long"}, {"name": "txn_id", "type": "string"},
        {"name": "kind", "type": {"type": "enum", "name": "K", "symbols": ["q", "y", "x"]}},
        {"name": "merchant", "type": ["null", "string"]}]}
    model = _model(["c", "kind", "merchant", "absent"],
                   {"kind": ["x", "y"], "merchant": ["shop", "fuel"]})
    with pytest.raises(InvalidMessage, match="feature 'absent' .absent.: the record has no "
                       "field 'absent'") as e:
        _fmt(tmp_path, {1: v2}, model=model).decode(wire(1, v2, {
            "new_field": [], "c": 1, "txn_id": "t-0", "kind": "x", "merchant": "fuel"}))
    assert e.value.code == "schema_mismatch"
    fmt = _fmt(tmp_path, {1: v2}, model=model, fields={"absent": {"optional": True}})
    m = fmt.decode(wire(1, v2, {"new_field": [1.0, 2.0], "c": 2**40, "txn_id": "t-1",
                                "kind": "x", "merchant": "fuel"}))
    X, ids = m.data
    assert X.tolist()[0][:3] == [float(np.float32(2**40)), 0.0, 1.0] and np.isnan(X[0, 3])
    assert ids.to_pylist() == ["t-1"]
    assert m.counts["absent"].tolist() == [0, 0, 0, 1]
    X, _ = fmt.decode(wire(1, v2, {"new_field": [], "c": 1, "txn_id": "t-2", "kind": "q",
                                   "merchant": "unseen"})).data
    assert np.isnan(X[0, 1]) and np.isnan(X[0, 2])  # not a category: the unseen one
    X, _ = fmt.decode(wire(1, v2, {"new_field": [], "c": 1, "txn_id": "t-3", "kind": "y",
                                   "merchant": None})).data
    assert X[0, 1] == 1.0 and np.isnan(X[0, 2])


RECURSIVE = {"type": "record", "name": "Node", "fields": [
    {"name": "a", "type": "double"}, {"name": "next", "type": ["null", "Node"]}]}


def _deep(n: int) -> dict:
    s = {"type": "record", "name": "R0", "fields": [{"name": "a", "type": "double"}]}
    for k in range(1, n):
        s = {"type": "record", "name": f"R{k}", "fields": [{"name": "inner", "type": s}]}
    return s


def test_hostile_schemas_are_refused_with_their_reason(tmp_path):
    bad_feature = {"type": "record", "name": "T", "fields": [{"name": "a", "type": "string"}]}
    bad_id = {"type": "record", "name": "T", "fields": [{"name": "txn_id", "type": "double"}]}
    fmt = _fmt(tmp_path, {1: RECURSIVE, 2: _deep(40), 3: bad_feature, 4: "{not json",
                          5: {"type": "record", "name": "T", "fields": [{"name": "a"}]},
                          6: bad_id, 7: '"double"'})
    body = b"\0" * 16
    assert _reason(fmt, b"\0\0\0\0\1" + body) == "bad_schema"
    assert _reason(fmt, b"\0\0\0\0\2" + body) == "bad_schema"
    assert _reason(fmt, b"\0\0\0\0\3" + body) == "bad_type"
    assert _reason(fmt, b"\0\0\0\0\4" + body) == "bad_schema"
    assert _reason(fmt, b"\0\0\0\0\5" + body) == "bad_schema"
    assert _reason(fmt, b"\0\0\0\0\6" + body) == "bad_type"
    assert _reason(fmt, b"\0\0\0\0\7" + body) == "bad_schema"
    assert _reason(fmt, b"\0\0\0\0\x63" + body) == "unknown_schema"
    assert _reason(fmt, b"\0\xff\xff\xff\xff" + body) == "unknown_schema"


SIMPLE = {"type": "record", "name": "S", "fields": [
    {"name": "txn_id", "type": "long"}, {"name": "a", "type": "double"},
    {"name": "xs", "type": {"type": "array", "items": "null"}},
    {"name": "u", "type": ["null", "int"]},
    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["p", "q"]}},
    {"name": "s", "type": "string"}]}


def _body(*parts: bytes) -> bytes:
    return b"\0\0\0\0\x09" + b"".join(parts)


def _long(v: int) -> bytes:
    u = (v << 1) ^ (v >> 63)
    u &= (1 << 64) - 1
    out = bytearray()
    while True:
        if u < 0x80:
            out.append(u)
            return bytes(out)
        out.append((u & 0x7f) | 0x80)
        u >>= 7


GOOD = [_long(5), struct.pack("<d", 1.5), _long(2), _long(0), _long(1), _long(7), _long(1),
        _long(3), b"abc"]


def test_hostile_records_are_refused_with_their_reason(tmp_path):
    fmt = _fmt(tmp_path, {9: SIMPLE}, model=_model(["a", "u"]))
    ok = fmt.decode(_body(*GOOD))
    assert ok.data[0].tolist() == [[1.5, 7.0]] and ok.data[1].tolist() == [5]
    assert fmt.decode(wire(9, SIMPLE, {"txn_id": 5, "a": 1.5, "xs": [None, None], "u": 7,
                                       "e": "q", "s": "abc"})).data[0].tolist() == [[1.5, 7.0]]
    cases = {
        "empty": b"",
        "bad_magic": b"\1\0\0\0\x09" + b"".join(GOOD),
        "short": b"\0\0\0",
        "truncated": _body(*GOOD)[:-1],
        "trailing": _body(*GOOD, b"\0"),
        "varint 11 bytes": _body(b"\xff" * 10 + b"\x01", *GOOD[1:]),
        "varint over 64 bits": _body(b"\xff" * 9 + b"\x7f", *GOOD[1:]),
        "array count 2^62 of nulls": _body(*GOOD[:2], _long(2**62), _long(0), *GOOD[4:]),
        "array count 2^63-1": _body(*GOOD[:2], _long(2**63 - 1), *GOOD[3:]),
        "array count -2^63": _body(*GOOD[:2], _long(-2**63), _long(0), *GOOD[4:]),
        "negative block, bad size": _body(*GOOD[:2], _long(-1), _long(2**40), *GOOD[3:]),
        "union branch 2": _body(*GOOD[:4], _long(2), _long(7), *GOOD[6:]),
        "union branch -1": _body(*GOOD[:4], _long(-1), *GOOD[6:]),
        "int over 32 bits": _body(*GOOD[:5], _long(2**31), *GOOD[6:]),
        "enum 5": _body(*GOOD[:6], _long(5), *GOOD[7:]),
        "string longer than the rest": _body(*GOOD[:7], _long(2**31), b"abc"),
        "string negative": _body(*GOOD[:7], _long(-3), b"abc"),
        "double 1e39": _body(GOOD[0], struct.pack("<d", 1e39), *GOOD[2:]),
    }
    expected = {"empty": "empty", "bad_magic": "bad_magic", "short": "bad_magic",
                "double 1e39": "bad_number"}
    for name, value in cases.items():
        assert _reason(fmt, value) == expected.get(name, "bad_avro"), name
    # NaN and infinities Avro can carry: as Arrow casts them
    X = fmt.decode(_body(GOOD[0], struct.pack("<d", math.inf), *GOOD[2:])).data[0]
    assert X[0, 0] == np.inf
    # the message bound holds before anything is read
    small = _fmt(tmp_path, {9: SIMPLE}, model=_model(["a"]), max_bytes=64)
    assert _reason(small, _body(*GOOD[:7], _long(100), b"s" * 100)) == "too_large"


def test_avro_scores_equal_xgboost_and_run_through_the_worker(tmp_path):
    booster = M.xgboost_models()["xgb-binary-logistic"]
    model = compile_model(booster)
    model.save(tmp_path / "m.model")
    names = model.feature_names
    schema = {"type": "record", "name": "E", "fields": [
        {"name": "txn_id", "type": "string"},
        *({"name": n, "type": ["null", "float"]} for n in names)]}
    rng = np.random.default_rng(4)
    X = rng.normal(size=(80, len(names))).astype(np.float32)
    X[rng.random(X.shape) < 0.1] = np.nan
    values = [wire(3, schema, {"txn_id": f"t{i}", **{n: (None if math.isnan(v) else v)
                                                     for n, v in zip(names, X[i].tolist(),
                                                                     strict=True)}})
              for i in range(len(X))]
    values[10:10] = [b"\0\0\0\0\x03\x02", b"\x05junk"]
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "3.avsc").write_text(json.dumps(schema))
    write_records(tmp_path / "in.arrows", [Record("in", 0, k, None, v, 0, [])
                                           for k, v in enumerate(values)])
    cfg = {"model": {"path": str(tmp_path / "m.model")},
           "source": {"type": "file", "path": str(tmp_path / "in.arrows"), "format": "avro",
                      "schemas_dir": str(tmp_path / "schemas")},
           "sink": {"type": "file", "path": str(tmp_path / "out.arrows"), "format": "json"},
           "scoring": {"id_column": "txn_id"}, "logging": {"progress": False}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "worker.cli", "--config",
                           str(tmp_path / "c.yaml")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(o.value) for o in read_records(tmp_path / "out.arrows")]
    dead = [dict(d.headers)["error_code"] for d in read_records(tmp_path / "out-dlq.arrows")]
    assert dead == [b"bad_avro", b"bad_magic"]
    assert [r["txn_id"] for r in rows] == [f"t{i}" for i in range(len(X))]
    np.testing.assert_allclose([r["score"] for r in rows], booster.inplace_predict(X),
                               rtol=2e-7, atol=0)


def test_avro_config_needs_its_schemas(tmp_path):
    from worker.config import ConfigError, load_settings

    with pytest.raises((ConfigError, ValueError), match="schemas_dir"):
        load_settings(None, source={"type": "file", "path": "x", "format": "avro"})


def test_strings_are_utf8(tmp_path):
    # found by the Avro fuzzer (seed 1, 1,500 cases) before the fix: a string id of invalid
    # UTF-8 (a flipped bit) was put into an Arrow string array and scored; fastavro refuses it
    schema = {"type": "record", "name": "S", "fields": [{"name": "txn_id", "type": "string"},
                                                       {"name": "note", "type": "string"},
                                                       {"name": "a", "type": "double"}]}
    fmt = _fmt(tmp_path, {2: schema}, model=_model(["a"]))
    good = wire(2, schema, {"txn_id": "é", "note": "x", "a": 1.0})
    assert fmt.decode(good).data[1].to_pylist() == ["é"]
    bad_id = good.replace("é".encode(), b"\xc3\x28")
    bad_note = good.replace(b"\x02x", b"\x02\xff")
    for value in (bad_id, bad_note):
        assert _reason(fmt, value) == "bad_avro"


def test_review_findings_stay_fixed(tmp_path):
    # found by reading the reader as an attacker: a named type used twice at each of 21
    # levels (a 2 kB schema) compiled into 2^21 nodes (6.5 s, 744 MB); an array of records of
    # 10,000 nulls with a count of 2^20 took 30 s for an 18-byte message
    levels = {"type": "record", "name": "R0", "fields": [{"name": "a", "type": "double"}]}
    for k in range(1, 22):
        levels = {"type": "record", "name": f"R{k}", "fields": [
            {"name": "p", "type": levels}, {"name": "q", "type": f"R{k - 1}"}]}
    nulls = {"type": "record", "name": "T", "fields": [
        {"name": "xs", "type": {"type": "array", "items": {
            "type": "record", "name": "N",
            "fields": [{"name": f"n{k}", "type": "null"} for k in range(10_000)]}}},
        {"name": "a", "type": "double"}]}
    fmt = _fmt(tmp_path, {1: levels, 2: nulls}, model=_model(["a"]))
    assert _reason(fmt, b"\0\0\0\0\1" + b"\0" * 8) == "bad_schema"
    # the empty records are dropped from the plan: 2^20 of them cost nothing, one more is
    # refused
    ok = _body(_long(2**20), _long(0), struct.pack("<d", 2.0)).replace(b"\x09", b"\x02", 1)
    assert fmt.decode(ok).data[0].tolist() == [[2.0]]
    over = _body(_long(2**20 + 1), _long(0), struct.pack("<d", 2.0)).replace(b"\x09", b"\x02",
                                                                               1)
    assert _reason(fmt, over) == "bad_avro"


_CAT_SCHEMA = {"type": "record", "name": "C", "fields": [
    {"name": "x", "type": "double"},
    {"name": "h", "type": ["null", "boolean", "int", "long", "float", "double", "string"]},
    {"name": "e", "type": ["null", {"type": "enum", "name": "E", "symbols": ["a", "B_2", "c"]}]},
    {"name": "pad", "type": {"type": "array", "items": "long"}}]}


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                 st.floats(allow_nan=True, allow_infinity=True),
                 st.sampled_from([0.0, -0.0, 1.0, 0.5, 1e39, 2.0**63, 2.0**24 + 1]),
                 st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)),
       st.sampled_from([None, "a", "B_2", "c"]),
       st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4))
def test_hashed_categorical_texts_are_what_fastavro_reads(tmp_path_factory, h, e, pad):
    """A CatBoost hashed feature's value (AvroReader hashed=, any branch of a union, an
    enum's symbol): the C reader's text equals the text CatBoost hashes for the value
    fastavro reads back from the same bytes; the row keeps NaN there."""
    d = tmp_path_factory.mktemp("s")
    model = SimpleNamespace(feature_names=["x", "h", "e"], categories={},
                            category_hashes={"h": [], "e": []}, columns=lambda t: t)
    fmt = _fmt(d, {1: _CAT_SCHEMA}, model=model, id_column=None)
    value = wire(1, _CAT_SCHEMA, {"x": 0.25, "h": h, "e": e, "pad": pad})
    back = fastavro.schemaless_reader(io.BytesIO(value[5:]),
                                      fastavro.parse_schema(_CAT_SCHEMA), None)
    msg = fmt.decode(value)
    X, _ids, texts = msg.data
    assert X[0, 0] == 0.25 and np.isnan(X[0, 1:]).all()
    assert texts == [[_hashed_text(back["h"]), back["e"]]]


@pytest.mark.parametrize("fields,id_column,said", [
    ({"a": "card.age", "b": "card.age"}, "txn_id", "feature 'a' and feature 'b' both read"),
    ({"a": "txn_id"}, "txn_id", "feature 'a' and scoring.id_column 'txn_id' both read"),
    ({}, "a", "scoring.id_column: 'a' is also a feature the model reads"),  # named so
    ({"a": "card.age", "b": "card"}, "txn_id", "feature 'b' reads 'card', which holds"),
])
def test_fields_that_clash_are_refused_not_left_missing(tmp_path, fields, id_column, said):
    """A feature read from the id's field, or two features from one field, are refused when
    the format is built. Before, the path table kept the last one read there and the other
    feature was missing on every row (a wrong score, silently); a field holding another's
    dead-lettered every message."""
    with pytest.raises(ValueError, match=said):
        _fmt(tmp_path, {7: TXN}, fields=fields, id_column=id_column)
    fmt = _fmt(tmp_path, {7: TXN}, fields={"age": "card.age"})  # apart: every one read
    rec = _record(3, np.random.default_rng(0))
    X, ids = fmt.decode(wire(7, TXN, rec)).data
    assert X[0, 1] == np.float32(rec["b"]) and X[0, 4] == np.float32(rec["card"]["age"])
    assert ids.tolist() == [3]


@pytest.mark.parametrize("model,fields,id_column,said", [
    (None, {"a": "tags.[]"}, "txn_id", "feature 'a' reads 'tags.[]', but '[]' is not"),
    (None, {"txn_id": "tags.[]"}, "txn_id",
     "scoring.id_column 'txn_id' reads 'tags.[]', but '[]' is not"),
    (_model(names=["card.age", "b"]), {}, "txn_id",
     "feature 'card.age' reads 'card.age', but 'card.age' is not"),
    (None, {"a": "card.1x"}, "txn_id", "'1x' is not an Avro field name"),
])
def test_paths_no_avro_schema_can_hold_are_refused(tmp_path, model, fields, id_column, said):
    """A path segment that is not an Avro name: "[]" reached an array's items (the last item
    was read, for a feature or the id), and a feature named with a dot or a symbol without a
    mapping was missing on every row (an attacker review of the fields check)."""
    with pytest.raises(ValueError, match=re.escape(said)):
        _fmt(tmp_path, {7: TXN}, model=model, fields=fields, id_column=id_column)


def test_avro_bounds_at_their_edges(tmp_path):
    """Each bound docs/formats.md's Avro section states, at its value (read) and one past (refused
    with its reason): 32 nested records, an int's 32 bits, a long's 10 varint bytes, a
    block's item count against the bytes left, a schema file's 1 MiB (tests/BOUNDS.md)."""
    # nesting: 32 records read, 33 refused
    for n, ok in ((32, True), (33, False)):
        d = tmp_path / f"deep{n}"
        d.mkdir()
        path = ".".join(["inner"] * (n - 1) + ["a"])
        fmt = _fmt(d, {1: _deep(n)}, model=_model(["a"]), id_column=None,
                   fields={"a": {"path": path}})
        value = b"\0\0\0\0\1" + struct.pack("<d", 2.0)
        if ok:
            assert fmt.decode(value).data[0].tolist() == [[2.0]]
        else:
            with pytest.raises(InvalidMessage, match="nested deeper than 32") as e:
                fmt.decode(value)
            assert e.value.code == "bad_schema"
    # an int: -2^31 .. 2^31 - 1 read, one past either end refused
    fmt = _fmt(tmp_path, {9: SIMPLE}, model=_model(["a", "u"]))
    for v in (2**31 - 1, -2**31):
        got = fmt.decode(_body(*GOOD[:5], _long(v), *GOOD[6:])).data[0]
        assert got[0, 1] == np.float32(v)
    for v in (2**31, -2**31 - 1):
        with pytest.raises(InvalidMessage, match="an int outside 32 bits"):
            fmt.decode(_body(*GOOD[:5], _long(v), *GOOD[6:]))
    # a long: the ten bytes of 2^63 - 1 and -2^63 read (the id), an eleventh refused
    for v in (2**63 - 1, -2**63):
        assert len(_long(v)) == 10
        assert fmt.decode(_body(_long(v), *GOOD[1:])).data[1].tolist() == [v]
    with pytest.raises(InvalidMessage, match="more than 10 bytes"):
        fmt.decode(_body(b"\xff" * 9 + b"\x81\x00", *GOOD[1:]))
    # a block of items that take a byte each: as many as the bytes left read, one more refused
    longs = {"type": "record", "name": "L", "fields": [
        {"name": "xs", "type": {"type": "array", "items": "long"}},
        {"name": "a", "type": "double"}]}
    fmt = _fmt(tmp_path, {3: longs}, model=_model(["a"]), id_column=None)
    tail = _long(0) + struct.pack("<d", 2.0)  # the block's end, then a: 9 bytes
    value = b"\0\0\0\0\3" + _long(3) + b"\2\4\6" + tail
    assert fmt.decode(value).data[0].tolist() == [[2.0]]
    left = 3 + len(tail)  # the bytes after the count
    exact = b"\0\0\0\0\3" + _long(left) + b"\2" * left
    assert _reason(fmt, exact) == "bad_avro"  # read as far as the bytes go: cut short
    with pytest.raises(InvalidMessage, match="the record is cut short"):
        fmt.decode(exact)
    with pytest.raises(InvalidMessage, match="a block of more items than the bytes left"):
        fmt.decode(b"\0\0\0\0\3" + _long(left + 1) + b"\2" * left)
    # a schema file: 1 MiB read, one byte more refused
    pad = json.dumps(SIMPLE)
    for size, ok in ((1 << 20, True), ((1 << 20) + 1, False)):
        d = tmp_path / f"size{size}"
        d.mkdir()
        fmt = _fmt(d, {9: pad + " " * (size - len(pad))}, model=_model(["a"]))
        assert (d / "schemas" / "9.avsc").stat().st_size == size
        if ok:
            assert fmt.decode(_body(*GOOD)).data[0].tolist() == [[1.5]]
        else:
            with pytest.raises(InvalidMessage, match="over 1 MiB") as e:
                fmt.decode(_body(*GOOD))
            assert e.value.code == "bad_schema"


# ---- found by mutation testing (issue 55, mutation/RESULTS.md: worker/formats/avro.py) ----

@pytest.mark.parametrize("id_type", ["long", "string", None, "absent"])
@pytest.mark.parametrize("n", [1, 3])
def test_gathered_rows_and_ids_are_the_messages_own(tmp_path, id_type, n):
    # gather is what the pipeline scores; a group it cannot gather is taken message by
    # message (worker/pipeline.py), which hid a gather that read the ids as rows
    fields = [{"name": "a", "type": ["null", "double"]}, {"name": "b", "type": "float"}]
    if id_type in ("long", "string"):
        fields.insert(0, {"name": "txn_id", "type": id_type})
    schema = {"type": "record", "name": "G", "fields": fields}
    # "absent": an id column is configured, optional, and this schema has no such field
    fmt = _fmt(tmp_path, {4: schema}, model=_model(["a", "b"]),
               id_column="txn_id" if id_type else None)
    records = [{"txn_id": (10 + i if id_type == "long" else f"t{i}"),
                "a": None if i == 1 else 1.5 * i, "b": -2.0 * i} for i in range(n)]
    g = fmt.gather([fmt.decode(wire(4, schema, r)) for r in records])
    want = np.array([[np.nan if r["a"] is None else r["a"], r["b"]] for r in records],
                    np.float32)
    np.testing.assert_array_equal(np.asarray(g.X), want)
    assert g.offsets.tolist() == list(range(n + 1))
    if id_type == "long":
        assert g.ids.tolist() == [r["txn_id"] for r in records] and g.own_ids is None
    elif id_type == "string":
        assert [x.to_pylist() for x in g.own_ids] == [[r["txn_id"]] for r in records]
    elif id_type == "absent":  # one null id a row
        assert [x.to_pylist() for x in g.own_ids] == [[None]] * n
    else:
        assert g.ids.tolist() == [0] * n  # each row's index in its message


def test_features_under_a_null_record_are_missing_not_absent(tmp_path):
    # a record on the way to several features is null: each of them is missing (NaN), not
    # absent (which a required feature is refused for), the first as the others
    card = {"type": "record", "name": "Card", "fields": [
        {"name": "x", "type": "double"}, {"name": "y", "type": "double"}]}
    schema = {"type": "record", "name": "N", "fields": [
        {"name": "card", "type": ["null", card]}, {"name": "a", "type": "double"}]}
    for names in (["card.x", "card.y", "a"], ["a", "card.x", "card.y"]):
        d = tmp_path / names[0]
        d.mkdir()
        fmt = _fmt(d, {5: schema}, model=_model(names), id_column=None,
                   fields={n: {"path": n} for n in names})
        X = fmt.decode(wire(5, schema, {"card": None, "a": 3.0})).data[0]
        want = [3.0 if n == "a" else np.nan for n in names]
        np.testing.assert_array_equal(X[0], np.array(want, np.float32))
        X = fmt.decode(wire(5, schema, {"card": {"x": 1.0, "y": 2.0}, "a": 3.0})).data[0]
        assert X[0].tolist() == [{"card.x": 1.0, "card.y": 2.0, "a": 3.0}[n] for n in names]


@pytest.mark.parametrize("size", [1, 2])
def test_arrays_of_short_fixed_values_are_read_item_by_item(tmp_path, size):
    # a fixed of one byte takes a byte: its array's items are read, not skipped by count
    schema = {"type": "record", "name": "F", "fields": [
        {"name": "xs", "type": {"type": "array", "items": {
            "type": "fixed", "name": "One", "size": size}}},
        {"name": "a", "type": "double"}]}
    fmt = _fmt(tmp_path, {6: schema}, model=_model(["a"]), id_column=None)
    value = wire(6, schema, {"xs": [b"\1" * size] * 3, "a": 2.5})
    assert fmt.decode(value).data[0].tolist() == [[2.5]]


def test_a_schema_whose_dropped_nodes_pass_the_plans_work_bound_is_refused(tmp_path):
    # a record of 200 null fields takes no bytes and reads nothing: each use is compiled
    # (201 nodes) and dropped, so the plan stays small while compiling it is not; the work is
    # bounded (4 x MAX_NODES nodes compiled), not only what the plan keeps
    from worker.formats.avro import MAX_NODES

    empty = {"type": "record", "name": "E", "fields": [
        {"name": f"n{k}", "type": "null"} for k in range(200)]}

    def schema(uses):
        return {"type": "record", "name": "T", "fields": [
            {"name": "u0", "type": empty},
            *({"name": f"u{k}", "type": "E"} for k in range(1, uses)),
            {"name": "a", "type": "double"}]}

    under, over = (4 * MAX_NODES) // 201 - 10, (4 * MAX_NODES) // 201 + 10
    fmt = _fmt(tmp_path, {7: schema(under), 8: schema(over)}, model=_model(["a"]),
               id_column=None)
    assert fmt.decode(b"\0\0\0\0\7" + struct.pack("<d", 2.0)).data[0].tolist() == [[2.0]]
    with pytest.raises(InvalidMessage, match=f"over {MAX_NODES} nodes") as e:
        fmt.decode(b"\0\0\0\0\x08" + struct.pack("<d", 2.0))
    assert e.value.code == "bad_schema"


def _nested_through(kind: str, n: int) -> dict:
    """A record whose double `a` sits under n - 1 levels of records, each reached through a
    union ["null", record] or an array of records."""
    s = {"type": "record", "name": "R0", "fields": [{"name": "a", "type": "double"}]}
    for k in range(1, n):
        inner = ["null", s] if kind == "union" else {"type": "array", "items": s}
        s = {"type": "record", "name": f"R{k}", "fields": [{"name": "inner", "type": inner}]}
    return s


@pytest.mark.parametrize("kind", ["union", "array"])
def test_nesting_through_unions_and_arrays_counts_against_the_depth_bound(tmp_path, kind):
    # each union branch and array item is a level: 40 records through them are refused as
    # 40 plain records are
    fmt = _fmt(tmp_path, {1: _nested_through(kind, 40)}, model=_model(["x"]), id_column=None,
               fields={"x": {"optional": True}})
    with pytest.raises(InvalidMessage, match="nested deeper than 32") as e:
        fmt.decode(b"\0\0\0\0\1" + b"\0" * 8)
    assert e.value.code == "bad_schema"


@pytest.mark.parametrize("items", [{"type": "fixed", "name": "Z", "size": 0}, ["null"]])
def test_arrays_of_items_that_take_no_bytes_are_read(tmp_path, items):
    # a fixed of size 0 and a union of null alone take no bytes and read nothing: any count
    # of them is read (bounded by MAX_EMPTY_ITEMS), not held to the bytes left
    schema = {"type": "record", "name": "E", "fields": [
        {"name": "xs", "type": {"type": "array", "items": items}},
        {"name": "a", "type": "double"}]}
    fmt = _fmt(tmp_path, {2: schema}, model=_model(["a"]), id_column=None)
    value = wire(2, schema, {"xs": [b"" if isinstance(items, dict) else None] * 50, "a": 4.5})
    assert fmt.decode(value).data[0].tolist() == [[4.5]]


def test_a_feature_of_the_wrong_avro_type_is_refused_with_the_way_out(tmp_path):
    # bad_type names the Avro type and, where a declared cast would read it, the cast
    def said(avro_type, categories=None):
        schema = {"type": "record", "name": "B", "fields": [{"name": "f", "type": avro_type}]}
        d = tmp_path / f"{avro_type}-{bool(categories)}"
        d.mkdir()
        fmt = _fmt(d, {3: schema}, model=_model(["f"], categories), id_column=None)
        with pytest.raises(InvalidMessage) as e:
            fmt.decode(b"\0\0\0\0\3" + b"\0" * 8)
        assert e.value.code == "bad_type"
        return str(e.value)

    assert "is an Avro string; the feature is a number (declare cast: number" in said("string")
    bytes_said = said("bytes")
    assert "is an Avro bytes; the feature is a number" in bytes_said
    assert "declare cast" not in bytes_said
    cats = {"f": ["a", "b"]}
    assert "(declare cast: string in source.fields" in said("int", cats)
    double_said = said("double", cats)
    assert "the feature's categories are strings" in double_said
    assert "declare cast" not in double_said
    assert "is an Avro bytes; the feature is a category" in said("bytes", cats)
