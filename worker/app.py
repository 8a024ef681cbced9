"""The run loop: source -> decode -> stage+score (kernels) -> encode -> sink, then commit."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections import Counter as Tally
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import structlog

from . import codec
from .config import ConfigError, Settings, load_settings
from .io import BatchRolledBack, FatalError, StartupError, open_sink, open_source
from .io.records import Record
from .metrics import Metrics
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
    kernel_s: float = 0.0
    # this batch's published (score, work units) arrays, for the run's bounded sample
    scores: list = field(default_factory=list)


class Pipeline:
    """Decode, score and encode one batch of messages. Never raises for one bad message."""

    def __init__(self, model: CompiledModel, settings: Settings, out_topic: str):
        self.model = model
        self.scoring = settings.scoring
        self.decoder = codec.Decoder(model.feature_names, settings.scoring.id_column,
                                     settings.delivery.max_message_rows)
        # what every output message carries, encoded once
        self._meta = codec.output_metadata(model)
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

    def decode(self, rec: Record) -> pa.Table | codec.InvalidMessage:
        try:
            return self.decoder.decode(rec.value)
        except codec.InvalidMessage as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 (one message never stops the loop)
            return codec.InvalidMessage("invalid", f"{type(exc).__name__}: {exc}")

    def dead_letter(self, rec: Record, err: codec.InvalidMessage) -> Record:
        headers = list(rec.headers) + [
            ("error", err.detail.encode()), ("error_code", err.code.encode()),
            ("source_topic", rec.topic.encode()),
            ("source_partition", str(rec.partition).encode()),
            ("source_offset", str(rec.offset).encode()),
            ("model_id", self.model.model_id.encode()),
        ]
        return Record(rec.topic, rec.partition, rec.offset, rec.key, rec.value,
                      rec.timestamp_ms, headers)

    def _score(self, table: pa.Table):
        lazy = self.scoring.lazy.mode
        params = self.lazy_params
        if "audit_fraction" in params:  # audit by position in the stream, not in the batch
            params = {**params, "audit_seed": self.rows_seen}
        r = self.model.score_batch(table, lazy=lazy, thresholds=self.scoring.thresholds,
                                   n_threads=self.threads, **params)
        self.rows_seen += len(r)
        return r

    def process(self, items: list[tuple[Record, pa.Table | codec.InvalidMessage]]
                ) -> tuple[list[Record], list[Record], BatchStats]:
        stats = BatchStats(messages=len(items))
        results: dict[int, Record] = {}
        dead: list[Record] = []
        groups: list[tuple[pa.Schema, list[int]]] = []  # usually few: one per producer
        by_schema: dict[pa.Schema, list[int]] | None = None  # hashed once there are many
        for i, (rec, table) in enumerate(items):
            if isinstance(table, codec.InvalidMessage):
                dead.append(self.dead_letter(rec, table))
                stats.dead[table.code] += 1
            else:
                stats.rows_in += table.num_rows
                # a few schemas are compared (a hash walks every field each time); many are
                # hashed, so a batch of distinct schemas stays linear
                if by_schema is not None:
                    members = by_schema.get(table.schema.remove_metadata())
                    if members is None:
                        members = by_schema[table.schema.remove_metadata()] = []
                        groups.append((table.schema, members))
                    members.append(i)
                    continue
                for schema, members in groups:
                    if schema.equals(table.schema, check_metadata=False):
                        members.append(i)
                        break
                else:
                    groups.append((table.schema, [i]))
                    if len(groups) > 8:
                        by_schema = {s.remove_metadata(): m for s, m in groups}
        for _schema, members in groups:
            # one kernel call per schema: messages of one producer share a schema
            tables = [items[i][1].replace_schema_metadata(None) for i in members]
            try:
                t0 = time.perf_counter()
                r = self._score(pa.concat_tables(tables) if len(tables) > 1 else tables[0])
                stats.kernel_s += time.perf_counter() - t0
                parts = [(i, r) for i in members]
                offsets = np.cumsum([0] + [t.num_rows for t in tables])
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
                    dead.extend(sub_dead)
                    stats.dead.update(sub_stats.dead)
                    _add_scored(stats, sub_stats)
                continue
            published = None  # rows of messages that failed to encode are not counted
            columns = codec.ResultColumns(r, self.classifier)  # the whole group's, once
            for k, (i, _res) in enumerate(parts):
                rec, table = items[i]
                sl = slice(int(offsets[k]), int(offsets[k + 1]))
                try:
                    results[i] = self._encode(rec, table, columns, sl)
                except Exception as exc:  # noqa: BLE001 (e.g. an id column Arrow cannot slice)
                    dead.append(self.dead_letter(rec, codec.InvalidMessage("encode_error",
                                                                           str(exc))))
                    stats.dead["encode_error"] += 1
                    if published is None:
                        published = np.ones(len(r), dtype=bool)
                    published[sl] = False
            _account(stats, r, published)
        return [results[i] for i in sorted(results)], dead, stats

    def _encode(self, rec: Record, table: pa.Table, columns: codec.ResultColumns,
                sl: slice) -> Record:
        idc = self.scoring.id_column
        ids = table.column(idc).combine_chunks() if idc else None
        batch = columns.batch(ids, sl)
        meta = {**self._meta, b"input_topic": rec.topic.encode(),
                b"input_partition": str(rec.partition).encode(),
                b"input_offset": str(rec.offset).encode()}
        value = codec.encode(batch, meta)
        # the worker's own headers, then the input's (trace context such as traceparent)
        headers = self._headers + [(k, v) for k, v in rec.headers
                                   if k not in ("content-type", "model_id")]
        return Record(self.out_topic, -1, -1, rec.key, value, rec.timestamp_ms, headers)


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
    stats.audit_rows += r.audit_rows
    stats.audit_disagreements += r.audit_disagreements


def _add_scored(into: BatchStats, other: BatchStats) -> None:
    """Add ``other``'s scored-row counts to ``into`` (messages and dead letters are counted
    by the caller)."""
    into.rows += other.rows
    into.work_units += other.work_units
    into.stop_reasons.update(other.stop_reasons)
    into.decisions.update(other.decisions)
    into.audit_rows += other.audit_rows
    into.audit_disagreements += other.audit_disagreements
    into.kernel_s += other.kernel_s
    into.scores.extend(other.scores)


class Worker:
    """Owns the loop; ``stop()`` (from a signal) ends it after the batch in hand commits."""

    def __init__(self, settings: Settings, model: CompiledModel, source, sink,
                 metrics: Metrics | None = None, progress=None):
        self.settings, self.model = settings, model
        self.source, self.sink = source, sink
        self.metrics = metrics or Metrics()
        self.pipeline = Pipeline(model, settings, sink.topic)
        self.progress = progress
        self.totals = BatchStats()
        self.sample = ScoreSample()
        # messages polled past a batch bound, decoded, for the next batch
        self._held: list[tuple[Record, pa.Table | codec.InvalidMessage]] = []
        self._stop = False

    def stop(self, *_args) -> None:
        self._stop = True

    def _collect(self) -> list[tuple[Record, pa.Table | codec.InvalidMessage]]:
        """One batch: it starts at the first message (the first poll returns as soon as one is
        there) and ends at max_wait_ms after it or before a bound would be passed. Bounds are
        upper bounds: a message that would pass one waits for the next batch (a message larger
        than a bound forms a batch of its own)."""
        d = self.settings.delivery
        items: list = []
        rows = nbytes = 0
        deadline = None
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
                        self.source.poll(d.max_batch_messages - len(items), timeout)]
            full = False
            for k, (rec, decoded) in enumerate(recs):
                if decoded is None:
                    decoded = self.pipeline.decode(rec)
                n_rows = decoded.num_rows if isinstance(decoded, pa.Table) else 0
                n_bytes = len(rec.value or b"")
                if items and (len(items) + 1 > d.max_batch_messages
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
            revoked = self.source.take_revoked()
            if revoked:
                # a rebalance ran inside that poll: messages of partitions no longer ours are
                # dropped (their new owner reads them from the committed offset) and the batch
                # ends here, so nothing of a revoked partition is produced or committed
                items = [it for it in items if (it[0].topic, it[0].partition) not in revoked]
                self._held = [it for it in self._held
                              if (it[0].topic, it[0].partition) not in revoked]
                break
            if full or len(items) >= d.max_batch_messages or self._stop:
                break
            if not recs and (deadline is None or self.source.exhausted):
                break
        return items

    def run(self) -> int:
        m = self.metrics
        last_lag = 0.0
        while not self._stop:
            now = time.time()
            if now - last_lag > 5:  # idle or busy: lag of the partitions we own right now
                m.consumer_lag.clear()
                for part, lag in self.source.lag().items():
                    m.consumer_lag.labels(part).set(lag)
                last_lag = now
            items = self._collect()
            if not items:
                if self.source.exhausted:
                    break
                m.beat()
                continue
            t0 = time.perf_counter()
            batch = [rec for rec, _ in items]
            outputs, dead, stats = self.pipeline.process(items)
            try:
                self.sink.deliver(self.source, batch, outputs, dead)
            except BatchRolledBack as exc:  # rewound: the same messages come again
                self._held = []  # they come again too, after the batch's own
                if exc.transaction:
                    self.metrics.transactions_aborted.inc()
                continue
            now = time.time()
            self._observe(stats, batch, time.perf_counter() - t0, now)
            if self.progress is not None:
                self.progress(len(batch), stats)
        return 0

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
        for rec in batch:
            if rec.timestamp_ms > 0:
                m.end_to_end_seconds.observe(max(now - rec.timestamp_ms / 1000, 0.0))
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


def run(settings: Settings, summary: bool = True) -> int:
    from .model.artifact import ArtifactError
    from .model.compiled import load_model

    configure_logging(settings.logging.level, settings.logging.format)
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
    metrics = Metrics()
    with contextlib.ExitStack() as stack:
        # every start-up error is one line: exit 2 for what the configuration names (a file
        # that is not a recording, an unknown librdkafka property, a busy port), exit 1 for a
        # dependency that is down
        try:
            source = open_source(settings)
            stack.callback(source.close)
            sink = open_sink(settings)
            stack.callback(sink.close)
        except StartupError as exc:
            print(f"{'config error' if exc.exit_code == 2 else 'error'}: {exc}",
                  file=sys.stderr)
            return exc.exit_code
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
        progress = stack.enter_context(_progress(settings, source))
        worker = Worker(settings, model, source, sink, metrics, progress)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, worker.stop)
        log.info("worker started", model_id=model.model_id[:12], model=settings.model.path,
                 source=settings.source.type, sink=settings.sink.type,
                 delivery=settings.delivery.mode, lazy=settings.scoring.lazy.mode)
        t0 = time.perf_counter()
        try:
            rc = worker.run()
        except FatalError as exc:
            log.error("fatal Kafka error: exiting for a restart", error=str(exc))
            return 1
        elapsed = time.perf_counter() - t0
    t = worker.totals
    log.info("worker stopped", records=t.rows, messages=t.messages,
             dead_letters=sum(t.dead.values()), seconds=round(elapsed, 2),
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
    Console(stderr=False).print(s.table())
    if note:
        print(note)
