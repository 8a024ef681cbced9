"""Hostile input, round two (issue 31): lies at integer edges in row counts, node lengths and
null counts; headers that take the worker's names; dead letters too large to carry the
input's key and headers. Each message is scored as pyarrow reads it alone, or dead-lettered;
nothing crashes."""

from __future__ import annotations

import struct
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from tests import ipc_forge as F
from tests.test_hostile_runs import MODEL, ROOT, _message, _recording
from worker import codec, demo
from worker.io.records import Record, read_records

EDGES = [2**31 - 1, 2**31, 2**32, 2**32 + 1, 2**62, 2**63 - 1, -1, -(2**63)]


def _pair(n=50):
    """A message that primes the schema's plan, and a second of the same schema."""
    ids = pa.array(np.arange(n, dtype=np.int64))
    return _message(n, 1, ids), _message(n, 2, ids)


def test_a_row_count_near_2_63_with_a_null_is_dead_lettered_not_a_sigsegv(tmp_path):
    # before: (length + 7) // 8 wrapped in signed 64-bit arithmetic, the bitmap check passed
    # and count_unset read far past the message: the worker died of SIGSEGV (-11) on the
    # second message of the schema
    first, second = _pair()
    forged = F.lie(second, length=2**63 - 1, node_lengths=2**63 - 1,
                   null_counts={j: 1 for j in range(1, 15)})  # a null on every feature
    rec = _recording(tmp_path / "in.arrows", [first, forged])
    out = tmp_path / "out.arrows"
    proc = subprocess.run([sys.executable, "-m", "worker.cli", "replay", str(rec), "--model",
                           str(MODEL), "--output", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert len(list(read_records(out))) == 1  # the first message is scored
    (dead,) = read_records(tmp_path / "out-dlq.arrows")
    assert dict(dead.headers)["error_code"] == b"too_large"
    assert dead.value == forged


@pytest.mark.parametrize("edge", EDGES)
@pytest.mark.parametrize("what", ["length", "nodes", "both", "nulls"])
def test_integer_edges_are_read_as_pyarrow_reads_them_or_refused(edge, what):
    first, second = _pair()
    kw = {"length": {"length": edge}, "nodes": {"node_lengths": edge},
          "both": {"length": edge, "node_lengths": edge,
                   "null_counts": {j: 1 for j in range(1, 15)}},
          "nulls": {"null_counts": {3: edge, 4: edge}}}[what]
    forged = F.lie(second, **kw)
    _read_as_pyarrow_reads_it_or_refused(first, forged)


def _read_as_pyarrow_reads_it_or_refused(first: bytes, forged: bytes, must_read=False):
    """The decoder refuses ``forged`` only where pyarrow cannot read and validate it
    either (no over-refusal), and reads what it reads row for row."""
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_rows=100_000)
    dec.decode_keyed(first)  # the schema's plan: the second message is read in C
    try:
        got = dec.decode(forged)
    except codec.InvalidMessage as exc:
        assert not must_read, exc
        with pytest.raises(Exception):  # noqa: B017 (whatever pyarrow raises: it cannot)
            pa.ipc.open_stream(forged).read_all().validate(full=True)
        return  # dead-lettered, as it must be
    alone = pa.ipc.open_stream(forged).read_all()  # pyarrow reads it: the same rows
    alone.validate(full=True)
    assert got.num_rows == alone.num_rows
    for name in demo.FEATURES:
        assert got.column(name).equals(alone.column(name).combine_chunks())


@pytest.mark.parametrize("kw", [{"length": 50}, {"node_lengths": 50},
                                {"length": 49, "node_lengths": 49},
                                {"null_counts": {3: 0, 4: 0}}],
                         ids=["length", "nodes", "both-49", "nulls-0"])
def test_counts_pyarrow_reads_are_read_alike(kw):
    """The other half of the edge test (issue 55: every edge there is refused, so the
    "read as pyarrow reads them" branch never ran): counts a valid message can carry, one
    row fewer among them, are read row for row."""
    first, second = _pair()
    _read_as_pyarrow_reads_it_or_refused(first, F.lie(second, **kw), must_read=True)


def test_input_headers_never_take_the_workers_names(tmp_path):
    # before: an input's MODEL_ID, Content-Type, error_code or source_offset came before (or
    # instead of) the worker's own on outputs and dead letters
    from tests.test_batches import RecordingSink, _rec, _worker

    forged = [("MODEL_ID", b"forged"), ("Content-Type", b"text/plain"),
              ("error_code", b"none"), ("source_offset", b"-1"), ("traceparent", b"00-a-b-01")]
    w = _worker(None, RecordingSink())
    good = _rec(0, 0, headers=forged)
    bad = Record("in", 0, 1, b"k", b"not arrow", 1, list(forged))
    outputs, dead, _ = w.pipeline.process([(good, w.pipeline.decode(good)),
                                           (bad, w.pipeline.decode(bad))])
    for r, own in ((outputs[0], ["content-type", "model_id"]),
                   (dead[0], ["error", "error_code", "source_topic", "source_partition",
                              "source_offset", "model_id"])):
        keys = [k for k, _v in r.headers]
        assert keys[:len(own)] == own
        lowered = [k.lower() for k in keys]
        assert all(lowered.count(k) == 1 for k in own), keys
        assert ("traceparent", b"00-a-b-01") in r.headers
        assert ("input-MODEL_ID", b"forged") in r.headers
    assert dict(dead[0].headers)["source_offset"] == b"1"


def test_a_dead_letter_too_large_for_its_input_key_and_headers_drops_them():
    from tests.test_batches import RecordingSink, _worker

    w = _worker(None, RecordingSink())
    w.pipeline.max_dead_bytes = 4096
    bad = Record("in", 0, 1, b"k" * 10_000, b"not arrow", 1, [("big", b"x" * 10_000)])
    (letter,) = w.pipeline.process([(bad, w.pipeline.decode(bad))])[1]
    h = dict(letter.headers)
    assert letter.value is None and letter.key is None and "big" not in h
    assert h["error_code"] == b"not_arrow" and "input_dropped" in h and "value_dropped" in h


def out_columns(table: pa.Table) -> int:
    return table.num_columns


def _stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def test_a_big_endian_message_reads_the_same_three_ways():
    # before: the first message of a big-endian schema was read by pyarrow's stream reader
    # (which swaps), the later ones by the C reader or the cached-schema reader (which do
    # not): id 2000 became -3456794188983566336 and the scores changed, nothing dead-lettered
    def table(seed):
        t = demo.generate(20, seed=seed).select(demo.FEATURES)
        t = t.cast(pa.schema([pa.field(f.name, pa.float64() if pa.types.is_floating(f.type)
                                       else f.type) for f in t.schema]))
        return t.add_column(0, demo.ID_COLUMN, pa.array(np.arange(2000, 2020)))

    first = F.big_endian(_stream(table(1)), table(1).schema)
    second = F.big_endian(_stream(table(2)), table(2).schema)
    alone = pa.ipc.open_stream(second).read_all()  # pyarrow's stream reader swaps
    assert alone.column(demo.ID_COLUMN).to_pylist()[0] == 2000
    for native in (True, False):  # the C reader, then the cached-schema pyarrow reader
        dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, native=native)
        dec.decode(first)
        got = dec.decode(second)
        for name in [demo.ID_COLUMN, *demo.FEATURES]:
            assert got.column(name).equals(alone.column(name).combine_chunks()), name


