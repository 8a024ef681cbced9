"""Arrow IPC in and out: decode and validate one message, encode one output stream."""

from __future__ import annotations

import pyarrow as pa

from .model.compiled import feature_type_problem
from .model.result import STOP_REASONS, ScoreResult

CONTENT_TYPE = "application/vnd.apache.arrow.stream"
_REASON_DICTIONARY = pa.array(STOP_REASONS.tolist(), type=pa.string())


class InvalidMessage(ValueError):
    """A message that cannot be decoded or validated; ``code`` names the kind of error."""

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


def decode(value: bytes | None, feature_names: list[str], id_column: str | None,
           max_rows: int | None = None) -> pa.Table:
    """One self-contained Arrow IPC stream -> a Table of the feature (and id) columns, each
    fully validated: nothing native reads a buffer whose size pyarrow has not checked against
    the lengths, offsets and null counts the message claims."""
    if not value:
        raise InvalidMessage("empty", "the message has no value")
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(value))
        table = reader.read_all()
        schema_names = table.schema.names  # field names are UTF-8 (or the decode fails here)
    except (pa.ArrowException, OSError, MemoryError, ValueError) as exc:
        raise InvalidMessage("not_arrow", f"not a readable Arrow IPC stream: "
                             f"{_short(exc)}") from None
    if table.num_rows == 0:
        raise InvalidMessage("empty_batch", "the Arrow stream has no rows")
    if max_rows is not None and table.num_rows > max_rows:
        raise InvalidMessage("too_large", f"{table.num_rows} rows, more than "
                             f"delivery.max_message_rows ({max_rows})")
    names = set(schema_names)
    wanted = list(feature_names) + ([id_column] if id_column else [])
    dup = sorted({n for n in wanted if table.schema.get_all_field_indices(n)[1:]})
    if dup:
        raise InvalidMessage("duplicate_column", "column(s) named more than once: "
                             + ", ".join(dup[:10]))
    missing = [f for f in feature_names if f not in names]
    if missing:
        raise InvalidMessage("missing_column", "missing feature column(s): "
                             + ", ".join(missing[:10]))
    if id_column and id_column not in names:
        raise InvalidMessage("missing_column", f"missing id column {id_column!r}")
    for f in feature_names:
        problem = feature_type_problem(f, table.schema.field(f).type)
        if problem:
            raise InvalidMessage("bad_type", problem)
    # only the columns read from here on; the others are never touched
    keep = set(wanted)
    table = table.select([n for n in schema_names if n in keep])  # in the message's order
    try:
        table.validate(full=True)
    except (pa.ArrowException, ValueError) as exc:
        raise InvalidMessage("invalid_arrow", f"buffers fail validation: {_short(exc)}") \
            from None
    return table


def _short(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:limit]


def result_batch(ids: pa.Array | None, r: ScoreResult, classifier: bool,
                 slice_: slice | None = None) -> pa.RecordBatch:
    """The output columns (README: Messages) for rows ``slice_`` of a score result; ``ids``
    are those rows' ids (one message's id column), or None for each row's index in its
    message."""
    s = slice_ or slice(0, len(r))
    n = s.stop - s.start
    codes = r.stop_code[s]
    cols = {
        # without an id column: the row's index in its own message
        "id": ids if ids is not None else pa.array(range(n), type=pa.int64()),
        "score": pa.array(r.score[s], type=pa.float64()),
    }
    if classifier:
        cols["label"] = pa.array(r.label[s], type=pa.int32())
    cols.update({
        "decision": pa.array(r.decision[s], type=pa.int8()),
        "work_units": pa.array(r.work_units[s], type=pa.int32()),
        "stop_reason": pa.DictionaryArray.from_arrays(pa.array(codes, type=pa.int8()),
                                                      _REASON_DICTIONARY),
        "score_lo": pa.array(r.score_lo[s], type=pa.float64()),
        "score_hi": pa.array(r.score_hi[s], type=pa.float64()),
    })
    return pa.RecordBatch.from_pydict(cols)


def output_metadata(model, **extra) -> dict[bytes, bytes]:
    meta = {"model_id": model.model_id, "work_total": str(model.work_total)}
    meta.update({k: str(v) for k, v in extra.items() if v is not None})
    return {k.encode(): v.encode() for k, v in meta.items()}


def encode(batch: pa.RecordBatch, metadata: dict[bytes, bytes]) -> bytes:
    batch = batch.replace_schema_metadata(metadata)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()
