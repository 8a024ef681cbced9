"""The batch pipeline: one batch of decoded messages in, its outputs, dead letters and counts
out, in named steps: route (dead letters, refusals), group, gather, score, encode, account,
shadow. A failing group is scored message by message (``_isolated``); nothing here raises
for one bad message."""

from __future__ import annotations

import time
from collections import Counter as Tally
from dataclasses import dataclass, field

import numpy as np
import structlog

from . import chaos, monitoring
from .config import Settings
from .formats import (
    Format,
    Gathered,
    InvalidMessage,
    Message,
    OutputFormat,
    input_format,
    output_format,
)
from .io.records import RESERVED_HEADERS, Record
from .model.compiled import CompiledModel
from .model.result import STOP_REASONS, default_threads

log = structlog.get_logger("worker")

TOP_REASONS = 5  # explained rows the run summary shows


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
    # the input contract: (kind, feature) -> count, kind "missing" (values scored as
    # missing), "absent" (optional fields absent), "unseen" (categories the model does not
    # know) or "refused:<reason>" (messages dead-lettered for that feature)
    features: Tally = field(default_factory=Tally)
    # flight monitoring (worker/monitoring.py): the scored rows' counts against the model's
    # reference profile (features x bins, missing, out of range) and the scores' bins
    # role (live, shadow) -> (counts, score bins); and the shadow's rows by decision band
    monitor: dict = field(default_factory=dict)
    monitor_errors: int = 0  # monitoring failures (monitoring then stops; scoring goes on)
    shadow_bands: Tally = field(default_factory=Tally)

    def add(self, other: BatchStats) -> None:
        """Add ``other``'s scored-row counts (messages and dead letters are the caller's)."""
        self.rows += other.rows
        self.work_units += other.work_units
        self.stop_reasons.update(other.stop_reasons)
        self.decisions.update(other.decisions)
        self.audit_rows += other.audit_rows
        self.audit_disagreements += other.audit_disagreements
        self.explained += other.explained
        self.kernel_s += other.kernel_s
        self.scores.extend(other.scores)
        self.shadow_kernel_s += other.shadow_kernel_s
        if other.shadow_pairs is not None:
            self.shadow_pairs = other.shadow_pairs if self.shadow_pairs is None else \
                self.shadow_pairs + other.shadow_pairs
        self.shadow_diffs.extend(other.shadow_diffs)
        self.shadow_errors += other.shadow_errors
        _keep_top(self.top_reasons, other.top_reasons)
        self.features.update(other.features)
        for role, (counts, bins, profile) in other.monitor.items():
            mine = self.monitor.get(role)
            if mine is None or mine[2] is not profile:  # another model's: the newer kept
                self.monitor[role] = (counts.copy(), bins.copy(), profile)
            else:
                mine[0][:] += counts
                mine[1][:] += bins
        self.monitor_errors += other.monitor_errors
        self.shadow_bands.update(other.shadow_bands)

    def count_features(self, kind: str, counts, names: list[str]) -> None:
        """Add per-feature ``counts`` (in ``names``' order) of ``kind``."""
        for j in np.flatnonzero(counts).tolist():
            self.features[(kind, names[j])] += int(counts[j])

    def account(self, r, rows: np.ndarray | None = None) -> None:
        """Count the rows of score result ``r`` that are published (all, or where ``rows``)."""
        score, work, decision, codes = r.score, r.work_units, r.decision, r.stop_code
        if rows is not None:
            score, work, decision, codes = score[rows], work[rows], decision[rows], codes[rows]
        self.rows += len(score)
        self.work_units += int(work.sum())
        for code, n in enumerate(np.bincount(codes, minlength=len(STOP_REASONS)).tolist()):
            if n:
                self.stop_reasons[STOP_REASONS[code]] += n
        for band, n in enumerate(np.bincount(decision.astype(np.int64)).tolist()):
            if n:
                self.decisions[band] += n
        self.scores.append((score, work))
        if r.reason_feature is not None:
            explained = r.reason_feature[:, 0] >= 0
            if rows is not None:
                explained &= rows
            idx = np.flatnonzero(explained)
            self.explained += idx.size
            idx = idx[np.argsort(-r.score[idx], kind="stable")[:TOP_REASONS]]
            _keep_top(self.top_reasons, [(float(r.score[i]), r.reason_feature[i].tolist(),
                                          r.reason_value[i].tolist(), float(r.reason_bias[i]))
                                         for i in idx])
        self.audit_rows += r.audit_rows
        self.audit_disagreements += r.audit_disagreements


