"""Arrow IPC, the first format: one stream a message in, one stream a message out.

In: a message of a schema seen before, in the usual form (one uncompressed record batch), is
checked and kept as its bytes by the C reader (``codec.Raw``) and gathered from them straight
into the row-major float32 block; any other message is read by pyarrow, which decides what is
invalid (``codec.Decoder``), and its group's batches are concatenated into one. Out: one rule
picks the writer (``ArrowOutput.encode``).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa

from .. import codec
from .base import Gathered, Message, offsets_of, row_index


class ArrowFormat:
    name = "arrow"

    def __init__(self, model, id_column: str | None, max_rows: int | None, max_bytes: int):
        # as JSON and Avro refuse it (a hostile review: Arrow took it, every output's id a
        # feature's value, so no decision joined back to its transaction)
        if id_column and id_column in model.feature_names:
            raise ValueError(f"scoring.id_column: {id_column!r} is also a feature the model "
                             "reads: set scoring.id_column to the column that holds the id")
        self.decoder = codec.Decoder(model.feature_names, id_column, max_rows,
                                     categories=model.categories, max_bytes=max_bytes,
                                     category_hashes=getattr(model, "category_hashes", None))
        self.feature_names = list(model.feature_names)
        self.id_column = id_column
        self._columns = model.columns  # Arrow columns -> the kernels' column descriptors

    def decode(self, value: bytes | None) -> Message:
        batch, key = self.decoder.decode_keyed(value)
        if type(batch) is codec.Raw:
            return Message(batch.num_rows, batch.num_rows * batch.plan.row_bytes, key, batch)
        counts = None
        if self.decoder.unseen:  # category strings the model does not know, per feature
            unseen = np.zeros(len(self.feature_names), np.int64)
            for name, n in self.decoder.unseen.items():
                unseen[self.feature_names.index(name)] = n
            counts = {"unseen": unseen}
        return Message(batch.num_rows, self._decoded_bytes(batch), key, batch, counts,
                       self._id_text_bytes(batch))

    def _id_text_bytes(self, batch: pa.RecordBatch) -> int:
        """The bytes of string (or binary) ids as one a row repeats them: a dictionary's
        value counts for every row that points at it (Message.id_bytes)."""
        if not self.id_column:
            return 0
        import pyarrow.compute as pc

        col = batch.column(self.id_column)
        t = col.type
        words = col.dictionary if pa.types.is_dictionary(t) else col
        wt = words.type
        if not (pa.types.is_string(wt) or pa.types.is_large_string(wt) or
                pa.types.is_binary(wt) or pa.types.is_large_binary(wt) or
                pa.types.is_string_view(wt) or pa.types.is_binary_view(wt)):
            return 0
        lengths = pc.binary_length(words)
        if pa.types.is_dictionary(t):
            lengths = lengths.take(col.indices)
        return int(pc.sum(lengths).as_py() or 0)

    def _decoded_bytes(self, batch: pa.RecordBatch) -> int:
        """The decoded size, at the width the gather writes: a float32 a feature a row, plus
        the id column (its fixed width a row, or its buffers' total)."""
        n = batch.num_rows
        size = 4 * len(self.feature_names) * n
        if self.id_column:
            t = batch.schema.field(self.id_column).type
            try:
                if pa.types.is_dictionary(t):  # its width is the indices'
                    raise ValueError
                size += t.byte_width * n
            except ValueError:  # variable width, a dictionary: what its buffers hold
                # nbytes as well: buffers shared by several fields count once there
                col = batch.column(self.id_column)
                size += max(col.get_total_buffer_size(), col.nbytes)
        return size

    def gather(self, messages: list[Message]) -> Gathered:
        offsets = offsets_of(m.rows for m in messages)
        first = messages[0].data
        if type(first) is codec.Raw:  # read in C: gathered from the bytes in one pass
            plan = first.plan
            X = np.empty((int(offsets[-1]), len(self.feature_names)), dtype=np.float32)
            ids = np.empty(len(X), dtype=plan.id_dtype) if plan.id_dtype is not None else None
            plan.gather([m.data.value for m in messages], first.start, X, ids)
            return Gathered(X, offsets, ids if ids is not None else row_index(offsets), None)
        # the features alone: nothing of one message's id column (a dictionary, say) is
        # unified with another's; each message keeps its own
        batches = [m.data.select(self.feature_names) for m in messages]
        table = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
        if self.id_column:
            ids, own_ids = None, [m.data.column(self.id_column) for m in messages]
        else:
            ids, own_ids = row_index(offsets), None
        return Gathered(self._columns(table), offsets, ids, own_ids, table)

    def rows_by_name(self, gathered: Gathered, names: list[str]):
        if gathered.table is not None:
            return gathered.table
        X = gathered.X
        return pa.RecordBatch.from_arrays([pa.array(X[:, j]) for j in range(X.shape[1])],
                                          names=self.feature_names)


class ArrowOutput:
    """One Arrow IPC stream an input message (docs/formats.md), after a head cached per
    output schema, topic and partition (``codec.StreamEncoder``)."""

    name = "arrow"
    content_type = codec.CONTENT_TYPE
    id_factor = 4  # a string id copied into the output batch, then into its stream

    def __init__(self, model, **metadata):
        self.stream = codec.StreamEncoder(codec.output_metadata(model, **metadata))
        self.classifier = model.task != "regression"
        self.feature_names = list(model.feature_names)

    def row_bytes(self, top_k: int = 0) -> int:
        """The most one row's output takes: its columns (an 8-byte id, the scores and
        bounds, label, decision, work units, stop reason, validity) and ``top_k`` reason
        codes (a name's dictionary index and an attribution each, list offsets, the bias);
        the columns are built once and written once (twice the bytes)."""
        return 2 * (48 + (16 + 8 * top_k if top_k else 0))

    def encode(self, gathered: Gathered, r, recs: list) -> list:
        # The one rule for the writer: the C writer (``_ipc.write_streams``) where the ids are
        # one numpy array and there are no reason columns; pyarrow otherwise (each message's
        # own Arrow ids, reason codes), and where the C writer cannot cache a head
        if self.stream.native and gathered.own_ids is None and r.reason_feature is None:
            try:
                return self.stream.encode_numpy(gathered.ids, r, self.classifier,
                                                gathered.offsets, recs)
            except Exception:  # noqa: BLE001 (pyarrow's writer below, message by message)
                pass
        columns = codec.ResultColumns(r, self.classifier, self.feature_names)
        values = []
        for out, rec in zip(_batches(columns, gathered), recs, strict=True):
            if not isinstance(out, Exception):
                try:
                    out = self.stream.encode(*out[:2], rec.topic, rec.partition, rec.offset,
                                             out[2])
                except Exception as exc:  # noqa: BLE001 (one message's failure is its own)
                    out = exc
            values.append(out)
        return values


def _batches(columns: codec.ResultColumns, g: Gathered) -> list:
    """For each message, (output batch, its rows to encode, its schema key), or the exception
    that kept its batch from being built: with ``own_ids``, a batch of that message's rows and
    its own ids; else slices of one batch over ``ids``."""
    keys: dict[int, tuple] = {}

    def key_of(batch):  # equal schema objects (ResultColumns reuses them): one key
        key = keys.get(id(batch.schema))
        if key is None:
            key = keys[id(batch.schema)] = ("schema", hashlib.blake2b(
                batch.schema.serialize().to_pybytes(), digest_size=16).digest())
        return key

    bounds = [slice(int(a), int(b)) for a, b in zip(g.offsets[:-1], g.offsets[1:],
                                                    strict=True)]
    if g.own_ids is None:
        try:
            whole = columns.batch(pa.array(g.ids))
            return [(whole, sl, key_of(whole)) for sl in bounds]
        except Exception as exc:  # noqa: BLE001 (ids Arrow cannot put in a batch)
            return [exc] * len(bounds)
    out = []
    for sl, own in zip(bounds, g.own_ids, strict=True):
        try:
            batch = columns.batch(own, sl)
            out.append((batch, slice(0, batch.num_rows), key_of(batch)))
        except Exception as exc:  # noqa: BLE001 (this message alone is dead-lettered)
            out.append(exc)
    return out
