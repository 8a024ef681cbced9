"""Issue 31's findings, end to end: each hostile recording replayed through the worker
(`scoring-worker replay`, file source and sink, default settings, the golden demo model) in a
child process; what happened (exit code, messages scored, dead letters by code, whether every
output's ids and scores equal pyarrow's reading of that message alone) and the child's peak
RSS. With --before REV the same recordings first go through the workers of commit REV (a
worktree under out/hostile/before with its own extensions built, bench/worktree.py).

    .venv/bin/python bench/hostile.py [--before REV] [--out bench/HOSTILE-RESULTS.md]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "bench"))

from tests import ipc_forge as F  # noqa: E402
from worker import demo  # noqa: E402
from worker.io.records import Record, read_records, write_records  # noqa: E402

OUT = REPO / "out" / "hostile"
MODEL = REPO / "tests" / "golden" / "fraud-xgb.model"


def stream(table: pa.Table, compression: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    opts = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=opts) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def demo_table(n: int, seed: int, ids: pa.Array) -> pa.Table:
    t = demo.generate(n, seed=seed).select(demo.FEATURES)
    return t.add_column(0, demo.ID_COLUMN, ids)


def findings() -> dict[str, tuple[str, list[Record]]]:
    """name -> (what it is, the recording's records)."""
    out = {}

    def recs(values, headers=()):
        return [Record("in", 0, i, b"k", v, 1, list(headers)) for i, v in enumerate(values)]

    ids = pa.array(np.arange(50, dtype=np.int64))
    first, second = stream(demo_table(50, 1, ids)), stream(demo_table(50, 2, ids))
    forged = F.lie(second, length=2**63 - 1, node_lengths=2**63 - 1,
                   null_counts={j: 1 for j in range(1, 15)})
    out["sigsegv"] = ("row count and node lengths 2^63 - 1, a null on every feature, as the "
                      "second message of a schema", recs([first, forged]))

    def be(seed):
        t = demo_table(20, seed, pa.array(np.arange(2000, 2020)))
        t = t.cast(pa.schema([pa.field(f.name, pa.float64() if pa.types.is_floating(f.type)
                                       else f.type) for f in t.schema]))
        return F.big_endian(stream(t), t.schema)

    out["big-endian"] = ("three messages of one big-endian schema (ids 2000..2019)",
                         recs([be(1), be(2), be(3)]))

    big = [stream(demo_table(50, k, pa.array([f"customer-{k}-{i:04d}-" + "x" * 900
                                              for i in range(50)]).dictionary_encode()))
           for k in range(150)]
    out["dictionary-ids"] = (f"150 messages of {len(big[0]) // 1000} KB with dictionary-encoded "
                             "string ids, one batch", recs(big))

    zeros = np.zeros(4_000_000, np.float32)
    bomb_t = pa.table({name: pa.array(zeros) for name in demo.FEATURES}).add_column(
        0, demo.ID_COLUMN, pa.array(np.zeros(4_000_000, np.int64)))
    bomb = stream(bomb_t, "zstd")
    out["bomb"] = (f"four real bombs: {len(bomb) // 1000} KB each, 4,000,000 rows of zeros "
                   f"({bomb_t.nbytes >> 20} MB decoded)", recs([bomb] * 4))

    # the issue's lie: four small messages whose feature columns' size prefixes declare 1.25 GB
    lie = bytearray(stream(demo_table(1000, 4, pa.array(np.arange(1000))), "zstd"))
    (_meta, _n), (meta1, n1) = F.messages(bytes(lie))[:2]
    hits = 0
    for off in range(meta1 + n1, len(lie) - 16, 8):
        if struct.unpack_from("<q", lie, off)[0] == 4000:  # 1000 float32 values
            struct.pack_into("<q", lie, off, 1_250_000_000)
            hits += 1
    out["size-lie"] = (f"four {len(lie) // 1000} KB messages whose {hits} feature buffers each "
                       "declare 1.25 GB", recs([bytes(lie)] * 4))

    t = demo_table(1000, 3, pa.array(np.arange(1000)))
    small = bytearray(stream(t.append_column("blob", pa.array(np.zeros(1000))), "zstd"))

    # the unread column's compressed buffer (the last one with data) claims 1.5 GB
    last = max(off for off in range(0, len(small) - 8, 8)
               if struct.unpack_from("<q", small, off)[0] == 8000)
    struct.pack_into("<q", small, last, 1_500_000_000)
    out["unread-bomb"] = (f"a {len(small) // 1000} KB message whose unread column declares "
                          "1.5 GB", recs([bytes(small)]))

    meta = [stream(demo_table(5, k, pa.array(np.arange(5))).replace_schema_metadata(
        {"pad": os.urandom(1 << 19).hex()})) for k in range(400)]
    out["schema-metadata"] = ("400 messages with distinct 1 MB schema metadata",
                              recs(meta))

    out["misaligned"] = ("the second message of a schema with its flatbuffer's tables moved 4 "
                         "bytes (int64 fields off their alignment: pyarrow refuses it)",
                         recs([first, F.shift(second, by=4)]))

    # a dictionary-encoded id column, K zstd dictionary deltas of one W-byte string each, a
    # one-row batch after each: the stream reader concatenates the deltas for every batch
    k_deltas, width = 600, 4000
    f1 = demo.generate(1, seed=1).select(demo.FEATURES).combine_chunks().to_batches()[0]
    dschema = f1.schema.insert(0, pa.field(demo.ID_COLUMN, pa.dictionary(pa.int32(), pa.string())))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, dschema, options=pa.ipc.IpcWriteOptions(
            emit_dictionary_deltas=True, compression="zstd")) as w:
        for k in range(k_deltas):
            d = pa.array([f"{i:08d}" + "a" * (width - 8) for i in range(k + 1)])
            ids = pa.DictionaryArray.from_arrays(pa.array([k], pa.int32()), d)
            w.write_batch(pa.RecordBatch.from_arrays([ids, *f1.columns], schema=dschema))
    delta = sink.getvalue().to_pybytes()
    out["delta-bomb"] = (f"a {len(delta) // 1000} KB message of {k_deltas} compressed "
                         f"dictionary deltas of one {width}-byte id each, a one-row batch after "
                         "each", recs([delta]))

    hdr = FORGED
    out["headers"] = ("a message with MODEL_ID, Content-Type, error_code and source_offset "
                      "headers, and a malformed one with the same", recs([first, b"junk"], hdr))
    return out


