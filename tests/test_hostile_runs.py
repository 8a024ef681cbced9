"""Runs that end well whatever the messages held: ids of any type, null ids, huge row-count
lies, no matplotlib; counters that count what was published."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from worker import codec, demo
from worker.io.records import Record, read_records, write_records
from worker.replay import compare

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
MODEL = GOLDEN / "fraud-xgb.model"


def _message(n: int, seed: int, ids: pa.Array | None) -> bytes:
    t = demo.generate(n, seed=seed).select(demo.FEATURES)
    if ids is not None:
        t = t.add_column(0, demo.ID_COLUMN, ids)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


def _recording(path: Path, values: list[bytes]) -> Path:
    write_records(path, [Record("t", 0, i, b"k", v, 1, []) for i, v in enumerate(values)])
    return path


def _replay(rec: Path, out: Path, *args, env=None):
    return subprocess.run([sys.executable, "-m", "worker.cli", "replay", str(rec), "--model",
                           str(MODEL), "--output", str(out), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)


def test_ids_of_mixed_types_and_nulls_end_in_a_summary_and_compare(tmp_path):
    # before: the end-of-run summary failed in concat_tables (exit 1), and --expect reported
    # null ids as missing when a run was compared with itself
    rec = _recording(tmp_path / "in.arrows", [
        _message(5, 1, pa.array(np.arange(5, dtype=np.int64))),
        _message(4, 2, pa.array(["a", "b", "c", "d"])),
        _message(3, 3, pa.nulls(3, pa.int64())),
        _message(3, 4, pa.array([1.0, float("nan"), None])),
        _message(2, 5, pa.array([0, 1], type=pa.int64())),  # ids 0, 1 again: duplicates
    ])
    out = tmp_path / "out.arrows"
    proc = _replay(rec, out)
    assert proc.returncode == 0, proc.stderr
    assert "records" in proc.stdout and "17" in proc.stdout
    res = compare(out, out)
    assert res.rows == res.golden_rows == 17
    assert not res.missing and not res.extra and not any(res.differences.values())
    assert res.duplicated == ["0", "1"]  # int ids 0 and 1 appear twice; "a" != 0
    proc = _replay(rec, tmp_path / "again.arrows", "--expect", out)
    assert proc.returncode == 1 and "duplicated" in proc.stdout  # duplicates are reported


def test_compare_tells_ids_of_different_types_apart(tmp_path):
    a = _recording(tmp_path / "a.arrows", [_message(3, 1, pa.array([1, 2, 3]))])
    b = _recording(tmp_path / "b.arrows", [_message(3, 1, pa.array(["1", "2", "3"]))])
    assert _replay(a, tmp_path / "sa.arrows").returncode == 0
    assert _replay(b, tmp_path / "sb.arrows").returncode == 0
    res = compare(tmp_path / "sa.arrows", tmp_path / "sb.arrows")
    assert len(res.missing) == 3 and len(res.extra) == 3


def test_no_matplotlib_means_no_png_and_exit_0(tmp_path):
    # a plain `pip install` has no matplotlib: the run ends with a note, not a traceback
    block = tmp_path / "block"
    (block / "matplotlib").mkdir(parents=True)
    (block / "matplotlib" / "__init__.py").write_text("raise ImportError('no matplotlib')\n")
    rec = _recording(tmp_path / "in.arrows", [_message(5, 1, pa.array(np.arange(5)))])
    env = {**os.environ, "PYTHONPATH": f"{block}{os.pathsep}{ROOT}"}
    proc = _replay(rec, tmp_path / "out.arrows", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "no histogram PNG: matplotlib is not installed" in proc.stdout
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out.png").exists()
    proc = _replay(rec, tmp_path / "out2.arrows")  # with matplotlib: the PNG
    assert proc.returncode == 0 and (tmp_path / "out2.png").exists()


def test_counters_count_published_rows_not_dead_letters(tmp_path, monkeypatch):
    from worker.config import load_settings
    from worker.io.files import FileSink, FileSource
    from worker.loop import Worker
    from worker.model.compiled import load_model

    lie = (ROOT / "tests" / "fuzz" / "corpus" / "messages" / "sigsegv-row-lie-1m.bin")
    rec = _recording(tmp_path / "in.arrows", [
        _message(5, 1, pa.array(np.arange(5))), lie.read_bytes(),
        _message(7, 2, pa.array(np.arange(7))), _message(4, 3, pa.array(np.arange(4)))])
    settings = load_settings(None, scoring={"threads": 1}, model={"path": str(MODEL)},
                             source={"type": "file", "path": str(rec)})
    real = codec.StreamEncoder.encode

    def encode(self, batch, rows, *args):  # the third message fails: dead-lettered, not counted
        if rows.stop - rows.start == 4:
            raise pa.ArrowInvalid("simulated encode failure")
        return real(self, batch, rows, *args)

    def encode_numpy(self, *args):  # the C writer gives way to pyarrow's, message by message
        raise ValueError("simulated")

    monkeypatch.setattr(codec.StreamEncoder, "encode", encode)
    monkeypatch.setattr(codec.StreamEncoder, "encode_numpy", encode_numpy)
    w = Worker(settings, load_model(MODEL), FileSource(rec),
               FileSink(tmp_path / "o.arrows", tmp_path / "d.arrows"))
    assert w.run() == 0
    w.sink.close()
    reg = w.metrics.registry
    assert reg.get_sample_value("scoring_records_out_total") == 12
    assert reg.get_sample_value("scoring_records_in_total") == 16
    assert reg.get_sample_value("scoring_messages_in_total") == 4
    assert reg.get_sample_value("scoring_dead_letters_total", {"reason": "invalid_arrow"}) == 1
    assert reg.get_sample_value("scoring_dead_letters_total", {"reason": "encode_error"}) == 1
    assert w.totals.rows == 12 and len(list(read_records(tmp_path / "o.arrows"))) == 2


@pytest.mark.parametrize("rows", [10_000_000, 1_000_000])
def test_row_count_lie_is_dead_lettered_by_the_cli(tmp_path, rows):
    # the attack: every length field of a ~50 KB message claims `rows` rows
    import struct

    value = bytearray(_message(200, 7, pa.array(np.arange(200))))
    value = bytes(value).replace(struct.pack("<q", 200), struct.pack("<q", rows))
    rec = _recording(tmp_path / "in.arrows", [value])
    out = tmp_path / "out.arrows"
    proc = _replay(rec, out)
    assert proc.returncode == 0, proc.stderr
    assert list(read_records(out)) == []
    (dead,) = read_records(tmp_path / "out-dlq.arrows")
    # some lies leave a stream pyarrow cannot read, the others fail validation
    assert dict(dead.headers)["error_code"] in (b"not_arrow", b"invalid_arrow")
    assert dead.value == value


def test_id_column_with_dictionary_indices_out_of_range_is_dead_lettered():
    # before: republished as is (readers of the scores topic then read out of bounds)
    ids = pa.DictionaryArray.from_arrays(pa.array([0, 7, 1], type=pa.int32()),
                                         pa.array(["a", "b"]), safe=False)
    value = _message(3, 1, ids)
    with pytest.raises(codec.InvalidMessage) as err:
        codec.decode(value, demo.FEATURES, demo.ID_COLUMN)
    assert err.value.code == "invalid_arrow"
    # an id column the model does not read is not validated: with id_column None it is ignored
    assert codec.decode(value, demo.FEATURES, None).num_rows == 3


def test_the_python_api_validates_arrow_before_pyarrow_reads_it(tmp_path):
    # a lying table straight into score_batch (no codec.decode): float16 columns are cast by
    # pyarrow before our own buffer check, and the cast read past the buffers (SIGSEGV or
    # garbage scores, found in review); now refused with pyarrow's validation error
    import struct

    t = demo.generate(200, seed=7).select(demo.FEATURES)
    t = pa.table({n: t.column(n).cast(pa.float32()).cast(pa.float16()) for n in demo.FEATURES})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    lie = sink.getvalue().to_pybytes().replace(struct.pack("<q", 200),
                                               struct.pack("<q", 1_000_000))
    (tmp_path / "lie.arrows").write_bytes(lie)
    code = ("import pyarrow as pa, worker\n"
            f"m = worker.load_model({str(MODEL)!r})\n"
            f"t = pa.ipc.open_stream(open({str(tmp_path / 'lie.arrows')!r}, 'rb').read())"
            ".read_all()\n"
            "try:\n    m.score_batch(t)\n    print('scored')\n"
            "except (ValueError, TypeError) as e:\n    print('refused:', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused:" in proc.stdout and "too small" in proc.stdout, proc.stdout


def test_a_failed_offset_commit_is_logged_not_raised():
    from confluent_kafka import KafkaError, KafkaException

    from worker.io.kafka import KafkaSource

    class Consumer:
        def commit(self, **kw):
            raise KafkaException(KafkaError(KafkaError.REBALANCE_IN_PROGRESS, "rebalancing"))

    from structlog.testing import capture_logs

    src = KafkaSource.__new__(KafkaSource)
    src.consumer = Consumer()
    with capture_logs() as logs:
        src.commit([Record("t", 0, 5, b"k", b"v")])  # the file sink calls this after writing
    # the warning is the guarantee (README): the next owner reads those messages again
    failed = [e for e in logs if e["event"].startswith("offset commit failed")]
    assert len(failed) == 1 and failed[0]["log_level"] == "warning", logs
    assert "rebalancing" in failed[0]["error"]


def test_lazy_parameters_out_of_range_exit_2(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{path: {MODEL}}}\n"
                   f"source: {{type: file, path: {GOLDEN / 'input.arrows'}}}\n"
                   f"sink: {{type: file, path: {tmp_path / 'o.arrows'}}}\n"
                   "scoring: {lazy: {mode: certified, chunk: 10000000000}}\n")
    proc = subprocess.run([sys.executable, "-m", "worker.cli", "--config", str(cfg)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "scoring.lazy" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_nested_ids_compare(tmp_path):
    ids = pa.array([[1], [2, 3], None])
    rec = _recording(tmp_path / "in.arrows", [_message(3, 1, ids)])
    out = tmp_path / "out.arrows"
    assert _replay(rec, out).returncode == 0
    res = compare(out, out)
    assert res.ok and res.rows == 3


def test_cached_schema_path_reads_what_the_full_path_reads():
    # a schema seen before has only its record batches read: same tables, same refusals
    import struct

    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN)
    base = demo.generate(300, seed=3).select([demo.ID_COLUMN, *demo.FEATURES])
    for compression in (None, "lz4", "zstd"):
        for table in (base, base.slice(17, 100)):
            sink = pa.BufferOutputStream()
            opts = pa.ipc.IpcWriteOptions(compression=compression)
            with pa.ipc.new_stream(sink, table.schema, options=opts) as w:
                for b in table.to_batches(max_chunksize=64):
                    w.write_batch(b)
            value = sink.getvalue().to_pybytes()
            first = dec.decode(value)  # the schema is cached from here on
            again = dec.decode(value)
            fresh = codec.decode(value, demo.FEATURES, demo.ID_COLUMN)
            assert first.equals(fresh) and again.equals(fresh)
            assert again.num_rows == table.num_rows
    assert len(dec._plans) == 1
    # the same schema with lying lengths: refused on the cached path as on the full path
    small = base.slice(0, 200)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, small.schema) as w:
        w.write_table(small)
    lie = sink.getvalue().to_pybytes()
    schema_len = 8 + struct.unpack_from("<i", lie, 4)[0]
    lie = lie[:schema_len] + lie[schema_len:].replace(struct.pack("<q", 200),
                                                      struct.pack("<q", 1_000_000))
    for d in (dec, codec.Decoder(demo.FEATURES, demo.ID_COLUMN)):
        with pytest.raises(codec.InvalidMessage) as err:
            d.decode(lie)
        assert err.value.code in ("invalid_arrow", "not_arrow")


def test_without_an_id_column_ids_are_row_indices_in_each_message(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("scoring: {id_column: null}\nlogging: {progress: false}\n")
    rec = _recording(tmp_path / "in.arrows", [_message(3, 1, None), _message(2, 2, None)])
    out = tmp_path / "out.arrows"
    proc = _replay(rec, out, "--config", cfg)
    assert proc.returncode == 0, proc.stderr
    ids = [pa.ipc.open_stream(r.value).read_all().column("id").to_pylist()
           for r in read_records(out)]
    assert ids == [[0, 1, 2], [0, 1]]


def test_encode_writes_what_the_stream_writer_writes():
    # dictionaries included (a batch serialized alone would lack stop_reason's dictionary)
    batch = pa.RecordBatch.from_pydict({"id": pa.array(["a", None]), "score": [0.1, 0.9],
                                        "stop_reason": pa.DictionaryArray.from_arrays(
                                            pa.array([0, 1], type=pa.int8()),
                                            pa.array(["full", "certificate"]))})
    meta = {b"model_id": b"m", b"input_offset": b"7"}
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema.with_metadata(meta)) as w:
        w.write_batch(batch.replace_schema_metadata(meta))
    assert codec.encode(batch, meta) == sink.getvalue().to_pybytes()


def test_dictionaries_inside_extension_types_are_not_cached():
    # an extension type reports no child fields: its dictionary storage was missed, the schema
    # cached, and later messages refused as not_arrow (found in review)
    dict_type = pa.dictionary(pa.int8(), pa.string())
    ext = pa.opaque(dict_type, "channel", "tests")
    base = demo.generate(2, seed=4).select([demo.ID_COLUMN, *demo.FEATURES])
    storage = pa.array(["web", "pos"]).dictionary_encode().cast(dict_type)
    t = base.append_column("channel", pa.ExtensionArray.from_storage(ext, storage))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    value = sink.getvalue().to_pybytes()
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN)
    for _ in range(3):
        assert dec.decode(value).num_rows == 2
    assert not dec._plans


def test_each_message_keeps_its_own_id_field_metadata():
    from worker.config import load_settings
    from worker.model.compiled import load_model
    from worker.pipeline import Pipeline

    def message(tenant: bytes, offset: int) -> Record:
        field = pa.field("n", pa.int64(), metadata={b"tenant": tenant})
        ids = pa.StructArray.from_arrays([pa.array([1, 2])], fields=[field])
        return Record("t", 0, offset, b"k", _message(2, offset, ids), 1, [])

    settings = load_settings(None, model={"path": str(MODEL)},
                             source={"type": "file", "path": "x.arrows"})
    pipe = Pipeline(load_model(MODEL), settings, "scores")
    recs = [message(b"A", 0), message(b"B", 1)]
    outputs, dead, _ = pipe.process([(r, pipe.decode(r)) for r in recs])
    assert not dead
    tenants = [pa.ipc.open_stream(o.value).read_all().schema.field("id").type.field(0).metadata
               for o in outputs]
    assert tenants == [{b"tenant": b"A"}, {b"tenant": b"B"}]


def test_many_schemas_in_one_batch_score_like_each_alone():
    from worker.config import load_settings
    from worker.model.compiled import load_model
    from worker.pipeline import Pipeline

    settings = load_settings(None, model={"path": str(MODEL)},
                             source={"type": "file", "path": "x.arrows"})
    pipe = Pipeline(load_model(MODEL), settings, "scores")
    recs = []
    for k in range(20):  # 20 producers: an extra column of their own each
        t = demo.generate(3, seed=k).select([demo.ID_COLUMN, *demo.FEATURES])
        t = t.append_column(f"extra_{k}", pa.array([k] * 3))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        recs.append(Record("t", 0, k, b"k", sink.getvalue().to_pybytes(), 1, []))
    together, dead, _ = pipe.process([(r, pipe.decode(r)) for r in recs])
    assert not dead and len(together) == 20
    for r, out in zip(recs, together, strict=True):
        (alone,), _, _ = pipe.process([(r, pipe.decode(r))])
        a = pa.ipc.open_stream(out.value).read_all()
        b = pa.ipc.open_stream(alone.value).read_all()
        assert a.equals(b)
