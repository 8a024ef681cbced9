"""JSON messages for the fuzzer: events of the golden model's features with values at the edges
(integers at 2^31, 2^32, 2^53, 2^63, 2^64, floats near float32's limits, strings, booleans,
nulls, nested values), one event or an array of them, then mutated as text and as bytes
(truncated, bytes flipped, keys doubled, nested 100,000 deep, numbers out of range, invalid
UTF-8). The oracle is Python's own ``json`` module: a message the worker scores must be one
Python reads, with the same rows (values cast to float32 as Arrow casts them) and ids, and
scores equal to the model's on those rows; a message Python reads as events of numbers is not
refused as malformed."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
from hypothesis import strategies as st

from worker import demo

from .messages import pack, through

FEATURES = demo.FEATURES
ID = demo.ID_COLUMN
# source.fields optional: true (an event may leave them out); the others are required
OPTIONAL = frozenset(FEATURES[1::2])

_EDGE_INTS = [0, -1, 1, 2**31 - 1, 2**31, -2**31, 2**32, 2**53 + 1, 2**63 - 1, -2**63, 2**63,
              2**64 - 1, 2**64, -2**63 - 1, 10**30]
_EDGE_FLOATS = [0.0, -0.0, 5e-324, 1e-45, 1.17549435e-38, 3.4028234663852886e38,
                3.4028235677973362e38, 3.4028235677973366e38, 3.5e38, 1.7976931348623157e308,
                0.1, 16777217.0]

_scalar = st.one_of(st.sampled_from(_EDGE_INTS), st.integers(),
                    st.sampled_from(_EDGE_FLOATS).flatmap(lambda v: st.sampled_from([v, -v])),
                    st.floats(allow_nan=False, allow_infinity=False), st.booleans(), st.none(),
                    st.text(max_size=8))
_any = st.recursive(_scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.text(max_size=4), inner,
                                                                     max_size=3)),
                    max_leaves=8)


@st.composite
def _event(draw) -> dict:
    ev = {}
    names = FEATURES if draw(st.booleans()) else \
        draw(st.lists(st.sampled_from(FEATURES), unique=True))
    for name in names:
        ev[name] = draw(st.one_of(_scalar, _scalar, _scalar, _any))
    if draw(st.booleans()):
        ev[ID] = draw(st.one_of(st.integers(-2**63, 2**63 - 1), st.text(max_size=6), st.none(),
                                st.sampled_from(_EDGE_INTS), st.floats()))
    for _ in range(draw(st.integers(0, 2))):
        ev[draw(st.text(max_size=5))] = draw(_any)
    return ev


_NUMBERS = [b"1e400", b"-1e309", b"123456789012345678901234567890", b"3.4028236e38", b"-0",
            b"1E+38", b"NaN", b"Infinity", b"0.0000000000000000000000000000000000000000000001"]


@st.composite
def one(draw) -> tuple[bytes, str]:
    events = draw(st.lists(_event(), max_size=4))
    doc = events[0] if events and draw(st.booleans()) else events
    text = json.dumps(doc, indent=draw(st.sampled_from([None, None, 1])),
                      ensure_ascii=draw(st.booleans()))
    data = text.encode("utf-8", "surrogatepass")
    how = draw(st.sampled_from(["plain", "plain", "truncate", "flip", "insert", "dup", "deep",
                                "number", "utf8"]))
    if how == "truncate" and data:
        data = data[:draw(st.integers(0, len(data) - 1))]
    elif how == "flip" and data:
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([data[i] ^ (1 << draw(st.integers(0, 7)))]) + data[i + 1:]
    elif how == "insert":
        i = draw(st.integers(0, len(data)))
        data = data[:i] + draw(st.binary(min_size=1, max_size=4)) + data[i:]
    elif how == "dup" and b"{" in data:
        key = json.dumps(draw(st.sampled_from(FEATURES + [ID]))).encode()
        data = data.replace(b"{", b"{" + key + b": 1, ", 1)
    elif how == "deep":
        n = draw(st.sampled_from([63, 64, 65, 1000, 100_000]))
        inner = b"[" * n + b"]" * n
        data = (b'{"x": ' + inner + b"}") if draw(st.booleans()) else inner
    elif how == "number" and b": " in data:
        data = data.replace(b": ", b": " + draw(st.sampled_from(_NUMBERS)) + b", \"_\": ", 1)
    elif how == "utf8":
        i = draw(st.integers(0, len(data)))
        data = data[:i] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80"])) \
            + data[i:]
    return data, how


@st.composite
def cases(draw) -> tuple[bytes, str]:
    n = draw(st.sampled_from([1, 1, 1, 3]))
    values = [draw(one()) for _ in range(n)]
    return pack([v for v, _ in values]), "+".join(w for _, w in values)


def _reject(_):
    raise ValueError("NaN or Infinity")


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    read = set(FEATURES) | {ID}
    if any(keys.count(k) > 1 for k in keys if k in read):
        raise ValueError("a read key given twice")
    return dict(pairs)


def _f32(v) -> float:
    """A JSON value as the worker casts it (Arrow's casts); raises ValueError where it refuses."""
    if v is None:
        return math.nan
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int):
        if -2**63 <= v < 2**63:
            return float(pa.array([v], pa.int64()).cast(pa.float32(), safe=False)[0].as_py())
        if 0 <= v < 2**64:
            return float(pa.array([v], pa.uint64()).cast(pa.float32(), safe=False)[0].as_py())
        raise ValueError("integer beyond 64 bits")
    if isinstance(v, float):
        with np.errstate(over="ignore"):
            x = np.float32(v)
        if not np.isfinite(x):
            raise ValueError("outside float32")
        return float(x)
    raise ValueError(f"{type(v).__name__} for a numeric feature")


