"""Avro events in Confluent's wire format: a magic byte 0, a 4-byte big-endian schema id, one
Avro binary record.

Each writer schema is read once per id from ``source.schemas_dir`` (``<id>.avsc``: a folder a
sidecar may fill from the schema registry; the worker itself talks to no registry), parsed by
fastavro (its
validation, names and namespaces) and compiled once into a reader plan: the record's fields
resolved by name against the model's features (or ``source.fields``' dotted paths through
nested records), so a producer may add, drop or reorder fields. The plan runs in C++
(``worker._eventread.AvroReader``, cyext/avro_rows.h): one float32 row a message, no Python
object per field (but a text for each value of a CatBoost hashed categorical feature:
``AvroFormat.hashed``). A schema that cannot be read (recursive, nested deeper than 32, a
feature of a type that is not a number) is remembered as the reason each of its messages is
dead-lettered.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np

from .base import (
    Gathered,
    InvalidMessage,
    Message,
    field_paths,
    field_specs,
    offsets_of,
    row_index,
)
from .json import _arrow_ids, _counted, _hashed_batch, _texts, failure, texts_size

KINDS = {"null": 0, "boolean": 1, "int": 2, "long": 3, "float": 4, "double": 5, "bytes": 6,
         "string": 7, "fixed": 8, "enum": 9, "array": 10, "map": 11, "union": 12,
         "record": 13}
NUMERIC = {"boolean", "int", "long", "float", "double"}
MAX_DEPTH = 32  # nesting of a schema's types
MAX_NODES = 1 << 16  # a plan's nodes (a named type is compiled at each use: bounded)
MAX_SCHEMA_BYTES = 1 << 20
AVRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # the specification's names
UNKNOWN_RETRY_S = 30.0  # an unknown schema id is looked up again after this
MAX_IDS = 4096  # schema ids remembered (compiled or unknown); past it the memory starts over
MAX_SYMBOL = 1024  # bytes of an enum symbol a hashed categorical feature reads


class SchemaError(ValueError):
    def __init__(self, code: str, detail: str, slot: int = -1):
        super().__init__(detail)
        self.code = code
        self.slot = slot  # the feature it is about (-1: none)


class _Plan:
    """A writer schema compiled against the features: the AvroReader's arguments.
    ``casts``: slot -> "number" or "string" (source.fields); ``labels``: slot -> the
    feature's name and path, and ``required`` the slots every record must give (a null on the
    way counts): a schema that cannot reach one is refused (``reach``, schema_mismatch)."""

    def __init__(self, schema, paths: dict[tuple, int], categories: dict[int, list],
                 hashed: frozenset = frozenset(), casts: dict[int, str] | None = None,
                 labels: list[str] | None = None, required: tuple = (),
                 id_label: str = "the id"):
        self.paths, self.categories, self.hashed = paths, categories, hashed
        self.casts = casts or {}
        self.nodes: list[list[int]] = []
        self.children: list[int] = []
        self.enum_codes: list[float] = []
        self.symbols: list[str] = []  # the same symbols' names (hashed features)
        self.tables: list[dict] = []
        self.covers: list[int] = []  # a null node's slots (those below its path)
        self.named: dict[str, object] = {}
        self._stack: list[str] = []
        self.steps = 0
        self.node(schema, (), 0)
        if self.nodes[0][0] != KINDS["record"]:
            raise SchemaError("bad_schema", "the schema is not a record")
        by_slot = {j: path for path, j in paths.items()}
        for j in required:  # after the whole schema: its named types are known (-2: the id)
            problem = self.reach(schema, by_slot[j], (), 0)
            if problem:
                who = id_label if j == -2 else labels[j] if labels else f"feature {j}"
                raise SchemaError("schema_mismatch", f"{who}: {problem} (check its path in "
                                  "source.fields; if records may leave it out, mark it "
                                  "optional)", j)

    def reach(self, schema, path: tuple, where: tuple, depth: int) -> str | None:
        """Why ``schema`` (at ``where``) cannot reach ``path`` in every record (None: it
        can; a union's null branch is the value missing, which reaches it)."""
        if depth > 4 * MAX_DEPTH:
            return "nested too deep"
        if isinstance(schema, str) and schema not in KINDS:
            schema = self.named.get(schema, schema)
        if isinstance(schema, list):
            for b in schema:
                if b == "null" or isinstance(b, dict) and b.get("type") == "null":
                    continue
                problem = self.reach(b, path, where, depth + 1)
                if problem:
                    return problem
            return None
        if isinstance(schema, dict) and isinstance(schema.get("type"), (dict, list)) or \
                isinstance(schema, dict) and isinstance(schema.get("type"), str) and \
                schema["type"] not in KINDS and schema["type"] != "error":
            return self.reach(schema["type"], path, where, depth + 1)
        if not path:
            return None  # the value itself: its type is checked where it is compiled
        kind = schema if isinstance(schema, str) else schema.get("type")
        at = ".".join(where) or "the record"
        if kind not in ("record", "error"):
            return f"{at} is an Avro {kind}, not a record holding {path[0]!r}"
        for f in schema["fields"]:
            if f["name"] == path[0]:
                return self.reach(f["type"], path[1:], where + (path[0],), depth + 1)
        return f"{at} has no field {path[0]!r}"

    def node(self, schema, path: tuple, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise SchemaError("bad_schema", f"nested deeper than {MAX_DEPTH}")
        if isinstance(schema, str) and schema not in KINDS:  # a named type, by name
            if schema in self._stack:
                raise SchemaError("bad_schema", f"recursive type {schema!r}")
            if schema not in self.named:
                raise SchemaError("bad_schema", f"unknown type {schema!r}")
            schema = self.named[schema]
        if isinstance(schema, list):
            schema = {"type": "union", "branches": schema}
        if isinstance(schema, str):
            schema = {"type": schema}
        kind = schema["type"]
        if kind == "error":  # an error is a record
            kind = "record"
        if isinstance(kind, (dict, list)) or (isinstance(kind, str) and kind not in KINDS):
            return self.node(kind, path, depth + 1)  # {"type": {...}} or a named reference
        self.steps += 1  # nodes compiled, kept or dropped: named types at each use
        if len(self.nodes) >= MAX_NODES or self.steps > 4 * MAX_NODES:
            raise SchemaError("bad_schema", f"the plan is over {MAX_NODES} nodes (named types "
                              "are compiled at each use)")
        name = schema.get("name")
        if kind in ("record", "enum", "fixed") and name:
            self.named[name] = schema
        i = len(self.nodes)
        self.nodes.append([KINDS[kind], -1, 0, -1 if kind in ("int", "long") else 0])
        slot = self.paths.get(path, -1) if path else -1
        if kind == "record":
            self._stack.append(name or "")
            fields = schema["fields"]
            names = [f["name"] for f in fields]
            if len(set(names)) != len(names):  # the specification's rule; fastavro's is laxer
                raise SchemaError("bad_schema", f"record {name or ''} names a field twice")
            kept = []
            for f in fields:
                child = self.node(f["type"], path + (f["name"],), depth + 1)
                if self.takes_bytes(child) or not self.inert(child):
                    kept.append(child)
                else:  # a field that takes no bytes (null, an empty record) is not visited
                    del self.nodes[child:]
            self._stack.pop()
            self.nodes[i][2:] = [len(self.children), len(kept)]  # after its fields' own
            self.children.extend(kept)
        elif kind == "union":
            branches = schema["branches"]
            start = len(self.children)
            self.children.extend([0] * len(branches))
            for k, b in enumerate(branches):
                self.children[start + k] = self.node(b, path, depth + 1)
            self.nodes[i][2:] = [start, len(branches)]
        elif kind in ("array", "map"):
            item = self.node(schema["items" if kind == "array" else "values"], path + ("[]",),
                             depth + 1)
            # b: 1, an item takes a byte at least (a map's key does): the block count is
            # bounded by the bytes left; 0, it takes none: it reads nothing either (no path
            # goes through an array), so items are skipped by count
            sized = kind == "map" or self.takes_bytes(item)
            if not sized and not self.inert(item):
                raise SchemaError("bad_schema", f"{'.'.join(path)}: items that take no bytes "
                                  "are read")
            self.nodes[i][2:] = [item, int(sized)]
        elif kind == "fixed":
            size = schema["size"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise SchemaError("bad_schema", f"a fixed size {size!r}")
            self.nodes[i][2] = size
        elif kind == "enum":
            symbols = list(schema["symbols"])
            if slot in self.hashed and any(len(str(x).encode()) > MAX_SYMBOL for x in symbols):
                # a hashed enum's symbol is copied into each message's texts: bounded
                raise SchemaError("bad_schema", f"{'.'.join(path)}: an enum symbol over "
                                  f"{MAX_SYMBOL} bytes")
            cats = self.categories.get(slot)
            self.nodes[i][2:] = [len(self.enum_codes), len(symbols)]
            where = {c: k for k, c in reversed(list(enumerate(cats or [])))}
            self.enum_codes.extend(float(where.get(s, np.nan)) for s in symbols)
            self.symbols.extend(str(s) for s in symbols)
        if kind == "null" and path:
            if slot >= 0:  # the feature's value is null: missing
                self.nodes[i][1] = slot
            else:  # a null on the way to features: each of them missing
                below = sorted({j for p, j in self.paths.items()
                                if j >= 0 and len(p) > len(path) and p[:len(path)] == path})
                self.nodes[i][2:] = [len(self.covers), len(below)]
                self.covers.extend(below)
        if slot != -1 and kind not in ("union", "null"):
            self._check(kind, slot, path)
            self.nodes[i][1] = slot
            cast = self.casts.get(slot)
            if kind == "string" and slot >= 0 and cast == "number":
                self.nodes[i][3] = -1  # a string holding a number (avro_rows.h)
            elif kind in ("string", "bytes") and slot >= 0 or \
                    kind in ("int", "long") and cast == "string" and slot in self.categories:
                cats = self.categories.get(slot, [])  # hashed: none (the reader keeps texts)
                self.nodes[i][3] = len(self.tables)
                self.tables.append({str(c): float(k) for k, c in
                                    reversed(list(enumerate(cats)))})
        return i

    def inert(self, i: int) -> bool:
        """Does node i (and what is below it) read nothing (no feature, id or null cover)?
        (A compiled node's subtree is the nodes after it up to its next sibling: checked
        through its children.)"""
        kind, slot, a, b = self.nodes[i]
        if slot != -1 or kind == KINDS["null"] and b:
            return False
        if kind in (KINDS["record"], KINDS["union"]):
            return all(self.inert(c) for c in self.children[a:a + b])
        if kind in (KINDS["array"], KINDS["map"]):
            return self.inert(a)
        return True

    def takes_bytes(self, i: int) -> bool:
        """Does every value of node i take a byte at least? (Compiled children of a record
        come right after it: a record with no kept child takes none.)"""
        kind, _slot, a, b = self.nodes[i]
        if kind == KINDS["null"]:
            return False
        if kind == KINDS["fixed"]:
            return a > 0
        if kind == KINDS["record"]:
            return any(self.takes_bytes(c) for c in self.children[a:a + b])
        return True

    def _check(self, kind: str, slot: int, path: tuple) -> None:
        """A feature's Avro type against what the model reads: numbers (a string only with
        cast: number); a feature with categories: strings and enums (an int or long only
        with cast: string); CatBoost's hashed ones: numbers, strings and enums."""
        where = ".".join(path)
        if slot == -2:
            if kind not in ("int", "long", "string"):
                raise SchemaError("bad_type", f"{where}: an id is an int, a long or a string, "
                                  f"not {kind}")
            return
        cast = self.casts.get(slot)
        if slot in self.hashed:
            if kind in NUMERIC or kind in ("string", "enum"):
                return
        elif self.categories.get(slot):
            if kind in ("string", "enum") or kind in ("int", "long") and cast == "string":
                return
            if kind in NUMERIC:
                raise SchemaError("bad_type", f"{where} is an Avro {kind}; the feature's "
                                  "categories are strings" + (
                                      " (declare cast: string in source.fields to read an "
                                      "int's digits)" if kind in ("int", "long") else ""), slot)
        elif kind in NUMERIC or kind == "string" and cast == "number":
            return
        elif kind == "string":
            raise SchemaError("bad_type", f"{where} is an Avro string; the feature is a "
                              "number (declare cast: number in source.fields to read a "
                              "string holding one)", slot)
        wants = "a number" if not self.categories.get(slot) and slot not in self.hashed \
            else "a category"
        raise SchemaError("bad_type", f"{where} is an Avro {kind}; the feature is {wants}",
                          slot)


class AvroFormat:
    name = "avro"

    def __init__(self, model, id_column: str | None, max_rows: int | None, max_bytes: int,
                 fields: dict[str, str] | None = None, schemas_dir: str | None = None):
        self.feature_names = list(model.feature_names)
        hashed = set(getattr(model, "category_hashes", None) or {})
        self.fields = specs = field_specs(model, id_column, fields, hashed)
        column = {f: j for j, f in enumerate(self.feature_names)}
        self.paths = {path: -2 if name is None else column[name] for path, name in
                      field_paths(self.feature_names, id_column, specs).items()}
        self.casts = {j: specs[f].cast for j, f in enumerate(self.feature_names)
                      if specs[f].cast}
        self.optional = [j for j, f in enumerate(self.feature_names) if specs[f].optional]
        self.labels = [f"feature {f!r} ({specs[f].dotted})" for f in self.feature_names]
        # the id is required too, unless optional (a record without it: a null id)
        self.id_required = bool(id_column) and not specs[id_column].optional
        self.id_label = f"the id {id_column!r} ({specs[id_column].dotted})" if id_column \
            else "the id"
        for path, j in self.paths.items():  # else no schema could hold it: missing always
            bad = next((p for p in path if not AVRO_NAME.fullmatch(p)), None)
            if bad is not None:
                who = (f"scoring.id_column {id_column!r}" if j == -2
                       else f"feature {self.feature_names[j]!r}")
                raise ValueError(f"source.fields: {who} reads {'.'.join(path)!r}, but {bad!r} "
                                 "is not an Avro field name (letters, digits and _, not first a "
                                 "digit): map it to its field in source.fields")
        self.id_column = id_column
        cats = model.categories or {}
        self.categories = {j: list(cats[f]) for j, f in enumerate(self.feature_names)
                           if cats.get(f)}
        # CatBoost's categorical features (model/cathash.py): the C reader keeps each value
        # as the text CatBoost hashes (an enum's symbol; avro_rows.h hashed), and a group's
        # rows go to the kernels as an Arrow batch whose categorical columns are those
        # strings, hashed once a distinct value (CompiledModel.columns)
        self.hashed = [j for j, f in enumerate(self.feature_names) if f in hashed]
        self._k_of = {j: k for k, j in enumerate(self.hashed)}  # _texts' row places
        self._columns = model.columns if self.hashed else None
        self.max_bytes = int(max_bytes)
        self.schemas_dir = Path(schemas_dir) if schemas_dir else None
        self._readers: dict[int, object] = {}  # id -> AvroReader
        # id -> when it was last looked for, and why it could not be read (None: no schema
        # of that id); looked for again after UNKNOWN_RETRY_S (a file half-written by the
        # sidecar that exports the registry is whole by then)
        self._failed: dict[int, tuple[float, SchemaError | None]] = {}

    # ---- schemas ------------------------------------------------------------------------
    def _schema_text(self, schema_id: int) -> str | None:
        if self.schemas_dir is not None:
            path = self.schemas_dir / f"{schema_id}.avsc"
            if path.is_file():
                try:
                    if path.stat().st_size > MAX_SCHEMA_BYTES:
                        raise SchemaError("bad_schema", f"{path.name} is over 1 MiB")
                    return path.read_text()
                except (OSError, UnicodeDecodeError) as exc:
                    raise SchemaError("bad_schema", f"{path.name}: {exc}") from None
        return None

    def _reader(self, schema_id: int):
        """The schema's compiled reader, or the SchemaError its messages are dead-lettered
        with; raises InvalidMessage(unknown_schema) for an id no schema has."""
        got = self._readers.get(schema_id)
        if got is not None:
            return got
        if len(self._readers) + len(self._failed) >= MAX_IDS:  # ids made up by a producer
            self._readers.clear()
            self._failed.clear()
        failed = self._failed.get(schema_id)
        if failed is not None and time.monotonic() - failed[0] < UNKNOWN_RETRY_S:
            if failed[1] is None:
                raise InvalidMessage("unknown_schema", f"no schema {schema_id}")
            return failed[1]
        try:
            text = self._schema_text(schema_id)
        except SchemaError as exc:
            got = exc
        else:
            if text is None:
                self._failed[schema_id] = (time.monotonic(), None)
                raise InvalidMessage("unknown_schema", f"no schema {schema_id}")
            got = self._compile(schema_id, text)
        if isinstance(got, SchemaError):
            if failed is None or str(failed[1]) != str(got):  # once a schema and reason
                import structlog

                structlog.get_logger("worker").warning(
                    "avro schema refused", schema_id=schema_id, code=got.code,
                    reason=str(got), retry_s=UNKNOWN_RETRY_S)
            self._failed[schema_id] = (time.monotonic(), got)
            return got
        self._failed.pop(schema_id, None)
        self._readers[schema_id] = got
        return got

    def _compile(self, schema_id: int, text: str):
        import fastavro

        from .. import _eventread

        try:
            parsed = fastavro.parse_schema(json.loads(text))
            required = tuple(j for j in range(len(self.feature_names))
                             if j not in set(self.optional)) + ((-2,) if self.id_required
                                                                else ())
            plan = _Plan(parsed, self.paths, self.categories, frozenset(self.hashed),
                         self.casts, self.labels, required, self.id_label)
            if plan.nodes[0][0] != KINDS["record"]:
                raise SchemaError("bad_schema", "the schema is not a record")
            return _eventread.AvroReader(plan.nodes, plan.children, plan.enum_codes,
                                         plan.tables, len(self.feature_names), self.max_bytes,
                                         plan.symbols, self.hashed, plan.covers, self.labels,
                                         self.optional)
        except SchemaError as exc:
            return SchemaError(exc.code, f"schema {schema_id}: {exc}", exc.slot)
        except RecursionError:
            return SchemaError("bad_schema", f"schema {schema_id}: nested too deep")
        except Exception as exc:  # noqa: BLE001 (fastavro's and json's refusals)
            return SchemaError("bad_schema", f"schema {schema_id}: {type(exc).__name__}: "
                               f"{str(exc)[:200]}")

    # ---- messages -----------------------------------------------------------------------
    def decode(self, value: bytes | None) -> Message:
        if not value:
            raise InvalidMessage("empty", "the message has no value")
        if len(value) < 5 or value[0] != 0:
            raise InvalidMessage("bad_magic", "not Confluent's wire format (a magic byte 0 "
                                 "and a 4-byte schema id first)")
        reader = self._reader(int.from_bytes(value[1:5], "big"))
        if isinstance(reader, SchemaError):
            raise InvalidMessage(reader.code, str(reader),
                                 self.feature_names[reader.slot] if reader.slot >= 0 else None)
        got = reader.read(memoryview(value)[5:])
        if type(got[0]) is str:
            raise failure(got, self.feature_names)
        X, kinds, ints, offsets, strings, _single, *cats = got
        counts = _counted(reader.counts())
        # the row and its id (and its hashed features' texts: _texts)
        more, size = (), X.nbytes
        if cats:
            more = (_texts(cats[0], 1, len(self.feature_names), self._k_of),)
            size += texts_size(cats[0], 1, len(self.hashed))
        if kinds is None:
            if self.id_column:  # this schema has no id field: the id is null
                import pyarrow as pa

                return Message(1, size + 8, ("avro", "own"),
                               (X, pa.nulls(1, pa.int64()), *more), counts)
            return Message(1, size, ("avro", None), (X, None, *more), counts)
        if kinds[0] == 1:
            return Message(1, size + 8, ("avro", "int"), (X, ints, *more), counts)
        ids = _arrow_ids(kinds, ints, offsets, strings, self.id_column)
        return Message(1, size + ids.nbytes, ("avro", "own"), (X, ids, *more), counts,
                       len(strings))

    def gather(self, messages: list[Message]) -> Gathered:
        offsets = offsets_of(m.rows for m in messages)
        X = messages[0].data[0] if len(messages) == 1 else \
            np.concatenate([m.data[0] for m in messages])
        table = None
        if self.hashed:  # an Arrow batch: the categorical values as strings
            table = _hashed_batch(X, [m.data[2] for m in messages], self.hashed,
                                  self.feature_names)
            X = self._columns(table)
        singles = [True] * len(messages)
        kind = messages[0].group[1]
        if kind is None:
            return Gathered(X, offsets, row_index(offsets), None, table, singles)
        if kind == "int":
            return Gathered(X, offsets, np.concatenate([m.data[1] for m in messages]), None,
                            table, singles)
        return Gathered(X, offsets, None, [m.data[1] for m in messages], table, singles)

    def rows_by_name(self, gathered: Gathered, names: list[str]):
        import pyarrow as pa

        if gathered.table is not None:
            return gathered.table
        X = gathered.X
        return pa.RecordBatch.from_arrays([pa.array(X[:, j]) for j in range(X.shape[1])],
                                          names=self.feature_names)