@pytest.mark.parametrize("kind", ["dictionary", "string", "list", "struct", "int64"])
def test_each_output_carries_only_its_own_messages_ids(kind):
    # before: a batch's dictionary-encoded id columns were unified by concat_batches and each
    # output sliced from it carried the whole unified dictionary: every customer's ids in
    # every output, outputs growing with the square of the batch
    def ids(k, n=6):
        names = [f"cust{k}-{i}" for i in range(n)]
        return {"dictionary": pa.array(names).dictionary_encode(),
                "string": pa.array(names),
                "list": pa.array([[k, i] for i in range(n)]),
                "struct": pa.array([{"c": k, "i": i} for i in range(n)]),
                "int64": pa.array(np.arange(n) + 100 * k)}[kind]

    import worker
    from worker.config import load_settings
    from worker.pipeline import Pipeline

    model = worker.load_model(MODEL)
    settings = load_settings(None, model={"path": str(MODEL)},
                             scoring={"id_column": demo.ID_COLUMN},
                             source={"type": "kafka", "topic": "in"},
                             logging={"progress": False})
    msgs = [_message(6, k, ids(k)) for k in range(5)]
    recs = [Record("in", 0, k, b"k", v, 1, []) for k, v in enumerate(msgs)]

    def outputs(rs):
        p = Pipeline(model, settings, "scores")
        out, dead, _ = p.process([(r, p.decode(r)) for r in rs])
        assert not dead, [dict(d.headers)["error"] for d in dead]
        return out

    together = outputs(recs)
    assert len(together) == len(recs)
    for r, out in zip(recs, together, strict=True):
        (single,) = outputs([r])
        got = pa.ipc.open_stream(out.value).read_all()
        want = pa.ipc.open_stream(single.value).read_all()
        assert got.equals(want)
        # its own share: the size of that message's output alone (sliced result columns may
        # pad a buffer: a few bytes a column, never another message's data)
        assert len(out.value) <= len(single.value) + 8 * out_columns(got)
        if kind == "dictionary":
            assert got.column("id").chunk(0).dictionary.to_pylist() == \
                [f"cust{r.offset}-{i}" for i in range(6)]


def _compressed(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    opts = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, table.schema, options=opts) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _bomb_table(rows: int) -> pa.Table:
    zeros = np.zeros(rows, np.float32)
    t = pa.table({name: pa.array(zeros) for name in demo.FEATURES})
    return t.add_column(0, demo.ID_COLUMN, pa.array(np.zeros(rows, dtype=np.int64)))


def test_a_real_compression_bomb_is_refused_before_it_is_inflated():
    # 4 M rows of zeros: ~250 MB decoded from well under 1 MB; the limit is 16 MB
    value = _compressed(_bomb_table(4_000_000))
    assert len(value) < 1 << 20
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=16 << 20)
    with pytest.raises(codec.InvalidMessage, match="^too_large"):
        dec.decode_keyed(value)
    small = _compressed(_bomb_table(1000))  # the same form, under the limit: scored
    assert dec.decode(small).num_rows == 1000


def test_a_lying_size_prefix_is_refused_before_anything_is_decompressed():
    import struct

    value = bytearray(_compressed(_bomb_table(1000)))
    (meta, n), = F.messages(bytes(value))[1:]
    body = meta + n  # the first buffer with data starts the body's compressed buffers
    rb = F.record_batch(bytes(value))
    assert rb  # a record batch is there
    # every 8-byte size prefix of a compressed buffer in the body claims 1.25 GB
    for off in range(body, len(value) - 16, 8):
        if struct.unpack_from("<q", value, off)[0] == 4000:  # 1000 float32 values
            struct.pack_into("<q", value, off, 1_250_000_000)
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=64 << 20)
    with pytest.raises(codec.InvalidMessage, match="^too_large"):
        dec.decode_keyed(bytes(value))


def test_an_unread_compressed_column_is_never_decompressed():
    # a column the model does not read whose compressed buffer is garbage: decompressing it
    # would fail (invalid_arrow), so reading the message proves it never was (issue 55: the
    # old check, "blob" absent from the output, held whether or not it was decompressed)
    t = _bomb_table(1000).append_column("blob", pa.array(np.zeros(1000, np.float64)))
    data = bytearray(_compressed(t))
    blob = F.body_buffers(bytes(data))[-1]  # the last column's values (compressed)
    assert blob[1] > 8
    data[blob[0] + 8:blob[0] + blob[1]] = b"\xa5" * (blob[1] - 8)  # the frame after its size
    with pytest.raises(Exception):  # noqa: B017 (pyarrow, reading every column, cannot)
        pa.ipc.open_stream(bytes(data)).read_all().validate(full=True)
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=64 << 20)
    got = dec.decode(bytes(data))
    assert got.num_rows == 1000 and "blob" not in got.schema.names


