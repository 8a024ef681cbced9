"""The Open Inference Protocol (KServe v2) over HTTP: an inference request's body in, the rows
the kernels read out; the scores back as the protocol's response, JSON or with Triton's
binary-tensor extension.

Nothing here does I/O or scoring: ``parse_infer`` turns bytes into a validated
``InferRequest`` (or raises ``RequestError`` with the status and the reason),
``encode_response`` turns a score result into the response body. Every size in a request (a
shape, a binary chunk, the JSON header's length) is checked against the body and the row
limit before any array is made.

Inputs take one of two forms (the metadata advertises the one the model takes):
- one tensor of shape ``[n, n_features]`` (any name but a feature's), the features in the
  model's order (models without category names: a categorical feature's codes);
- one tensor per feature, named by the feature, of shape ``[n]`` or ``[n, 1]``; every
  feature must have one (a request that leaves one out is refused naming it, unless the
  ``Contract`` allows missing ones: then they are missing in every row); a name that is no
  feature is an error. A feature the model knows by category names takes BYTES (the names;
  a name the model does not know is missing, as the libraries read an unseen category),
  never codes: a code would mean another category once the model is retrained.
Numbers become float32 as an Arrow cast would; JSON ``null`` is a missing value.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field

import numpy as np
import orjson

from .._eventread import json_shape

# the protocol's numeric tensor types (BYTES, BF16: not features)
DTYPES = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"), "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
}
_FP64 = DTYPES["FP64"]
MATRIX_INPUT = "input-0"
MAX_DEPTH = 8  # JSON nesting: a request nests 5 (object, inputs, tensor, data, a row)
MAX_TENSORS = 4096  # inputs or outputs named in one request
MAX_NAME = 256  # bytes of a tensor's name
HEADER_LENGTH = "inference-header-content-length"


class RequestError(Exception):
    """A request that cannot be answered: the HTTP status and what was wrong."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message

    def __reduce__(self):  # raised in the parsing process, raised again here
        return RequestError, (self.status, self.message)


def bad(message: str) -> RequestError:
    return RequestError(400, message)


@dataclass(frozen=True)
class OutputSpec:
    name: str
    datatype: str


@dataclass
class InferRequest:
    id: str | None
    X: np.ndarray  # (n, n_features) float32, C order
    outputs: list[str] | tuple[str, ...]  # output names, in the order answered
    binary: set[str] = field(default_factory=set)  # of those, the ones sent as binary
    explain: bool = False  # reason codes asked for (the reason outputs)
    top_k: int | None = None
    unseen: dict = field(default_factory=dict)  # column -> category names the model lacks


def output_specs(classifier: bool) -> list[OutputSpec]:
    specs = [OutputSpec("score", "FP64")]
    if classifier:
        specs.append(OutputSpec("label", "INT64"))
    specs += [OutputSpec("decision", "INT8"), OutputSpec("work_units", "INT32"),
              OutputSpec("stop_reason", "BYTES")]
    return specs


REASON_OUTPUTS = (OutputSpec("reason_feature", "BYTES"), OutputSpec("reason_value", "FP32"))


@functools.lru_cache(maxsize=4)
def _default_outputs(classifier: bool, explain: bool) -> tuple[str, ...]:
    """The outputs answered when a request names none (the reason codes when they are on)."""
    return tuple(s.name for s in output_specs(classifier) + (
        list(REASON_OUTPUTS) if explain else []))


@dataclass(frozen=True)
class Contract:
    """What a request must give: each feature's column (``index``), the category names of
    the features known by them (column -> name -> code) and whether features may be left out
    (``serve.allow_missing``)."""

    index: dict[str, int]
    categories: dict[int, dict[str, float]] = field(default_factory=dict)
    allow_missing: bool = False

    @classmethod
    def of(cls, model, allow_missing: bool = False) -> Contract:
        index = {f: j for j, f in enumerate(model.feature_names)}
        cats = {}
        for name, names in (model.categories or {}).items():
            codes = {}
            for code, c in enumerate(names):
                codes.setdefault(str(c), float(code))  # the first of equal names
            cats[index[name]] = codes
        return cls(index, cats, allow_missing)


