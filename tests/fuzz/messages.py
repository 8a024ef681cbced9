"""Hostile input messages: Hypothesis builds Arrow tables of every shape a producer can send
(numeric, boolean, null, dictionary, nested and string columns, slices, nulls, compression),
then mutates their IPC bytes: bit flips, truncation, length and offset lies in the flatbuffer
metadata, lies in the body (compressed-length prefixes, buffer contents), and structured lies
(tests.ipc_forge) at integer edges in a record batch's row count, its field nodes' lengths and
null counts; schemas pyarrow's writer never writes (big-endian, Schema.features flags);
flatbuffers moved off their alignment; batches with custom metadata, broken or naming Arrow
0.17's compression; compressed buffers that declare huge sizes and real bombs (1.1 M rows of
zeros); string-view ids. Some cases
are batches of several messages (dictionary ids of different dictionaries among them),
processed together as the run loop processes a batch.

Each case runs through the worker's message path (``Pipeline.decode`` + ``Pipeline.process``,
the code the run loop calls) and must end scored or dead-lettered. The oracle reads each
message alone with pyarrow's stream reader (the columns the worker reads): a scored message
must be valid there, its output's ids must equal that message's own ids (type, dictionary and
all) and its scores those of the same rows scored from numpy; a crash is caught by the parent
process (see ``tests.fuzz.runner``).
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import strategies as st

from tests import ipc_forge
from worker import demo
from worker.io.records import Record

FEATURES = demo.FEATURES
ID = demo.ID_COLUMN

_NUMERIC = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(),
            pa.uint32(), pa.uint64(), pa.float16(), pa.float32(), pa.float64(), pa.bool_()]
_LIES = [0, 1, 7, 63, 64, 65, 1000, 1_000_000, 10_000_000, 2**31 - 1, 2**31, 2**32,
         2**62, 2**63 - 1, -1, -8, -(2**63)]


def _feature_array(draw, name: str, n: int, rng: np.random.Generator, style: str) -> pa.Array:
    kind = {"demo": "demo", "numeric": draw(st.sampled_from(["demo", "numeric", "null"]))}.get(
        style) or draw(st.sampled_from(["demo", "numeric", "dictionary", "string", "list"]))
    null_p = draw(st.sampled_from([0.0, 0.0, 0.1, 0.9, 1.0]))
    mask = rng.random(n) < null_p if null_p else None
    if kind == "demo":
        t = demo.FEATURE_TYPES[name]
    elif kind == "numeric":
        t = draw(st.sampled_from(_NUMERIC))
    elif kind == "null":
        return pa.nulls(n)
    elif kind == "dictionary":
        idx = pa.array(rng.integers(0, 3, n), type=pa.int8(), mask=mask)
        return pa.DictionaryArray.from_arrays(idx, pa.array([0.5, 1.5, 2.5]))
    elif kind == "string":
        return pa.array([str(v) for v in rng.integers(0, 100, n)], mask=mask)
    else:
        return pa.array([[float(v)] for v in rng.normal(size=n)], mask=mask)
    if pa.types.is_boolean(t):
        return pa.array(rng.random(n) < 0.5, mask=mask)
    values = rng.normal(scale=50.0, size=n)
    special = rng.random(n)
    values[special < 0.05] = np.nan
    values[(special >= 0.05) & (special < 0.08)] = np.inf
    values[(special >= 0.08) & (special < 0.1)] = -np.inf
    if pa.types.is_floating(t):
        arr = values.astype(t.to_pandas_dtype())
    else:
        info = np.iinfo(t.to_pandas_dtype())
        arr = np.clip(np.nan_to_num(values), info.min, info.max).astype(t.to_pandas_dtype())
    return pa.array(arr, type=t, mask=mask)


def _id_array(draw, n: int, first: int, rng: np.random.Generator) -> pa.Array:
    kind = draw(st.sampled_from(["int64", "int64", "string", "dictionary", "null", "float",
                                 "string_view"]))
    ids = np.arange(first, first + n, dtype=np.int64)
    if kind == "int64":
        return pa.array(ids)
    if kind == "string":
        return pa.array([f"t{i}" for i in ids])
    if kind == "dictionary":
        return pa.DictionaryArray.from_arrays(pa.array(np.arange(n) % 4, type=pa.int32()),
                                              pa.array(["a", "b", "c", "d"]))
    if kind == "null":
        return pa.nulls(n, type=pa.int64())
    if kind == "string_view":
        return pa.array([f"t{i}-" + "v" * (i % 20) for i in ids], pa.string_view())
    return pa.array(ids.astype(np.float64))


@st.composite
def tables(draw) -> pa.Table:
    """A table a producer could send: the model's features (sometimes of other types, missing,
    duplicated or reordered), an id column of any type, and extra columns."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    n = draw(st.sampled_from([0, 1, 2, 3, 7, 63, 64, 65, 200]))
    offset = draw(st.sampled_from([0, 0, 0, 1, 5]))
    if draw(st.booleans()):  # the usual message, the shape the C reader takes (worker._ipc)
        return _usual(draw, n, offset, rng)
    cols, names = [], []
    if draw(st.integers(0, 9)):
        cols.append(_id_array(draw, n + offset, 1000, rng))
        names.append(ID)
    feats = list(FEATURES)
    if draw(st.integers(0, 9)) == 0:
        feats.remove(draw(st.sampled_from(feats)))
    if draw(st.integers(0, 9)) == 0:
        feats.append(draw(st.sampled_from(feats)))  # a column named twice
    if draw(st.booleans()):
        rng.shuffle(feats)
    style = draw(st.sampled_from(["demo", "demo", "numeric", "numeric", "hostile"]))
    hostile = draw(st.sampled_from(feats))
    for name in feats:
        cols.append(_feature_array(draw, name, n + offset, rng,
                                   style if name == hostile else style.replace("hostile",
                                                                               "demo")))
        names.append(name)
    if draw(st.booleans()):
        names.append("extra_struct")
        cols.append(pa.StructArray.from_arrays([pa.array(np.arange(n + offset))], ["a"]))
    t = pa.Table.from_arrays(cols, names=names)
    return t.slice(offset, n) if offset else t