def _batches_stream(batches, **options):
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema,
                           options=pa.ipc.IpcWriteOptions(**options)) as w:
        for b in batches:
            w.write_batch(b)
    return sink.getvalue().to_pybytes()


def _small(start, rows=2, ids=None):
    cols = {name: pa.array(np.full(rows, 0.5, np.float32)) for name in demo.FEATURES}
    t = pa.table(cols).add_column(0, demo.ID_COLUMN, ids if ids is not None else
                                  pa.array(np.arange(start, start + rows, dtype=np.int64)))
    return t.to_batches()[0]


def test_a_message_of_more_record_batches_than_the_cap_is_too_large():
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=64 << 20)
    at_cap = _batches_stream([_small(2 * i) for i in range(codec.MAX_BATCHES)])
    got = dec.decode(at_cap)  # the cap itself is read, every row
    assert got.column(demo.ID_COLUMN).to_pylist() == list(range(2 * codec.MAX_BATCHES))
    with pytest.raises(codec.InvalidMessage, match="^too_large.*record batches"):
        dec.decode_keyed(_batches_stream([_small(2 * i) for i in range(codec.MAX_BATCHES + 1)]))


def test_a_message_of_more_dictionary_batches_than_the_cap_is_too_large():
    # every batch grows the id column's dictionary: one delta a batch
    def batches(k):
        words = [f"card-{i}" for i in range(2 * k)]
        return [_small(0, ids=pa.DictionaryArray.from_arrays(
            pa.array([2 * i, 2 * i + 1], pa.int32()), pa.array(words[:2 * i + 2])))
            for i in range(k)]

    def dictionary_batches(value):
        reader = pa.ipc.open_stream(value)
        reader.read_all()
        return reader.stats.num_dictionary_batches

    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=64 << 20)
    ok = _batches_stream(batches(codec.MAX_DICTIONARY_BATCHES), emit_dictionary_deltas=True)
    assert dictionary_batches(ok) == codec.MAX_DICTIONARY_BATCHES
    got = dec.decode(ok)
    assert got.column(demo.ID_COLUMN).to_pylist() == \
        [f"card-{i}" for i in range(2 * codec.MAX_DICTIONARY_BATCHES)]
    over = _batches_stream(batches(codec.MAX_DICTIONARY_BATCHES + 1), emit_dictionary_deltas=True)
    assert dictionary_batches(over) == codec.MAX_DICTIONARY_BATCHES + 1
    with pytest.raises(codec.InvalidMessage, match="^too_large.*dictionary batches"):
        dec.decode_keyed(over)


@pytest.mark.parametrize("by", [2, 4, 8, 12])
def test_a_misaligned_flatbuffer_is_read_only_if_pyarrow_verifies_it(by):
    # before: the C reader scored a record batch whose int64 fields and structs sat 4 bytes
    # off their alignment, which pyarrow's flatbuffer verifier refuses
    first, second = _pair()
    forged = F.shift(second, by=by)
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN)
    dec.decode_keyed(first)  # the schema's plan: the C reader reads the second
    try:
        alone = pa.ipc.open_stream(forged).read_all()
    except (pa.ArrowException, OSError):  # Invalid flatbuffers message
        with pytest.raises(codec.InvalidMessage, match="^not_arrow"):
            dec.decode_keyed(forged)
        return
    assert by % 8 == 0  # aligned again: read as pyarrow reads it
    got = dec.decode(forged)
    for name in [demo.ID_COLUMN, *demo.FEATURES]:
        assert got.column(name).equals(alone.column(name).combine_chunks())


def _with_batch_metadata(table, metadata, compression=None):
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema,
                           options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        for b in table.to_batches():
            w.write_batch(b, custom_metadata=metadata)
    return sink.getvalue().to_pybytes()


def _noise_table(seed, n=200):
    # incompressible columns: the zstd writer stores them with the -1 (as they are) prefix,
    # so read as uncompressed they are other numbers, not an error
    rng = np.random.default_rng(seed)
    cols = {demo.ID_COLUMN: pa.array(rng.integers(0, 2**62, n))}
    cols.update({f: pa.array(rng.integers(0, 2**31, n, dtype=np.uint32).view(np.float32))
                 for f in demo.FEATURES})
    return pa.table(cols)


@pytest.mark.parametrize("native", [True, False])
def test_arrow_0_17_compression_is_refused_not_read_as_raw_bytes(native):
    # before: the C reader read such buffers as uncompressed (an id became the size prefix
    # of its compressed buffer, 1600) while pyarrow alone decompresses them; and the size
    # check never saw them (a bomb)
    first = _with_batch_metadata(_noise_table(1), None)
    forged = F.experimental_compression(_with_batch_metadata(
        _noise_table(2), {"ARROW:experimental_compression": "zstd"}, "zstd"))
    alone = pa.ipc.open_stream(forged).read_all()  # pyarrow reads it, decompressing
    assert alone.column(demo.ID_COLUMN).equals(_noise_table(2).column(demo.ID_COLUMN))
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, native=native)
    dec.decode_keyed(first)
    with pytest.raises(codec.InvalidMessage, match="^not_arrow.*experimental_compression"):
        dec.decode_keyed(forged)
    with pytest.raises(codec.InvalidMessage, match="^not_arrow"):
        codec.Decoder(demo.FEATURES, demo.ID_COLUMN).decode_keyed(forged)  # not primed