FORGED = [("MODEL_ID", b"forged"), ("Content-Type", b"text/plain"), ("error_code", b"none"),
          ("source_offset", b"-1")]

# the test in make test that covers each finding (tests/test_hostile_input.py unless named)
TESTS = {
    "sigsegv": "test_a_row_count_near_2_63_with_a_null_is_dead_lettered_not_a_sigsegv",
    "big-endian": "test_a_big_endian_message_reads_the_same_three_ways",
    "dictionary-ids": "test_each_output_carries_only_its_own_messages_ids",
    "bomb": "test_a_real_compression_bomb_is_refused_before_it_is_inflated",
    "size-lie": "test_a_lying_size_prefix_is_refused_before_anything_is_decompressed",
    "unread-bomb": "test_an_unread_compressed_column_is_never_decompressed, "
                   "test_a_lying_size_prefix_is_refused_before_anything_is_decompressed",
    "schema-metadata": "test_schemas_with_large_metadata_are_scored_and_not_kept",
    "misaligned": "test_a_misaligned_flatbuffer_is_read_only_if_pyarrow_verifies_it",
    "delta-bomb": "test_a_message_of_more_dictionary_batches_than_the_cap_is_too_large",
    "headers": "test_input_headers_never_take_the_workers_names",
}


def oracle(value: bytes) -> tuple[np.ndarray, pa.Array] | None:
    """The message read alone by pyarrow: (features, ids), or None when it does not read."""
    try:
        t = pa.ipc.open_stream(value).read_all()
        t.validate(full=True)
        return t.select(demo.FEATURES), t.column(demo.ID_COLUMN).combine_chunks()
    except Exception:  # noqa: BLE001
        return None


