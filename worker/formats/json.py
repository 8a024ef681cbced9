"""JSON events: a message is one event (an object) or several (an array of objects).

In: ``worker._eventread`` (cyext/json_rows.h, simdjson's DOM parser) reads a message straight
into row-major float32 rows, each feature at its key path (its name, or ``source.fields``),
and the ids; no Python object is made per field (but a text for each value of a CatBoost
hashed categorical feature: ``JsonFormat.hashed``). A group's rows are concatenated once.
Ids:
integers (every row's) are one int64 array, the C writer's; strings, or ids missing from some
rows, are each message's own Arrow array. Out (``JsonOutput``): an object for an object in, an
array for an array (or for any Arrow message), keyed like the Arrow output's columns.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa

from .base import (
    CAST_CODES,
    Gathered,
    InvalidMessage,
    Message,
    field_paths,
    field_specs,
    offsets_of,
    row_index,
)

MAX_DEPTH = 64  # nesting of a message (objects and arrays), as simdjson's DOM parser counts it
_EMPTY_I64 = np.zeros(0, np.int64)


class _Event:
    __slots__ = ("X", "ids", "single", "hashed")

    def __init__(self, X: np.ndarray, ids, single: bool, hashed=None):
        self.X, self.ids, self.single = X, ids, single
        self.hashed = hashed  # per row, its hashed features' texts (_texts), or None


class JsonFormat:
    name = "json"

    def __init__(self, model, id_column: str | None, max_rows: int | None, max_bytes: int,
                 fields: dict | None = None):
        from .. import _eventread

        self.feature_names = list(model.feature_names)
        self.id_column = id_column
        hashed = set(getattr(model, "category_hashes", None) or {})
        # a name is one key (it may hold a dot: "Sepal.Length"); source.fields are dotted
        self.fields = specs = field_specs(model, id_column, fields, hashed)
        field_paths(self.feature_names, id_column, specs)  # clashes refused by name
        paths = [list(specs[f].path) for f in self.feature_names]
        id_path = list(specs[id_column].path) if id_column else None
        self.reader = _eventread.JsonReader(
            paths, id_path, dict(model.categories or {}), self.feature_names,
            int(max_rows or 0), int(max_bytes), MAX_DEPTH, hashed,
            {f for f in self.feature_names if specs[f].optional},
            [CAST_CODES[specs[f].cast] for f in self.feature_names],
            bool(id_column and specs[id_column].optional), id_column)
        # CatBoost's categorical features (model/cathash.py): the C reader keeps each value
        # as the text CatBoost hashes (json_rows.h append_cat), and a group's rows go to the
        # kernels as an Arrow batch whose categorical columns are those strings, hashed once
        # a distinct value (CompiledModel.columns)
        self.hashed = [j for j, f in enumerate(self.feature_names) if f in hashed]
        self._k_of = {j: k for k, j in enumerate(self.hashed)}
        self._columns = model.columns if self.hashed else None
        self.max_bytes = int(max_bytes)

    def decode(self, value: bytes | None) -> Message:
        if value is None:
            raise InvalidMessage("empty", "the message has no value")
        got = self.reader.read(value)
        if type(got[0]) is str:
            raise failure(got, self.feature_names)
        X, kinds, ints, offsets, strings, single, *cats = got
        n = len(X)
        hashed, size = None, X.nbytes
        if cats:  # the texts as Python holds them count against the message byte limit
            size += texts_size(cats[0], n, len(self.hashed))
            if size > self.max_bytes:
                raise InvalidMessage("too_large", f"more than {self.max_bytes} bytes decoded "
                                     "(the message byte limit; categorical values as text)")
            hashed = _texts(cats[0], n, len(self.feature_names), self._k_of)
        counts = _counted(self.reader.counts())
        if kinds is None:  # no id column: each row's index
            return Message(n, size, ("json", None), _Event(X, None, single, hashed), counts)
        if (kinds == 1).all():
            return Message(n, size + ints.nbytes, ("json", "int"),
                           _Event(X, ints, single, hashed), counts)
        ids = _arrow_ids(kinds, ints, offsets, strings, self.id_column)
        return Message(n, size + ids.nbytes, ("json", "own"),
                       _Event(X, ids, single, hashed), counts, len(strings))

    def gather(self, messages: list[Message]) -> Gathered:
        offsets = offsets_of(m.rows for m in messages)
        events = [m.data for m in messages]
        X = events[0].X if len(events) == 1 else np.concatenate([e.X for e in events])
        singles = [e.single for e in events]
        table = None
        if self.hashed:  # an Arrow batch: the categorical values as strings
            table = _hashed_batch(X, [e.hashed for e in events], self.hashed,
                                  self.feature_names)
            X = self._columns(table)
        kind = messages[0].group[1]
        if kind is None:
            return Gathered(X, offsets, row_index(offsets), None, table, singles)
        if kind == "int":
            ids = events[0].ids if len(events) == 1 else np.concatenate([e.ids for e in events])
            return Gathered(X, offsets, ids, None, table, singles)
        return Gathered(X, offsets, None, [e.ids for e in events], table, singles)

    def rows_by_name(self, gathered: Gathered, names: list[str]):
        if gathered.table is not None:
            return gathered.table
        X = gathered.X
        return pa.RecordBatch.from_arrays([pa.array(X[:, j]) for j in range(X.shape[1])],
                                          names=self.feature_names)


def failure(got: tuple, feature_names: list[str]) -> InvalidMessage:
    """The dead letter of a C reader's failed read (``_eventread._failure``: code, detail,
    the feature's slot or -1, what went wrong with it: the code but for a failed declared
    cast, whose code it becomes)."""
    code, detail, slot, kind = got
    feature = feature_names[slot] if 0 <= slot < len(feature_names) else None
    if kind == "cast_failed":  # a declared cast that cannot read the value: its own code
        code = kind
    return InvalidMessage(code, detail, feature)


def _counted(counts) -> dict | None:
    """A C reader's (absent, unseen) per feature as ``Message.counts``."""
    if counts is None:
        return None
    return {"absent": counts[0], "unseen": counts[1]}