def test_batch_custom_metadata_is_read_as_pyarrow_reads_it_and_broken_is_refused():
    first, _ = _pair()
    t = demo.generate(50, seed=2).select(demo.FEATURES).add_column(
        0, demo.ID_COLUMN, pa.array(np.arange(50, dtype=np.int64)))
    tagged = _with_batch_metadata(t, {"trace": "abc"})
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN)
    dec.decode_keyed(first)
    got = dec.decode(tagged)
    alone = pa.ipc.open_stream(tagged).read_all()
    for name in [demo.ID_COLUMN, *demo.FEATURES]:
        assert got.column(name).equals(alone.column(name).combine_chunks())
    # before: the C reader never looked at the custom metadata pyarrow's verifier checks,
    # and scored this message, which pyarrow alone refuses
    broken = F.custom_metadata_offset(tagged)
    with pytest.raises(OSError, match="flatbuffers"):
        pa.ipc.open_stream(broken).read_all()
    with pytest.raises(codec.InvalidMessage, match="^not_arrow"):
        dec.decode_keyed(broken)
    with pytest.raises(codec.InvalidMessage, match="^not_arrow"):
        dec.decode(broken)


def test_batches_sharing_a_large_dictionary_are_bounded_by_the_work_they_cost():
    # validation checks, and concatenation unifies, a shared dictionary once a batch: 200
    # one-row batches of one 1 MB dictionary are 200 MB of work from a message of 1 MB
    dictionary = pa.array(["x" * (1 << 20)])

    def message(batches):
        ids = pa.DictionaryArray.from_arrays(pa.array([0], pa.int32()), dictionary)
        b = pa.record_batch({demo.ID_COLUMN: ids, **{f: pa.array(np.zeros(1, np.float32))
                                                     for f in demo.FEATURES}})
        return _batches_stream([b] * batches)

    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=64 << 20)
    assert dec.decode(message(20)).num_rows == 20  # 20 MB of work: read
    big = message(200)
    assert len(big) < 2 << 20
    with pytest.raises(codec.InvalidMessage, match="^too_large.*share dictionaries"):
        dec.decode_keyed(big)


def test_string_view_ids_are_read_and_bounded_by_the_bytes_they_view():
    n = 30
    ids = pa.array([f"card-{i:04d}-" + "y" * 40 for i in range(n)], pa.string_view())
    t = demo.generate(n, seed=3).select(demo.FEATURES).add_column(0, demo.ID_COLUMN, ids)
    value = _stream(t)
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=64 << 20)
    got = dec.decode(value)
    assert got.column(demo.ID_COLUMN).equals(pa.ipc.open_stream(value).read_all()
                                             .column(demo.ID_COLUMN).combine_chunks())
    # 2,000 views of the same 100 KB: 200 MB of UTF-8 to check from a message of 100 KB
    data = b"z" * 100_000
    views = np.zeros((2000, 4), np.int32)
    views[:, 0] = len(data)
    views[:, 1] = np.frombuffer(data[:4], np.int32)[0]  # the prefix; buffer 0, offset 0
    ids = pa.Array.from_buffers(pa.string_view(), 2000, [None, pa.py_buffer(views.tobytes()),
                                                         pa.py_buffer(data)])
    t = pa.table({demo.ID_COLUMN: ids, **{f: pa.array(np.zeros(2000, np.float32))
                                         for f in demo.FEATURES}})
    with pytest.raises(codec.InvalidMessage, match="string views") as e:
        dec.decode_keyed(_stream(t))
    assert e.value.code == "too_large"


@pytest.mark.parametrize("id_type", [pa.list_view(pa.int64()),
                                     pa.struct([("card", pa.string_view())])])
def test_views_inside_an_id_column_are_refused(id_type):
    ids = pa.array([[1], [2]] if pa.types.is_list_view(id_type) else
                   [{"card": "a"}, {"card": "b"}], id_type)
    t = demo.generate(2, seed=3).select(demo.FEATURES).add_column(0, demo.ID_COLUMN, ids)
    with pytest.raises(codec.InvalidMessage, match="^bad_type.*views"):
        codec.Decoder(demo.FEATURES, demo.ID_COLUMN).decode_keyed(_stream(t))


def test_schemas_with_large_metadata_are_scored_and_not_kept():
    # before: a cache keyed by schema bytes of any size kept 400 MB for 400 messages of
    # distinct 1 MB schema metadata
    import worker
    from worker.config import load_settings
    from worker.pipeline import Pipeline

    model = worker.load_model(MODEL)
    settings = load_settings(None, model={"path": str(MODEL)},
                             scoring={"id_column": demo.ID_COLUMN},
                             source={"type": "kafka", "topic": "in"}, logging={"progress": False})
    p = Pipeline(model, settings, "scores")
    values = []
    for k in range(20):
        t = demo.generate(5, seed=k).select(demo.FEATURES).add_column(
            0, demo.ID_COLUMN, pa.array(np.arange(5, dtype=np.int64)))
        values.append(_stream(t.replace_schema_metadata({"pad": f"{k}" * (256 << 10)})))
    recs = [Record("in", 0, k, b"k", v, 1, []) for k, v in enumerate(values)]
    for _ in range(2):  # a second time: the schemas are known, still nothing kept
        outputs, dead, _stats = p.process([(r, p.decode(r)) for r in recs])
        assert len(outputs) == 20 and not dead
    assert not p.format.decoder._plans  # the schemas' plans: none kept
    assert all(h is None or len(h[0]) + len(h[2]) <= codec._MAX_CACHED_SCHEMA
               for h in p.output.stream._heads.values())
    small = _stream(demo.generate(5, seed=1).select(demo.FEATURES).add_column(
        0, demo.ID_COLUMN, pa.array(np.arange(5, dtype=np.int64))))
    p.decode(Record("in", 0, 99, b"k", small, 1, []))
    assert len(p.format.decoder._plans) == 1  # a schema of a usual size is kept


def _struct_ids(children):
    ids = pa.StructArray.from_arrays(children, [f"c{j}" for j in range(len(children))])
    return pa.record_batch({demo.ID_COLUMN: ids, **{f: pa.array(np.zeros(1, np.float32))
                                                   for f in demo.FEATURES}})


