"""Message formats end to end, file -> file: the same events as Arrow IPC streams and as JSON,
through the worker, against the loop a user writes for JSON, in one run.

    python bench/formats.py [--quick]     # prints the table; make bench-e2e writes it into
                                          # bench/E2E-RESULTS.md (bench/e2e.py calls bench())

Model and events: bench/e2e.py's (XGBoost 300 trees x depth 6, 30 float32 features, 2%
missing, an int64 ``txn_id``), ``threads: 1``. Messages of 1 event (a JSON object, an Avro
record) and of 100 (a JSON array). For each: the worker reading Arrow and writing Arrow, the
worker reading JSON and writing JSON, and the hand-written JSON loop (``json.loads``, a
float32 row block, XGBoost ``inplace_predict``, ``json.dumps`` of id and score per event);
for one-event messages also the worker reading Avro (Confluent's wire format) and writing
JSON, and the hand-written Avro loop (fastavro's ``schemaless_reader``, ``inplace_predict``,
``json.dumps``). Rates are messages/s of the run
loop (the worker's ``worker stopped ... seconds``; the hand loop timed around its loop, reading
and writing the same recorded topics), the best of two runs.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "bench"))

import e2e  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402

COUNTS = {1: 20_000, 100: 2_000}


def json_recording(rows: int, n: int) -> Path:
    """The events of ``e2e.recording(rows, n)`` as JSON messages: an object for one event,
    an array for more; a missing value as null."""
    from worker.io.records import Record, read_records, write_records

    path = e2e.OUT / f"in-{rows}x{n}.json.arrows"
    if not path.exists():
        import pyarrow as pa

        def as_json(rec):
            t = pa.ipc.open_stream(rec.value).read_all()
            events = [{k: (None if isinstance(v, float) and math.isnan(v) else v)
                       for k, v in ev.items()} for ev in t.to_pylist()]
            doc = events[0] if rows == 1 else events
            return Record(rec.topic, rec.partition, rec.offset, rec.key,
                          json.dumps(doc).encode(), rec.timestamp_ms,
                          [("content-type", b"application/json")])

        write_records(path, (as_json(r) for r in read_records(e2e.recording(rows, n))))
    return path


AVRO_ID = 1


def avro_schema() -> dict:
    return {"type": "record", "name": "Txn", "fields": [
        {"name": "txn_id", "type": "long"},
        *({"name": f, "type": ["null", "float"]} for f in e2e.FEATURES)]}


def avro_recording(rows: int, n: int) -> Path:
    """The one-event messages of ``json_recording(1, n)`` as Avro in Confluent's wire format
    (schema id 1, bench/out/e2e/schemas/1.avsc)."""
    import io
    import struct

    import fastavro

    from worker.io.records import Record, read_records, write_records

    schemas = e2e.OUT / "schemas"
    schemas.mkdir(parents=True, exist_ok=True)
    (schemas / f"{AVRO_ID}.avsc").write_text(json.dumps(avro_schema()))
    path = e2e.OUT / f"in-{rows}x{n}.avro.arrows"
    if not path.exists():
        parsed = fastavro.parse_schema(avro_schema())
        head = b"\0" + struct.pack(">I", AVRO_ID)

        def as_avro(rec):
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, parsed, json.loads(rec.value))
            return Record(rec.topic, rec.partition, rec.offset, rec.key, head + buf.getvalue(),
                          rec.timestamp_ms, [("content-type", b"application/vnd.confluent.avro")])

        write_records(path, (as_avro(r) for r in read_records(json_recording(rows, n))))
    return path


def worker_run(path: Path, art: Path, tmp: Path, fmt: str) -> float:
    """Seconds of the worker's run loop, ``fmt`` in (Avro answered in JSON) and out."""
    cfg = tmp / f"{fmt}.yaml"
    source = {"type": "file", "path": str(path), "format": fmt}
    if fmt == "avro":
        source["schemas_dir"] = str(e2e.OUT / "schemas")
    cfg.write_text(yaml.safe_dump({
        "source": source,
        "sink": {"type": "file", "path": str(tmp / f"scores-{fmt}.arrows"),
                 "format": "json" if fmt == "avro" else fmt},
        "model": {"path": str(art)},
        "scoring": {"id_column": "txn_id", "thresholds": [0.5, 0.9], "threads": 1},
        "logging": {"level": "INFO", "format": "json", "progress": False},
    }))
    p = subprocess.run([sys.executable, "-m", "worker.cli", "--config", str(cfg)],
                       cwd=e2e.package_tree(), capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"worker failed: {p.stderr[-2000:]}")
    for line in p.stderr.splitlines():
        if '"worker stopped"' in line:
            stats = json.loads(line)
            if stats.get("dead_letters"):
                raise RuntimeError(f"{stats['dead_letters']} dead letters in the {fmt} run")
            return float(stats["seconds"])
    raise RuntimeError("no 'worker stopped' line")


def hand_json_loop(path: Path, tmp: Path, booster) -> float:
    """The loop a user writes for JSON events: parse, a row block, inplace_predict, dumps."""
    from worker.io.records import Record, RecordWriter, read_records

    recs = list(read_records(path))
    features = e2e.FEATURES
    t0 = time.perf_counter()
    with RecordWriter(tmp / "hand.arrows") as w:
        out = []
        for rec in recs:
            doc = json.loads(rec.value)
            events = [doc] if isinstance(doc, dict) else doc
            X = np.array([[e.get(f) for f in features] for e in events], dtype=np.float32)
            score = booster.inplace_predict(X)
            res = [{"txn_id": e.get("txn_id"), "score": float(s)}
                   for e, s in zip(events, score, strict=True)]
            value = json.dumps(res[0] if isinstance(doc, dict) else res).encode()
            out.append(Record("out", -1, -1, rec.key, value, rec.timestamp_ms, rec.headers))
            if len(out) >= 1000:
                w.write(out)
                out = []
        w.write(out)
    return time.perf_counter() - t0