def parse_infer(body: bytes, header_length: int | None, contract: Contract | dict,
                max_rows: int, classifier: bool, explain_on: bool) -> InferRequest:
    """The request ``body`` (with the binary extension, ``header_length`` is the value of the
    Inference-Header-Content-Length header: the JSON's bytes, the binary tensors after it).
    ``contract``: the model's ``Contract`` (a feature index alone: features may be left
    out)."""
    if not isinstance(contract, Contract):
        contract = Contract(contract, {}, True)
    if header_length is None:
        header, binary = body, b""
    else:
        if not 0 <= header_length <= len(body):
            raise bad(f"Inference-Header-Content-Length {header_length} is outside the body "
                      f"({len(body)} bytes)")
        header, binary = body[:header_length], memoryview(body)[header_length:]
    _bound_json(header, max_rows)
    return parse_doc(_loads(header), binary, contract, max_rows, classifier, explain_on)


def parse_doc(doc, binary: memoryview | bytes, contract: Contract | dict, max_rows: int,
              classifier: bool, explain_on: bool) -> InferRequest:
    """A request's document (the JSON's, or one a gRPC request was turned into: its raw
    tensors in ``binary``, as the binary extension has them) read and checked."""
    if not isinstance(contract, Contract):
        contract = Contract(contract, {}, True)
    if not isinstance(doc, dict):
        raise bad("the request must be a JSON object")
    req_id = doc.get("id")
    if req_id is not None and not isinstance(req_id, str):
        raise bad("id must be a string")
    params = _object(doc.get("parameters"), "parameters")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise bad("inputs must be a non-empty list of tensors")
    if len(inputs) > MAX_TENSORS:
        raise bad(f"{len(inputs)} inputs: at most {MAX_TENSORS}")
    unseen: dict[int, int] = {}
    X = _rows(inputs, binary, contract, max_rows, unseen)
    outputs, binary_out, explain = _outputs(doc.get("outputs"), params, classifier, explain_on)
    top_k = params.get("top_k")
    if top_k is not None and (type(top_k) is not int or not 1 <= top_k <= 64):
        raise bad("parameters.top_k must be an integer from 1 to 64")
    return InferRequest(req_id, X, outputs, binary_out, explain, top_k, unseen)


def _bound_json(header, max_rows: int) -> None:
    """What parsing ``header`` would build, bounded before it is built: arrays and objects
    cost ~60 bytes each and nothing a request needs asks for more than two a row, and four
    a tensor."""
    if len(header) < 4096 and header.count(b"[") + header.count(b"{") <= MAX_DEPTH:
        return  # (a one-row request: no deeper than its count, far from the bound)
    most = 2 * max_rows + 4 * MAX_TENSORS + 1024
    depth, containers = json_shape(header, MAX_DEPTH, most)
    if depth > MAX_DEPTH:
        raise bad(f"the JSON nests deeper than {MAX_DEPTH} levels (a request nests 5)")
    if containers > most:
        raise bad(f"the JSON has more than {most:,} arrays and objects (2 x serve.max_rows + "
                  f"{4 * MAX_TENSORS + 1024:,}): send each tensor's data as one flat list")


def _loads(header) -> object:
    """The JSON document. tritonclient writes NaN and +-inf as the literals NaN, Infinity
    and -Infinity (as Python's json module does), which strict JSON parsers refuse: such a
    body is read again by the json module (NaN: a missing value)."""
    try:
        return orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        error = exc
    if b"NaN" in header or b"Infinity" in header:
        try:
            doc = json.loads(bytes(header).decode("utf-8"))
            # no lone surrogate ("\\ud800" escapes), which orjson refuses too
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
            return doc
        except (ValueError, RecursionError, UnicodeError):
            pass
    raise bad(f"the request is not valid JSON: {error}")


