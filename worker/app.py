"""The run loop: source -> decode -> stage+score (kernels) -> encode -> sink, then commit."""

from __future__ import annotations

import contextlib
import hashlib
import signal
import sys
import time
from collections import Counter as Tally
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pyarrow as pa
import structlog

from . import chaos, codec
from .config import ConfigError, Settings, load_settings
from .io import BatchRolledBack, FatalError, StartupError, open_sink, open_source
from .io.base import CredentialsRejected, NotAuthorized
from .io.records import RESERVED_HEADERS, Record
from .metrics import Metrics, observe_many
from .model.compiled import CompiledModel
from .model.result import STOP_REASONS, default_threads
from .report import ScoreSample

log = structlog.get_logger("worker")


@dataclass
class BatchStats:
    rows: int = 0  # rows published (scored and encoded)
    rows_in: int = 0  # rows of the messages that decoded
    messages: int = 0
    work_units: int = 0
    stop_reasons: Tally = field(default_factory=Tally)
    decisions: Tally = field(default_factory=Tally)
    dead: Tally = field(default_factory=Tally)
    audit_rows: int = 0
    audit_disagreements: int = 0
    explained: int = 0  # rows published with reason codes
    kernel_s: float = 0.0
    # this batch's published (score, work units) arrays, for the run's bounded sample
    scores: list = field(default_factory=list)
    # the shadow model (model.shadow_path): kernel seconds, decision pairs (live band x
    # shadow band, flattened), score differences, batches it could not score
    shadow_kernel_s: float = 0.0
    shadow_pairs: np.ndarray | None = None
    shadow_diffs: list = field(default_factory=list)
    shadow_errors: int = 0
    # reason codes (scoring.explain): the highest-scored explained rows, (score, feature
    # indices, attributions, bias), at most TOP_REASONS
    top_reasons: list = field(default_factory=list)


TOP_REASONS = 5  # explained rows the run summary shows


@dataclass
class Shadow:
    """A challenger scored on the live model's rows; its outputs go to its own topic."""

    model: CompiledModel
    topic: str
    encoder: codec.StreamEncoder
    headers: list
    classifier: bool
    same_features: bool  # the live model's gathered columns serve it as they are