@pytest.mark.parametrize("fields", [1, 40])
def test_fields_sharing_one_dictionary_count_it_once_a_field(fields):
    # before: 200 fields naming one 100 MB dictionary validated it 200 times (16 s) from a
    # message of 41 KB; the output wrote it once a field
    idx = pa.array([0], pa.int32())
    big = pa.array(["x" * (4 << 20)])  # 4 MB: 40 fields are 160 MB to check
    value = F.share_dictionary_ids(_batches_stream(
        [_struct_ids([pa.DictionaryArray.from_arrays(idx, big)] * fields)]), ident=0)
    alone = pa.ipc.open_stream(value).read_all()  # pyarrow reads it: each field, one dictionary
    assert alone.column(demo.ID_COLUMN).type.num_fields == fields
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=64 << 20)
    if fields == 1:
        assert dec.decode(value).column(demo.ID_COLUMN).equals(
            alone.column(demo.ID_COLUMN).combine_chunks())
        return
    with pytest.raises(codec.InvalidMessage, match="share dictionaries") as e:
        dec.decode_keyed(value)
    assert e.value.code == "too_large"


def test_buffers_sharing_bytes_are_refused():
    # before: 2,000 string fields whose buffers all pointed at one 420 KB region: a 637 KB
    # message checked 840 MB of UTF-8 and wrote an 840 MB output
    s = pa.array(["€" * 1000])
    value = _batches_stream([_struct_ids([s] * 50)])
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=64 << 20)
    assert dec.decode(value).num_rows == 1  # as written: read
    aliased = F.alias_buffers(value)
    assert len(aliased) < len(value) // 10
    alone = pa.ipc.open_stream(aliased).read_all()  # pyarrow reads it
    assert alone.column(demo.ID_COLUMN).nbytes > 50 * 3000
    with pytest.raises(codec.InvalidMessage, match="share bytes") as e:
        dec.decode_keyed(aliased)
    assert e.value.code == "invalid_arrow"


def test_string_views_in_several_batches_are_bounded_before_validation():
    # before: against a cached schema, each batch was validated before the views were
    # counted: 25,000 views of one 500 KB string took 10 s to refuse. Not UTF-8 here: counted
    # first, the views say too_large; validated first, they would fail validation
    def batch(n, length):
        data = b"\xff" * length
        views = np.zeros((n, 4), np.int32)
        views[:, 0] = len(data)
        views[:, 1] = np.frombuffer(data[:4], np.int32)[0]
        ids = pa.Array.from_buffers(pa.string_view(), n, [None, pa.py_buffer(views.tobytes()),
                                                          pa.py_buffer(data)])
        return pa.record_batch({demo.ID_COLUMN: ids, **{f: pa.array(np.zeros(n, np.float32))
                                                       for f in demo.FEATURES}})

    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=64 << 20, native=False)
    with pytest.raises(codec.InvalidMessage):  # the schema, cached (its views not UTF-8)
        dec.decode_keyed(_batches_stream([batch(2, 100)]))
    assert dec._plans
    value = _batches_stream([batch(2000, 100_000), batch(1, 100)])
    with pytest.raises(codec.InvalidMessage, match="string views") as e:
        dec.decode_keyed(value)
    assert e.value.code == "too_large"


# ---- found by mutation testing (issue 55, mutation/RESULTS.md: worker/codec.py) -----------

def _lz4(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema,
                           options=pa.ipc.IpcWriteOptions(compression="lz4")) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def test_a_buffer_stored_uncompressed_is_read_and_a_negative_size_refused():
    # the format lets a writer store a buffer compression would not shrink as it is, its size
    # prefix -1 (Arrow writers other than pyarrow's do): read as pyarrow reads it; any other
    # negative size is no size at all
    t = demo.generate(300, seed=3).select(demo.FEATURES)
    t = t.add_column(0, demo.ID_COLUMN, pa.array(np.arange(300, dtype=np.int64)))
    stored = F.stored_uncompressed(_lz4(t))
    assert pa.ipc.open_stream(stored).read_all().equals(t)  # the reference reads it
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=64 << 20)
    assert dec.decode(stored).equals(t.to_batches()[0])
    with pytest.raises(codec.InvalidMessage, match="^not_arrow.*negative size"):
        dec.decode_keyed(F.stored_uncompressed(_lz4(t), size=-2))


def test_the_stream_caps_hold_together():
    # MAX_BATCHES record batches and MAX_DICTIONARY_BATCHES dictionary batches in one
    # message (the schema, then both at their caps) is read, every row
    k, n = codec.MAX_DICTIONARY_BATCHES, codec.MAX_BATCHES
    words = [f"card-{i}" for i in range(2 * k)]
    batches = []
    for i in range(n):
        grown = min(i, k - 1)  # the first k batches each grow the dictionary: a delta each
        ids = pa.DictionaryArray.from_arrays(pa.array([2 * grown, 2 * grown + 1], pa.int32()),
                                             pa.array(words[:2 * grown + 2]))
        batches.append(_small(0, ids=ids))
    value = _batches_stream(batches, emit_dictionary_deltas=True)
    reader = pa.ipc.open_stream(value)
    reader.read_all()
    assert (reader.stats.num_dictionary_batches, reader.stats.num_record_batches) == (k, n)
    got = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=64 << 20).decode(value)
    assert got.num_rows == 2 * n
    assert got.column(demo.ID_COLUMN).to_pylist()[-2:] == words[-2:]


def test_a_dictionary_delta_adds_to_the_work_of_each_batch_after_it():
    # a 1 MB dictionary, a delta of 1 MB more, then batches that use both: each batch after
    # the delta validates 2 MB; 33 of them pass a 64 MB bound that 1 MB each would not
    first, second = "x" * (1 << 20), "y" * (1 << 20)

    def message(after):
        def batch(dictionary):
            ids = pa.DictionaryArray.from_arrays(pa.array([0], pa.int32()),
                                                 pa.array(dictionary))
            return pa.record_batch({demo.ID_COLUMN: ids, **{
                f: pa.array(np.zeros(1, np.float32)) for f in demo.FEATURES}})
        return _batches_stream([batch([first])] + [batch([first, second])] * after,
                               emit_dictionary_deltas=True)

    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=64 << 20)
    assert dec.decode(message(20)).num_rows == 21  # 1 + 20 x 2 MB of work: read
    big = message(33)  # 1 + 33 x 2 MB = 67 MB (as 1 MB each: 34 MB)
    assert len(big) < 3 << 20
    with pytest.raises(codec.InvalidMessage, match="^too_large.*share dictionaries"):
        dec.decode_keyed(big)