_KEPT = r"""
import gc, os, sys
import numpy as np, pyarrow as pa
import worker
from worker import demo
from worker.pipeline import Pipeline
from worker.config import load_settings
from worker.io.records import Record

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

model = worker.load_model(sys.argv[1])
settings = load_settings(None, model={"path": sys.argv[1]}, scoring={"id_column": demo.ID_COLUMN},
                         source={"type": "kafka", "topic": "in"}, logging={"progress": False})
p = Pipeline(model, settings, "scores")

def message(k):
    t = demo.generate(5, seed=k).select(demo.FEATURES).add_column(
        0, demo.ID_COLUMN, pa.array(np.arange(5, dtype=np.int64)))
    t = t.replace_schema_metadata({"pad": os.urandom(1 << 19).hex()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()

for k in range(8):  # warm up
    r = Record("in", 0, k, b"k", message(k), 1, [])
    p.process([(r, p.decode(r))])
gc.collect()
base = rss()
for k in range(400):
    r = Record("in", 0, k, b"k", message(1000 + k), 1, [])
    outs, dead, _ = p.process([(r, p.decode(r))])
    assert len(outs) == 1 and not dead
    del r, outs, dead
gc.collect()
print(f"{rss() - base:.0f}")
"""


def kept_after(tree: Path) -> float:
    """MB the worker's pipeline still holds after 400 messages of distinct 1 MB schema
    metadata went through it one at a time (RSS after, less RSS before, in one process)."""
    proc = subprocess.run([sys.executable, "-c", _KEPT, str(MODEL)], cwd=tree,
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(tree)})
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return float(proc.stdout.strip().splitlines()[-1])


def _records(path: Path) -> list[Record]:
    """What a sink file holds: nothing when the child died before writing its first record."""
    if not path.exists() or path.stat().st_size == 0:
        return []
    try:
        return list(read_records(path))
    except (pa.ArrowInvalid, OSError):
        return []


def replay(tree: Path, rec: Path, out: Path) -> dict:
    for p in (out, out.with_name(out.stem + "-dlq.arrows")):
        p.unlink(missing_ok=True)
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "replay", str(rec), "--model",
                             str(MODEL), "--output", str(out)], cwd=tree,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(tree)})
    # the child's own peak (VmHWM of its address space, read every 10 ms until it exits):
    # wait4's ru_maxrss would carry this process's own peak, inherited through fork and exec
    peak_kb = 0
    while True:
        try:
            status_text = Path(f"/proc/{proc.pid}/status").read_text()
            for line in status_text.splitlines():
                if line.startswith("VmHWM:"):
                    peak_kb = max(peak_kb, int(line.split()[1]))
        except (OSError, ValueError):
            pass
        pid, status = os.waitpid(proc.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.01)
    err = proc.stderr.read().decode(errors="replace")
    rc = os.waitstatus_to_exitcode(status)
    res = {"rc": rc, "peak_rss_mb": peak_kb / 1024, "s": time.monotonic() - t0,
           "stderr": err[-400:]}
    outputs = _records(out)
    dead = _records(out.with_name(out.stem + "-dlq.arrows"))
    res["scored"] = len(outputs)
    res["dead"] = {}
    for d in dead:
        code = dict(d.headers).get("error_code", b"?").decode()
        res["dead"][code] = res["dead"].get(code, 0) + 1
    res["output_bytes_max"] = max((len(o.value) for o in outputs), default=0)
    res["outputs"] = outputs
    res["first_headers"] = list(outputs[0].headers) if outputs else []
    res["dead_headers"] = list(dead[0].headers) if dead else []
    return res


def exact(res: dict, records: list[Record]) -> bool | None:
    """Every output's ids equal its message's ids as pyarrow reads the message alone, and
    its scores those of the model on those rows (None: nothing scored)."""
    import worker

    if not res["outputs"]:
        return None
    model = worker.load_model(MODEL)
    by_offset = {r.offset: r for r in records}
    for o in res["outputs"]:
        t = pa.ipc.open_stream(o.value).read_all()
        offset = int(t.schema.metadata[b"input_offset"])
        got = oracle(by_offset[offset].value)
        if got is None:
            return False
        feats, ids = got
        if not t.column("id").combine_chunks().equals(ids):
            return False
        want = model.score_batch(feats).score
        if not np.array_equal(t.column("score").to_numpy(), want):
            return False
    return True


