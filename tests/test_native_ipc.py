"""The message path in C (worker._ipc): record batches of a cached schema read from the message
bytes, output streams written from whole-batch columns. Checked against pyarrow (the reader
and writer of record) and XGBoost's own predictions, on hostile rows and block edges; the
fuzzer (tests/fuzz/messages.py) primes every other case's schema so that it takes this path."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from worker import _ipc, codec
from worker.io.records import Record
from worker.model.result import ScoreResult

INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(),
             pa.uint32(), pa.uint64()]
FEATURES = ["amount", "count", "flag", "ratio", "small", "big", "unsigned"]


def _stream(table: pa.Table, compression=None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema,
                           options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _hostile(n: int, seed: int, id_type: pa.DataType = INT_TYPES[3], first_id: int = 0
             ) -> pa.Table:
    """Rows of every awkward kind: NaN, +-inf, zeros, -0.0, values on and beside thresholds
    (the model's own thresholds are near 0, 0.5, 1), integer extremes, nulls in every
    feature type, booleans with nulls."""
    rng = np.random.default_rng(seed)
    amount = rng.normal(size=n).astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, 1.0, np.float32(0.5) + 1e-7,
                         np.finfo(np.float32).max, -np.finfo(np.float32).max], np.float32)
    pick = rng.random(n) < 0.3
    amount[pick] = rng.choice(specials, pick.sum())
    ratio = rng.normal(size=n)
    ratio[rng.random(n) < 0.2] = np.nan
    mask = rng.random(n) < 0.15
    info8, info64 = np.iinfo(np.int8), np.iinfo(np.int64)
    small = rng.integers(info8.min, info8.max, n, endpoint=True).astype(np.int8)
    big = rng.choice(np.array([info64.min, info64.max, 0, -1, 1, 2**24 + 1], np.int64), n)
    idmax = 127 if id_type == pa.int8() else 2**31
    return pa.table({
        "txn_id": pa.array((np.arange(n) + first_id) % idmax, type=id_type),
        "amount": pa.array(amount),
        "count": pa.array(rng.integers(0, 4, n).astype(np.int32), mask=mask),
        "flag": pa.array(rng.random(n) < 0.5, mask=rng.random(n) < 0.1),
        "ratio": pa.array(ratio, type=pa.float64()),
        "small": pa.array(small),
        "big": pa.array(big, mask=~mask & (rng.random(n) < 0.1)),
        "unsigned": pa.array(rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)),
        "note": pa.array([f"n{i}" for i in range(n)]),  # a column the model does not read
    })


def _read(value: bytes) -> pa.Table:
    t = pa.ipc.open_stream(value).read_all()
    t.validate(full=True)
    return t


def _oracle_features(table: pa.Table) -> np.ndarray:
    """float32 features as pyarrow converts them (missing -> NaN), no code of ours."""
    cols = []
    for name in FEATURES:
        c = table.column(name).combine_chunks()
        missing = c.is_null().to_numpy(zero_copy_only=False)
        if pa.types.is_boolean(c.type):
            c = c.cast(pa.int8())
        v = c.fill_null(0).to_numpy(zero_copy_only=False).astype(np.float32)
        v[missing] = np.nan
        cols.append(v)
    return np.column_stack(cols)


@pytest.fixture(scope="module")
def booster_and_model():
    import xgboost as xgb

    import worker

    rng = np.random.default_rng(3)
    X = rng.normal(size=(3000, len(FEATURES))).astype(np.float32)
    X[:, 1] = rng.integers(0, 4, 3000)
    X[:, 2] = rng.random(3000) < 0.5
    X[rng.random(X.shape) < 0.05] = np.nan
    y = (np.nan_to_num(X[:, 0]) + 0.5 * np.nan_to_num(X[:, 1]) > 1).astype(int)
    booster = xgb.train({"max_depth": 4, "objective": "binary:logistic", "nthread": 1},
                        xgb.DMatrix(X, y, feature_names=FEATURES), num_boost_round=40)
    return booster, worker.compile_model(booster)


def _pipeline(model, native: bool, id_column="txn_id"):
    from worker.config import load_settings
    from worker.pipeline import Pipeline

    settings = load_settings(None, scoring={"threads": 1, "id_column": id_column},
                             source={"type": "file", "path": "x.arrows"},
                             model={"path": "unused.model"})
    pipe = Pipeline(model, settings, "scores")
    pipe.format.decoder.native = pipe.output.stream.native = native
    return pipe


@pytest.mark.parametrize("n", [1, 7, 63, 64, 65, 1000])
@pytest.mark.parametrize("sliced", [False, True])
def test_gathered_rows_are_pyarrows_rows(booster_and_model, n, sliced):
    table = _hostile(n + 5, seed=n)
    table = table.slice(5, n) if sliced else table.slice(0, n)
    value = _stream(table)
    dec = codec.Decoder(FEATURES, "txn_id")
    with pytest.raises(codec.InvalidMessage):  # the schema alone: cached, refused as empty
        dec.decode(value[:len(codec._schema_bytes(value))])
    raw, _ = dec.decode_keyed(value)
    assert isinstance(raw, codec.Raw) and raw.num_rows == n
    X = np.full((2 * n, len(FEATURES)), -7.0, np.float32)
    ids = np.zeros(2 * n, np.int64)
    raw.plan.gather([value, value], raw.start, X, ids)
    want = _oracle_features(table)
    np.testing.assert_array_equal(X[:n], want)  # NaN where missing, equal bits elsewhere
    np.testing.assert_array_equal(X[n:], want)
    assert ids.tolist() == 2 * table.column("txn_id").to_pylist()
    # and the library's own predictions on those rows
    booster, model = booster_and_model
    np.testing.assert_allclose(model.predict_proba(X[:n])[:, 1],
                               booster.inplace_predict(want), atol=1e-6, rtol=0)


def test_the_pipeline_writes_the_bytes_of_the_pyarrow_path(booster_and_model):
    # the same messages through the C path and through pyarrow: the same output bytes, and
    # scores equal to XGBoost's on the rows pyarrow reads
    booster, model = booster_and_model
    recs, tables = [], []
    for i, (n, id_type) in enumerate([(1, pa.int64()), (3, pa.int64()), (64, pa.int64()),
                                      (65, pa.int64()), (1, pa.int64()), (200, pa.int64())]):
        t = _hostile(n, seed=100 + i, id_type=id_type, first_id=1000 * i)
        tables.append(t)
        recs.append(Record("in", i % 2, 10 + i if i != 4 else 2**63 - 1, b"k", _stream(t), 5,
                           [("traceparent", b"00-abc-def-01")]))
    fast, slow = _pipeline(model, True), _pipeline(model, False)
    for pipe in (fast, slow):  # schema seen once first, as in a running worker
        pipe.process([(recs[0], pipe.decode(recs[0]))])
    items_fast = [(r, fast.decode(r)) for r in recs]
    assert all(isinstance(d.data, codec.Raw) for _, d in items_fast)
    out_fast, dead_fast, stats_fast = fast.process(items_fast)
    out_slow, dead_slow, stats_slow = slow.process([(r, slow.decode(r)) for r in recs])
    assert not dead_fast and not dead_slow
    assert len(out_fast) == len(out_slow) == len(recs)
    for a, b in zip(out_fast, out_slow, strict=True):
        # pyarrow pads a sliced buffer with its neighbours' bytes, the C writer with zeros:
        # the same streams, not the same bytes
        assert _read(a.value).equals(_read(b.value), check_metadata=True)
        assert len(a.value) == len(b.value)
    assert [o.headers for o in out_fast] == [o.headers for o in out_slow]
    assert out_fast[0].headers[-1] == ("traceparent", b"00-abc-def-01")
    assert stats_fast.rows == stats_slow.rows == sum(t.num_rows for t in tables)
    for out, t in zip(out_fast, tables, strict=True):
        got = pa.ipc.open_stream(out.value).read_all()
        got.validate(full=True)
        assert got.column("id").equals(t.column("txn_id"))
        np.testing.assert_allclose(got.column("score").to_numpy(),
                                   booster.inplace_predict(_oracle_features(t)), atol=1e-6,
                                   rtol=0)


@pytest.mark.parametrize("id_type", INT_TYPES)
@pytest.mark.parametrize("classifier", [True, False])
def test_c_writer_gives_pyarrows_streams(id_type, classifier):
    rng = np.random.default_rng(7)
    n = 140
    score = rng.random(n)
    r = ScoreResult(score, (score > 0.5).astype(np.int32), (score > 0.7).astype(np.int8),
                    rng.integers(1, 300, n).astype(np.int32),
                    rng.integers(0, 6, n).astype(np.int8), score - 0.1, score + 0.1)
    ids = rng.integers(0, 100, n).astype(id_type.to_pandas_dtype())
    sizes = [1, 1, 2, 63, 64, 1, 8]
    rows = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    recs = [Record(t, p, o, None, b"", 0) for t, p, o in [
        ("in", 0, 0), ("in", 0, 1), ("in", 3, -1), ("other.topic", 2**31 - 1, 2**63 - 1),
        ("in", 0, -(2**63)), ("in", 3, 12345), ("in", 0, 99)]]
    enc = codec.StreamEncoder({b"model_id": b"ab" * 32, b"work_total": b"40"})
    got = enc.encode_numpy(ids, r, classifier, rows, recs)
    out = codec.ResultColumns(r, classifier).batch(pa.array(ids, type=id_type))
    key = ("schema", out.schema.serialize().to_pybytes())
    ref = codec.StreamEncoder({b"model_id": b"ab" * 32, b"work_total": b"40"})
    for k, rec in enumerate(recs):
        sl = slice(int(rows[k]), int(rows[k + 1]))
        want = ref.encode(out, sl, rec.topic, rec.partition, rec.offset, key)
        assert _read(got[k]).equals(_read(want), check_metadata=True)
        assert len(got[k]) == len(want)
        full = codec.encode(out.slice(sl.start, sl.stop - sl.start), {
            b"model_id": b"ab" * 32, b"work_total": b"40", b"input_topic": rec.topic.encode(),
            b"input_partition": str(rec.partition).encode(),
            b"input_offset": str(rec.offset).encode()})
        assert pa.ipc.open_stream(got[k]).read_all().equals(
            pa.ipc.open_stream(full).read_all(), check_metadata=True)


@pytest.mark.parametrize("what", ["compressed", "two batches", "string id", "struct column",
                                  "float16 feature", "null id", "null-type column"])
def test_other_shapes_are_read_by_pyarrow_with_the_same_result(booster_and_model, what):
    _, model = booster_and_model
    t = _hostile(70, seed=5)
    compression = None
    if what == "compressed":
        compression = "zstd"
    elif what == "string id":
        t = t.set_column(0, "txn_id", pa.array([f"t{i}" for i in range(70)]))
    elif what == "struct column":
        t = t.append_column("s", pa.StructArray.from_arrays([pa.array(np.arange(70))], ["a"]))
    elif what == "float16 feature":
        t = t.set_column(1, "amount", pa.array(np.arange(70, dtype=np.float16)))
    elif what == "null id":
        t = t.set_column(0, "txn_id", pa.array([None] + list(range(69)), pa.int64()))
    elif what == "null-type column":
        t = t.append_column("nothing", pa.nulls(70))
    value = _stream(t, compression)
    if what == "two batches":
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema) as w:
            for b in t.to_batches(max_chunksize=40):
                w.write_batch(b)
        value = sink.getvalue().to_pybytes()
    rec = Record("in", 0, 1, None, value, 0)
    fast, slow = _pipeline(model, True), _pipeline(model, False)
    for pipe in (fast, slow):
        pipe.decode(rec)  # the schema cached
    decoded = fast.decode(rec)
    assert not isinstance(decoded.data, codec.Raw)
    a, _, _ = fast.process([(rec, decoded)])
    b, _, _ = slow.process([(rec, slow.decode(rec))])
    assert len(a) == len(b) == 1
    assert _read(a[0].value).equals(_read(b[0].value), check_metadata=True)


def test_a_lie_in_the_batch_is_left_to_pyarrow_and_refused():
    # row count and buffer lies after a cached schema: never read here, refused as before
    import struct

    t = _hostile(200, seed=1)
    value = _stream(t)
    head = len(codec._schema_bytes(value))
    dec = codec.Decoder(FEATURES, "txn_id")
    assert isinstance(dec.decode_keyed(value)[0], pa.RecordBatch)  # first: pyarrow, cached
    raw, key = dec.decode_keyed(value)
    assert isinstance(raw, codec.Raw)
    plan = dec._plans[key][2]
    for lie in (201, 10**6, 2**63 - 1, -1):
        bad = value[:head] + value[head:].replace(struct.pack("<q", 200), struct.pack("<q", lie))
        # never read here: pyarrow's to judge (0), or too large, read by nobody (-1)
        assert plan.rows(bad, head) <= 0
        with pytest.raises(codec.InvalidMessage) as err:
            dec.decode(bad)
        assert err.value.code in ("invalid_arrow", "not_arrow", "too_large")
    cut = value[:-40]  # truncated body
    assert plan.rows(cut, head) == 0
    with pytest.raises(codec.InvalidMessage):
        dec.decode(cut)


def test_shape_refuses_a_batch_that_is_not_flat_fixed_width():
    ok = pa.record_batch({"a": pa.array([1, 2], pa.int64())}).serialize().to_pybytes()
    assert _ipc.Shape.of(ok, 2, [8]).n_rows == 2
    with pytest.raises(ValueError):
        _ipc.Shape.of(ok, 3, [8])
    nulls = pa.record_batch({"a": pa.array([1, None], pa.int64())}).serialize().to_pybytes()
    with pytest.raises(ValueError):
        _ipc.Shape.of(nulls, 2, [8])
    with pytest.raises(ValueError):
        _ipc.Head(b"\x00" * 10, 8)