def _object(v, where: str) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise bad(f"{where} must be an object")
    return v


def _name(t: dict, where: str) -> str:
    name = t.get("name")
    if not isinstance(name, str) or not name or len(name.encode()) > MAX_NAME:
        raise bad(f"{where}: name must be a non-empty string of at most {MAX_NAME} bytes")
    return name


def _shape(t: dict, name: str) -> list[int]:
    shape = t.get("shape")
    if not isinstance(shape, list) or not 1 <= len(shape) <= 2 or \
            any(type(d) is not int or d < 0 for d in shape):
        raise bad(f"input {name!r}: shape must be a list of one or two non-negative integers")
    return shape


def _rows(inputs: list, binary: memoryview | bytes, contract: Contract,
          max_rows: int, unseen: dict | None = None) -> np.ndarray:
    """The row block from the inputs (the module docstring's two forms); ``unseen``: each
    categorical column's count of names the model does not know, added to."""
    index = contract.index
    n_features = len(index)
    tensors = []
    for i, t in enumerate(inputs):
        if not isinstance(t, dict):
            raise bad(f"inputs[{i}] must be an object")
        tensors.append((_name(t, f"inputs[{i}]"), t))
    pos = 0  # the next binary tensor's offset
    if len(tensors) == 1 and tensors[0][0] not in index:  # the matrix form
        name, t = tensors[0]
        if contract.categories:
            names = [f for f, j in index.items() if j in contract.categories]
            raise bad(f"input {name!r}: the model knows {', '.join(names[:5])} by category "
                      "names, which one matrix of numbers cannot carry: send one input per "
                      "feature, those as BYTES (the metadata lists their categories)")
        shape = _shape(t, name)
        if len(shape) != 2 or shape[1] != n_features:
            raise bad(f"input {name!r}: shape {shape}, expected [n, {n_features}] (the "
                      f"model's {n_features} features; or one input per feature name)")
        if shape[0] > max_rows:
            raise RequestError(413, f"input {name!r}: {shape[0]} rows, more than "
                                    f"serve.max_rows ({max_rows}): send them in smaller "
                                    "requests")
        values, pos = _values(t, name, shape[0] * n_features, binary, pos, shape)
        X = np.ascontiguousarray(values.reshape(shape[0], n_features))
    else:
        n = None
        columns = {}
        for name, t in tensors:
            j = index.get(name)
            if j is None:
                raise bad(f"input {name!r} is not a feature of the model (send one input of "
                          f"shape [n, {n_features}], or one per feature name)")
            if j in columns:
                raise bad(f"input {name!r} is given twice")
            shape = _shape(t, name)
            if len(shape) == 2 and shape[1] != 1:
                raise bad(f"input {name!r}: shape {shape}, expected [n] or [n, 1]")
            if n is None:
                n = shape[0]
                if n > max_rows:
                    raise RequestError(413, f"input {name!r}: {n} rows, more than "
                                            f"serve.max_rows ({max_rows}): send them in "
                                            "smaller requests")
            elif shape[0] != n:
                raise bad(f"input {name!r}: {shape[0]} rows, the other inputs have {n}")
            codes = contract.categories.get(j)
            if codes is not None:
                columns[j], pos, new = _category_values(t, name, n, binary, pos, codes)
                if new and unseen is not None:
                    unseen[j] = new
            else:
                columns[j], pos = _values(t, name, n, binary, pos, shape)
        if not contract.allow_missing and len(columns) < n_features:
            missing = [f for f, j in index.items() if j not in columns]
            raise bad(f"{len(missing)} of the model's {n_features} features "
                      f"{'has' if len(missing) == 1 else 'have'} no input: "
                      f"{', '.join(missing[:20])}{' ...' if len(missing) > 20 else ''} (send "
                      "null for a value that is missing)")
        X = np.full((n, n_features), np.nan, dtype=np.float32)
        for j, col in columns.items():
            X[:, j] = col
    if pos != len(binary):
        raise bad(f"{len(binary) - pos} bytes of binary data after the last binary input")
    if not len(X):  # as an Arrow body of no rows is (issue 50: JSON said 200, Arrow 400)
        raise bad("the request has no rows")
    return X