def test_a_missing_feature_column_is_named():
    t = demo.generate(5, seed=1).select(demo.FEATURES[1:])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    dec = codec.Decoder(demo.FEATURES, None)
    with pytest.raises(codec.InvalidMessage) as e:
        dec.decode(sink.getvalue().to_pybytes())
    assert e.value.code == "missing_column"
    assert str(e.value).endswith(f"missing feature column(s): {demo.FEATURES[0]}")


def test_unseen_categories_are_counted_per_message():
    cats = {demo.FEATURES[0]: ["a", "b"]}

    def message(words):
        col = pa.array(words).dictionary_encode()
        t = demo.generate(len(words), seed=1).select(demo.FEATURES)
        return _batches_stream(t.set_column(0, demo.FEATURES[0], col).to_batches())

    dec = codec.Decoder(demo.FEATURES, None, categories=cats)
    got = dec.decode(message(["a", "zz", None, "zz", "b"]))
    assert dec.unseen == {demo.FEATURES[0]: 2}
    codes = got.column(0).to_numpy(zero_copy_only=False)
    assert codes[0] == 0 and np.isnan(codes[1])  # a code; unseen: missing
    dec.decode(message(["b", "a"]))
    assert dec.unseen == {}  # the last message's, none


def test_the_schema_cache_holds_as_many_schemas_as_it_is_given():
    # a message whose schema is cached is read in C (a Raw); the cache holds cache_size
    # schemas, then starts over
    def message(order, seed):
        t = demo.generate(4, seed=seed).select(order)
        return _batches_stream(t.to_batches())

    a, b, c = demo.FEATURES, demo.FEATURES[::-1], demo.FEATURES[1:] + demo.FEATURES[:1]
    dec = codec.Decoder(demo.FEATURES, None, cache_size=2)
    for order in (a, b):
        assert not isinstance(dec.decode_keyed(message(order, 1))[0], codec.Raw)
    for order in (a, b):  # both held
        assert isinstance(dec.decode_keyed(message(order, 2))[0], codec.Raw), order
    dec.decode_keyed(message(c, 1))  # a third: the cache starts over
    assert not isinstance(dec.decode_keyed(message(a, 3))[0], codec.Raw)


def test_legacy_framed_streams_of_two_schemas_are_each_read_by_their_own():
    # before Arrow 0.15 a message had no continuation marker: no schema bytes to cache by;
    # two schemas whose messages begin alike must not share a plan
    def legacy(order, seed):
        t = demo.generate(6, seed=seed).select(order)
        t = t.add_column(0, demo.ID_COLUMN, pa.array(np.arange(6, dtype=np.int64) + seed))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema,
                               options=pa.ipc.IpcWriteOptions(use_legacy_format=True)) as w:
            w.write_table(t)
        return t, sink.getvalue().to_pybytes()

    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN)
    for seed, order in enumerate([demo.FEATURES, demo.FEATURES[::-1]] * 2):
        t, value = legacy(order, seed)
        assert value[:4] != b"\xff\xff\xff\xff"
        got = dec.decode(value)
        for name in demo.FEATURES + [demo.ID_COLUMN]:
            assert got.column(name).equals(t.column(name).chunk(0)), (seed, name)


def test_a_flatbuffer_field_past_its_vtable_is_absent():
    # flatbuffers: a table's vtable lists as many fields as the writer wrote; a field past
    # its end is absent (its default), whatever bytes follow the vtable
    vtable = struct.pack("<HHH", 6, 8, 4)  # 6 bytes, a table of 8, field 0 at +4
    after = b"\x09\x00\x07\x00"  # not a vtable entry: bytes that follow it
    table = len(vtable) + len(after)
    fb = vtable + after + struct.pack("<i", table) + struct.pack("<I", 42)
    assert codec._fb_field(fb, table, 0) == table + 4
    assert struct.unpack_from("<I", fb, codec._fb_field(fb, table, 0))[0] == 42
    assert codec._fb_field(fb, table, 1) == 0
    assert codec._fb_field(fb, table, 2) == 0


def test_a_schema_is_kept_up_to_its_byte_bound_and_not_past_it():
    # the schema message is kept (its batches then read in C) up to _MAX_CACHED_SCHEMA
    # bytes, metadata included; a schema message is padded to 8 bytes: 64 KiB, then 8 more
    def message(pad, seed):
        t = demo.generate(4, seed=seed).select(demo.FEATURES)
        return _batches_stream(t.replace_schema_metadata({"pad": "x" * pad}).to_batches())

    def pad_for(size):
        return next(k for k in range(size - 2048, size) if
                    len(codec._schema_bytes(message(k, 0))) == size)

    for size, kept in ((64 << 10, True), ((64 << 10) + 8, False)):
        k = pad_for(size)
        dec = codec.Decoder(demo.FEATURES, None)
        dec.decode_keyed(message(k, 1))
        assert isinstance(dec.decode_keyed(message(k, 2))[0], codec.Raw) == kept, size


def test_a_cached_schema_read_by_pyarrow_keeps_only_the_columns_read():
    # without the C reader (native=False), a message whose schema is cached is read against
    # it: the columns the model does not read are left out, as for the first message
    def message(seed):
        t = demo.generate(4, seed=seed).select(demo.FEATURES)
        t = t.append_column("blob", pa.array(["b" * 10] * 4))
        return _batches_stream(t.to_batches())

    dec = codec.Decoder(demo.FEATURES, None, native=False)
    for seed in (1, 2):
        got = dec.decode(message(seed))
        assert got.schema.names == demo.FEATURES, seed