def hand_avro_loop(path: Path, tmp: Path, booster) -> float:
    """The loop a user writes for Avro events: fastavro, a row, inplace_predict, dumps."""
    import io

    import fastavro

    from worker.io.records import Record, RecordWriter, read_records

    recs = list(read_records(path))
    parsed = fastavro.parse_schema(avro_schema())
    features = e2e.FEATURES
    t0 = time.perf_counter()
    with RecordWriter(tmp / "hand-avro.arrows") as w:
        out = []
        for rec in recs:
            ev = fastavro.schemaless_reader(io.BytesIO(rec.value[5:]), parsed)
            X = np.array([[ev.get(f) for f in features]], dtype=np.float32)
            score = booster.inplace_predict(X)
            value = json.dumps({"txn_id": ev["txn_id"], "score": float(score[0])}).encode()
            out.append(Record("out", -1, -1, rec.key, value, rec.timestamp_ms, rec.headers))
            if len(out) >= 1000:
                w.write(out)
                out = []
        w.write(out)
    return time.perf_counter() - t0


def bench(art: Path, xgb_path: Path, quick: bool) -> dict:
    import xgboost as xgb

    booster = xgb.Booster(model_file=str(xgb_path))
    booster.set_param({"nthread": 1})
    res = {}
    for rows, n in COUNTS.items():
        n = max(n // 10, 30) if quick else n
        arrow, js = e2e.recording(rows, n), json_recording(rows, n)
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            a = min(worker_run(arrow, art, tmp, "arrow") for _ in range(2))
            j = min(worker_run(js, art, tmp, "json") for _ in range(2))
            h = min(hand_json_loop(js, tmp, booster) for _ in range(2))
            res[rows] = {"messages": n, "arrow_s": a, "json_s": j, "hand_json_s": h}
            if rows == 1:  # Avro: one record a message
                av = avro_recording(rows, n)
                res[rows]["avro_s"] = min(worker_run(av, art, tmp, "avro") for _ in range(2))
                res[rows]["hand_avro_s"] = min(hand_avro_loop(av, tmp, booster)
                                               for _ in range(2))
        print(f"formats {rows:>3} events/msg: arrow {n / a:,.0f} msg/s, json {n / j:,.0f} "
              f"msg/s ({a / j:.0%} of arrow), hand-written json loop {n / h:,.0f} msg/s "
              f"(json worker {h / j:.1f}x)", flush=True)
        if "avro_s" in res[rows]:
            av, ha = res[rows]["avro_s"], res[rows]["hand_avro_s"]
            print(f"formats {rows:>3} events/msg: avro {n / av:,.0f} msg/s ({a / av:.0%} of "
                  f"arrow), hand-written avro loop {n / ha:,.0f} msg/s (avro worker "
                  f"{ha / av:.1f}x)", flush=True)
    return res


def report_lines(res: dict) -> list[str]:
    one = res.get("1") or res.get(1)
    hundred = res.get("100") or res.get(100)
    lines = ["## Message formats, file -> file (the same events, one run)", "",
             "| events per message | Arrow msg/s | JSON msg/s | JSON of Arrow | hand-written "
             "JSON loop msg/s | JSON worker / hand loop | Arrow rows/s | JSON rows/s |",
             "|---|---|---|---|---|---|---|---|"]
    for rows, s in ((1, one), (100, hundred)):
        if s is None:
            continue
        n = s["messages"]
        lines.append(f"| {rows} | {n / s['arrow_s']:,.0f} | {n / s['json_s']:,.0f} | "
                     f"{s['arrow_s'] / s['json_s']:.0%} | {n / s['hand_json_s']:,.0f} | "
                     f"{s['hand_json_s'] / s['json_s']:.1f}x | {n * rows / s['arrow_s']:,.0f} | "
                     f"{n * rows / s['json_s']:,.0f} |")
    if one is not None and "avro_s" in one:
        n = one["messages"]
        lines += ["", "| one-event messages | Avro msg/s | Avro of Arrow | hand-written Avro "
                  "loop (fastavro) msg/s | Avro worker / hand loop |", "|---|---|---|---|---|",
                  f"| 1 | {n / one['avro_s']:,.0f} | {one['arrow_s'] / one['avro_s']:.0%} | "
                  f"{n / one['hand_avro_s']:,.0f} | "
                  f"{one['hand_avro_s'] / one['avro_s']:.1f}x |"]
    if one is not None:
        lines += ["", "Targets (issue 34), one-event messages:"]
        for fmt in ("json", "avro"):
            if f"{fmt}_s" not in one:
                continue
            ratio = one["arrow_s"] / one[f"{fmt}_s"]
            hand = one[f"hand_{fmt}_s"] / one[f"{fmt}_s"]
            lines.append(f"- {fmt.upper() if fmt == 'json' else 'Avro'} of Arrow's msg/s "
                         f"{ratio:.0%} (goal >= 50%: {'met' if ratio >= 0.5 else 'missed'}); "
                         f"over the hand-written loop {hand:.1f}x (goal >= 5x: "
                         f"{'met' if hand >= 5 else 'missed'})")
        lines.append("")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a tenth of the messages")
    args = ap.parse_args()
    xgb_path, art = e2e.model_files()
    res = bench(art, xgb_path, args.quick)
    print("\n".join(report_lines(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
