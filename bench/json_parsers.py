"""JSON readers a worker could use, on bench/e2e.py's events (30 float features and an id):
microseconds a message to get its events into a float32 row block, one-event messages and
100-event arrays, one thread, best of 5.

    python bench/json_parsers.py

Readers: ours (``worker._eventread.JsonReader``: simdjson's DOM parser in C++, straight into
rows); ``json.loads`` / orjson / msgspec / pysimdjson, each then a row block built from the
Python objects; pyarrow's JSON reader (``pyarrow.json.read_json``, newline-delimited events)
per message and over 500 messages at once. A reader that is not installed is skipped.
"""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "bench"))

import e2e  # noqa: E402
import numpy as np  # noqa: E402

FEATURES = e2e.FEATURES


def _events(n: int) -> list[dict]:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(n, len(FEATURES))).astype(np.float32)
    return [{"txn_id": i, **{f: float(v) for f, v in zip(FEATURES, row, strict=True)}}
            for i, row in enumerate(X)]


def _best_us(fn, values: list[bytes], repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for v in values:
            fn(v)
        best = min(best, time.perf_counter() - t0)
    return best / len(values) * 1e6


def readers() -> dict:
    def rows(doc):
        events = [doc] if isinstance(doc, dict) else doc
        return np.array([[e.get(f) for f in FEATURES] for e in events], dtype=np.float32)

    out = {}
    from worker import _eventread

    ours = _eventread.JsonReader([[f] for f in FEATURES], ["txn_id"], {}, FEATURES, 0,
                                 1 << 26, 64)
    out["scoring-worker (simdjson DOM, C++)"] = ours.read
    out["json.loads + rows"] = lambda v: rows(json.loads(v))
    try:
        import orjson

        out["orjson + rows"] = lambda v: rows(orjson.loads(v))
    except ImportError:
        pass
    try:
        import msgspec

        dec = msgspec.json.Decoder()
        out["msgspec + rows"] = lambda v: rows(dec.decode(v))
    except ImportError:
        pass
    try:
        import simdjson

        parser = simdjson.Parser()
        out["pysimdjson + rows"] = lambda v: rows(parser.parse(v).as_dict()
                                                  if v[:1] == b"{" else parser.parse(v).as_list())
    except ImportError:
        pass
    import pyarrow as pa
    import pyarrow.json as pj

    schema = pa.schema([("txn_id", pa.int64())] + [(f, pa.float32()) for f in FEATURES])
    po = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    ro = pj.ReadOptions(use_threads=False)

    def arrow_rows(v):
        lines = v if v[:1] == b"{" else b"\n".join(json.dumps(e).encode()
                                                   for e in json.loads(v))
        t = pj.read_json(io.BytesIO(lines), read_options=ro, parse_options=po)
        return np.column_stack([t.column(f).to_numpy() for f in FEATURES])

    out["pyarrow.json, a message at a time"] = arrow_rows
    return out


def main() -> int:
    events = _events(500)
    one = [json.dumps(e).encode() for e in events]
    hundred = [json.dumps(events[i:i + 100]).encode() for i in range(0, 500, 100)]
    print("| reader | 1-event message (us) | 100-event message (us) |")
    print("|---|---|---|")
    for name, fn in readers().items():
        a = _best_us(fn, one)
        b = _best_us(fn, hundred)
        print(f"| {name} | {a:.1f} | {b:.0f} |", flush=True)
    import pyarrow as pa
    import pyarrow.json as pj

    schema = pa.schema([("txn_id", pa.int64())] + [(f, pa.float32()) for f in FEATURES])
    po = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    ro = pj.ReadOptions(use_threads=False)
    block = b"\n".join(one)
    t = _best_us(lambda v: pj.read_json(io.BytesIO(v), read_options=ro, parse_options=po),
                 [block]) / len(one)
    print(f"| pyarrow.json, 500 one-event messages joined into one read | {t:.1f} a message | "
          "- |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