def test_string_views_after_an_empty_batch_are_still_counted():
    # batches of 0 and 2,000 rows: the views of the second are held to the limit
    data = b"z" * 100_000
    views = np.zeros((2000, 4), np.int32)
    views[:, 0] = len(data)
    views[:, 1] = np.frombuffer(data[:4], np.int32)[0]
    ids = pa.Array.from_buffers(pa.string_view(), 2000, [None, pa.py_buffer(views.tobytes()),
                                                         pa.py_buffer(data)])
    big = pa.record_batch({demo.ID_COLUMN: ids, **{f: pa.array(np.zeros(2000, np.float32))
                                                   for f in demo.FEATURES}})
    empty = big.slice(0, 0)
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=64 << 20)
    with pytest.raises(codec.InvalidMessage, match="string views") as e:
        dec.decode_keyed(_batches_stream([empty, big]))
    assert e.value.code == "too_large"


def test_a_compressed_buffer_too_short_for_its_size_is_refused():
    # a compressed buffer starts with its 8-byte decompressed size: 1 to 7 bytes cannot hold it
    t = demo.generate(50, seed=3).select(demo.FEATURES)
    data = bytearray(_lz4(t))
    (meta, n), = F.messages(bytes(data))[1:]
    msg = meta + struct.unpack_from("<I", data, meta)[0]
    vec = F._ref(bytes(data), F._ref(bytes(data), msg, 2), 2)
    for j in range(struct.unpack_from("<I", data, vec)[0]):
        off, ln = struct.unpack_from("<qq", data, vec + 4 + 16 * j)
        if ln:  # the first buffer with data: 4 bytes long
            struct.pack_into("<qq", data, vec + 4 + 16 * j, off, 4)
            break
    dec = codec.Decoder(demo.FEATURES, None, max_bytes=64 << 20)
    with pytest.raises(codec.InvalidMessage, match="^not_arrow.*without its size"):
        dec.decode_keyed(bytes(data))


def test_short_string_views_held_inline_count_nothing_against_the_limit():
    # a view of 12 bytes or fewer holds its string itself: 2,000 of them (18 kB of text)
    # view no bytes elsewhere and are read under a 16 KiB limit
    ids = pa.array([f"card-{i:04d}" for i in range(2000)], pa.string_view())
    t = pa.table({demo.ID_COLUMN: ids, **{f: pa.array(np.zeros(2000, np.float32))
                                         for f in demo.FEATURES}})
    assert sum(len(s) for s in ids.to_pylist()) > 16 << 10
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=16 << 10)
    got = dec.decode(_stream(t))
    assert got.column(demo.ID_COLUMN).to_pylist() == ids.to_pylist()


@pytest.mark.parametrize("native", [True, False])
def test_a_message_of_several_batches_after_its_schema_is_cached_keeps_every_row(native):
    def message(seed, parts):
        t = demo.generate(6, seed=seed).select(demo.FEATURES)
        return t, _batches_stream([t.slice(2 * k, 2).to_batches()[0] for k in range(parts)])

    dec = codec.Decoder(demo.FEATURES, None, native=native)
    dec.decode(message(1, 1)[1])  # the schema cached
    t, value = message(2, 3)
    got = dec.decode(value)
    assert got.num_rows == 6
    for name in demo.FEATURES:
        assert got.column(name).to_pylist() == t.column(name).to_pylist()[:6]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("primed", [True, False])
@pytest.mark.parametrize("tail", ["second_stream", "garbage", "short"])
def test_bytes_after_the_stream_are_refused_not_dropped(native, primed, tail):
    # before: pyarrow's stream reader stops at the end-of-stream marker, so a message of two
    # concatenated streams (a producer that appends) was scored from the first alone and the
    # second's rows were dropped without a word
    first, second = _pair(5)
    extra = {"second_stream": second, "garbage": b"garbage" * 3, "short": b"\x00\x00"}[tail]
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, native=native)
    if primed:
        assert dec.decode(first).num_rows == 5
    body = first + extra
    with pytest.raises(codec.InvalidMessage, match="^not_arrow.*bytes after"):
        dec.decode(body)
    assert dec.decode(first).num_rows == 5  # the stream alone is read


def test_a_message_of_two_streams_is_dead_lettered_by_replay(tmp_path):
    first, second = _pair(5)
    rec = _recording(tmp_path / "in.arrows", [first, first + second, second])
    out = tmp_path / "out.arrows"
    proc = subprocess.run([sys.executable, "-m", "worker.cli", "replay", str(rec), "--model",
                           str(MODEL), "--output", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert len(list(read_records(out))) == 2
    (dead,) = read_records(tmp_path / "out-dlq.arrows")
    assert dict(dead.headers)["error_code"] == b"not_arrow"
    assert dead.value == first + second


def _plain(amount: list[float]) -> bytes:
    b = pa.record_batch({**{f: pa.array(np.full(len(amount), 3.0, np.float32))
                            for f in demo.FEATURES},
                         demo.FEATURES[0]: pa.array(np.asarray(amount, np.float32)),
                         demo.ID_COLUMN: pa.array(np.arange(len(amount), dtype=np.int64))})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, b.schema) as w:
        w.write_batch(b)
    return sink.getvalue().to_pybytes()


def test_aliased_buffers_are_refused_once_the_schema_is_cached_too():
    """A hostile review: a column's data buffer pointed at another column's bytes was
    dead-lettered on its schema's first message (pyarrow's path) but scored, reading the
    other column's values, once the schema was cached (the C reader); now both refuse it."""
    value = _plain([50.0, 50.0, 50.0])
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=64 << 20)
    fb_start = 8 + int.from_bytes(value[4:8], "little")  # the batch message after the schema
    meta_len = int.from_bytes(value[fb_start + 4:fb_start + 8], "little")
    meta = value[fb_start + 8:fb_start + 8 + meta_len]
    # the first feature's data buffer (its validity bitmap first, 0 bytes): point it at the
    # second feature's data (each 12 bytes, 3 float32s, at offsets 16 apart)
    first = struct.pack("<qqqq", 0, 0, 0, 12)
    at = meta.find(first)
    assert at > 0
    aliased = bytearray(value)
    aliased[fb_start + 8 + at + 16:fb_start + 8 + at + 24] = struct.pack("<q", 16)
    aliased = bytes(aliased)
    read = pa.ipc.open_stream(aliased).read_all()  # pyarrow reads it: the second's values
    assert read.column(demo.FEATURES[0]).to_pylist() == [3.0, 3.0, 3.0]
    for _ in range(2):  # the first message of its schema, then cached (the C reader)
        with pytest.raises(codec.InvalidMessage, match="share bytes") as e:
            dec.decode_keyed(aliased)
        assert e.value.code == "invalid_arrow"
        got, _ = dec.decode_keyed(value)  # (the same schema, as written: read)
    assert isinstance(got, codec.Raw)  # the schema is cached: the C reader read it
    assert dec.decode(value).column(demo.FEATURES[0]).to_pylist() == [50.0, 50.0, 50.0]