def _category_values(t: dict, name: str, count: int, binary, pos: int,
                     codes: dict[str, float]) -> tuple[np.ndarray, int, int]:
    """A BYTES input of category names (JSON strings or null; binary: each a 4-byte
    little-endian length and its bytes, as Triton writes them) as float32 codes: a name the
    model does not know, and null, are missing. And the next binary offset, and how many
    names the model does not know."""
    datatype = t.get("datatype")
    if datatype != "BYTES":
        raise bad(f"input {name!r}: datatype {datatype!r}; the model knows {name!r} by its "
                  "category names: send them as BYTES (the metadata lists them), not codes")
    params = _object(t.get("parameters"), f"input {name!r} parameters")
    size = params.get("binary_data_size")
    nan = math.nan
    if size is not None:
        if "data" in t:
            raise bad(f"input {name!r}: both data and binary_data_size")
        if type(size) is not int or not 0 <= size <= len(binary) - pos:
            raise bad(f"input {name!r}: binary_data_size {size!r} is not within the "
                      f"{len(binary) - pos} bytes of binary data left")
        view = memoryview(binary)[pos:pos + size]
        out = np.empty(count, np.float32)
        at = 0
        for i in range(count):
            if size - at < 4:
                raise bad(f"input {name!r}: {i} of {count} BYTES elements in "
                          f"binary_data_size {size}")
            n = int.from_bytes(view[at:at + 4], "little")
            if n > size - at - 4:
                raise bad(f"input {name!r}: element {i} claims {n} bytes, more than are left")
            text = bytes(view[at + 4:at + 4 + n])
            at += 4 + n
            try:
                out[i] = codes.get(text.decode("utf-8"), nan)
            except UnicodeDecodeError:
                raise bad(f"input {name!r}: element {i} is not UTF-8") from None
        if at != size:
            raise bad(f"input {name!r}: {size - at} bytes after its {count} BYTES elements")
        return out, pos + size, int(np.count_nonzero(np.isnan(out)))
    data = t.get("data")
    if not isinstance(data, list):
        raise bad(f"input {name!r}: data must be a list (or binary_data_size given)")
    if data and type(data[0]) is list:  # nested: one value a row
        if any(type(row) is not list or len(row) != 1 for row in data):
            raise bad(f"input {name!r}: nested data must be rows of one value")
        data = [row[0] for row in data]
    if len(data) != count:
        raise bad(f"input {name!r}: {len(data)} values for {count} (its shape)")
    if not all(v is None or type(v) is str for v in data):
        raise bad(f"input {name!r}: BYTES values must be strings (category names) or null")
    out = np.fromiter((nan if v is None else codes.get(v, nan) for v in data), np.float32,
                      count)
    return out, pos, int(np.count_nonzero(np.isnan(out))) - data.count(None)