def _keep_top(into: list, more: list) -> None:
    """The TOP_REASONS highest-scored of both lists, into ``into``."""
    if more:
        into[:] = sorted(into + more, key=lambda t: -t[0])[:TOP_REASONS]


@dataclass
class Shadow:
    """A challenger scored on the live model's rows; its outputs go to its own topic."""

    model: CompiledModel
    topic: str
    output: OutputFormat
    headers: list
    same_features: bool  # the live model's gathered rows serve it as they are
    # features whose categories (or CatBoost hashes) differ from the live model's: their
    # codes in the live rows are not the shadow's, only their strings serve it
    own_categories: list = field(default_factory=list)


@dataclass
class _Batch:
    """What one batch's steps produce: outputs by item index, shadow outputs, dead letters."""

    items: list
    stats: BatchStats
    results: dict = field(default_factory=dict)
    shadow: list = field(default_factory=list)
    dead: list = field(default_factory=list)

    def record(self, i: int) -> Record:
        return self.items[i][0]


def reader_for(model: CompiledModel, settings: Settings, strict: bool = True) -> Format:
    """The input format reading ``model``'s features as ``settings`` say (source.format,
    source.fields, scoring.id_column). ValueError for settings the model cannot be read by:
    fields that clash with each other or the id, and (``strict``, start-up's check) a
    source.fields name the model does not read, a typo; not strict, such names are left out
    (a model swapped in may read fewer features). Start-up exits 2 on it and a hot swap
    refuses the model (startup.run, lifecycle.verify), so no Pipeline raises it mid-stream."""
    fields = settings.source.fields
    if not strict:
        reads = set(model.feature_names) | {settings.scoring.id_column}
        fields = {k: v for k, v in fields.items() if k in reads}
    return input_format(
        settings.source.format, model, settings.scoring.id_column,
        settings.delivery.max_message_rows,
        min(settings.message_byte_limit, settings.delivery.memory_budget_mb << 20),
        fields, **({"schemas_dir": settings.source.schemas_dir}
                   if settings.source.format == "avro" else {}))