@pytest.mark.parametrize("extra", [1_000, 200_000])
def test_a_schema_past_the_header_cap_is_too_large(extra):
    """A hostile review: a one-row message of 500,000 null columns (30 MB, inside a 32 MB
    max_message_bytes) took the worker from 162 to 371 MB and 3.6 s of CPU a message. A
    message header is now at most a sixteenth of max_message_bytes (at least 1 MiB)."""
    cols = {f: pa.array([1.0], pa.float32()) for f in demo.FEATURES}
    cols[demo.ID_COLUMN] = pa.array([7], pa.int64())
    cols.update({f"pad{i:06d}": pa.nulls(1) for i in range(extra)})
    b = pa.record_batch(cols)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, b.schema) as w:
        w.write_batch(b)
    value = sink.getvalue().to_pybytes()
    head = 8 + int.from_bytes(value[4:8], "little")
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=32 << 20)
    assert codec.header_cap(32 << 20) == codec.MIN_HEADER_CAP == 4 << 20
    if head < codec.header_cap(32 << 20):
        assert dec.decode(value).num_rows == 1
        return
    with pytest.raises(codec.InvalidMessage, match="a message header") as e:
        dec.decode_keyed(value)
    assert e.value.code == "too_large"
    # the walk of every message's header bounds them too (a batch's, a schema's framed
    # without the continuation marker): the same cap, at least MIN_HEADER_CAP
    assert codec.header_cap(1024) == codec.MIN_HEADER_CAP
    with pytest.raises(codec._TooMuch, match="a message header"):
        codec._headers_walk(value, 32 << 20)


@pytest.mark.parametrize("fanout", [8, 2000])
def test_a_schema_of_shared_tables_is_counted_as_built(fanout):
    """A review of the header cap: a 1 MB schema of one struct of 2,000 references to one
    struct of 2,000 references to one null leaf passed it, and pyarrow built 4 million fields
    (+1.5 GB). Fields are now counted as referenced, and refused past fields_cap."""
    schema = pa.schema([(demo.ID_COLUMN, pa.int64())] +
                       [(f, pa.float32()) for f in demo.FEATURES])
    value = F.shared_struct_schema(schema, fanout)
    assert len(value) < codec.MIN_HEADER_CAP
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=32 << 20)
    if fanout * fanout < codec.fields_cap(32 << 20):  # read: a stream of no batch
        with pytest.raises(codec.InvalidMessage) as e:
            dec.decode_keyed(value)
        assert e.value.code != "too_large"
        return
    with pytest.raises(codec.InvalidMessage, match="more than 83,886 fields") as e:
        dec.decode_keyed(value)
    assert e.value.code == "too_large"


def test_a_buffer_outside_its_body_is_not_arrow_before_sharing_is_judged():
    """A review: a buffer at offset -16 was reported as sharing bytes (invalid_arrow); it is
    outside its message body (not_arrow), whichever other buffer it overlaps."""
    value = _plain([50.0, 50.0, 50.0])
    fb_start = 8 + int.from_bytes(value[4:8], "little")
    meta_len = int.from_bytes(value[fb_start + 4:fb_start + 8], "little")
    meta = value[fb_start + 8:fb_start + 8 + meta_len]
    at = meta.find(struct.pack("<qqqq", 0, 0, 0, 12))
    assert at > 0
    bad = bytearray(value)
    bad[fb_start + 8 + at + 16:fb_start + 8 + at + 24] = struct.pack("<q", -16)
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=64 << 20)
    with pytest.raises(codec.InvalidMessage, match="outside its message body") as e:
        dec.decode_keyed(bytes(bad))
    assert e.value.code == "not_arrow"


def _schema():
    return pa.schema([(demo.ID_COLUMN, pa.int64())] +
                     [(f, pa.float32()) for f in demo.FEATURES])


def _code(dec, value):
    try:
        dec.decode_keyed(value)
    except codec.InvalidMessage as e:
        return e.code, str(e)
    return None, ""


def test_the_header_cap_at_its_edge():
    """A header of exactly header_cap bytes is read; the next size a header can take (8
    bytes more: flatbuffers end on 8) is too_large."""
    limit = 32 << 20
    cap = codec.header_cap(limit)
    def size(pad):
        return struct.unpack_from("<i", F.padded_schema(_schema(), pad), 4)[0]

    pad = cap - size(0) - 8  # (the string grows the header a byte a byte, in 8-byte steps)
    while size(pad) < cap:
        pad += 1
    at = F.padded_schema(_schema(), pad)
    assert struct.unpack_from("<i", at, 4)[0] == cap
    past = F.padded_schema(_schema(), pad + 8)
    assert struct.unpack_from("<i", past, 4)[0] == cap + 8
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=limit)
    code, _ = _code(dec, at)
    assert code != "too_large"  # read (a stream of no batch: refused for that)
    code, said = _code(dec, past)
    assert code == "too_large" and "a message header" in said


def test_the_field_cap_at_its_edge():
    """A schema of exactly fields_cap fields (15 flat, one struct of references to one leaf)
    is read; one field more is too_large."""
    limit = 32 << 20
    cap = codec.fields_cap(limit)
    flat = len(_schema()) + 1  # and the struct itself
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_bytes=limit)
    code, _ = _code(dec, F.shared_struct_schema(_schema(), cap - flat, depth=1))
    assert code != "too_large"
    code, said = _code(dec, F.shared_struct_schema(_schema(), cap - flat + 1, depth=1))
    assert code == "too_large" and f"more than {cap:,} fields" in said