def _values(t: dict, name: str, count: int, binary, pos: int, shape: list[int]
            ) -> tuple[np.ndarray, int]:
    """An input's ``count`` values as float32 (flat), and the next binary offset."""
    datatype = t.get("datatype")
    dtype = DTYPES.get(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        raise bad(f"input {name!r}: datatype {datatype!r} is not a numeric tensor type "
                  f"({', '.join(DTYPES)})")
    params = _object(t.get("parameters"), f"input {name!r} parameters")
    size = params.get("binary_data_size")
    if size is not None:
        if "data" in t:
            raise bad(f"input {name!r}: both data and binary_data_size")
        if type(size) is not int or size < 0:
            raise bad(f"input {name!r}: binary_data_size must be a non-negative integer")
        if size != count * dtype.itemsize:
            raise bad(f"input {name!r}: binary_data_size {size}, expected {count} "
                      f"{datatype} values ({count * dtype.itemsize} bytes)")
        if size > len(binary) - pos:
            raise bad(f"input {name!r}: binary_data_size {size}, but only "
                      f"{len(binary) - pos} bytes of binary data are left")
        raw = np.frombuffer(binary, dtype=dtype, count=count, offset=pos)
        if dtype == np.bool_:
            raw = np.frombuffer(binary, dtype=np.uint8, count=count, offset=pos) != 0
        with np.errstate(over="ignore"):  # beyond float32: infinity, as a cast gives
            return raw.astype(np.float32), pos + size
    data = t.get("data")
    if not isinstance(data, list):
        raise bad(f"input {name!r}: data must be a list (or binary_data_size given)")
    return _json_values(data, name, count, dtype, datatype, shape), pos


_VALUE_TYPES = frozenset((float, int, bool, type(None)))


def _json_values(data: list, name: str, count: int, dtype: np.dtype, datatype: str,
                 shape: list[int]) -> np.ndarray:
    """JSON values (flat, or nested row by row: one level) as ``count`` float32s; null is a
    missing value; true and false are 1 and 0."""
    if data and type(data[0]) is list:  # nested: [[row], [row], ...], each as the shape says
        width = shape[1] if len(shape) == 2 else None
        if len(data) != shape[0] or any(type(row) is not list or len(row) != width
                                        for row in data):
            raise bad(f"input {name!r}: nested data must be {shape[0]} rows of "
                      f"{width} values (its shape {shape})")
        data = [v for row in data for v in row]
    if len(data) != count:
        raise bad(f"input {name!r}: {len(data)} values for {count} (its shape)")
    kinds = set(map(type, data))  # one pass in C: what the values are
    if not kinds <= _VALUE_TYPES:
        odd = next(v for v in data if type(v) not in _VALUE_TYPES)
        raise bad(f"input {name!r}: a value is {type(odd).__name__}, expected a {datatype} "
                  f"number or null")
    if dtype.kind == "b" and not kinds <= {bool, type(None)}:
        raise bad(f"input {name!r}: BOOL values must be true, false or null")
    if int not in kinds:  # floats, booleans and nulls (NaN): no floating-point flag raised
        a = np.asarray(data, dtype=np.float64)  # (an errstate is dear per request)
    else:
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                a = np.asarray(data, dtype=np.float64)  # null: NaN
        except OverflowError:  # an integer beyond float64 (JSON allows it)
            a = np.array([_to_float64(v) for v in data], dtype=np.float64)
    # digits lost on the way? (an FP64 tensor's integers are float64s, as its binary form
    # is: issue 50 found JSON and binary FP64 read 2^53 + 2^29 + 1 apart)
    big = int in kinds and dtype != _FP64 and _beyond_2_53(a)
    if big:
        a = a.astype(object)
        for i, v in enumerate(data):  # the integers beyond 2^53: cast once, as Arrow does
            if type(v) is int and abs(v) > 2**53:
                a[i] = _int_to_float32(v)
        a = a.astype(np.float64)
    if dtype.kind in "iu":
        whole = a[~np.isnan(a)]
        if float in kinds and not np.array_equal(whole, np.floor(whole)):
            raise bad(f"input {name!r}: {datatype} values must be integers")
        info = np.iinfo(dtype)
        # in float64 the range's ends are exact (-2^63, 2^63 = INT64's max + 1, ...); an
        # integer past 2^53 has been rounded (2^63 - 1 and 2^63 are one float): those are
        # held to the range as the integers they are
        least, most = int(info.min), int(info.max)  # Python's: numpy's compare as floats
        lo, past = float(least), float(most + 1)
        if big:
            out = any(not least <= v <= most for v in data if type(v) is int)
            whole = np.array([v for v in data if type(v) is float], np.float64)
            whole = whole[~np.isnan(whole)]  # NaN: missing (a hostile review found a NaN
            # beside the integers let every float past the range)
        else:
            out = False
        if out or whole.size and (whole.min() < lo or whole.max() >= past):
            raise bad(f"input {name!r}: a value is outside {datatype}'s range")
    elif dtype == np.float16:  # FP16 values: as that type holds them
        with np.errstate(over="ignore"):
            a = a.astype(np.float16)
    with np.errstate(over="ignore"):  # beyond float32: infinity, as a cast gives
        return a.astype(np.float32)


def _beyond_2_53(a: np.ndarray) -> bool:
    with np.errstate(invalid="ignore"):  # (NaN and null compare false: not big)
        return bool(np.any(np.abs(a) > 2**53))


def _int_to_float32(v: int) -> float:
    """An integer as float32 in one rounding (as Arrow casts int64 and uint64), never through
    float64 (two roundings); beyond 64 bits (no Arrow integer holds it): through float64,
    infinity past float32."""
    if -2**63 <= v < 2**63:
        return float(np.array([v], np.int64).astype(np.float32)[0])
    if 0 <= v < 2**64:
        return float(np.array([v], np.uint64).astype(np.float32)[0])
    with np.errstate(over="ignore"):
        return float(np.float32(_to_float64(v)))


def _to_float64(v) -> float:
    """A JSON value as float64 (null: NaN; an integer beyond float64's range: infinity)."""
    if v is None:
        return math.nan
    try:
        return float(v)
    except OverflowError:  # an integer beyond float64
        return math.inf if v > 0 else -math.inf


def _outputs(requested, params: dict, classifier: bool, explain_on: bool
             ) -> tuple[list[str], set[str], bool]:
    all_binary = params.get("binary_data_output")
    if all_binary is not None and type(all_binary) is not bool:
        raise bad("parameters.binary_data_output must be true or false")
    if requested is None:
        names = _default_outputs(classifier, explain_on)
        return names, set(names) if all_binary else set(), explain_on
    known = set(_default_outputs(classifier, True))
    if not isinstance(requested, list) or len(requested) > MAX_TENSORS:
        raise bad(f"outputs must be a list of at most {MAX_TENSORS} objects")
    names, binary = [], set()
    for i, o in enumerate(requested):
        if not isinstance(o, dict):
            raise bad(f"outputs[{i}] must be an object")
        name = _name(o, f"outputs[{i}]")
        if name not in known:
            raise bad(f"output {name!r} is not one of {', '.join(sorted(known))}")
        if name in names:
            raise bad(f"output {name!r} is asked for twice")
        flag = _object(o.get("parameters"), f"output {name!r} parameters").get("binary_data")
        if flag is not None and type(flag) is not bool:
            raise bad(f"output {name!r}: binary_data must be true or false")
        names.append(name)
        if flag or (flag is None and all_binary):
            binary.add(name)
    explain = explain_on or any(n.startswith("reason_") for n in names)
    return names, binary, explain


# ---- the response ----------------------------------------------------------------------

def output_arrays(r, names: list[str], feature_names: list[str], stop_names: np.ndarray
                  ) -> dict[str, tuple[str, list[int], object]]:
    """Each asked-for output: (datatype, shape, values: a numpy array, or bytes strings)."""
    n = len(r)
    out = {}
    for name in names:
        if name == "score":
            out[name] = ("FP64", [n], np.ascontiguousarray(r.score, np.float64))
        elif name == "label":
            out[name] = ("INT64", [n], np.ascontiguousarray(r.label, np.int64))
        elif name == "decision":
            out[name] = ("INT8", [n], np.ascontiguousarray(r.decision, np.int8))
        elif name == "work_units":
            out[name] = ("INT32", [n], np.ascontiguousarray(r.work_units, np.int32))
        elif name == "stop_reason":
            out[name] = ("BYTES", [n], [s.encode() for s in stop_names[r.stop_code].tolist()])
        elif name == "reason_feature":
            feat = r.reason_feature
            k = feat.shape[1] if feat is not None else 0
            names_b = [f.encode() for f in feature_names]
            flat = [] if feat is None else \
                [names_b[j] if j >= 0 else b"" for j in feat.reshape(-1).tolist()]
            out[name] = ("BYTES", [n, k], flat)
        elif name == "reason_value":
            val = r.reason_value
            if val is None:
                out[name] = ("FP32", [n, 0], np.zeros(0, np.float32))
            else:
                v = np.array(val, np.float32)
                if r.reason_feature is not None:
                    v[r.reason_feature < 0] = np.nan
                out[name] = ("FP32", list(v.shape), v.reshape(-1))
    return out


# the most bytes a value of each output type takes in a JSON answer (its comma too: -x.xe-xxx
# in orjson's shortest form, null for NaN; an INT64's 20 digits and sign) and in a binary one
_JSON_WIDTH = {"FP64": 25, "FP32": 25, "INT64": 21, "INT32": 12, "INT8": 5}
_BINARY_WIDTH = {"FP64": 8, "FP32": 4, "INT64": 8, "INT32": 4, "INT8": 1}
_DATATYPE = {s.name: s.datatype for s in output_specs(True) + list(REASON_OUTPUTS)}
ANSWER_OVERHEAD = 1024  # the answer's names, ids and brackets, its outputs' own aside
OUTPUT_OVERHEAD = 256  # an output's name, datatype, shape and parameters


def answer_bound(req: InferRequest, n: int, k: int, stop_longest: tuple[int, int],
                 feature_longest: tuple[int, int]) -> int:
    """The most bytes ``encode_response`` can write for ``req`` of ``n`` rows with ``k``
    reason codes a row, before anything is scored: ``*_longest`` are (the longest JSON
    string with its quotes and escapes, the longest UTF-8 name) of the stop reasons and the
    feature names."""
    total = ANSWER_OVERHEAD + (6 * len(req.id) if req.id else 0)
    for name in req.outputs:
        datatype = _DATATYPE[name]
        binary = name in req.binary
        if datatype == "BYTES":
            text, raw = stop_longest if name == "stop_reason" else feature_longest
            width = 4 + raw if binary else text + 1
        else:
            width = (_BINARY_WIDTH if binary else _JSON_WIDTH)[datatype]
        total += OUTPUT_OVERHEAD + (n * k if name.startswith("reason_") else n) * width
    return total


def longest(names) -> tuple[int, int]:
    """(the longest JSON string of ``names``, quotes and escapes in, the longest UTF-8)."""
    names = list(names)
    return (max((len(orjson.dumps(x)) for x in names), default=2),
            max((len(x.encode()) for x in names), default=0))


PIECE = 8192  # values written to JSON at a time (the GIL is held while orjson writes)


def _pieces(values):
    """``values`` for orjson: as they are, or past PIECE values as the JSON array written a
    PIECE at a time (the same bytes), so a large answer encoded off the loop gives the loop's
    thread the GIL between pieces."""
    n = len(values)
    if n <= PIECE:
        return values
    parts = [orjson.dumps(values[i:i + PIECE], option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
             for i in range(0, n, PIECE)]
    return orjson.Fragment(b"[" + b",".join(parts) + b"]")


def encode_response(model_name: str, model_id: str, req: InferRequest, arrays: dict
                    ) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when any output is binary."""
    outputs = []
    chunks = []
    for name in req.outputs:
        datatype, shape, values = arrays[name]
        o = {"name": name, "datatype": datatype, "shape": shape}
        if name in req.binary:
            if datatype == "BYTES":
                data = b"".join(len(s).to_bytes(4, "little") + s for s in values)
            else:
                data = np.ascontiguousarray(values).tobytes()
            o["parameters"] = {"binary_data_size": len(data)}
            chunks.append(data)
        elif datatype == "BYTES":
            o["data"] = _pieces([s.decode() for s in values])
        else:
            o["data"] = _pieces(values)
        outputs.append(o)
    doc = {"model_name": model_name, "model_version": model_id, "outputs": outputs,
           "parameters": {"model_id": model_id}}
    if req.id is not None:
        doc["id"] = req.id
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return head, None
    return head + b"".join(chunks), len(head)