def texts_size(cats, n_rows: int, k: int) -> int:
    """What a message's hashed texts (``_texts``) hold in Python: each text's bytes and its
    str (up to 80 bytes: 76 for a str of 4-byte characters, whose UTF-8 is as long as its
    characters), a row's list of ``k`` (56 bytes and 8 a slot), and the list of the rows (64
    bytes and up to 16 a row as a comprehension grows it: measured with sys.getsizeof,
    tests/test_json.py)."""
    at, _ends, data = cats
    return len(data) + 80 * len(at) + (56 + 8 * k) * n_rows + 64 + 16 * n_rows


def _texts(cats, n_rows: int, n_features: int, k_of: dict[int, int]) -> list[list]:
    """A message's hashed categorical values from the C reader (``_eventread._cats``: where,
    ends, bytes), as rows of one text (or None: missing) a hashed feature; ``k_of``: a hashed
    feature's column -> its place in a row (made once, by the format)."""
    at, ends, data = cats
    rows = [[None] * len(k_of) for _ in range(n_rows)]
    start = 0
    for a, e in zip(at.tolist(), ends.tolist(), strict=True):
        # the C readers' strings are UTF-8 (simdjson and avro_rows.h check it)
        rows[a // n_features][k_of[a % n_features]] = data[start:e].decode("utf-8", "replace")
        start = e
    return rows


def _hashed_batch(X: np.ndarray, values: list, hashed: list[int], names: list[str]):
    """The rows ``X`` as an Arrow batch whose hashed features (columns ``hashed``) are
    dictionary strings: ``values`` per message, per row, one text (or None) a hashed feature
    in ``hashed``'s order (``_texts``)."""
    cols = [pa.array(X[:, j]) for j in range(X.shape[1])]
    for k, j in enumerate(hashed):
        cols[j] = pa.array([row[k] for rows in values for row in rows],
                           type=pa.string()).dictionary_encode()
    return pa.RecordBatch.from_arrays(cols, names=names)


def _arrow_ids(kinds, ints, offsets, strings, column) -> pa.Array:
    """A message's ids where not every row has an integer one: strings (nulls where a row
    has none), or integers with nulls; integers and strings mixed are bad_type."""
    valid = kinds != 0
    has_str, has_int = bool((kinds == 2).any()), bool((kinds == 1).any())
    if has_str and has_int:
        raise InvalidMessage("bad_type", f"{column}: integer and string ids in one message")
    mask = pa.py_buffer(np.packbits(valid, bitorder="little"))
    if has_str:
        return pa.Array.from_buffers(pa.string(), len(kinds),
                                     [mask, pa.py_buffer(offsets), pa.py_buffer(strings)])
    return pa.Array.from_buffers(pa.int64(), len(kinds), [mask, pa.py_buffer(ints)])


class JsonOutput:
    """One JSON value an input message: for a message that was one event, one object; for an
    array (or an Arrow message), an array of objects, one a row. Keys: the id (under the
    input's id column name, or ``id``), score, label (classifiers), decision, work_units,
    stop_reason, score_lo, score_hi, and with reason codes reason_feature (names),
    reason_value and reason_bias (null where a row was not explained)."""

    name = "json"
    content_type = "application/json"
    # a string id's text: escaped for JSON (a control character takes six bytes), as the
    # Python text, its bytes, the writer's buffer and the value (measured: a 32 MB id of
    # control characters took 22 times its size)
    id_factor = 24

    def __init__(self, model, id_column: str | None = None, **metadata):
        self.classifier = model.task != "regression"
        self.feature_names = list(model.feature_names)
        self.id_key = json.dumps(id_column or "id")
        from .. import _eventread
        from ..model.result import STOP_REASONS

        # once, not per group of messages
        self._encode_scores = _eventread.encode_scores
        self.stop_names = [str(x).encode() for x in STOP_REASONS]

    def row_bytes(self, top_k: int = 0) -> int:
        """The most one row's output takes (``top_k`` reason codes): its keys and values,
        each number at most 24 characters, a string id counted in the message's decoded
        size (``Pipeline.decode``)."""
        names = max((len(json.dumps(f)) for f in self.feature_names), default=2)
        # keys, doubles, integers, an id that is not a string (a timestamp's text, say)
        base = len(self.id_key) + 120 + 6 * 24 + 4 * 11 + 64
        return base + (80 + top_k * (names + 26) if top_k else 0)

    def encode(self, gathered: Gathered, r, recs: list) -> list:
        g = gathered
        n_msg = len(g.offsets) - 1
        singles = np.zeros(n_msg, np.uint8) if g.singles is None else \
            np.asarray(g.singles, np.uint8)
        int_ids, texts = _EMPTY_I64, None
        if g.own_ids is None and g.ids is not None and g.ids.dtype.kind == "i":
            int_ids = np.ascontiguousarray(g.ids, np.int64)
        else:  # strings, nulls, any other type: each id's JSON text
            values = [v for own in g.own_ids for v in own.to_pylist()] \
                if g.own_ids is not None else g.ids.tolist()
            texts = [_id_json(v) for v in values]
        reasons = self._reasons(r)
        try:
            return self._encode_scores(
                np.ascontiguousarray(g.offsets, np.int64), singles, int_ids, texts,
                self.id_key.encode(), np.ascontiguousarray(r.score, np.float64),
                np.ascontiguousarray(r.label, np.int64) if self.classifier else _EMPTY_I64,
                np.ascontiguousarray(r.decision, np.int8),
                np.ascontiguousarray(r.work_units, np.int32),
                np.ascontiguousarray(r.stop_code, np.int8),
                self.stop_names,
                np.ascontiguousarray(r.score_lo, np.float64),
                np.ascontiguousarray(r.score_hi, np.float64),
                None if reasons is None else [x.encode() for x in reasons])
        except Exception as exc:  # noqa: BLE001 (the pipeline dead-letters each message)
            return [exc] * len(recs)

    def _reasons(self, r) -> list[str] | None:
        if r.reason_feature is None:
            return None
        names = [json.dumps(f) for f in self.feature_names]
        out = []
        for feat, val, bias in zip(r.reason_feature.tolist(), r.reason_value.tolist(),
                                   _numbers(r.reason_bias), strict=True):
            if not feat or feat[0] < 0:
                out.append(',"reason_feature":null,"reason_value":null,"reason_bias":null')
                continue
            out.append(',"reason_feature":[' + ",".join(names[j] for j in feat) + '],'
                       '"reason_value":[' + ",".join(_number(float(v)) for v in val) + '],'
                       f'"reason_bias":{bias}')
        return out


def _id_json(v) -> bytes:
    """An id as JSON text: numbers and strings as they are, a float that JSON cannot say as
    null, anything else (bytes, timestamps from an Arrow id column) as its string."""
    if isinstance(v, float) and not math.isfinite(v):
        return b"null"
    return json.dumps(v, default=str).encode()


def _number(x: float) -> str:
    return repr(x) if math.isfinite(x) else "null"


def _numbers(a: np.ndarray) -> list[str]:
    return [_number(x) for x in a.tolist()]