def _usual(draw, n: int, offset: int, rng: np.random.Generator) -> pa.Table:
    """An integer id, every feature once (of its own type or another numeric or boolean
    type, nulls or not), sometimes a string column the model does not read."""
    t = draw(st.sampled_from([pa.int64(), pa.int64(), pa.int32(), pa.uint64(), pa.int8()]))
    ids = np.arange(1000, 1000 + n + offset) % (128 if t == pa.int8() else 2**40)
    cols = [pa.array(ids, type=t)]
    names = [ID]
    feats = list(FEATURES)
    if draw(st.booleans()):
        rng.shuffle(feats)
    style = draw(st.sampled_from(["demo", "numeric"]))
    for name in feats:
        arr = _feature_array(draw, name, n + offset, rng, style)
        cols.append(arr if not pa.types.is_null(arr.type) else
                    pa.array(np.full(n + offset, np.nan)))
        names.append(name)
    if draw(st.booleans()):
        cols.append(pa.array([f"note {i}" for i in range(n + offset)]))
        names.append("note")
    table = pa.Table.from_arrays(cols, names=names)
    return table.slice(offset, n) if offset else table


def ipc_bytes(table: pa.Table, compression: str | None, chunks: int) -> bytes:
    sink = pa.BufferOutputStream()
    opts = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=opts) as w:
        if chunks > 1 and table.num_rows > 1:
            step = max(1, table.num_rows // chunks)
            for b in table.to_batches(max_chunksize=step):
                w.write_batch(b)
        else:
            w.write_table(table)
    return sink.getvalue().to_pybytes()


def messages_of(data: bytes) -> list[tuple[int, int, int]]:
    """(metadata start, metadata end, body end) of each IPC message in a stream."""
    out, pos = [], 0
    while pos + 8 <= len(data):
        cont, mlen = struct.unpack_from("<Ii", data, pos)
        if cont != 0xFFFFFFFF or mlen <= 0:
            break
        start = pos + 8
        end = start + mlen
        body = _body_length(data[start:end])
        out.append((start, end, end + body))
        pos = end + body
    return out


def _body_length(meta: bytes) -> int:
    """Message.bodyLength from the flatbuffer (field 3 of the root table), 0 when absent."""
    try:
        root = struct.unpack_from("<I", meta, 0)[0]
        vt = root - struct.unpack_from("<i", meta, root)[0]
        vt_len = struct.unpack_from("<H", meta, vt)[0]
        if vt_len < 4 + 2 * 4:
            return 0
        off = struct.unpack_from("<H", meta, vt + 4 + 2 * 3)[0]
        return struct.unpack_from("<q", meta, root + off)[0] if off else 0
    except struct.error:
        return 0


@st.composite
def mutated(draw, data: bytes, table: pa.Table) -> tuple[bytes, str]:
    """One mutation of an IPC stream; returns (bytes, what was done)."""
    kind = draw(st.sampled_from(["none", "none", "row_lie", "row_lie", "row_lie", "meta_lie",
                                 "meta_lie", "body_lie", "body_lie", "bitflip", "truncate",
                                 "field_lie", "field_lie", "field_lie", "big_endian",
                                 "size_lie", "shift", "batch_metadata", "experimental",
                                 "schema_features", "bomb"]))
    buf = bytearray(data)
    msgs = messages_of(data)
    if kind == "none" or not buf:
        return bytes(buf), "none"
    if kind == "field_lie":  # the batch's row count, node lengths, null counts at the edges
        lie = draw(st.sampled_from(_LIES))
        how = draw(st.sampled_from(["length", "nodes", "both", "nulls", "both_nulls"]))
        try:
            nodes = len(ipc_forge.record_batch(data, len(msgs) - 1)["nodes"])
            nulls = {j: (1 if how == "both_nulls" else lie) for j in range(nodes)}
            kw = {"length": {"length": lie}, "nodes": {"node_lengths": lie},
                  "both": {"length": lie, "node_lengths": lie},
                  "nulls": {"null_counts": nulls},
                  "both_nulls": {"length": lie, "node_lengths": lie,
                                 "null_counts": nulls}}[how]
            return ipc_forge.lie(data, k=len(msgs) - 1, **kw), f"field_lie {how} {lie}"
        except (IndexError, struct.error, TypeError):
            return bytes(buf), "none"
    if kind == "big_endian":  # flat fixed-width and boolean columns only
        try:
            schema = pa.ipc.open_stream(data).schema
            if len(msgs) == 2:
                return ipc_forge.big_endian(data, schema), "big_endian"
        except (ValueError, pa.ArrowException, struct.error, IndexError):
            pass
        return bytes(buf), "none"
    if kind == "bomb":  # a real one: true sizes, past delivery.max_message_rows (1,000,000)
        rows = 1_100_000
        codec_name = draw(st.sampled_from(["zstd", "lz4"]))
        zeros = pa.array(np.zeros(rows, np.float32))
        t = pa.table({ID: pa.array(np.zeros(rows, np.int64)),
                      **{name: zeros for name in FEATURES}})
        return ipc_bytes(t, codec_name, 1), f"bomb {rows} rows {codec_name}"
    if kind == "shift" and len(msgs) >= 2:  # a batch's flatbuffer off its alignment
        by = draw(st.sampled_from([1, 2, 4, 8, 12]))
        try:
            return ipc_forge.shift(data, k=len(msgs) - 1, by=by), f"shift {by}"
        except (IndexError, struct.error):
            return bytes(buf), "none"
    if kind in ("batch_metadata", "experimental") and table.num_rows:
        # custom metadata on the batches (Arrow 0.17 named its compression there), broken
        # by an offset lie or not
        codec_name = draw(st.sampled_from(["zstd", "lz4", "bogus"]))
        experimental = kind == "experimental"
        meta = {"ARROW:experimental_compression": codec_name} if experimental else \
            {"k": "v" * draw(st.integers(0, 40))}
        sink = pa.BufferOutputStream()
        opts = pa.ipc.IpcWriteOptions(compression="zstd" if experimental else None)
        try:
            with pa.ipc.new_stream(sink, table.schema, options=opts) as w:
                for b in table.to_batches():
                    w.write_batch(b, custom_metadata=meta)
            out = sink.getvalue().to_pybytes()
            if experimental:
                return ipc_forge.experimental_compression(out), f"experimental {codec_name}"
            if draw(st.booleans()):
                lie = draw(st.sampled_from([0, 1, 2, 3, 2**31 - 1, 2**32 - 1]))
                return ipc_forge.custom_metadata_offset(out, value=lie), f"batch_metadata @{lie}"
            return out, "batch_metadata"
        except (IndexError, struct.error, AssertionError, pa.ArrowException):
            return bytes(buf), "none"
    if kind == "schema_features":  # flags pyarrow's writer never declares
        flags = draw(st.lists(st.sampled_from([0, 1, 2, 3, 2**31, 2**63 - 1, -1]),
                              min_size=1, max_size=3))
        try:
            schema = pa.ipc.open_stream(data).schema
            return ipc_forge.with_features(data, schema, flags), f"schema_features {flags}"
        except (ValueError, pa.ArrowException, struct.error, IndexError):
            return bytes(buf), "none"
    if kind == "size_lie":  # every compressed buffer's size prefix (a bomb of lies)
        lie = draw(st.sampled_from(_LIES + [1 << 30, 5 << 30]))
        start, end, body_end = msgs[-1] if msgs else (0, 0, 0)
        hit = 0
        for off in range(end, body_end - 8, 8):
            if 0 < struct.unpack_from("<q", buf, off)[0] < 1 << 20:
                struct.pack_into("<q", buf, off, lie)
                hit += 1
        return bytes(buf), f"size_lie {lie} x{hit}"
    if kind == "row_lie":
        # the record batch length and every field node length hold the row count
        lie = draw(st.sampled_from(_LIES))
        pat = struct.pack("<q", table.num_rows)
        hits = [i for i in range(len(buf) - 7) if buf[i:i + 8] == pat]
        if not hits:
            return bytes(buf), "none"
        every = draw(st.booleans())
        for i in hits if every else [draw(st.sampled_from(hits))]:
            buf[i:i + 8] = struct.pack("<q", lie)
        return bytes(buf), f"row_lie {lie} {'all' if every else 'one'}"
    if kind in ("meta_lie", "body_lie") and msgs:
        start, end, body_end = draw(st.sampled_from(msgs))
        lo, hi = (start, end) if kind == "meta_lie" else (end, body_end)
        if hi - lo < 8:
            return bytes(buf), "none"
        pos = lo + 8 * draw(st.integers(0, (hi - lo) // 8 - 1))
        lie = draw(st.sampled_from(_LIES))
        width = draw(st.sampled_from([8, 4]))
        buf[pos:pos + width] = struct.pack("<q" if width == 8 else "<i",
                                           lie if width == 8 else max(min(lie, 2**31 - 1),
                                                                      -(2**31)))
        return bytes(buf), f"{kind} @{pos} {lie}/{width}"
    if kind == "bitflip":
        flips = draw(st.lists(st.integers(0, len(buf) * 8 - 1), min_size=1, max_size=8))
        for b in flips:
            buf[b >> 3] ^= 1 << (b & 7)
        return bytes(buf), f"bitflip {flips}"
    cut = draw(st.integers(0, len(buf) - 1))
    return bytes(buf[:cut]), f"truncate {cut}"


@st.composite
def one(draw) -> tuple[bytes, str]:
    table = draw(tables())
    compression = draw(st.sampled_from([None, None, "lz4", "zstd"]))
    chunks = draw(st.sampled_from([1, 1, 3]))
    data = ipc_bytes(table, compression, chunks)
    value, what = draw(mutated(data, table))
    return value, f"{what}; rows {table.num_rows}, compression {compression}, chunks {chunks}"


BATCH = b"SWFUZZBATCH\0"  # a case of several messages: magic, count, lengths, messages


def pack(values: list[bytes]) -> bytes:
    return BATCH + struct.pack(f"<I{len(values)}Q", len(values), *map(len, values)) + \
        b"".join(values)


def unpack(data: bytes) -> list[bytes]:
    if not data.startswith(BATCH):
        return [data]
    pos = len(BATCH)
    (n,) = struct.unpack_from("<I", data, pos)
    lens = struct.unpack_from(f"<{n}Q", data, pos + 4)
    pos += 4 + 8 * n
    out = []
    for ln in lens:
        out.append(data[pos:pos + ln])
        pos += ln
    return out


@st.composite
def cases(draw) -> tuple[bytes, str]:
    if draw(st.integers(0, 5)):
        return draw(one())
    # a batch: messages of one schema (dictionary ids of different dictionaries, say) and
    # others, scored together as the run loop scores a batch
    n = draw(st.integers(2, 4))
    parts = [draw(one()) for _ in range(n)]
    if draw(st.booleans()):  # the same schema, each with its own dictionary of ids
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        values = []
        for k in range(n):
            t = _usual(draw, 5, 0, rng)
            t = t.set_column(0, ID, pa.array([f"m{k}-{i}" for i in range(5)])
                             .dictionary_encode())
            values.append(ipc_bytes(t, None, 1))
        return pack(values), f"batch of {n}: dictionary ids"
    return pack([v for v, _ in parts]), "batch: " + " | ".join(w for _, w in parts)


def as_record(value: bytes, i: int) -> Record:
    return Record("fuzz", 0, i, b"k", value, 1, [("content-type", b"x")])


def features_numpy(table: pa.Table) -> np.ndarray:
    """The model's features as float64, missing -> NaN: the oracle the scores are checked with
    (pyarrow's own conversions, no code of ours)."""
    cols = []
    for name in FEATURES:
        c = table.column(name).combine_chunks()
        if pa.types.is_null(c.type):
            cols.append(np.full(table.num_rows, np.nan, dtype=np.float32))
            continue
        missing = c.is_null().to_numpy(zero_copy_only=False)
        if pa.types.is_boolean(c.type):
            c = pc.cast(c, pa.int8())
        # integers straight to float32 (as the staging does), never through float64
        v = c.fill_null(0).to_numpy(zero_copy_only=False).astype(np.float32)
        v[missing] = np.nan
        cols.append(v)
    return np.column_stack(cols)


def prime(pipeline, value: bytes) -> None:
    """Show the decoder the message's schema alone first (a stream with no batch: refused as
    empty, its schema cached), so that the record batch after it takes the cached-schema
    path, read in C (``worker._ipc``), as every message after the first of a schema does."""
    if len(value) >= 8 and value[:4] == b"\xff\xff\xff\xff":
        n = struct.unpack_from("<i", value, 4)[0]
        if 0 < n <= len(value) - 8:
            pipeline.decode(as_record(value[:8 + n] + b"\xff\xff\xff\xff\x00\x00\x00\x00", -1))


def check(pipeline, data: bytes, i: int) -> str:
    """Run one case (a message, or a batch of them) through the worker's message path; raise
    AssertionError on any broken invariant. Returns 'scored' or the dead-letter code (of a
    batch: its outcomes joined by '+')."""
    values = unpack(data)
    recs = [as_record(v, 10 * i + k) for k, v in enumerate(values)]
    if i % 2:  # every other case: its schema cached first (the C reader's path)
        prime(pipeline, values[0])
    items = [(rec, pipeline.decode(rec)) for rec in recs]
    outputs, dead, _stats = pipeline.process(items)
    assert len(outputs) + len(dead) == len(recs), \
        f"{len(outputs)} outputs, {len(dead)} dead letters for {len(recs)} messages"
    by_origin = {r.origin[2]: r for r in outputs}
    ends = []
    for rec, value in zip(recs, values, strict=True):
        letter = next((d for d in dead if d.offset == rec.offset), None)
        if letter is not None:
            h = dict(letter.headers)
            code = h["error_code"].decode()
            ends.append(code if code != "invalid" else f"invalid: {h['error'].decode()[:80]}")
            continue
        assert rec.offset in by_origin, "a message neither scored nor dead-lettered"
        ends.append(_check_scored(pipeline, value, by_origin[rec.offset]))
    if len(ends) == 1:
        return ends[0]
    return f"batch of {len(ends)}, {ends.count('scored')} scored"


def _check_scored(pipeline, value: bytes, output) -> str:
    """The oracle: the message read alone by pyarrow, the output read back."""
    try:
        # the columns the worker reads, read alone (extra columns are ignored, valid or not,
        # and never decompressed)
        schema = pa.ipc.open_stream(value).schema
        read = sorted(schema.get_field_index(n) for n in FEATURES + [ID])
        opts = pa.ipc.IpcReadOptions(included_fields=read)
        table = pa.ipc.open_stream(value, options=opts).read_all().select(FEATURES + [ID])
        table.validate(full=True)
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"scored a message that is not valid Arrow: {exc}") from None
    out = pa.ipc.open_stream(output.value).read_all()
    out.validate(full=True)
    assert out.num_rows == table.num_rows, (out.num_rows, table.num_rows)
    assert _same_ids(out.column("id"), table.column(ID)), "the ids are not the message's ids"
    want = pipeline.model.predict_proba(features_numpy(table), n_threads=1)
    got = out.column("score").to_numpy()
    np.testing.assert_array_equal(got, want[:, 1])
    return "scored"


def _same_ids(a, b) -> bool:
    """Equal ids: Arrow's equality, or for floating ids the same nulls and the same bits
    (Arrow's ``equals`` holds NaN unequal to itself; an id is passed through bit for bit)."""
    if a.equals(b):
        return True
    if not (pa.types.is_floating(a.type) and a.type == b.type):
        return False
    a, b = a.combine_chunks(), b.combine_chunks()
    if not a.is_null().equals(b.is_null()):
        return False
    valid = np.asarray(a.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    x, y = a.to_numpy(zero_copy_only=False), b.to_numpy(zero_copy_only=False)
    word = {2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize]
    return bool(np.array_equal(x.view(word)[valid], y.view(word)[valid]))


def check_factory(state):
    """The child's check: the golden model behind the worker's own Pipeline (one thread).
    Every case is also appended to ``cases.arrows`` (a recorded topic) so that the whole run
    loop can replay them afterwards."""
    from worker.config import load_settings
    from worker.io.records import RecordWriter
    from worker.model.compiled import load_model
    from worker.pipeline import Pipeline

    from .runner import GOLDEN_MODEL

    model = load_model(GOLDEN_MODEL)
    settings = load_settings(None, scoring={"id_column": ID, "threads": 1},
                             model={"path": str(GOLDEN_MODEL)},
                             source={"type": "file", "path": "fuzz.arrows"})
    pipeline = Pipeline(model, settings, "scores")
    writer = RecordWriter(state / "cases.arrows")
    pending: list[Record] = []

    def run(value: bytes, what: str, i: int) -> str:
        pending.append(as_record(value, i))
        if len(pending) >= 50:
            writer.write(pending)
            pending.clear()
        return check(pipeline, value, i)

    import atexit

    atexit.register(lambda: (writer.write(pending), writer.close()))
    return run


def through(pipeline, data: bytes, i: int, refused, scored) -> str:
    """Run a case of another format (a batch of values, ``pack``) through the pipeline: each
    value either dead-lettered, then ``refused(value, code, error)`` judges it, or scored,
    then ``scored(value, output)``. Returns the outcome, as ``check`` does."""
    values = unpack(data)
    recs = [Record("in", 0, 10 * i + k, None, v, 0, []) for k, v in enumerate(values)]
    outputs, dead, _ = pipeline.process([(rec, pipeline.decode(rec)) for rec in recs])
    assert len(outputs) + len(dead) == len(recs), "a message neither scored nor dead-lettered"
    by_origin = {r.origin[2]: r for r in outputs}
    ends = []
    for rec, value in zip(recs, values, strict=True):
        letter = next((d for d in dead if d.offset == rec.offset), None)
        if letter is not None:
            h = dict(letter.headers)
            code = h["error_code"].decode()
            refused(value, code, h["error"].decode())
            ends.append(code)
            continue
        scored(value, by_origin[rec.offset])
        ends.append("scored")
    return ends[0] if len(ends) == 1 else f"batch of {len(ends)}, {ends.count('scored')} scored"