def reference(value: bytes):
    """(rows, ids) as Python's json module and Arrow's casts read the message; raises
    ValueError where the worker must refuse it."""
    doc = json.loads(value.decode("utf-8"), parse_constant=_reject,
                     object_pairs_hook=_no_duplicates)
    events = [doc] if isinstance(doc, dict) else doc
    if not isinstance(events, list) or not events or \
            not all(isinstance(e, dict) for e in events):
        raise ValueError("not an event or a non-empty array of events")
    for e in events:  # absent is not missing: a required key absent refuses the message
        if any(f not in e for f in FEATURES if f not in OPTIONAL):
            raise ValueError("a required feature's key is absent")
    X = np.array([[_f32(e.get(f)) for f in FEATURES] for e in events], dtype=np.float32)
    ids = [e.get(ID) for e in events]
    for i in ids:
        if not (i is None or isinstance(i, str) or
                (isinstance(i, int) and not isinstance(i, bool) and -2**63 <= i < 2**63)):
            raise ValueError("an id that is neither int64 nor a string")
    if any(isinstance(i, str) for i in ids) and any(isinstance(i, int) for i in ids):
        raise ValueError("mixed ids")
    return X, ids


# refusals that Python's json cannot tell, each only where its cause is in the message
# (issue 55: any of these codes was accepted for a message Python reads, so an over-refusal
# was invisible): nesting past the README's 64, a message past the byte or row bounds, a lone
# surrogate (\\ud800: Python reads it, it is no UTF-8), a number outside the double range or
# an integer beyond 64 bits anywhere in the message, read or not
MAX_DEPTH = 64  # README, worker/formats/json.py


def _depth(doc) -> int:
    """Nesting of objects and arrays, as simdjson counts it (a scalar message is 0)."""
    if isinstance(doc, dict):
        return 1 + max((_depth(v) for v in doc.values()), default=0)
    if isinstance(doc, list):
        return 1 + max((_depth(v) for v in doc), default=0)
    return 0


def _walk(doc):
    yield doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield k
            yield from _walk(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from _walk(v)


def _surrogate(s: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in s)


def _justified(code: str, value: bytes, limits) -> str | None:
    """Why the worker may refuse ``value`` with ``code`` though Python reads it (None: it may
    not: an over-refusal)."""
    try:
        doc = json.loads(value.decode("utf-8"), parse_constant=_reject)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return "unreadable as plain JSON"
    if code == "too_deep":
        return "nested past 64" if _depth(doc) > MAX_DEPTH else None
    if code == "too_large":
        events = doc if isinstance(doc, list) else [doc]
        max_rows, max_bytes = limits
        if len(events) > max_rows or len(value) * 16 > max_bytes:
            return "past the row or byte bound"
        return None
    if code == "bad_utf8":
        return "a lone surrogate" if any(isinstance(x, str) and _surrogate(x)
                                         for x in _walk(doc)) else None
    if code == "bad_number":
        for x in _walk(doc):
            if isinstance(x, bool):
                continue
            if isinstance(x, int) and not -2**63 <= x < 2**64:
                return "an integer beyond 64 bits"
            if isinstance(x, float) and not math.isfinite(x):
                return "a number outside the double range"
        return None
    return None


def check(pipeline, data: bytes, i: int, max_rows: int = 1_000_000) -> str:
    limits = (max_rows, pipeline.max_message_bytes)  # delivery.max_message_rows, bytes

    def refused(value: bytes, code: str, _why: str) -> None:
        try:
            reference(value)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return
        assert _justified(code, value, limits), \
            f"refused ({code}) a message Python reads as events: {value[:200]!r}"

    def scored(value: bytes, output) -> None:
        try:
            X, ids = reference(value)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise AssertionError(f"scored a message Python refuses ({exc})") from None
        out = json.loads(output.value)
        rows = [out] if isinstance(out, dict) else out
        assert len(rows) == len(X)
        assert [r[ID] for r in rows] == ids, "the ids are not the message's"
        want = pipeline.model.predict_proba(X, n_threads=1)[:, 1]
        np.testing.assert_array_equal([r["score"] for r in rows], want)

    return through(pipeline, data, i, refused, scored)


def check_factory(state):
    from worker.config import load_settings
    from worker.model.compiled import load_model
    from worker.pipeline import Pipeline

    from .runner import GOLDEN_MODEL

    model = load_model(GOLDEN_MODEL)
    settings = load_settings(None, scoring={"id_column": ID, "threads": 1},
                             model={"path": str(GOLDEN_MODEL)},
                             source={"type": "file", "path": "fuzz.arrows", "format": "json",
                                     "fields": {f: {"optional": True}
                                                for f in OPTIONAL | {ID}}},
                             sink={"type": "file", "path": "out.arrows", "format": "json"})
    pipeline = Pipeline(model, settings, "scores")

    def run(value: bytes, what: str, i: int) -> str:
        return check(pipeline, value, i, settings.delivery.max_message_rows)

    return run
