"""The cases of issue 48 ("fail closed at the seams"), each as a user meets it, with what the
checkout this runs from does: run it from this checkout (`python bench/input_contract.py`)
and from an older one (`PYTHONPATH=<old checkout> python bench/input_contract.py`, built in
place with `python setup.py build_ext --inplace`) to see each case before and after. It uses
only what both versions take (source.fields as dotted paths, the Python API, serve's
Service), and prints one line a case; the memory cases run in processes of their own.

A fraud model as a team trains it: LightGBM on a pandas frame, amount and hour numbers,
country and merchant category code (mcc) pandas categories of strings."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import worker
from worker.config import load_settings
from worker.io.records import Record
from worker.pipeline import Pipeline

MCC = ["5411", "5812", "5999", "7995", "4829"]
COUNTRY = ["US", "GB", "DE", "NG", "IN"]


def frame(n: int, seed: int):
    import pandas as pd

    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "amount": rng.lognormal(3.5, 1.4, n).astype(np.float32),
        "hour": rng.integers(0, 24, n).astype(np.float32),
        "country": pd.Categorical(rng.choice(COUNTRY, n), categories=COUNTRY),
        "mcc": pd.Categorical(rng.choice(MCC, n, p=[.3, .3, .2, .1, .1]), categories=MCC)})


def train():
    import lightgbm as lgb

    df = frame(4000, 0)
    rng = np.random.default_rng(1)
    y = ((df.mcc == "7995") & ((df.hour < 6) | df.country.isin(["NG", "IN"])) |
         (df.amount > 900) & (rng.random(len(df)) < 0.6)).astype(int)
    clf = lgb.LGBMClassifier(n_estimators=60, num_leaves=15, verbose=-1, min_data_per_group=5,
                             cat_smooth=1.0, random_state=0).fit(df, y)
    return clf, worker.compile_model(clf)


def pipeline(model, fields, fmt="json", **source):
    settings = load_settings(
        None, scoring={"id_column": "txn_id", "threads": 1, "thresholds": [0.5]},
        model={"path": "unused"},
        source={"type": "file", "path": "x.arrows", "format": fmt, "fields": fields, **source},
        sink={"type": "file", "path": "o.arrows", "format": "json"})
    return Pipeline(model, settings, "scores")


def run(pipe, values):
    recs = [Record("in", 0, k, None, v, 0, []) for k, v in enumerate(values)]
    outs, dead, _ = pipe.process([(r, pipe.decode(r)) for r in recs])
    rows = []
    for o in outs:
        doc = json.loads(o.value)
        rows += [doc] if isinstance(doc, dict) else doc
    codes = sorted({dict(d.headers)["error_code"].decode() for d in dead})
    return rows, len(dead), codes


def events(df):
    return [{"txn_id": i, "amount": float(r.amount), "hour": int(r.hour),
             "merchant": {"country": r.country, "mcc": r.mcc}}
            for i, r in enumerate(df.itertuples(index=False))]


NESTED = {"country": "merchant.country", "mcc": "merchant.mcc"}


def case_typo(clf, model):
    df = frame(2000, 2)
    values = [json.dumps(e).encode() for e in events(df)]
    good, _, _ = run(pipeline(model, NESTED), values)
    rows, dead, codes = run(pipeline(model, {**NESTED, "country": "merchant.countr"}), values)
    review, typo_review = (sum(r["decision"] for r in x) for x in (good, rows))
    return (f"typo merchant.countr, 2,000 events: {len(rows)} scored ({typo_review} review, "
            f"{review} with the right path), {dead} dead-lettered {codes}")


def case_number_category(clf, model):
    ev = {"txn_id": 1, "amount": 40.0, "hour": 2, "merchant": {"country": "NG", "mcc": 7995}}
    pipe = pipeline(model, NESTED)
    as_string = run(pipe, [json.dumps({**ev, "merchant": {"country": "NG",
                                                          "mcc": "7995"}}).encode()])[0]
    rows, dead, codes = run(pipe, [json.dumps(ev).encode()])
    absent, dead2, codes2 = run(pipe, [json.dumps({k: v for k, v in ev.items()
                                                   if k != "merchant"}).encode()])
    got = f"{rows[0]['score']:.3f}" if rows else f"dead-lettered {codes}"
    got2 = f"{absent[0]['score']:.3f}" if absent else f"dead-lettered {codes2}"
    return (f"mcc 7995 as a number: {got} (as the string \"7995\": "
            f"{as_string[0]['score']:.3f}); merchant absent: {got2}")


def case_avro_schema_change(clf, model):
    import fastavro

    d = Path(tempfile.mkdtemp())
    txn = {"type": "record", "name": "Txn", "fields": [{"name": "amount", "type": "double"}]}

    def schema(t):
        return {"type": "record", "name": "Payment", "fields": [
            {"name": "txn_id", "type": "long"}, {"name": "txn", "type": t},
            {"name": "hour", "type": "int"}, {"name": "country", "type": "string"},
            {"name": "mcc", "type": "string"}]}

    kinds = {1: (txn, {"amount": 5000.0}), 2: ({"type": "map", "values": "double"},
                                               {"amount": 5000.0}),
             3: ("string", "5000.0"), 4: (["null", {"type": "map", "values": "double"}],
                                          {"amount": 5000.0})}
    for sid, (t, _) in kinds.items():
        (d / f"{sid}.avsc").write_text(json.dumps(schema(t)))
    pipe = pipeline(model, {"amount": "txn.amount"}, fmt="avro", schemas_dir=str(d))
    out = []
    for sid, (t, v) in kinds.items():
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, fastavro.parse_schema(schema(t)),
                                   {"txn_id": 7, "txn": v, "hour": 3, "country": "NG",
                                    "mcc": "7995"})
        rows, _, codes = run(pipe, [b"\0" + struct.pack(">I", sid) + buf.getvalue()])
        name = {1: "record", 2: "map", 3: "string", 4: "nullable map"}[sid]
        out.append(f"{name} {rows[0]['score']:.3f}" if rows else f"{name} {codes}")
    return "Avro txn as " + ", ".join(out)


def case_pandas(clf, model):
    df = frame(1000, 6)
    want = (clf.predict_proba(df)[:, 1] >= 0.5)
    rev = df[["mcc", "hour", "country", "amount"]]
    try:
        got = model.predict_proba(rev)[:, 1] >= 0.5
        flips = f"{int((got != want).sum())} of 1,000 decisions flip"
    except Exception as exc:  # noqa: BLE001
        flips = f"{type(exc).__name__}: {str(exc)[:80]}"
    try:
        model.predict_proba(df)
        train = "scores"
    except Exception as exc:  # noqa: BLE001
        train = f"{type(exc).__name__}: {str(exc)[:60]}"
    return f"pandas frame in another column order: {flips}; the training frame: {train}"


def case_serve(clf, model):
    from worker.serve.service import Service

    d = Path(tempfile.mkdtemp())
    model.save(d / "fraud.model")
    settings = load_settings(None, model={"path": str(d / "fraud.model")},
                             source={"type": "file", "path": "unused"})
    svc = Service(settings, str(d / "fraud.model"), "fraud")
    svc.load()
    body = json.dumps({"inputs": [{"name": "amount", "shape": [1], "datatype": "FP32",
                                   "data": [5000.0]}]}).encode()
    status, _, out, _ = svc.handle(b"POST", b"/v2/models/fraud/infer",
                                   {b"content-type": b"application/json"}, body)
    svc.close()
    what = json.loads(out)
    what = f"score {what['outputs'][0]['data'][0]:.4f}" if status == 200 else what["error"][:70]
    return f"serve, only amount of 4 features: {status} ({what})"


# both children: the process's memory, and a JSON pipeline whose features (and id) an event
# may leave out (a version without optional fields read absent keys as missing anyway)
_CHILD_HEAD = r'''
import sys
def kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
import worker
from worker.config import load_settings
from worker.io.records import Record
from worker.pipeline import Pipeline
model = worker.load_model(sys.argv[1])
sc = {"id_column": "txn_id", "threads": 1}
if sys.argv[2] == "1":
    sc["explain"] = {"method": "treeshap", "top_k": 3, "min_score": 0.0}
kw = dict(scoring=sc, model={"path": sys.argv[1]}, delivery={"memory_budget_mb": int(sys.argv[3])},
          sink={"type": "file", "path": "o", "format": "json"})
fields = {f: {"optional": True} for f in [*model.feature_names, "txn_id"]}
try:
    settings = load_settings(None, source={"type": "file", "path": "x", "format": "json",
                                           "fields": fields}, **kw)
except Exception:
    settings = load_settings(None, source={"type": "file", "path": "x", "format": "json"}, **kw)
pipe = Pipeline(model, settings, "out")
'''

_PEAK = _CHILD_HEAD + r'''
value = b"[" + b"{}," * 699_049 + b"{}]"
rec = Record("in", 0, 0, None, value, 0, [])
outs, dead, _ = pipe.process([(rec, pipe.decode(rec))])
print(len(outs), [dict(d.headers)["error_code"].decode() for d in dead],
      (kb("VmHWM:") - kb("RssFile:")) >> 10)
'''

_RESIDENT = _CHILD_HEAD + r'''
small = Record("in", 0, 0, None, b'{"txn_id": 1}', 0, [])
for _ in range(3):
    pipe.process([(small, pipe.decode(small))])
before = kb("VmRSS:")
got = pipe.decode(Record("in", 0, 1, None, b"[" + b"{}," * 2_666_666 + b"{}]", 0, []))
code = got.code
del got
for _ in range(3):
    pipe.process([(small, pipe.decode(small))])
print(code, (kb("VmRSS:") - before) >> 10)
'''


def case_memory(clf, model):
    d = Path(tempfile.mkdtemp())
    model.save(d / "fraud.model")
    out = []
    for explain in ("0", "1"):
        got = subprocess.run([sys.executable, "-c", _PEAK, str(d / "fraud.model"), explain,
                              "256"],
                             capture_output=True, text=True, check=True).stdout.split()
        out.append(f"{'with' if explain == '1' else 'without'} reason codes: "
                   f"{' '.join(got[:-1])} peak {got[-1]} MB")
    got = subprocess.run([sys.executable, "-c", _RESIDENT, str(d / "fraud.model"), "0",
                          "1024"],
                         capture_output=True, text=True, check=True).stdout.split()
    return ("2 MB JSON message of 699,050 {} under a 256 MB budget (outputs, dead letters, "
            "peak anonymous memory): " + "; ".join(out) +
            f". An 8 MB message of {{}} refused ({got[0]}): +{got[1]} MB resident after")


def case_avro_empty_items(clf, model):
    import time
    from types import SimpleNamespace

    from worker.formats import input_format

    d = tempfile.mkdtemp()
    schema = {"type": "record", "name": "T", "fields": [
        {"name": "xs", "type": {"type": "array", "items": "null"}},
        {"name": "a", "type": "double"}, {"name": "b", "type": "double"}]}
    Path(d, "1.avsc").write_text(json.dumps(schema))
    fmt = input_format("avro", SimpleNamespace(feature_names=["a", "b"], categories={}), None,
                       None, 1 << 20, None, schemas_dir=d)

    def long_(v):
        u, out = (v << 1) ^ (v >> 63), bytearray()
        while u >= 0x80:
            out.append((u & 0x7f) | 0x80)
            u >>= 7
        return bytes(out + bytes([u]))

    ordinary = b"\0\0\0\0\1" + long_(0) + struct.pack("<dd", 1.5, 2.5)
    hostile = b"\0\0\0\0\1" + long_(2**20) + long_(0) + struct.pack("<dd", 1.5, 2.5)

    def per(value, n):
        fmt.decode(value)
        t0 = time.perf_counter()
        for _ in range(n):
            fmt.decode(value)
        return (time.perf_counter() - t0) / n

    a, b = per(ordinary, 20000), per(hostile, 50)
    return (f"Avro array of nulls claiming 2^20 items ({len(hostile)} bytes): {b * 1e6:.1f} us "
            f"a message, an ordinary one {a * 1e6:.2f} us ({b / a:.0f}x)")


def main() -> None:
    import platform

    print(f"worker from {Path(worker.__file__).parent.parent}, {platform.processor() or ''} "
          f"{platform.machine()}, Python {platform.python_version()}")
    clf, model = train()
    for case in (case_typo, case_number_category, case_avro_schema_change, case_pandas,
                 case_serve, case_memory, case_avro_empty_items):
        try:
            print("-", case(clf, model))
        except Exception as exc:  # noqa: BLE001 (a version without the feature)
            print("-", case.__name__, "failed:", type(exc).__name__, str(exc)[:200])


if __name__ == "__main__":
    main()