class Pipeline:
    """Decode, score and encode one batch of messages. Never raises for one bad message."""

    def __init__(self, model: CompiledModel, settings: Settings, out_topic: str):
        self.model = model
        self.scoring = settings.scoring
        self.max_message_bytes = settings.message_byte_limit
        self.format: Format = reader_for(model, settings, strict=False)
        self.sink_format = settings.sink.format
        self.id_column = settings.scoring.id_column
        self.output: OutputFormat = output_format(self.sink_format, model, self.id_column)
        self._headers = [("content-type", self.output.content_type.encode()),
                         ("model_id", model.model_id.encode())]
        self.out_topic = out_topic
        self.lazy_params = settings.scoring.lazy.params
        if settings.scoring.audit_fraction:
            self.lazy_params = {**self.lazy_params,
                                "audit_fraction": settings.scoring.audit_fraction}
        self.threads = settings.scoring.threads or default_threads()  # resolved once
        self.rows_seen = 0
        # inputs whose output or dead letter the broker refused: {(topic, partition, offset):
        # (reason code, dead letter refused too)}; dead-lettered (without the value if the
        # dead letter was refused) until a delivery of them succeeds
        self.refused: dict[tuple[str, int, int], tuple[str, bool]] = {}
        # the largest message (value, key, headers) the sink's topics take, if it says
        self.max_out_bytes = self.max_dead_bytes = self.max_shadow_bytes = None
        self.shadow: Shadow | None = None
        self.row_cost, self.id_factor = self._costs()
        # flight monitoring: windows of this model (monitor_on), its rows counted against
        # its reference profile (monitoring), and the same for a shadow model
        self.monitor_on = monitoring.enabled(model, settings)
        self.monitoring = monitoring.counts(model, settings)
        self.monitor_settings = settings
        self.monitoring_shadow = False

    def _costs(self) -> tuple[int, int]:
        """What scoring a row and writing its output take beyond its decoded size (which the
        format counts): the score result and its copies, the attributions of an explained
        row (every output's, float64), and the output held twice while it is written (the
        C or Arrow writer's buffer, then the value); and so again for a shadow model. A
        message counts these against the message byte limit before it is scored. And the
        bytes written a byte of string ids (``Message.id_bytes``)."""
        ex = self.scoring.explain
        k = min(ex.top_k, self.model.n_features) if ex is not None else 0

        def one(model, output) -> int:
            work = 96 + 24 * int(model.n_outputs)
            if k:
                work += 8 * (model.n_features + 1) * int(model.n_outputs) + \
                    4 * model.n_features + 8 * k + 16
            return work + 2 * output.row_bytes(k)

        cost, ids = one(self.model, self.output), self.output.id_factor
        if self.shadow is not None:
            cost += one(self.shadow.model, self.shadow.output)
            ids += self.shadow.output.id_factor
        return cost, ids

    def set_shadow(self, model: CompiledModel | None, topic: str | None) -> None:
        """Score ``model`` beside the live one (None: stop). It must read only features the
        live model reads (they are the columns decoded)."""
        if model is None:
            self.shadow = None
            self.row_cost, self.id_factor = self._costs()
            return
        missing = [f for f in model.feature_names if f not in set(self.model.feature_names)]
        if missing:
            raise ValueError("the shadow model reads features the live model does not: "
                             + ", ".join(missing[:10]))
        output = output_format(self.sink_format, model, self.id_column)
        own = [f for f in model.feature_names
               if (model.categories or {}).get(f) != (self.model.categories or {}).get(f)
               or model.category_hashes.get(f) != self.model.category_hashes.get(f)]
        self.monitoring_shadow = monitoring.counts(model, self.monitor_settings)
        self.shadow = Shadow(model, topic, output,
                             [("content-type", output.content_type.encode()),
                              ("model_id", model.model_id.encode()), ("role", b"shadow")],
                             list(model.feature_names) == list(self.model.feature_names)
                             and not own, own)
        self.row_cost, self.id_factor = self._costs()

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

    def decode(self, rec: Record) -> Message | InvalidMessage:
        """The record's decoded message, or why it is invalid."""
        try:
            msg = self.format.decode(rec.value)
        except InvalidMessage as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 (one message never stops the loop)
            return InvalidMessage("invalid", f"{type(exc).__name__}: {exc}")
        if msg.nbytes > self.max_message_bytes:
            return InvalidMessage(
                "too_large", f"{msg.nbytes} bytes decoded, more than "
                f"delivery.max_message_bytes ({self.max_message_bytes})")
        # its scores and output count too, before they are made (the batch bounds with them)
        msg.nbytes += msg.rows * self.row_cost + msg.id_bytes * self.id_factor
        if msg.nbytes > self.max_message_bytes:
            err = InvalidMessage(
                "too_large", f"{msg.rows} rows: decoded, scored and written they take up to "
                f"{msg.nbytes} bytes ({self.row_cost} a row beyond the input), more than "
                f"delivery.max_message_bytes ({self.max_message_bytes})")
            large = msg.rows * (4 * len(self.model.feature_names) + 8) > TRIM_ABOVE
            del msg
            if large:  # its rows were freed: their pages back to the system
                trim_heap()
            return err
        return msg

    # ---- the steps ---------------------------------------------------------------------
    def process(self, items: list[tuple[Record, Message | InvalidMessage]]
                ) -> tuple[list[Record], list[Record], BatchStats]:
        """One batch: (outputs, then shadow outputs; dead letters; counts). Messages of one
        group are gathered, scored in one kernel call and encoded together."""
        chaos.point("score")
        out = _Batch(items, BatchStats(messages=len(items)))
        for members in self._route(out):
            self._isolated(members, out)
        return [out.results[i] for i in sorted(out.results)] + out.shadow, out.dead, out.stats

    def _route(self, out: _Batch) -> list[list[int]]:
        """Dead letters for invalid messages and for inputs whose delivery the broker refused;
        the others grouped by ``Message.group`` (usually one group)."""
        groups: dict[object, list[int]] = {}
        for i, (rec, decoded) in enumerate(out.items):
            if self.refused:
                letter = self._refused_letter(rec, decoded)
                if letter is not None:
                    out.dead.append(letter)
                    out.stats.dead[_code_of(letter)] += 1
                    continue
            if isinstance(decoded, InvalidMessage):
                self._dead(out, rec, decoded)
                continue
            if decoded.counts:
                for kind, counts in decoded.counts.items():
                    out.stats.count_features(kind, counts, self.format.feature_names)
            out.stats.rows_in += decoded.rows
            groups.setdefault(decoded.group, []).append(i)
        return list(groups.values())

    def _isolated(self, members: list[int], out: _Batch) -> None:
        """Gather, score, encode and account one group; a group that fails to gather or score
        is taken message by message, so only the message that fails is dead-lettered."""
        try:
            t0 = time.perf_counter()
            g = self.format.gather([out.items[i][1] for i in members])
            r = self._score(g)
            out.stats.kernel_s += time.perf_counter() - t0
            out.stats.count_features("missing", missing_counts(g, self.model.feature_names),
                                     self.model.feature_names)
        except Exception as exc:  # noqa: BLE001 (isolate, dead-letter, keep running)
            if len(members) == 1:
                self._dead(out, out.record(members[0]), InvalidMessage("score_error", str(exc)))
            else:
                # said, not only survived: a group that never gathers is a bug (found by
                # mutation testing: every message then scored alone, correct and slow)
                log.warning("a group of messages failed to gather or score; scoring them one "
                            "by one", messages=len(members), error=str(exc)[:200])
                for i in members:
                    self._isolated([i], out)
            return
        self._encode(g, r, members, out)
        if self.monitoring:
            try:
                monitoring.count(self.model, g.X, r.score, out.stats)
            except Exception as exc:  # noqa: BLE001 (monitoring never stops scoring)
                self.monitoring = False
                out.stats.monitor_errors += 1
                log.error("flight monitoring stops", error=str(exc)[:300])
        if self.shadow is not None:
            self._shadow(g, r, members, out)

    def _score(self, g: Gathered):
        params = self.lazy_params
        if "audit_fraction" in params:  # audit by position in the stream, not in the batch
            params = {**params, "audit_seed": self.rows_seen}
        ex = self.scoring.explain
        explain = {} if ex is None else {"explain": ex.method, "top_k": ex.top_k,
                                         "explain_min_score": ex.min_score}
        # reason codes read the rows again: a row block or the batch, not column descriptors
        X = g.X if ex is None or g.table is None else g.table
        r = self.model.score_batch(X, lazy=self.scoring.lazy.mode,
                                   thresholds=self.scoring.thresholds, n_threads=self.threads,
                                   **params, **explain)
        self.rows_seen += len(r)
        return r

    def _encode(self, g: Gathered, r, members: list[int], out: _Batch) -> None:
        """Each message's output record (a message that cannot be encoded, or is too large
        for the output topic, is dead-lettered alone), then the published rows counted."""
        values = self.output.encode(g, r, [out.record(i) for i in members])
        published = None  # rows of messages that failed to encode are not counted
        for k, i in enumerate(members):
            rec, value = out.record(i), values[k]
            if not isinstance(value, Exception):
                value = self._record(rec, value)
            if isinstance(value, Exception):
                err = value if isinstance(value, InvalidMessage) else \
                    InvalidMessage("encode_error", str(value))
                self._dead(out, rec, err)
                if published is None:
                    published = np.ones(len(r), dtype=bool)
                published[int(g.offsets[k]):int(g.offsets[k + 1])] = False
            else:
                out.results[i] = value
        out.stats.account(r, published)

    def _shadow(self, g: Gathered, r, members: list[int], out: _Batch) -> None:
        """The shadow's outputs for the messages whose live output is published. Whatever
        fails here is counted and leaves the live outputs as they are."""
        sh = self.shadow
        stats = out.stats
        try:
            t0 = time.perf_counter()
            params = {k: v for k, v in self.lazy_params.items() if k != "audit_fraction"}
            if sh.own_categories and g.table is None:
                # rows read as the live model's codes (no strings kept): wrong for the shadow
                raise ValueError("the shadow model's categories of "
                                 f"{', '.join(sh.own_categories[:5])} differ from the live "
                                 "model's, and these rows keep only the live model's codes")
            X = g.X if sh.same_features else \
                self.format.rows_by_name(g, sh.model.feature_names)
            rs = sh.model.score_batch(X, lazy=self.scoring.lazy.mode,
                                      thresholds=self.scoring.thresholds,
                                      n_threads=self.threads, **params)
            stats.shadow_kernel_s += time.perf_counter() - t0
            values = sh.output.encode(g, rs, [out.record(i) for i in members])
            limit = self.max_shadow_bytes or self.max_out_bytes
            records = []
            for k, i in enumerate(members):
                rec, value = out.record(i), values[k]
                if i not in out.results or isinstance(value, Exception) or \
                        ("shadow", rec.topic, rec.partition, rec.offset) in self.refused:
                    continue
                if limit is not None and len(value) > limit - 512:
                    continue  # too large for the topic: the live output goes on alone
                records.append(Record(sh.topic, -1, -1, rec.key, value, rec.timestamp_ms,
                                      sh.headers, ("shadow", rec.topic, rec.partition,
                                                   rec.offset)))
            nb = len(self.scoring.thresholds) + 1
            pairs = np.bincount(r.decision.astype(np.int64) * nb + rs.decision,
                                minlength=nb * nb)
            stats.shadow_pairs = pairs if stats.shadow_pairs is None else \
                stats.shadow_pairs + pairs
            stats.shadow_diffs.append(rs.score - r.score)
            for band, n in enumerate(np.bincount(rs.decision.astype(np.int64)).tolist()):
                if n:
                    stats.shadow_bands[band] += n
            if self.monitoring_shadow:
                try:
                    monitoring.count(sh.model, X, rs.score, stats, "shadow")
                except Exception as exc:  # noqa: BLE001 (monitoring never stops scoring)
                    self.monitoring_shadow = False
                    stats.monitor_errors += 1
                    log.error("flight monitoring of the shadow stops", error=str(exc)[:300])
        except Exception as exc:  # noqa: BLE001 (the shadow never touches the live output)
            stats.shadow_errors += 1
            log.warning("the shadow model could not score a batch", error=str(exc)[:200])
            return
        out.shadow.extend(records)

    # ---- records -----------------------------------------------------------------------
    def _dead(self, out: _Batch, rec: Record, err: InvalidMessage) -> None:
        out.dead.append(self.dead_letter(rec, err))
        out.stats.dead[err.code] += 1
        if err.feature:
            out.stats.features[(f"refused:{err.code}", err.feature)] += 1

    def _record(self, rec: Record, value: bytes) -> Record | InvalidMessage:
        """The output record of ``rec`` (or why the output topic would refuse it): the
        worker's own headers, then the input's (trace context such as traceparent)."""
        headers = self._headers + forwarded(rec.headers) if rec.headers \
            else list(self._headers)
        if self.max_out_bytes is not None and len(value) > self.max_out_bytes - 512 and \
                _size(value, rec.key, headers) > self.max_out_bytes:
            return InvalidMessage(
                "output_too_large", f"the scores message ({len(value)} bytes) is larger than "
                f"the output topic takes ({self.max_out_bytes} bytes with key and headers)")
        return Record(self.out_topic, -1, -1, rec.key, value, rec.timestamp_ms, headers,
                      (rec.topic, rec.partition, rec.offset))

    def dead_letter(self, rec: Record, err: InvalidMessage, drop_value: bool = False) -> Record:
        """The worker's headers first, then the input's (renamed where they take a worker's
        name). Too large for the dead-letter topic (or refused by it before): without the
        value, and if still too large without the input's key and headers too."""
        own = [("error", err.detail.encode()), ("error_code", err.code.encode()),
               ("source_topic", rec.topic.encode()),
               ("source_partition", str(rec.partition).encode()),
               ("source_offset", str(rec.offset).encode()),
               ("model_id", self.model.model_id.encode()),
               ("source_timestamp", str(rec.timestamp_ms).encode())]
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
        err = decoded if isinstance(decoded, InvalidMessage) else InvalidMessage(
            code, "the broker refused this message's scores"
                  + (" (too large)" if code == "output_too_large" else ""))
        return self.dead_letter(rec, err, drop_value=dead_letter_refused)


