"""Inference requests for the fuzzer (`scoring-worker serve`'s request parser and scoring):
Open Inference Protocol bodies of the golden model's features, in the matrix form or one
input per feature, JSON values or Triton binary tensors, with shapes, binary sizes and the
JSON header's length at integer edges (2^31, 2^32, 2^63 - 1, negative), wrong datatypes,
nested and mixed values, NaN and Infinity literals, then mutated as bytes (truncated,
flipped, inserted, nested 100,000 deep, invalid UTF-8).

The oracle is a reading of the protocol written here, on Python's json module and struct:
a request the service scores must be one it reads, with the same rows (values cast to
float32 as Arrow casts them), and scores equal to the model's on those rows; one it reads
must not be refused; nothing is answered 500."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pyarrow as pa
from hypothesis import strategies as st

from worker import demo

FEATURES = demo.FEATURES
F = len(FEATURES)
MAX_ROWS = 64
PATH = b"/v2/models/golden/infer"
_TYPES = {"BOOL": "?", "UINT8": "B", "UINT16": "H", "UINT32": "I", "UINT64": "Q", "INT8": "b",
          "INT16": "h", "INT32": "i", "INT64": "q", "FP16": "e", "FP32": "f", "FP64": "d"}
_EDGES = [0, 1, -1, 2, 7, F, F + 1, MAX_ROWS, MAX_ROWS + 1, 2**31 - 1, 2**31, 2**32,
          2**32 + 1, 2**63 - 1, -2**63, 2**64 + 3]
_OUTPUTS = ["score", "label", "decision", "work_units", "stop_reason", "reason_feature",
            "reason_value", "nonesuch"]
_scalar = st.one_of(st.floats(width=32), st.floats(), st.integers(-2**70, 2**70),
                    st.sampled_from([0, -0.0, 2**53 + 1, 2**63 - 1, 2**64 - 1, 3.5e38, 1e-46]),
                    st.booleans(), st.none(), st.text(max_size=3))


_clean = st.one_of(st.floats(width=32, allow_nan=False, allow_infinity=False),
                   st.integers(-2**24, 2**24), st.none())
_clean_int = st.one_of(st.integers(-100, 100), st.none())


@st.composite
def _tensor(draw, name: str, count: int, shape: list) -> tuple[dict, bytes]:
    # mostly requests that should be scored (Hypothesis draws the first choice most)
    clean = draw(st.sampled_from([True, True, True, False]))
    datatype = draw(st.sampled_from(["FP32", "FP64", "INT32", "FP32"])) if clean else \
        draw(st.sampled_from(list(_TYPES) + ["FP32"] * 4 + ["BYTES", "BF16", 7, None]))
    t: dict = {"name": name, "shape": shape, "datatype": datatype}
    if draw(st.sampled_from([False, True])) and datatype in _TYPES:  # binary
        code = _TYPES[datatype]
        size = struct.calcsize(code)
        n = max(0, min(count, 256))
        raw = draw(st.binary(min_size=n * size, max_size=n * size))
        declared = len(raw) if draw(st.sampled_from([True] * 5 + [False])) else \
            draw(st.sampled_from(_EDGES + [len(raw) + 1, len(raw) - 1]))
        t["parameters"] = {"binary_data_size": declared}
        return t, raw
    n = max(0, min(count, 256))
    elem = (_clean_int if datatype == "INT32" else _clean) if clean else _scalar
    values = draw(st.lists(elem, min_size=n, max_size=n))
    # the count off by one
    if not clean and draw(st.sampled_from([False, False, False, True])) and values:
        values = values[:-1] if draw(st.booleans()) else values + [1.0]
    if len(shape) == 2 and type(shape[1]) is int and 0 < shape[1] < 2**20 and \
            draw(st.booleans()):  # nested row by row
        w = shape[1]
        values = [values[i:i + w] for i in range(0, len(values), w)]
    t["data"] = values
    return t, b""


@st.composite
def _request(draw) -> tuple[bytes, int | None, str]:
    rows = draw(st.sampled_from([0, 1, 1, 1, 2, 3, 5]))
    inputs, chunks = [], []
    form = draw(st.sampled_from(["matrix", "matrix", "features"]))
    if form == "matrix":
        shape = draw(st.sampled_from([[rows, F]] * 24 + [[rows], [rows, F + 1], [F],
                                                         [draw(st.sampled_from(_EDGES)), F],
                                                         [rows, draw(st.sampled_from(_EDGES))],
                                                         [rows, F, 1], [], "x", [True, F],
                                                         [rows, float(F)]]))
        count = rows * F if isinstance(shape, list) and len(shape) == 2 and \
            all(type(d) is int and 0 <= d < 2**20 for d in shape) else rows * F
        t, raw = draw(_tensor(draw(st.sampled_from(["input-0"] * 6 + ["x", "", 5])), count, shape))
        inputs.append(t)
        chunks.append(raw)
    else:
        names = draw(st.lists(st.sampled_from(FEATURES + ["nofeature"]), min_size=1,
                              max_size=F + 1,
                              unique=draw(st.sampled_from([True, True, True, False]))))
        for name in names:
            shape = draw(st.sampled_from([[rows]] * 20 + [[rows, 1], [rows + 1], [rows, 2],
                                                         [draw(st.sampled_from(_EDGES))]]))
            t, raw = draw(_tensor(name, rows, shape))
            inputs.append(t)
            chunks.append(raw)
    doc: dict = {"inputs": inputs}
    if draw(st.booleans()):
        doc["id"] = draw(st.one_of(st.text(max_size=5), st.text(max_size=5),
                                   st.integers()))
    if draw(st.booleans()):
        doc["outputs"] = [{"name": n, **({"parameters": {"binary_data": draw(st.one_of(
            st.booleans(), st.booleans(), st.none(), st.integers(0, 2)))}}
            if draw(st.booleans()) else {})}
            for n in draw(st.lists(st.sampled_from(_OUTPUTS[:5] * 3 + _OUTPUTS[5:]),
                                   max_size=4, unique=draw(st.booleans())))]
    if draw(st.booleans()):
        doc["parameters"] = draw(st.fixed_dictionaries({}, optional={
            "binary_data_output": st.one_of(st.booleans(), st.integers(0, 1)),
            "top_k": st.sampled_from([1, 3, 64, 0, 65, -1, 2**63, 1.0, True])}))
    text = json.dumps(doc, allow_nan=True).encode()  # NaN, Infinity: as tritonclient writes
    binary = b"".join(chunks)
    hlen = len(text) if binary or draw(st.sampled_from([False, False, False, True])) else None
    if hlen is not None and draw(st.sampled_from([False] * 11 + [True])):
        hlen = draw(st.sampled_from(_EDGES + [len(text) - 1, len(text) + 1]))
    body = text + binary
    how = draw(st.sampled_from(["plain"] * 12 + ["truncate", "flip", "insert", "deep",
                                                  "utf8"]))
    if how == "truncate" and body:
        body = body[:draw(st.integers(0, len(body) - 1))]
    elif how == "flip" and body:
        i = draw(st.integers(0, len(body) - 1))
        body = body[:i] + bytes([body[i] ^ (1 << draw(st.integers(0, 7)))]) + body[i + 1:]
    elif how == "insert":
        i = draw(st.integers(0, len(body)))
        body = body[:i] + draw(st.binary(min_size=1, max_size=4)) + body[i:]
    elif how == "deep":
        n = draw(st.sampled_from([2, 3, 64, 1000, 100_000]))
        body = body.replace(b'"data": [', b'"data": ' + b"[" * n, 1) \
            .replace(b"]", b"]" * n, 1) if b'"data": [' in body else b"[" * n + b"]" * n
    elif how == "utf8":
        i = draw(st.integers(0, len(text)))
        body = body[:i] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) + body[i:]
    return body, hlen, f"{form}+{how}"


@st.composite
def cases(draw) -> tuple[bytes, str]:
    body, hlen, what = draw(_request())
    return struct.pack("<q?", hlen if hlen is not None and -2**63 <= hlen < 2**63 else 0,
                       hlen is not None) + body, what


def unpack(data: bytes) -> tuple[bytes, int | None]:
    hlen, has = struct.unpack_from("<q?", data)
    return data[9:], hlen if has else None


# ---- the oracle -------------------------------------------------------------------------------

class Refused(Exception):
    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.status = status


_RANGES = {t: (np.iinfo(c).min, np.iinfo(c).max) for t, c in
           (("UINT8", "u1"), ("UINT16", "u2"), ("UINT32", "u4"), ("UINT64", "u8"),
            ("INT8", "i1"), ("INT16", "i2"), ("INT32", "i4"), ("INT64", "i8"))}


def _f32(v, datatype: str) -> float:
    if v is None:
        return math.nan
    if type(v) is bool:
        return float(v)
    if datatype == "BOOL":
        raise Refused(400, "BOOL takes true, false or null")
    if datatype in _RANGES and type(v) is float and math.isinf(v):
        raise Refused(400, "an integer type cannot hold infinity")
    if datatype in _RANGES and type(v) in (int, float) and not (
            type(v) is float and not v.is_integer()):
        lo, hi = _RANGES[datatype]
        if not lo <= v <= hi:
            raise Refused(400, "outside the type's range")
    if datatype == "FP16" and type(v) in (int, float):
        with np.errstate(over="ignore"):
            return float(np.float32(np.float16(float(v) if abs(v) < 2**1000 else
                                               math.copysign(math.inf, v))))
    if type(v) is int:
        if datatype == "FP64":  # float64s, as an FP64 tensor's binary form holds them
            with np.errstate(over="ignore"):
                return float(np.float32(float(v))) if abs(v) < 2**1000 else \
                    math.copysign(math.inf, v)
        return _int_f32(v)
    if type(v) is float:
        if datatype[0] in "IU" and math.isfinite(v) and not v.is_integer():
            raise Refused(400, "an integer type with a fraction")
        with np.errstate(over="ignore"):
            return float(np.float32(v))
    raise Refused(400, f"{type(v).__name__} value")


def _int_f32(v: int) -> float:
    """An integer as float32 as Arrow casts int64 and uint64 (one rounding)."""
    if -2**63 <= v < 2**63:
        return float(pa.array([v], pa.int64()).cast(pa.float32(), safe=False)[0].as_py())
    if 0 <= v < 2**64:
        return float(pa.array([v], pa.uint64()).cast(pa.float32(), safe=False)[0].as_py())
    return float(np.float32(float(v))) if abs(v) < 2**1000 else math.copysign(math.inf, v)


def _nesting(doc) -> tuple[int, int]:
    """(deepest nesting, arrays and objects) of a parsed JSON document."""
    most, count, stack = 0, 0, [(doc, 1)]
    while stack:
        v, depth = stack.pop()
        if type(v) in (list, dict):
            count += 1
            most = max(most, depth)
            stack.extend((x, depth + 1) for x in (v.values() if type(v) is dict else v))
    return most, count


def _values(t: dict, count: int, binary: bytes, pos: int, shape: list
            ) -> tuple[list[float], int]:
    datatype = t.get("datatype")
    if datatype not in _TYPES:
        raise Refused(400, "datatype")
    params = t.get("parameters")
    if params is not None and type(params) is not dict:
        raise Refused(400, "parameters")
    size = (params or {}).get("binary_data_size")
    if size is not None:
        if "data" in t or type(size) is not int or size < 0:
            raise Refused(400, "binary_data_size")
        code = _TYPES[datatype]
        if size != count * struct.calcsize(code) or size > len(binary) - pos:
            raise Refused(400, "binary size")
        vals = struct.unpack_from(f"<{count}{code}", binary, pos)
        if datatype == "BOOL":
            vals = [float(binary[pos + i] != 0) for i in range(count)]
        out = []
        for v in vals:
            if type(v) is int:
                out.append(_int_f32(v))
            else:
                with np.errstate(over="ignore"):
                    out.append(float(np.float32(v)))
        return out, pos + size
    data = t.get("data")
    if type(data) is not list:
        raise Refused(400, "data")
    if data and type(data[0]) is list:
        width = shape[1] if len(shape) == 2 else -1
        if len(data) != shape[0] or any(type(r) is not list or len(r) != width for r in data):
            raise Refused(400, "rows not as the shape says")
        data = [v for r in data for v in r]
    if len(data) != count:
        raise Refused(400, "count")
    return [_f32(v, datatype) for v in data], pos


def _shape(t) -> list[int]:
    s = t.get("shape")
    # an integer beyond 64 bits is no integer to the service's JSON parser (orjson reads it
    # as a float): a bad shape, not too many rows
    if type(s) is not list or not 1 <= len(s) <= 2 or any(type(d) is not int or d < 0 or
                                                           d >= 2**64 for d in s):
        raise Refused(400, "shape")
    return s


def reference(body: bytes, hlen: int | None, explainable: bool) -> tuple[np.ndarray, dict]:
    """The rows a request asks to score, read per the protocol; raises Refused
    (``explainable``: the model gives reason codes)."""
    if hlen is not None and not 0 <= hlen <= len(body):
        raise Refused(400, "header length")
    header, binary = (body, b"") if hlen is None else (body[:hlen], body[hlen:])
    try:
        doc = json.loads(header.decode("utf-8"))
        json.dumps(doc).encode("utf-8")  # strings the answer can carry (no lone surrogates)
    except (ValueError, RecursionError, UnicodeError):
        raise Refused(400, "json") from None
    depth, containers = _nesting(doc)
    if depth > 8 or containers > 2 * MAX_ROWS + 4 * 4096 + 1024:
        raise Refused(400, "nesting")  # what the parse would build, bounded before it
    if type(doc) is not dict:
        raise Refused(400, "not an object")
    for key, kind in (("id", str), ("parameters", dict)):
        if doc.get(key) is not None and type(doc[key]) is not kind:
            raise Refused(400, key)
    inputs = doc.get("inputs")
    if type(inputs) is not list or not inputs or len(inputs) > 4096:
        raise Refused(400, "inputs")
    for t in inputs:
        if type(t) is not dict or type(t.get("name")) is not str or not t["name"] or \
                len(t["name"].encode()) > 256:
            raise Refused(400, "input")
    pos = 0
    if len(inputs) == 1 and inputs[0]["name"] not in FEATURES:
        s = _shape(inputs[0])
        if len(s) != 2 or s[1] != F:
            raise Refused(400, "matrix shape")
        if s[0] > MAX_ROWS:
            raise Refused(413, "rows")
        vals, pos = _values(inputs[0], s[0] * F, binary, pos, s)
        X = np.array(vals, np.float32).reshape(s[0], F)
    else:
        n, cols = None, {}
        for t in inputs:
            if t["name"] not in FEATURES or t["name"] in cols:
                raise Refused(400, "input name")
            s = _shape(t)
            if len(s) == 2 and s[1] != 1:
                raise Refused(400, "feature shape")
            if n is None:
                n = s[0]
                if n > MAX_ROWS:
                    raise Refused(413, "rows")
            elif s[0] != n:
                raise Refused(400, "rows differ")
            cols[t["name"]], pos = _values(t, n, binary, pos, s)
        if len(cols) < F:  # every feature has its input (serve.allow_missing is off)
            raise Refused(400, "missing features")
        X = np.full((n, F), np.nan, np.float32)
        for name, vals in cols.items():
            X[:, FEATURES.index(name)] = vals
    if pos != len(binary):
        raise Refused(400, "trailing binary")
    if not len(X):
        raise Refused(400, "no rows")
    params = doc.get("parameters") or {}
    flag = params.get("binary_data_output")
    top_k = params.get("top_k")
    if (flag is not None and type(flag) is not bool) or \
            (top_k is not None and (type(top_k) is not int or not 1 <= top_k <= 64)):
        raise Refused(400, "parameters")
    outputs = doc.get("outputs")
    if outputs is not None:
        if type(outputs) is not list:
            raise Refused(400, "outputs")
        seen = set()
        for o in outputs:
            if type(o) is not dict or o.get("name") not in _OUTPUTS[:-1] or o["name"] in seen:
                raise Refused(400, "output")
            seen.add(o["name"])
            p = o.get("parameters")
            if p is not None and (type(p) is not dict or (p.get("binary_data") is not None and
                                                          type(p["binary_data"]) is not bool)):
                raise Refused(400, "output parameters")
        if not explainable and seen & {"reason_feature", "reason_value"}:
            raise Refused(400, "reason codes from a model without them")
    return X, doc


def check_factory(state):
    import os

    from worker.config import load_settings
    from worker.serve import oip
    from worker.serve.service import Service

    from .runner import GOLDEN_MODEL

    settings = load_settings(None, defaults={"source": {"type": "file", "path": os.devnull}},
                             model={"path": str(GOLDEN_MODEL)},
                             scoring={"threads": 1}, serve={"max_rows": MAX_ROWS})
    svc = Service(settings, str(GOLDEN_MODEL), "golden")
    svc.load()
    model = svc.current.model

    def run(data: bytes, what: str, i: int) -> str:
        body, hlen = unpack(data)
        headers = {b"content-type": b"application/json"}
        if hlen is not None:
            headers[oip.HEADER_LENGTH.encode()] = str(hlen).encode()
        status, _, out, extra = svc.handle(b"POST", PATH, headers, body)
        assert status != 500, f"500 for {body[:300]!r}: {out[:300]!r}"
        try:
            X, doc = reference(body, hlen, svc.current.explain_error is None)
        except Refused as exc:
            assert status == exc.status, \
                f"answered {status} ({out[:200]!r}), the oracle refuses it ({exc})"
            return f"refused_{status}"
        assert status == 200, f"refused ({out[:300]!r}) a request the oracle reads"
        head_len = dict(extra).get(b"inference-header-content-length")
        head = out if head_len is None else out[:int(head_len)]
        answer = json.loads(head)
        score = next(o for o in answer["outputs"] if o["name"] == "score") \
            if any(o["name"] == "score" for o in answer["outputs"]) else None
        if score is not None:
            if "data" in score:
                got = np.array(score["data"], np.float64)
            else:  # binary: its bytes follow the JSON, in the outputs' order
                off = int(head_len)
                for o in answer["outputs"]:
                    size = o.get("parameters", {}).get("binary_data_size")
                    if o["name"] == "score":
                        got = np.frombuffer(out, "<f8", count=len(X), offset=off)
                        break
                    off += size or 0
            want = model.predict_proba(X, n_threads=1)[:, 1] if len(X) else np.zeros(0)
            np.testing.assert_array_equal(got, want)
        assert answer.get("id") == doc.get("id")
        return "scored"

    return run