class Pipeline:
    """Decode, score and encode one batch of messages. Never raises for one bad message."""

    def __init__(self, model: CompiledModel, settings: Settings, out_topic: str):
        self.model = model
        self.scoring = settings.scoring
        self.decoder = codec.Decoder(model.feature_names, settings.scoring.id_column,
                                     settings.delivery.max_message_rows,
                                     categories=model.categories,
                                     max_bytes=min(settings.message_byte_limit,
                                                   settings.delivery.memory_budget_mb << 20))
        # what every output message carries, encoded once
        self.encoder = codec.StreamEncoder(codec.output_metadata(model))
        self._headers = [("content-type", codec.CONTENT_TYPE.encode()),
                         ("model_id", model.model_id.encode())]
        self.out_topic = out_topic
        self.lazy_params = settings.scoring.lazy.params
        if settings.scoring.audit_fraction:
            self.lazy_params = {**self.lazy_params,
                                "audit_fraction": settings.scoring.audit_fraction}
        self.classifier = model.task != "regression"
        self.threads = settings.scoring.threads or default_threads()  # resolved once
        self.rows_seen = 0
        self.max_message_bytes = settings.message_byte_limit
        # inputs whose output or dead letter the broker refused: {(topic, partition, offset):
        # (reason code, dead letter refused too)}; dead-lettered (without the value if the
        # dead letter was refused) until a delivery of them succeeds
        self.refused: dict[tuple[str, int, int], tuple[str, bool]] = {}
        # the largest message (value, key, headers) the sink's topics take, if it says
        self.max_out_bytes = self.max_dead_bytes = self.max_shadow_bytes = None
        self.shadow: Shadow | None = None

    def set_shadow(self, model: CompiledModel | None, topic: str | None) -> None:
        """Score ``model`` beside the live one (None: stop). It must read only features the
        live model reads (they are the columns decoded)."""
        if model is None:
            self.shadow = None
            return
        missing = [f for f in model.feature_names if f not in set(self.model.feature_names)]
        if missing:
            raise ValueError("the shadow model reads features the live model does not: "
                             + ", ".join(missing[:10]))
        self.shadow = Shadow(model, topic, codec.StreamEncoder(codec.output_metadata(model)),
                             [("content-type", codec.CONTENT_TYPE.encode()),
                              ("model_id", model.model_id.encode()), ("role", b"shadow")],
                             model.task != "regression",
                             list(model.feature_names) == list(self.model.feature_names))

    def with_model(self, model: CompiledModel, settings: Settings) -> Pipeline:
        """The same pipeline around another model (a hot swap): what it learned of the
        stream (refused outputs, the sink's limits, rows seen for the audit) carries over."""
        new = Pipeline(model, settings, self.out_topic)
        new.refused, new.rows_seen = self.refused, self.rows_seen
        new.max_out_bytes, new.max_dead_bytes = self.max_out_bytes, self.max_dead_bytes
        new.max_shadow_bytes = self.max_shadow_bytes
        if self.shadow is not None:
            try:
                new.set_shadow(self.shadow.model, self.shadow.topic)
            except ValueError as exc:  # the new live model no longer has its features
                log.warning("shadow scoring stops", reason=str(exc))
        return new

    def decode(self, rec: Record) -> tuple[pa.RecordBatch, object, int] | codec.InvalidMessage:
        """(the message's validated batch, its group key, its decoded bytes) or why it is
        invalid."""
        try:
            batch, key = self.decoder.decode_keyed(rec.value)
        except codec.InvalidMessage as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 (one message never stops the loop)
            return codec.InvalidMessage("invalid", f"{type(exc).__name__}: {exc}")
        nbytes = batch.num_rows * batch.plan.row_bytes if type(batch) is codec.Raw else \
            self._decoded_bytes(batch)
        if nbytes > self.max_message_bytes:
            return codec.InvalidMessage(
                "too_large", f"{nbytes} bytes decoded, more than delivery.max_message_bytes "
                f"({self.max_message_bytes})")
        return batch, key, nbytes

    def _decoded_bytes(self, batch: pa.RecordBatch) -> int:
        """The decoded size, at the width the gather writes: a float32 a feature a row, plus
        the id column (its fixed width a row, or its buffers' total)."""
        n = batch.num_rows
        size = 4 * len(self.model.feature_names) * n
        idc = self.scoring.id_column
        if idc:
            t = batch.schema.field(idc).type
            try:
                if pa.types.is_dictionary(t):  # its width is the indices'
                    raise ValueError
                size += t.byte_width * n
            except ValueError:  # variable width, a dictionary: what its buffers hold
                # nbytes as well: buffers shared by several fields count once there
                col = batch.column(idc)
                size += max(col.get_total_buffer_size(), col.nbytes)
        return size

    def dead_letter(self, rec: Record, err: codec.InvalidMessage,
                    drop_value: bool = False) -> Record:
        """The worker's headers first, then the input's (renamed where they take a worker's
        name). Too large for the dead-letter topic (or refused by it before): without the
        value, and if still too large without the input's key and headers too."""
        own = [("error", err.detail.encode()), ("error_code", err.code.encode()),
               ("source_topic", rec.topic.encode()),
               ("source_partition", str(rec.partition).encode()),
               ("source_offset", str(rec.offset).encode()),
               ("model_id", self.model.model_id.encode())]
        headers = own + forwarded(rec.headers)
        value, key = rec.value, rec.key
        limit = self.max_dead_bytes
        if not drop_value and limit is not None and value is not None and \
                _size(value, key, headers) > limit:
            drop_value = True
        if drop_value:  # the broker would refuse (or refused) this dead letter with its value
            value = None
            dropped = [("value_dropped", b"the dead letter with the value is larger than the "
                                         b"dead-letter topic takes")]
            headers = own + dropped + forwarded(rec.headers)
            if limit is not None and _size(b"", key, headers) > limit - 512:
                key, headers = None, own + dropped + [
                    ("input_dropped", b"the input's key and headers are larger than the "
                                      b"dead-letter topic takes")]
        return Record(rec.topic, rec.partition, rec.offset, key, value,
                      rec.timestamp_ms, headers, (rec.topic, rec.partition, rec.offset))

    def _refused_letter(self, rec: Record, decoded) -> Record | None:
        """A dead letter for an input whose output (or dead letter) the broker refused."""
        why = self.refused.get((rec.topic, rec.partition, rec.offset))
        if why is None:
            return None
        code, dead_letter_refused = why
        err = decoded if isinstance(decoded, codec.InvalidMessage) else codec.InvalidMessage(
            code, "the broker refused this message's scores"
                  + (" (too large)" if code == "output_too_large" else ""))
        return self.dead_letter(rec, err, drop_value=dead_letter_refused)

    def _score(self, table):
        lazy = self.scoring.lazy.mode
        params = self.lazy_params
        if "audit_fraction" in params:  # audit by position in the stream, not in the batch
            params = {**params, "audit_seed": self.rows_seen}
        ex = self.scoring.explain
        explain = {} if ex is None else {"explain": ex.method, "top_k": ex.top_k,
                                         "explain_min_score": ex.min_score}
        r = self.model.score_batch(table, lazy=lazy, thresholds=self.scoring.thresholds,
                                   n_threads=self.threads, **params, **explain)
        self.rows_seen += len(r)
        return r

    def _shadow(self, stats: BatchStats, big, cols, r, ids, own_ids, members, items, offsets,
                results) -> list[Record]:
        """The shadow's outputs for the messages whose live output is published. Whatever
        fails here is counted and leaves the live outputs as they are."""
        sh = self.shadow
        out = []
        try:
            t0 = time.perf_counter()
            params = {k: v for k, v in self.lazy_params.items() if k != "audit_fraction"}
            rs = sh.model.score_batch(cols if sh.same_features else big,
                                      lazy=self.scoring.lazy.mode,
                                      thresholds=self.scoring.thresholds,
                                      n_threads=self.threads, **params)
            stats.shadow_kernel_s += time.perf_counter() - t0
            outputs = self._outputs(codec.ResultColumns(rs, sh.classifier), ids, own_ids,
                                    offsets)
            for k, i in enumerate(members):
                rec = items[i][0]
                if i not in results or ("shadow", rec.topic, rec.partition, rec.offset) \
                        in self.refused or isinstance(outputs[k], Exception):
                    continue
                sout, sl, key = outputs[k]
                value = sh.encoder.encode(sout, sl, rec.topic, rec.partition, rec.offset, key)
                limit = self.max_shadow_bytes or self.max_out_bytes
                if limit is not None and len(value) > limit - 512:
                    continue  # too large for the topic: the live output goes on alone
                out.append(Record(sh.topic, -1, -1, rec.key, value, rec.timestamp_ms,
                                  sh.headers, ("shadow", rec.topic, rec.partition,
                                               rec.offset)))
            nb = len(self.scoring.thresholds) + 1
            pairs = np.bincount(r.decision.astype(np.int64) * nb + rs.decision, minlength=nb * nb)
            stats.shadow_pairs = pairs if stats.shadow_pairs is None else \
                stats.shadow_pairs + pairs
            stats.shadow_diffs.append(rs.score - r.score)
        except Exception as exc:  # noqa: BLE001 (the shadow never touches the live output)
            stats.shadow_errors += 1
            log.warning("the shadow model could not score a batch", error=str(exc)[:200])
            return []
        return out

    def process(self, items: list[tuple[Record, tuple | codec.InvalidMessage]]
                ) -> tuple[list[Record], list[Record], BatchStats]:
        """One batch: messages of one schema are concatenated (pyarrow, in C++), scored in one
        kernel call and encoded from one output batch, each message a slice of it."""
        chaos.point("score")
        stats = BatchStats(messages=len(items))
        results: dict[int, Record] = {}
        shadow_out: list[Record] = []
        dead: list[Record] = []
        groups: dict[object, list[int]] = {}  # by the stream's schema bytes: usually one
        for i, (rec, decoded) in enumerate(items):
            if self.refused:
                letter = self._refused_letter(rec, decoded)
                if letter is not None:
                    dead.append(letter)
                    stats.dead[_code_of(letter)] += 1
                    continue
            if isinstance(decoded, codec.InvalidMessage):
                dead.append(self.dead_letter(rec, decoded))
                stats.dead[decoded.code] += 1
                continue
            stats.rows_in += decoded[0].num_rows
            members = groups.get(decoded[1])
            if members is None:
                groups[decoded[1]] = [i]
            else:
                members.append(i)
        for members in groups.values():
            raw = isinstance(items[members[0]][1][0], codec.Raw)
            try:
                t0 = time.perf_counter()
                if raw:  # read in C: gathered from the message bytes, no Arrow objects
                    big, X, ids, offsets = self._gather(members, items)
                    r = self._score(X)
                    cols = X
                else:
                    # the features alone: nothing of one message's id column (a dictionary,
                    # say) is unified with another's
                    batches = [items[i][1][0].select(self.model.feature_names)
                               for i in members]
                    big = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
                    cols = self.model.columns(big)  # gathered once (the shadow reads it too)
                    # reason codes read the rows again: the batch, not the column descriptors
                    r = self._score(cols if self.scoring.explain is None else big)
                    offsets = _offsets(b.num_rows for b in batches)
                    ids = None
                stats.kernel_s += time.perf_counter() - t0
            except Exception as exc:  # noqa: BLE001 (isolate, dead-letter, keep running)
                if len(members) == 1:
                    rec = items[members[0]][0]
                    dead.append(self.dead_letter(rec, codec.InvalidMessage("score_error",
                                                                           str(exc))))
                    stats.dead["score_error"] += 1
                    continue
                for i in members:  # isolate the bad message(s): score one by one
                    sub_out, sub_dead, sub_stats = self.process([items[i]])
                    if sub_out:
                        results[i] = sub_out[0]
                        shadow_out.extend(sub_out[1:])
                    dead.extend(sub_dead)
                    stats.dead.update(sub_stats.dead)
                    _add_scored(stats, sub_stats)
                continue
            counts = np.diff(offsets)
            if ids is None:  # each row's index in its message
                ids = None if big is not None and self.scoring.id_column else \
                    np.arange(len(r), dtype=np.int64) - np.repeat(offsets[:-1], counts)
            published = None  # rows of messages that failed to encode are not counted
            if raw and self.encoder.native and r.reason_feature is None:
                try:
                    values = self.encoder.encode_numpy(
                        ids, r, self.classifier, offsets, [items[i][0] for i in members])
                    for k, i in enumerate(members):
                        results[i] = self._record(items[i][0], values[k])
                except Exception:  # noqa: BLE001 (pyarrow's encoder below, message by message)
                    results.update({i: None for i in members})
            # each message's ids: its own id column where pyarrow read it (a dictionary is
            # that message's, never the batch's unified one), else slices of one array
            own_ids = [items[i][1][0].column(self.scoring.id_column) for i in members] \
                if self.scoring.id_column and not raw else None
            if not raw or not self.encoder.native or r.reason_feature is not None or \
                    results.get(members[0]) is None:
                columns = codec.ResultColumns(r, self.classifier, self.model.feature_names)
                outputs = self._outputs(columns, ids, own_ids, offsets)
                for k, i in enumerate(members):
                    rec = items[i][0]
                    try:
                        if isinstance(outputs[k], Exception):
                            raise outputs[k]
                        results[i] = self._encode(rec, *outputs[k])
                    except Exception as exc:  # noqa: BLE001 (one message's failure is its own)
                        results.pop(i, None)
                        err = exc if isinstance(exc, codec.InvalidMessage) else \
                            codec.InvalidMessage("encode_error", str(exc))
                        dead.append(self.dead_letter(rec, err))
                        stats.dead[err.code] += 1
                        if published is None:
                            published = np.ones(len(r), dtype=bool)
                        published[int(offsets[k]):int(offsets[k + 1])] = False
            else:  # encoded in C: refusals for size are dead letters, message by message
                for k, i in enumerate(members):
                    if isinstance(results[i], codec.InvalidMessage):
                        err = results.pop(i)
                        dead.append(self.dead_letter(items[i][0], err))
                        stats.dead[err.code] += 1
                        if published is None:
                            published = np.ones(len(r), dtype=bool)
                        published[int(offsets[k]):int(offsets[k + 1])] = False
            _account(stats, r, published)
            if self.shadow is not None:
                if raw and not self.shadow.same_features:
                    big = pa.RecordBatch.from_arrays(
                        [pa.array(X[:, j]) for j in range(X.shape[1])],
                        names=self.model.feature_names)
                shadow_out.extend(self._shadow(stats, big, cols, r, ids, own_ids, members,
                                               items, offsets, results))
        return [results[i] for i in sorted(results)] + shadow_out, dead, stats

    @staticmethod
    def _outputs(columns: codec.ResultColumns, ids, own_ids: list | None,
                 offsets: np.ndarray) -> list:
        """For each message, (output batch, its rows to encode, its schema key), or the
        exception that kept its batch from being built: with ``own_ids``, a batch of that
        message's rows and its own ids; else slices of one batch over ``ids``."""
        keys: dict[int, tuple] = {}

        def key_of(batch):  # equal schema objects (ResultColumns reuses them): one key
            key = keys.get(id(batch.schema))
            if key is None:
                key = keys[id(batch.schema)] = ("schema", hashlib.blake2b(
                    batch.schema.serialize().to_pybytes(), digest_size=16).digest())
            return key

        bounds = [slice(int(a), int(b)) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
        if own_ids is None:
            try:
                whole = columns.batch(pa.array(ids))
                return [(whole, sl, key_of(whole)) for sl in bounds]
            except Exception as exc:  # noqa: BLE001 (ids Arrow cannot put in a batch)
                return [exc] * len(bounds)
        out = []
        for sl, own in zip(bounds, own_ids, strict=True):
            try:
                batch = columns.batch(own, sl)
                out.append((batch, slice(0, batch.num_rows), key_of(batch)))
            except Exception as exc:  # noqa: BLE001 (this message alone is dead-lettered)
                out.append(exc)
        return out

    def _gather(self, members: list[int], items) -> tuple:
        """(None, features (n, features) float32, ids or None, row offsets) of messages read
        in C, gathered from their bytes in one pass."""
        first = items[members[0]][1][0]
        offsets = _offsets(items[i][1][0].num_rows for i in members)
        n = int(offsets[-1])
        X = np.empty((n, len(self.model.feature_names)), dtype=np.float32)
        plan = first.plan
        ids = np.empty(n, dtype=plan.id_dtype) if plan.id_dtype is not None else None
        plan.gather([items[i][0].value for i in members], first.start, X, ids)
        return None, X, ids, offsets

    def _record(self, rec: Record, value: bytes) -> Record | codec.InvalidMessage:
        """The output record of ``rec`` (or why the output topic would refuse it): the
        worker's own headers, then the input's (trace context such as traceparent)."""
        headers = self._headers + forwarded(rec.headers) if rec.headers \
            else list(self._headers)
        if self.max_out_bytes is not None and len(value) > self.max_out_bytes - 512 and \
                _size(value, rec.key, headers) > self.max_out_bytes:
            return codec.InvalidMessage(
                "output_too_large", f"the scores message ({len(value)} bytes) is larger than "
                f"the output topic takes ({self.max_out_bytes} bytes with key and headers)")
        return Record(self.out_topic, -1, -1, rec.key, value, rec.timestamp_ms, headers,
                      (rec.topic, rec.partition, rec.offset))

    def _encode(self, rec: Record, out: pa.RecordBatch, sl: slice, key) -> Record:
        out = self._record(rec, self.encoder.encode(out, sl, rec.topic, rec.partition,
                                                    rec.offset, key))
        if isinstance(out, codec.InvalidMessage):
            raise out
        return out


def forwarded(headers: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """The input's headers as outputs and dead letters carry them (trace context and the
    like), a name the worker writes renamed input-NAME."""
    return [(f"input-{k}" if k.lower() in RESERVED_HEADERS else k, v) for k, v in headers]


def _offsets(counts) -> np.ndarray:
    """Row offsets (n + 1) from the rows of each of n messages."""
    c = np.fromiter(counts, dtype=np.int64)
    offsets = np.zeros(len(c) + 1, dtype=np.int64)
    np.cumsum(c, out=offsets[1:])
    return offsets


def _size(value: bytes, key: bytes | None, headers: list[tuple[str, bytes]]) -> int:
    return len(value) + len(key or b"") + sum(len(k) + len(v or b"") for k, v in headers)


def _code_of(letter: Record) -> str:
    return next(v.decode() for k, v in reversed(letter.headers) if k == "error_code")


def _account(stats: BatchStats, r, rows: np.ndarray | None = None) -> None:
    """Count the rows of ``r`` that are published (all, or where ``rows`` is True)."""
    score, work, decision, codes = r.score, r.work_units, r.decision, r.stop_code
    if rows is not None:
        score, work, decision, codes = score[rows], work[rows], decision[rows], codes[rows]
    stats.rows += len(score)
    stats.work_units += int(work.sum())
    for code, n in enumerate(np.bincount(codes, minlength=len(STOP_REASONS)).tolist()):
        if n:
            stats.stop_reasons[STOP_REASONS[code]] += n
    for band, n in enumerate(np.bincount(decision.astype(np.int64)).tolist()):
        if n:
            stats.decisions[band] += n
    stats.scores.append((score, work))
    if r.reason_feature is not None:
        explained = r.reason_feature[:, 0] >= 0
        if rows is not None:
            explained &= rows
        idx = np.flatnonzero(explained)
        stats.explained += idx.size
        idx = idx[np.argsort(-r.score[idx], kind="stable")[:TOP_REASONS]]
        _keep_top(stats.top_reasons, [(float(r.score[i]), r.reason_feature[i].tolist(),
                                       r.reason_value[i].tolist(), float(r.reason_bias[i]))
                                      for i in idx])
    stats.audit_rows += r.audit_rows
    stats.audit_disagreements += r.audit_disagreements


def _keep_top(into: list, more: list) -> None:
    """The TOP_REASONS highest-scored of both lists, into ``into``."""
    if more:
        into[:] = sorted(into + more, key=lambda t: -t[0])[:TOP_REASONS]


def _add_scored(into: BatchStats, other: BatchStats) -> None:
    """Add ``other``'s scored-row counts to ``into`` (messages and dead letters are counted
    by the caller)."""
    into.rows += other.rows
    into.work_units += other.work_units
    into.stop_reasons.update(other.stop_reasons)
    into.decisions.update(other.decisions)
    into.audit_rows += other.audit_rows
    into.audit_disagreements += other.audit_disagreements
    into.explained += other.explained
    into.kernel_s += other.kernel_s
    into.scores.extend(other.scores)
    into.shadow_kernel_s += other.shadow_kernel_s
    if other.shadow_pairs is not None:
        into.shadow_pairs = other.shadow_pairs if into.shadow_pairs is None else \
            into.shadow_pairs + other.shadow_pairs
    into.shadow_diffs.extend(other.shadow_diffs)
    into.shadow_errors += other.shadow_errors
    _keep_top(into.top_reasons, other.top_reasons)


class Worker:
    """Owns the loop; ``stop()`` (from a signal) ends it after the batch in hand commits."""

    def __init__(self, settings: Settings, model: CompiledModel, source, sink,
                 metrics: Metrics | None = None, progress=None):
        self.settings, self.model = settings, model
        self.source, self.sink = source, sink
        # what waits on the broker (a full queue, a commit, a rewind) gives up once a stop was
        # asked for delivery.stop_timeout_ms ago: the worker then exits 0 within that bound
        # plus the batch in hand
        for part in (sink, source):
            if hasattr(part, "stopping"):
                part.stopping = self._give_up
        self.metrics = metrics or Metrics()
        self.pipeline = Pipeline(model, settings, sink.topic)
        limits = getattr(sink, "max_bytes", None)
        if limits:
            self.pipeline.max_out_bytes = limits.get(sink.topic)
            self.pipeline.max_dead_bytes = limits.get(sink.dead_letter_topic)
            self.pipeline.max_shadow_bytes = limits.get(settings.sink.shadow_topic)
        self.progress = progress
        self.totals = BatchStats()
        self.sample = ScoreSample()
        # messages polled past a batch bound, decoded, for the next batch
        self._held: list[tuple[Record, tuple | codec.InvalidMessage]] = []
        # (delivery, its commit in the helper thread, batch, stats, start) while it commits
        self._pending: tuple | None = None
        self._behind = False  # the last batch closed at a bound: more messages are waiting
        self._stop = False
        self._stop_deadline = float("inf")
        self._failures = 0  # batches rolled back in a row (backoff grows with it)
        self.watcher = None  # a lifecycle.ModelWatcher when model.reload is on
        self.shadow_watcher = None  # the same for model.shadow_path
        self.shadow_topic: str | None = None  # where shadow outputs go ("shadow": a file)
        self._shadow_refusals = 0
        self.swaps: list[dict] = []  # the last swaps (model ids, when, how long)
        self._limit: int | None = None  # messages per batch while a failing one is split

    def stop(self, *_args) -> None:
        if not self._stop:
            self._stop = True
            self._stop_deadline = (time.monotonic()
                                   + self.settings.delivery.stop_timeout_ms / 1000)

    def _give_up(self) -> bool:
        """A stop was asked for and its grace (delivery.stop_timeout_ms) has passed."""
        return self._stop and time.monotonic() >= self._stop_deadline

    def _collect(self) -> list[tuple[Record, tuple | codec.InvalidMessage]]:
        """One batch: it starts at the first message (the first poll returns as soon as one is
        there) and ends at max_wait_ms after it or before a bound would be passed. Bounds are
        upper bounds: a message that would pass one waits for the next batch (a message larger
        than a bound forms a batch of its own)."""
        d = self.settings.delivery
        max_messages = self._limit or d.max_batch_messages
        items: list = []
        rows = nbytes = 0
        deadline = None
        self._behind = False
        while True:
            if self._held:
                recs, self._held = self._held, []
            else:
                if deadline is None:
                    timeout = 0.5  # idle: wake up twice a second to notice a stop request
                else:
                    timeout = deadline - time.monotonic()
                    if timeout <= 0:
                        break
                recs = [(r, None) for r in
                        self.source.poll(max_messages - len(items), timeout)]
            full = False
            for k, (rec, decoded) in enumerate(recs):
                if decoded is None:
                    decoded = self.pipeline.decode(rec)
                if isinstance(decoded, codec.InvalidMessage):
                    n_rows, n_bytes = 0, len(rec.value or b"")
                else:
                    n_rows, n_bytes = decoded[0].num_rows, max(len(rec.value), decoded[2])
                if items and (len(items) + 1 > max_messages
                              or rows + n_rows > d.max_batch_rows
                              or nbytes + n_bytes > d.max_batch_bytes):
                    # kept, decoded, for the next batch
                    self._held = [(rec, decoded)] + [(r, x) for r, x in recs[k + 1:]]
                    full = True
                    break
                items.append((rec, decoded))
                rows += n_rows
                nbytes += n_bytes
            if deadline is None and items:
                deadline = time.monotonic() + d.max_wait_ms / 1000
            if self.source.take_revoked():
                # a rebalance ran inside that poll: records fetched under an assignment that
                # was revoked or lost since are dropped (whoever owns the partition now, this
                # worker too if it was given back, reads them again from the committed
                # offset); records fetched under the present assignment stay. The batch ends
                # here
                owns = self.source.owns
                items = [it for it in items if owns(it[0])]
                self._held = [it for it in self._held if owns(it[0])]
                break
            if full or len(items) >= max_messages or self._stop:
                self._behind = full or len(items) >= max_messages
                break
            if not recs and (deadline is None or self.source.exhausted):
                break
        return items

    def run(self) -> int:
        """Collect, process, deliver, until stopped (or a file source ends). With a sink that
        can split its delivery (Kafka), a batch's commit runs in a helper thread while the
        next batch is collected, decoded and scored; that batch is produced only after the
        commit returned, so what is committed, and when, is what it is without the overlap."""
        m = self.metrics
        last_lag = 0.0
        overlap = self.settings.delivery.overlap and hasattr(self.sink, "send")
        committer = None
        if overlap:
            from concurrent.futures import ThreadPoolExecutor

            committer = ThreadPoolExecutor(1, thread_name_prefix="commit")
            if hasattr(self.source, "before_revoke"):
                self.source.before_revoke = self._settle_for_revoke
        try:
            while not self._stop:
                if self.watcher is not None and self.watcher._ready is not None:
                    self._swap(self.watcher.take())
                if self.shadow_watcher is not None and self.shadow_watcher._ready is not None:
                    self._swap_shadow(self.shadow_watcher.take())
                now = time.time()
                if now - last_lag > 5:  # idle or busy: lag of the partitions we own right now
                    m.consumer_lag.clear()
                    for part, lag in self.source.lag().items():
                        m.consumer_lag.labels(part).set(lag)
                    last_lag = now
                items = self._collect()
                if not items:
                    self._complete()  # idle: settle the batch in flight
                    if self._pending is None:
                        self._mark_ready()
                    if self.source.exhausted:
                        break
                    m.beat()
                    continue
                t0 = time.perf_counter()
                batch = [rec for rec, _ in items]
                outputs, dead, stats = self.pipeline.process(items)
                if not self._complete():
                    # the batch in flight rolled back and the source was rewound: this one,
                    # read after it, comes again too
                    self._held = []
                    continue
                try:
                    if committer is None:
                        self.sink.deliver(self.source, batch, outputs, dead)
                    else:
                        delivery = self.sink.send(self.source, batch, outputs, dead)
                        if self._behind:  # more is waiting: prepare it while this commits
                            self._pending = (delivery, committer.submit(delivery.wait), batch,
                                             stats, t0)
                            continue
                        # caught up (the batch closed at max_wait_ms): commit right away,
                        # nothing would be gained by a hand-over to the helper thread
                        delivery.wait()
                        self._pending = (delivery, None, batch, stats, t0)
                        self._complete()
                        continue
                except BatchRolledBack as exc:  # rewound: the same messages come again
                    self._rolled_back(exc, batch)
                    continue
                self._delivered(stats, batch, t0)
            self._complete()
        finally:
            if committer is not None:
                if self._pending is not None and self._pending[1] is not None:
                    self._pending[1].result()  # an error escaped: the commit ends, unused
                    self._pending = None
                committer.shutdown(wait=True)
        return 0

    def _observe_shadow(self, stats: BatchStats) -> None:
        m = self.metrics
        if stats.shadow_pairs is not None:
            nb = len(self.settings.scoring.thresholds) + 1
            for flat, n in enumerate(stats.shadow_pairs.tolist()):
                if n:
                    m.shadow_agreement.labels(str(flat // nb), str(flat % nb)).inc(n)
        for diff in stats.shadow_diffs:
            observe_many(m.shadow_score_diff, diff)
        stats.shadow_diffs = []
        if stats.shadow_kernel_s:
            m.shadow_kernel_seconds.observe(stats.shadow_kernel_s)
        if stats.shadow_errors:
            m.shadow_errors.inc(stats.shadow_errors)

    def _swap(self, model: CompiledModel) -> None:
        """Between two batches: the next batch is scored by ``model``, every batch before by
        the one before (a batch whose commit is in flight was scored, and is committed, as
        it is). Messages held for the next batch were decoded for the old model's columns:
        they are decoded again."""
        t0 = time.perf_counter()
        old = self.model
        self.pipeline = self.pipeline.with_model(model, self.settings)
        self.model = model
        self._held = [(rec, None) for rec, _ in self._held]
        m = self.metrics
        m.model_info.labels(old.model_id, "live").set(0)
        m.model_info.labels(model.model_id, "live").set(1)
        m.model_swaps.labels("live").inc()
        took = (time.perf_counter() - t0) * 1000
        self.swaps = (self.swaps + [{"from": old.model_id[:12], "to": model.model_id[:12],
                                     "at": round(time.time(), 3),
                                     "swap_ms": round(took, 3)}])[-10:]
        log.info("model swapped", role="live", from_model=old.model_id[:12],
                 to_model=model.model_id[:12], swap_ms=round(took, 3),
                 last_swaps=[f"{s['from']}->{s['to']}" for s in self.swaps])

    def _swap_shadow(self, model: CompiledModel) -> None:
        old = self.pipeline.shadow
        try:
            self.pipeline.set_shadow(model, self.shadow_topic)
        except ValueError as exc:
            log.warning("shadow model refused: the running shadow stays", reason=str(exc))
            self.metrics.model_refusals.labels("shadow", "feature_change").inc()
            return
        m = self.metrics
        if old is not None:
            m.model_info.labels(old.model.model_id, "shadow").set(0)
        m.model_info.labels(model.model_id, "shadow").set(1)
        m.model_swaps.labels("shadow").inc()
        log.info("model swapped", role="shadow", to_model=model.model_id[:12],
                 from_model=old.model.model_id[:12] if old else None)

    def _complete(self) -> bool:
        """Settle the batch in flight, if any: False when it rolled back."""
        if self._pending is None:
            return True
        delivery, future, batch, stats, t0 = self._pending
        if future is not None:
            future.result()  # the commit (or flush) has returned
        self._pending = None
        try:
            delivery.finish()
        except BatchRolledBack as exc:
            self._rolled_back(exc, batch)
            return False
        self._delivered(stats, batch, t0)
        return True

    def _settle_for_revoke(self) -> None:
        """Inside a rebalance: wait for the commit in flight; at least once, commit its
        offsets now, while the partitions are still ours (an error is handled after)."""
        if self._pending is not None:
            delivery, future = self._pending[:2]
            if future is not None:
                future.result()
            delivery.commit_offsets()

    def _rolled_back(self, exc: BatchRolledBack, batch: list[Record]) -> None:
        """A batch came back. Inputs whose output the broker refused are dead-lettered next
        time. A batch that keeps failing is retried with a growing pause (the broker is away:
        it comes back); one that keeps failing for no message named and for no reason of the
        broker's is split in halves until the message that fails is alone, which is then
        dead-lettered (``delivery_failed``), so no batch loops forever."""
        self._held = []  # they come again too, after the batch's own
        if exc.transaction:
            self.metrics.transactions_aborted.inc()
        self._failures += 1
        if any(key[0] == "shadow" for key in exc.refused):
            self._shadow_refusals += 1
            if self._shadow_refusals >= 3 and self.pipeline.shadow is not None:
                log.error("shadow scoring turned off: the broker keeps refusing its outputs "
                          "(the live outputs go on; a shadow model swap turns it back on)",
                          topic=self.pipeline.shadow.topic)
                self.metrics.shadow_errors.inc()
                self.pipeline.set_shadow(None, None)
        if exc.refused:
            for key, (code, dead_letter) in exc.refused.items():
                before = self.pipeline.refused.get(key)
                self.pipeline.refused[key] = (code, dead_letter or (before or ("", False))[1])
            return  # the next attempt dead-letters them: no pause needed
        if not exc.retriable and self._failures >= 2 and batch:
            if len(batch) == 1:  # alone and still failing: it is the message
                r = batch[0]
                key = (r.topic, r.partition, r.offset)
                dropped = key in self.pipeline.refused  # its dead letter failed as well
                self.pipeline.refused[key] = ("delivery_failed", dropped)
                log.warning("a message fails delivery alone: dead-lettering it",
                            source=f"{r.topic}[{r.partition}]@{r.offset}", error=str(exc))
                return
            self._limit = max(1, len(batch) // 2)
            log.warning("a batch keeps failing: splitting it", messages=self._limit)
        pause = min(0.1 * 2 ** (self._failures - 1), 5.0) if self._failures > 1 else 0.0
        end = time.monotonic() + pause
        while not self._stop and time.monotonic() < end:  # a stop ends the pause
            time.sleep(min(0.1, max(end - time.monotonic(), 0)))

    def _mark_ready(self) -> None:
        """Ready (/readyz) once partitions are ours (a file source: at once) and a batch was
        committed or there was nothing to read."""
        if not self.metrics.ready and getattr(self.source, "assigned", True):
            self.metrics.ready = True
            log.info("ready")

    def _delivered(self, stats: BatchStats, batch: list[Record], t0: float) -> None:
        self._mark_ready()
        self._failures = 0
        if self._limit is not None:  # after a split: back to full batches, doubling
            self._limit *= 2
            if self._limit >= self.settings.delivery.max_batch_messages:
                self._limit = None
        if self.pipeline.refused:
            for r in batch:
                self.pipeline.refused.pop((r.topic, r.partition, r.offset), None)
                self.pipeline.refused.pop(("shadow", r.topic, r.partition, r.offset), None)
        self._observe(stats, batch, time.perf_counter() - t0, time.time())
        if self.progress is not None:
            self.progress(len(batch), stats)

    def _observe(self, stats: BatchStats, batch: list[Record], seconds: float, now: float):
        m = self.metrics
        m.messages_in.inc(stats.messages)
        m.records_in.inc(stats.rows_in)
        m.records_out.inc(stats.rows)
        for reason, n in stats.dead.items():
            m.dead_letters.labels(reason).inc(n)
        m.batch_seconds.observe(seconds)
        m.kernel_seconds.observe(stats.kernel_s)
        m.work_units.inc(stats.work_units)
        m.work_units_full.inc(stats.rows * self.model.work_total)
        for reason, n in stats.stop_reasons.items():
            m.stop_reasons.labels(reason).inc(n)
        m.audit_rows.inc(stats.audit_rows)
        m.audit_disagreements.inc(stats.audit_disagreements)
        if stats.explained:
            m.explained_rows.inc(stats.explained)
        stamps = np.fromiter((rec.timestamp_ms for rec in batch), dtype=np.float64,
                             count=len(batch))
        stamps = stamps[stamps > 0]
        if len(stamps):
            observe_many(m.end_to_end_seconds, np.maximum(now - stamps / 1000, 0.0))
        if self.pipeline.shadow is not None or stats.shadow_pairs is not None:
            self._observe_shadow(stats)
        m.beat()
        for score, work in stats.scores:
            self.sample.add(score, work)
        stats.scores = []  # the run keeps its bounded sample, not every score
        _add_scored(self.totals, stats)
        self.totals.rows_in += stats.rows_in
        self.totals.messages += stats.messages
        self.totals.dead.update(stats.dead)


def configure_logging(level: str = "INFO", fmt: str = "console") -> None:
    import logging

    logging.basicConfig(level=getattr(logging, level), stream=sys.stderr, format="%(message)s")
    renderer = (structlog.processors.JSONRenderer() if fmt == "json"
                else structlog.dev.ConsoleRenderer(colors=False))
    structlog.configure(
        processors=[structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso"), renderer],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )


def run_from_config(path: str | None, **overrides) -> int:
    """The `scoring-worker --config FILE` entry point; returns the process exit code."""
    try:
        settings = load_settings(path, **overrides)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    return run(settings)


# After a stop, the loop gives up on an absent broker after delivery.stop_timeout_ms; some
# librdkafka calls block longer than the timeout they are given (sending offsets to a
# transaction waits for its request, up to socket.timeout.ms, 60 s). So the process exits 0
# at the latest this long after the grace: what is open is uncommitted (a transaction the
# broker aborts, offsets the next owner reads from), so nothing is lost or doubled.
EXIT_MARGIN_S = 10.0
_watchdog = None


def _arm_exit_watchdog(after_s: float) -> None:
    import os
    import threading

    global _watchdog
    if _watchdog is not None:
        return

    def hard_exit():
        log.warning("still waiting for the broker after the stop's grace: exiting now, with "
                    "nothing more committed (an open transaction is aborted by the broker)",
                    waited_s=round(after_s, 1))
        sys.stderr.flush()
        os._exit(0)

    _watchdog = threading.Timer(after_s, hard_exit)
    _watchdog.daemon = True
    _watchdog.start()


class _StopDuringStartup(BaseException):
    """SIGTERM or SIGINT before the loop runs (Kubernetes stops starting pods too); a
    BaseException, so no ``except Exception`` of a start-up step swallows it."""


class _Signals:
    """SIGTERM and SIGINT, from the first line of start-up to the last commit. Python runs a
    signal handler only in the main thread, between bytecodes, so a main thread waiting in a
    librdkafka call (some ignore the timeout they are given) would not notice a stop. Here the
    interpreter's own C handler writes each signal to a socket (``signal.set_wakeup_fd``),
    read by a thread of its own, which calls ``on_stop`` at once. Before the loop runs, a stop
    interrupts the start-up instead (``_StopDuringStartup``, raised in the main thread: the
    start-up's waits are one-second attempts)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.on_stop = None
        self.on_startup_stop = None  # called (from the thread) for a stop before the loop runs
        self.pending = False
        self.armed = False  # the start-up can be interrupted (run's try is entered)
        self._closing = False

    def __enter__(self):
        import socket
        import threading

        self._handlers = {sig: signal.signal(sig, self._handler) for sig in self.SIGNALS}
        self._r, self._w = socket.socketpair()
        self._w.setblocking(False)
        self._old_fd = signal.set_wakeup_fd(self._w.fileno(), warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._wait, name="signals", daemon=True)
        self._thread.start()
        return self

    def _handler(self, *_args):
        if self.on_stop is None:  # start-up: stop it where it is
            self.pending = True
            if self.armed:  # else run's start-up reads pending as soon as it can be stopped
                raise _StopDuringStartup
        # the loop runs: the thread has been told through the socket

    def _wait(self):
        wanted = {int(s) for s in self.SIGNALS}
        while True:
            try:
                data = self._r.recv(64)
            except OSError:
                return
            if not data or self._closing:
                return
            if wanted.intersection(data):
                # first the flag, then the callback: _run sets the callback, then reads the
                # flag, so a stop as the loop is being set up is never lost
                self.pending = True
                if self.on_stop is not None:
                    self.on_stop()
                elif self.on_startup_stop is not None:
                    self.on_startup_stop()

    def __exit__(self, *exc):
        self._closing = True
        signal.set_wakeup_fd(self._old_fd)
        self._w.close()  # ends the thread's recv
        self._thread.join(1.0)
        self._r.close()
        for sig, handler in self._handlers.items():
            if signal.getsignal(sig) == self._handler:
                signal.signal(sig, handler)


stopped_by_signal = False  # the last run ended by SIGTERM/SIGINT (replay then compares nothing)


def run(settings: Settings, summary: bool = True) -> int:
    """Start, run until stopped, summarize; the process exit code. A stop requested during
    start-up (while a coordinator loads, say) ends it there with exit 0: nothing was read."""
    global _watchdog, stopped_by_signal
    configure_logging(settings.logging.level, settings.logging.format)
    with _Signals() as signals:
        chaos.install()
        try:
            # a stop during start-up unwinds it (closing what was opened) within the same
            # bound as a stop of the loop
            signals.on_startup_stop = partial(_arm_exit_watchdog,
                                              settings.delivery.stop_timeout_ms / 1000
                                              + EXIT_MARGIN_S)
            signals.armed = True
            # a stop as the handlers were being installed, or while the modules loaded whose
            # SystemExit CPython lost (worker/cli.py), ends the start-up here
            if signals.pending or sys.modules[__package__].stop_requested_while_loading:
                raise _StopDuringStartup
            return _run(settings, summary, signals)
        except _StopDuringStartup:
            log.info("stopped during start-up")
            return 0
        finally:
            stopped_by_signal = signals.pending
            if _watchdog is not None:  # the run ended in time: no hard exit later
                _watchdog.cancel()
                _watchdog = None


def _run(settings: Settings, summary: bool, signals: _Signals) -> int:
    from .lifecycle import identity
    from .model.artifact import ArtifactError
    from .model.compiled import load_model

    seen = identity(settings.model.path)  # before loading: a change from here is noticed
    try:
        model = load_model(settings.model.path)
    except FileNotFoundError:
        print(f"config error: model.path: {settings.model.path} does not exist", file=sys.stderr)
        return 2
    except ArtifactError as exc:
        print(f"config error: model.path: {exc}", file=sys.stderr)
        return 2
    if settings.scoring.lazy.mode != "off":  # the policy's parameters, tried on this model
        try:
            model.score_batch(np.zeros((1, model.n_features), dtype=np.float32),
                              lazy=settings.scoring.lazy.mode,
                              thresholds=settings.scoring.thresholds,
                              **settings.scoring.lazy.params)
        except (TypeError, ValueError, ImportError, OverflowError) as exc:
            print(f"config error: scoring.lazy: {exc}", file=sys.stderr)
            return 2
    shadow = None
    if settings.model.shadow_path:
        shadow_seen = identity(settings.model.shadow_path)
        try:
            shadow = load_model(settings.model.shadow_path)
            from .lifecycle import verify

            verify(shadow, model, settings)
            missing = [f for f in shadow.feature_names if f not in set(model.feature_names)]
            if missing:  # the columns decoded are the live model's
                raise ValueError("it reads features the live model does not: "
                                 + ", ".join(missing[:10]))
        except FileNotFoundError:
            print(f"config error: model.shadow_path: {settings.model.shadow_path} does not "
                  "exist", file=sys.stderr)
            return 2
        except ArtifactError as exc:
            print(f"config error: model.shadow_path: {exc}", file=sys.stderr)
            return 2
        except Exception as exc:  # noqa: BLE001 (lifecycle.ModelRefused: features, probe)
            print(f"config error: model.shadow_path: {exc}", file=sys.stderr)
            return 2
    metrics = Metrics()
    with contextlib.ExitStack() as stack:
        # every start-up error is one line: exit 2 for what the configuration names (a file
        # that is not a recording, an unknown librdkafka property, a busy port), exit 1 for a
        # dependency that is down
        if "kafka" in (settings.source.type, settings.sink.type):
            log.info("kafka settings", **settings.kafka.masked())  # secrets as '***'
            for warning in settings.kafka.warnings():
                log.warning(warning)
        try:
            source = open_source(settings)
            stack.callback(source.close)
            sink = open_sink(settings)
            stack.callback(sink.close)
        except StartupError as exc:
            print(f"{'config error' if exc.exit_code == 2 else 'error'}: {exc}",
                  file=sys.stderr)
            return exc.exit_code
        except ConfigError as exc:  # a secret file that went away since the config was read
            print(exc, file=sys.stderr)
            return 2
        except NotAuthorized as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except FatalError as exc:
            log.error("cannot start the producer", error=str(exc))
            return 1
        if settings.metrics.port:
            try:
                server = metrics.serve(settings.metrics.host, settings.metrics.port)
            except (OSError, OverflowError) as exc:
                return _startup_error(f"metrics.host/port ({settings.metrics.host}:"
                                      f"{settings.metrics.port})", exc)
            stack.callback(server.shutdown)
        if signals.pending:  # a stop whose _StopDuringStartup CPython lost: end here
            raise _StopDuringStartup
        progress = stack.enter_context(_progress(settings, source))
        worker = Worker(settings, model, source, sink, metrics, progress)

        def on_stop():
            worker.stop()
            _arm_exit_watchdog(settings.delivery.stop_timeout_ms / 1000 + EXIT_MARGIN_S)

        signals.on_stop = on_stop
        if signals.pending:  # a stop that came as the loop was being set up
            on_stop()
        metrics.model_info.labels(model.model_id, "live").set(1)
        if shadow is not None:
            worker.shadow_topic = (settings.sink.shadow_topic if settings.sink.type == "kafka"
                                   else "shadow")
            worker.pipeline.set_shadow(shadow, worker.shadow_topic)
            metrics.model_info.labels(shadow.model_id, "shadow").set(1)
        if settings.model.reload:
            from .lifecycle import ModelWatcher

            worker.watcher = ModelWatcher(settings.model.path, model, settings, metrics,
                                          seen=seen).start()
            stack.callback(worker.watcher.stop)
            if shadow is not None:
                worker.shadow_watcher = ModelWatcher(settings.model.shadow_path, shadow,
                                                     settings, metrics, role="shadow",
                                                     seen=shadow_seen).start()
                stack.callback(worker.shadow_watcher.stop)
        log.info("worker started", model_id=model.model_id[:12], model=settings.model.path,
                 layout=model.layout, kernel=model.kernel,
                 chosen=model.kernel_choice["by"], source=settings.source.type,
                 sink=settings.sink.type,
                 delivery=settings.delivery.mode, lazy=settings.scoring.lazy.mode)
        if settings.scoring.lazy.mode != "off" and model.kernel != "walk":
            log.info("the lazy policy walks the trees (QuickScorer, this model's kernel for "
                     "full evaluation, evaluates every tree at once)",
                     kernel=model.kernel, lazy=settings.scoring.lazy.mode)
        t0 = time.perf_counter()
        try:
            rc = worker.run()
        except (NotAuthorized, CredentialsRejected) as exc:  # one line: the permission, the
            print(f"error: {exc}", file=sys.stderr)          # credentials
            return 1
        except FatalError as exc:
            log.error("fatal Kafka error: exiting for a restart", error=str(exc))
            return 1
        elapsed = time.perf_counter() - t0
    t = worker.totals
    log.info("worker stopped", records=t.rows, messages=t.messages,
             dead_letters=sum(t.dead.values()), seconds=round(elapsed, 4),
             audit_rows=t.audit_rows, audit_disagreements=t.audit_disagreements)
    if summary and settings.sink.type == "file":
        _print_summary(settings, model, worker, elapsed)
    return rc


def _startup_error(field: str, exc: BaseException) -> int:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"config error: {field}: {text}", file=sys.stderr)
    return 2


@contextlib.contextmanager
def _progress(settings: Settings, source):
    """A progress bar over messages for file sources; a rate line every 10 s otherwise."""
    total = getattr(source, "total", None)
    if not settings.logging.progress:
        yield None
        return
    if total:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        with Progress(TextColumn("scoring"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("messages"), TimeRemainingColumn(),
                      transient=False) as bar:
            task = bar.add_task("scoring", total=total)
            yield lambda n, stats: bar.advance(task, n)
        return
    state = {"t": time.monotonic(), "rows": 0}

    def tick(n, stats):
        state["rows"] += stats.rows
        now = time.monotonic()
        if now - state["t"] >= 10:
            log.info("progress", rows_per_s=round(state["rows"] / (now - state["t"])))
            state.update(t=now, rows=0)

    yield tick


def _print_summary(settings: Settings, model: CompiledModel, worker: Worker, elapsed: float):
    """The end-of-run summary from the loop's own counts (memory bounded by the sample)."""
    from pathlib import Path

    from rich.console import Console

    from .report import summary_of_run

    t = worker.totals
    png = Path(settings.sink.path).with_suffix(".png")
    s, note = summary_of_run(t.rows, t.messages, elapsed, model.work_total, t.work_units,
                             settings.scoring.thresholds, t.stop_reasons, t.decisions,
                             sum(t.dead.values()), worker.sample, png)
    console = Console(stderr=False)
    console.print(s.table())
    if t.top_reasons:
        from rich.table import Table

        table = Table(title="highest scores and their reasons "
                            f"({settings.scoring.explain.method}, margin space)")
        for col in ("score", "top reasons (feature: attribution)", "bias"):
            table.add_column(col)
        for score, feats, values, bias in t.top_reasons:
            table.add_row(f"{score:.4f}", ", ".join(
                f"{model.feature_names[f]}: {v:+.3f}" for f, v in zip(feats, values,
                                                                       strict=True)),
                f"{bias:+.3f}")
        console.print(table)
    if note:
        print(note)