TRIM_ABOVE = 4 << 20  # decoded bytes of a refused message whose pages are given back


def trim_heap() -> None:
    """Return the heap's free pages to the system (glibc's malloc_trim; elsewhere nothing):
    glibc keeps freed blocks below its mmap threshold (up to 32 MB), so a large refused
    message left its memory resident for the rest of the run."""
    global _malloc_trim
    if _malloc_trim is None:
        import ctypes
        import ctypes.util

        try:
            _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None


def missing_counts(g: Gathered, names: list[str]) -> np.ndarray:
    """Per feature, the gathered rows the model reads as missing: NaN in a row block; nulls
    and NaN (and, for categories, strings not in the model's list) in an Arrow batch."""
    X = g.X
    if isinstance(X, np.ndarray):
        return monitoring.nan_counts(X)
    out = np.zeros(len(names), np.int64)
    t = g.table
    if t is None:
        return out
    import pyarrow as pa
    import pyarrow.compute as pc

    for j, name in enumerate(names):
        col = t.column(name)
        n = col.null_count
        if pa.types.is_floating(col.type):
            n += int(pc.sum(pc.is_nan(col)).as_py() or 0)
        out[j] = n
    return out


def forwarded(headers: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """The input's headers as outputs and dead letters carry them (trace context and the
    like), a name the worker writes renamed input-NAME, and so a name already starting with
    input- too (so the renaming can be undone: io.records.original_headers)."""
    return [(f"input-{k}" if k.lower() in RESERVED_HEADERS or k[:6].lower() == "input-"
             else k, v) for k, v in headers]


def _size(value: bytes, key: bytes | None, headers: list[tuple[str, bytes]]) -> int:
    return len(value) + len(key or b"") + sum(len(k) + len(v or b"") for k, v in headers)


def _code_of(letter: Record) -> str:
    return next(v.decode() for k, v in reversed(letter.headers) if k == "error_code")
