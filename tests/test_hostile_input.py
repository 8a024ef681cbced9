"""Hostile input, round two (issue 31): lies at integer edges in row counts, node lengths and
null counts; headers that take the worker's names; dead letters too large to carry the
input's key and headers. Each message is scored as pyarrow reads it alone, or dead-lettered;
nothing crashes."""

from __future__ import annotations

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
    dec = codec.Decoder(demo.FEATURES, demo.ID_COLUMN, max_rows=100_000)
    dec.decode_keyed(first)  # the schema's plan: the second message is read in C
    try:
        got = dec.decode(forged)
    except codec.InvalidMessage:
        return  # dead-lettered
    alone = pa.ipc.open_stream(forged).read_all()  # pyarrow reads it: the same rows
    alone.validate(full=True)
    assert got.num_rows == alone.num_rows
    for name in demo.FEATURES:
        assert got.column(name).equals(alone.column(name).combine_chunks())


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