def before_tree(rev: str) -> Path:
    from worktree import checkout

    return checkout(rev, OUT / "before")


def describe(res: dict, name: str, ok) -> str:
    if res["rc"] != 0:
        return f"exit {res['rc']}" + (" (SIGSEGV)" if res["rc"] == -11 else "")
    dead = ", ".join(f"{n} {c}" for c, n in sorted(res["dead"].items())) or "no dead letter"
    text = f"{res['scored']} scored, {dead}"
    if ok is not None:
        text += "; ids and scores " + ("exact" if ok else "WRONG")
    if "kept_mb" in res:
        text += f"; {res['kept_mb']:,.0f} MB still held after 400 such messages one at a time"
    if name == "dictionary-ids":
        text += f"; largest output {res['output_bytes_max'] / 1e6:.2f} MB"
    if name == "headers":
        def taken(headers):  # the input's forged headers still under the worker's names
            return sum((k, v) in FORGED for k, v in headers)

        text += (f"; output headers start {[k for k, _v in res['first_headers'][:2]]}, dead "
                 f"letter's {[k for k, _v in res['dead_headers'][:2]]}; forged headers left "
                 f"under the worker's names: {taken(res['first_headers'])} of 4 on the output, "
                 f"{taken(res['dead_headers'])} of 4 on the dead letter")
    return text


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", help="a commit to run the same recordings through first")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "HOSTILE-RESULTS.md")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                         text=True).stdout.strip()
    trees = ([("before", before_tree(args.before), args.before)] if args.before else []) + \
        [("after", REPO, rev)]
    rows = []
    for name, (what, records) in findings().items():
        rec = OUT / f"{name}.arrows"
        write_records(rec, records)
        row = {"finding": name, "what": what,
               "input_bytes": sum(len(r.value or b"") for r in records)}
        for label, tree, _rev in trees:
            res = replay(tree, rec, OUT / f"{name}-{label}.arrows")
            ok = exact(res, records) if res["rc"] == 0 else None
            if name == "schema-metadata":
                res["kept_mb"] = kept_after(tree)
            row[label] = {"text": describe(res, name, ok), "peak_rss_mb": res["peak_rss_mb"],
                          "rc": res["rc"], "exact": ok}
            print(f"{name} {label}: {row[label]['text']}, peak RSS "
                  f"{res['peak_rss_mb']:.0f} MB", flush=True)
        rows.append(row)
    from soak import machine

    m = machine()
    cmd = " ".join([".venv/bin/python", "bench/hostile.py", *map(shlex.quote, sys.argv[1:])])
    lines = ["# Hostile input, round two: each finding before and after", "",
             f"`{cmd}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}): each "
             "recording replayed by `scoring-worker replay` (file source and sink, default "
             "settings, the golden demo model) in a child process; peak RSS is the child's "
             "(VmHWM, read every 10 ms). *Exact*: every output's ids equal its message's ids "
             "as pyarrow reads that message alone, and its scores the model's on those rows; "
             "*WRONG*: some output differs, or scores a message pyarrow alone refuses.", "",
             f"Machine: {m.get('Model name', '?')}, {m.get('cpus_usable', '?')} usable CPUs; "
             f"Python {m['python']}.", "",
             "| finding | input | " + " | ".join(
                 f"{label} ({r}) | peak RSS" for label, _t, r in trees) + " | test |",
             "|---|---|" + "---|---:|" * len(trees) + "---|"]
    for row in rows:
        cells = " | ".join(f"{row[label]['text']} | {row[label]['peak_rss_mb']:,.0f} MB"
                           for label, _t, _r in trees)
        lines.append(f"| {row['finding']} | {row['what']} | {cells} | "
                     f"`{TESTS.get(row['finding'], '-')}` |")
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"rows": rows, "machine": m},
                                                        indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
