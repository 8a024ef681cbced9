"""What a message format is to the pipeline: decode one record's value into a ``Message``,
gather messages of one group into what the kernels read (``Gathered``), and, on the way out,
encode a group's scores into one value a message (``OutputFormat``).

The pipeline (``worker/pipeline.py``) treats every format one way: it groups the decoded
messages by ``Message.group``, gathers each group once, scores the rows, and asks the output
format for the values. Nothing in it knows which reader ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


class InvalidMessage(ValueError):
    """A message that cannot be decoded or validated; ``code`` names the kind of error (the
    dead letter's ``error_code``), ``detail`` says what was found."""

    def __init__(self, code: str, detail: str, feature: str | None = None):
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.feature = feature  # the feature at fault, where one is (counted by name)


@dataclass(slots=True)
class Message:
    """One decoded message: its rows, its decoded size (what the batch bounds count), the key
    of the messages it can be gathered with (equal keys: one gather, one kernel call), the
    format's own form of it (``data``) and its per-feature counts (``counts``)."""

    rows: int
    nbytes: int
    group: object
    data: object
    # per feature (int64 arrays, the model's order), what the reader met that the model
    # reads as missing: {"absent": optional fields absent, "unseen": category strings the
    # model does not know}; None: nothing
    counts: dict | None = None
    # the bytes of its string ids as the output repeats them, one a row (a dictionary's
    # value once a row that points at it): what writing them takes grows with it
    id_bytes: int = 0


@dataclass(slots=True)
class Gathered:
    """The rows of one group of messages, gathered once.

    ``X`` is what the kernels read (a row-major float32 block, or ``_kernels.Columns`` over
    Arrow buffers); ``offsets`` (messages + 1, int64) bound each message's rows. A message's
    ids are either slices of ``ids`` (one numpy array for the group, each row's index in its
    message when the input has no id column) or, where each message keeps its own Arrow id
    column (a dictionary is that message's), ``own_ids``. ``table`` is the group's features
    as a record batch where the format read one (None: ``X`` is a row block). ``singles``
    (formats whose messages are one event or several: JSON) says which messages were one."""

    X: object
    offsets: np.ndarray
    ids: np.ndarray | None
    own_ids: list | None
    table: object = None
    singles: list | None = None


class Format(Protocol):
    """A message format's reader, one per model (what it checks depends on the features)."""

    name: str

    def decode(self, value: bytes | None) -> Message:
        """One record's value, fully validated; raises ``InvalidMessage`` with its reason."""

    def gather(self, messages: list[Message]) -> Gathered:
        """The rows of messages of one group (equal ``Message.group``), gathered once."""

    def rows_by_name(self, gathered: Gathered, names: list[str]):
        """The gathered features as something ``score_batch`` reads by feature name (another
        model's features, a subset of these: the shadow)."""


class OutputFormat(Protocol):
    """The scores' format: one value an input message."""

    name: str
    content_type: str

    def row_bytes(self, top_k: int = 0) -> int:
        """The most bytes one row's output takes (with ``top_k`` reason codes a row), but
        for the text of string ids: ``id_factor`` bytes a byte of them."""

    id_factor: int

    def encode(self, gathered: Gathered, r, recs: list) -> list:
        """For message ``k`` of the group (rows ``gathered.offsets[k]:[k + 1]`` of the score
        result ``r``; ``recs[k]`` its input record): its output value (bytes), or the
        exception that kept that message's value from being built."""


def offsets_of(counts) -> np.ndarray:
    """Row offsets (n + 1, int64) from the rows of each of n messages."""
    c = np.fromiter(counts, dtype=np.int64)
    offsets = np.zeros(len(c) + 1, dtype=np.int64)
    np.cumsum(c, out=offsets[1:])
    return offsets


def row_index(offsets: np.ndarray) -> np.ndarray:
    """Each row's index in its message (the id of a message without an id column)."""
    n = int(offsets[-1])
    return np.arange(n, dtype=np.int64) - np.repeat(offsets[:-1], np.diff(offsets))


@dataclass(frozen=True, slots=True)
class Field:
    """Where one feature (or the id) is read in a JSON or Avro event (``source.fields``):
    its path of keys, whether an event may leave it out (``optional``: a missing value,
    counted; else the event is dead-lettered ``missing_field``) and the declared ``cast``
    ("number": a string holding a number; "string": an integer read as its decimal digits,
    for a category; None: neither is accepted)."""

    path: tuple[str, ...]
    optional: bool = False
    cast: str | None = None

    @property
    def dotted(self) -> str:
        return ".".join(self.path)


CAST_CODES = {None: 0, "number": 1, "string": 2}  # json_rows.h's CAST_* values


def field_specs(model, id_column: str | None, fields: dict | None,
                hashed=()) -> dict[str, Field]:
    """Each feature's (and the id's) ``Field`` from ``source.fields`` (a dotted path, or a
    ``FieldSpec``/dict with path, optional, cast), checked against the model: a name that is
    no feature or the id, a cast the feature cannot take (``string`` is for a feature with
    categories, ``number`` for one without; the id takes none) are ValueErrors naming the
    setting. A name is one key unless mapped (it may hold a dot: "Sepal.Length")."""
    fields = dict(fields or {})
    names = list(model.feature_names)
    unknown = sorted(set(fields) - set(names) - {id_column})
    if unknown:
        raise ValueError("source.fields names no feature or id column: "
                         + ", ".join(unknown[:10]))
    categorical = set(model.categories or {})
    out: dict[str, Field] = {}
    for name in names + ([id_column] if id_column else []):
        spec = fields.get(name)
        if isinstance(spec, Field):  # already resolved (the dry run's lenient reader)
            out[name] = spec
            continue
        if spec is None or isinstance(spec, str):
            path, optional, cast = spec, False, None
        elif isinstance(spec, dict):
            path, optional, cast = spec.get("path"), bool(spec.get("optional")), spec.get("cast")
        else:
            path, optional, cast = spec.path, spec.optional, spec.cast
        if cast not in CAST_CODES:
            raise ValueError(f"source.fields.{name}.cast: {cast!r} is not number or string")
        is_id = name == id_column and name not in names
        if is_id and cast:
            raise ValueError(f"source.fields.{name}: the id column takes no cast (ids are "
                             "integers or strings as they are)")
        if cast == "string" and name not in categorical and name not in hashed:
            raise ValueError(f"source.fields.{name}.cast: string reads a number as a "
                             "category's text, and the model has no categories for "
                             f"{name!r}: use cast: number, or no cast")
        if cast == "number" and (name in categorical or name in hashed):
            raise ValueError(f"source.fields.{name}.cast: number is for numeric features; "
                             f"{name!r} is categorical: use cast: string, or no cast")
        out[name] = Field(tuple(path.split(".")) if path else (name,), optional, cast)
    return out


def field_paths(feature_names, id_column: str | None,
                fields: dict[str, Field] | None) -> dict[tuple[str, ...], str | None]:
    """Where each feature, and the id, is read in an event with nested fields (JSON, Avro):
    its ``Field.path`` (``field_specs``), else its own name as one key. Path -> the
    feature's name, or None for the id. Refused with what clashes (ValueError naming the
    setting): two of them reading one field (the one read first would otherwise go missing
    on every row), or one reading a field that holds another's (a record or object is not a
    value)."""
    fields = dict(fields or {})

    def path_of(name: str) -> tuple[str, ...]:
        return fields[name].path if name in fields else (name,)

    def label(name: str | None) -> str:
        return f"scoring.id_column {id_column!r}" if name is None else f"feature {name!r}"

    named: list[tuple[str | None, tuple[str, ...]]] = [(f, path_of(f)) for f in feature_names]
    if id_column:
        named.append((None, path_of(id_column)))
    paths: dict[tuple[str, ...], str | None] = {}
    for name, path in named:
        if path in paths:
            if name is None and paths[path] == id_column:  # one name: no mapping parts them
                raise ValueError(f"scoring.id_column: {id_column!r} is also a feature the "
                                 "model reads (both read its field): set scoring.id_column "
                                 "to the field that holds the id")
            raise ValueError(f"source.fields: {label(paths[path])} and {label(name)} both read "
                             f"{'.'.join(path)!r}: map one of them to another field in "
                             "source.fields")
        paths[path] = name
    for path, name in paths.items():
        for k in range(1, len(path)):
            if path[:k] in paths:
                raise ValueError(f"source.fields: {label(paths[path[:k]])} reads "
                                 f"{'.'.join(path[:k])!r}, which holds {label(name)}'s "
                                 f"{'.'.join(path)!r} (a record is not a value)")
    return paths
