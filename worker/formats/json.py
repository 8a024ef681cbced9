"""JSON events: a message is one event (an object) or several (an array of objects).

In: ``worker._jsonread`` (cyext/json_rows.h, simdjson's DOM parser) reads a message straight
into row-major float32 rows, each feature at its key path (its name, or ``source.fields``),
and the ids; no Python object is made per field. A group's rows are concatenated once. Ids:
integers (every row's) are one int64 array, the C writer's; strings, or ids missing from some
rows, are each message's own Arrow array. Out (``JsonOutput``): an object for an object in, an
array for an array (or for any Arrow message), keyed like the Arrow output's columns.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa

from .base import Gathered, InvalidMessage, Message, offsets_of, row_index

MAX_DEPTH = 64  # nesting of a message (objects and arrays), as simdjson's DOM parser counts it


class _Event:
    __slots__ = ("X", "ids", "single")

    def __init__(self, X: np.ndarray, ids, single: bool):
        self.X, self.ids, self.single = X, ids, single


class JsonFormat:
    name = "json"

    def __init__(self, model, id_column: str | None, max_rows: int | None, max_bytes: int,
                 fields: dict[str, str] | None = None):
        from .. import _jsonread

        fields = dict(fields or {})
        self.feature_names = list(model.feature_names)
        self.id_column = id_column
        unknown = sorted(set(fields) - set(self.feature_names) - {id_column})
        if unknown:
            raise ValueError("source.fields names no feature or id column: "
                             + ", ".join(unknown[:10]))
        # a name is one key (it may hold a dot: "Sepal.Length"); source.fields are dotted
        paths = [fields[f].split(".") if f in fields else [f] for f in self.feature_names]
        id_path = (fields[id_column].split(".") if id_column in fields else [id_column]) \
            if id_column else None
        self.reader = _jsonread.JsonReader(paths, id_path, dict(model.categories or {}),
                                           self.feature_names, int(max_rows or 0),
                                           int(max_bytes), MAX_DEPTH)

    def decode(self, value: bytes | None) -> Message:
        if value is None:
            raise InvalidMessage("empty", "the message has no value")
        got = self.reader.read(value)
        if len(got) == 2:
            raise InvalidMessage(*got)
        X, kinds, ints, offsets, strings, single = got
        n = len(X)
        if kinds is None:  # no id column: each row's index
            return Message(n, X.nbytes, ("json", None), _Event(X, None, single))
        if (kinds == 1).all():
            return Message(n, X.nbytes + ints.nbytes, ("json", "int"), _Event(X, ints, single))
        ids = _arrow_ids(kinds, ints, offsets, strings, self.id_column)
        return Message(n, X.nbytes + ids.nbytes, ("json", "own"), _Event(X, ids, single))

    def gather(self, messages: list[Message]) -> Gathered:
        offsets = offsets_of(m.rows for m in messages)
        events = [m.data for m in messages]
        X = events[0].X if len(events) == 1 else np.concatenate([e.X for e in events])
        singles = [e.single for e in events]
        kind = messages[0].group[1]
        if kind is None:
            return Gathered(X, offsets, row_index(offsets), None, singles=singles)
        if kind == "int":
            ids = events[0].ids if len(events) == 1 else np.concatenate([e.ids for e in events])
            return Gathered(X, offsets, ids, None, singles=singles)
        return Gathered(X, offsets, None, [e.ids for e in events], singles=singles)

    def rows_by_name(self, gathered: Gathered, names: list[str]):
        X = gathered.X
        return pa.RecordBatch.from_arrays([pa.array(X[:, j]) for j in range(X.shape[1])],
                                          names=self.feature_names)


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

    def __init__(self, model, id_column: str | None = None, **metadata):
        self.classifier = model.task != "regression"
        self.feature_names = list(model.feature_names)
        self.id_key = json.dumps(id_column or "id")

    def encode(self, gathered: Gathered, r, recs: list) -> list:
        rows = self._rows(gathered, r)
        singles = gathered.singles
        values = []
        for k in range(len(recs)):
            a, b = int(gathered.offsets[k]), int(gathered.offsets[k + 1])
            try:
                ids = self._id_texts(gathered, k, b - a)
                objs = [ids[i] + rows[a + i] for i in range(b - a)]
                single = singles is not None and singles[k] and len(objs) == 1
                text = objs[0] if single else "[" + ",".join(objs) + "]"
                values.append(text.encode())
            except Exception as exc:  # noqa: BLE001 (one message's failure is its own)
                values.append(exc)
        return values

    def _id_texts(self, g: Gathered, k: int, n: int) -> list[str]:
        """``{"<id key>":<id>`` for message k's rows (an id JSON has no type for: its
        text)."""
        if g.own_ids is not None:
            values = g.own_ids[k].to_pylist()
        else:
            a = int(g.offsets[k])
            values = g.ids[a:a + n].tolist()
        head = "{" + self.id_key + ":"
        return [head + json.dumps(v, default=str) for v in values]

    def _rows(self, g: Gathered, r) -> list[str]:
        """Each row's members after the id: ``,"score":...}``."""
        score, lo, hi = _numbers(r.score), _numbers(r.score_lo), _numbers(r.score_hi)
        decision, work = r.decision.tolist(), r.work_units.tolist()
        reason = [json.dumps(s) for s in r.stop_reason.tolist()]
        label = r.label.tolist() if self.classifier else None
        reasons = self._reasons(r)
        out = []
        for i in range(len(score)):
            head = f',"score":{score[i]}'
            if label is not None:
                head += f',"label":{label[i]}'
            out.append(f'{head},"decision":{decision[i]},"work_units":{work[i]},'
                       f'"stop_reason":{reason[i]},"score_lo":{lo[i]},"score_hi":{hi[i]}'
                       f'{reasons[i] if reasons else ""}}}')
        return out

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


def _number(x: float) -> str:
    return repr(x) if math.isfinite(x) else "null"


def _numbers(a: np.ndarray) -> list[str]:
    return [_number(x) for x in a.tolist()]
