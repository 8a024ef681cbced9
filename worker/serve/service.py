"""What ``scoring-worker serve`` answers, whatever HTTP server carries it: the Open Inference
Protocol's routes (health, metadata, inference) and ``/metrics``, over one model that hot
swaps between requests.

``Service.handle`` takes a parsed request (method, path, lower-cased headers, body) and gives
``(status, content type, body, extra headers)``; it never raises. Scoring is the worker's:
the same compiled artifact, lazy policy, thresholds, audit and reason codes
(``settings.scoring``); an Arrow IPC body goes through the worker's own pipeline (its C
reader, its writer), so a request and a message are scored and answered alike.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import orjson
import structlog
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from .. import __version__, monitoring
from ..config import Settings
from ..formats.base import InvalidMessage
from ..io.records import Record
from ..model.result import STOP_REASONS, default_threads
from . import oip
from .apart import Parser
from .onerow import OneRow

log = structlog.get_logger("worker.serve")

JSON = b"application/json"
ARROW = b"application/vnd.apache.arrow.stream"
_LATENCY = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
            1, 2.5)
PARSE_APART = 256 << 10  # JSON past this, on the heavy lane, is parsed in a process apart
ARROW_OVERHEAD = 64 << 10  # an Arrow answer's schema, metadata and buffer padding
SMALL_REQUEST_ROWS = 1024  # fewer rows than this: one kernel thread (no pool to wake)
MONITOR_ROWS = 256  # requests' rows kept before the monitor counts them (or the ticker does)


class ServeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
        self.seconds = Histogram("serve_request_seconds", "Inference request time, body read "
                                 "to response written, by body kind", ["kind"],
                                 buckets=_LATENCY, registry=r)
        self.requests = Counter("serve_requests", "Requests answered, by route and status",
                                ["route", "status"], registry=r)
        self.rows = Counter("serve_rows", "Rows scored", registry=r)
        self.work_units = Counter("serve_work_units", "Work units (trees or boosting rounds) "
                                  "evaluated", registry=r)
        # with serve.workers > 1 each process writes its values to PROMETHEUS_MULTIPROC_DIR
        # and any of them answers /metrics for all (a gauge: as the mode says)
        self.ready = Gauge("serve_ready", "1 once the model is loaded and warmed up (in "
                           "every worker process)", registry=r, multiprocess_mode="livemin")
        self.model_info = Gauge("serve_model_info", "1 for the model scoring now",
                                ["model_id"], registry=r, multiprocess_mode="livemax")
        self.model_swaps = Counter("scoring_model_swaps", "Models swapped in while running",
                                   ["role"], registry=r)
        self.model_refusals = Counter("scoring_model_refusals", "New model artifacts refused "
                                      "(the running model stayed)", ["role", "reason"],
                                      registry=r)
        self.connections = Gauge("serve_connections", "Open client connections", registry=r,
                                 multiprocess_mode="livesum")
        self.connections_refused = Counter("serve_connections_refused", "Connections closed "
                                           "at once: serve.max_connections were open",
                                           registry=r)
        # the input contract, by feature (labels bounded by the model's features)
        self.feature_missing = Counter("serve_feature_missing", "Values scored as missing "
                                       "(null, a category name the model does not know; "
                                       "with serve.allow_missing a feature given no input), "
                                       "by feature", ["feature"], registry=r)
        self.feature_unseen = Counter("serve_feature_unseen_categories", "Category names the "
                                      "model does not know (scored as missing), by feature",
                                      ["feature"], registry=r)
        self.exposition = r
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess

            self.exposition = CollectorRegistry()
            multiprocess.MultiProcessCollector(self.exposition)
        # the seconds histogram's children, looked up once
        self.by_kind = {k: self.seconds.labels(k) for k in ("json", "binary", "arrow", "grpc")}
        self._counts: dict[tuple[str, int], object] = {}
        self._missing: dict[str, object] = {}  # feature name -> its missing counter's child
        self._pending_lock = threading.Lock()  # (the loop's thread and the heavy lane's)
        self._pending_names: list[str] | None = None  # the features _pending counts
        self._pending: np.ndarray | None = None  # missing values not yet in their counters
        # with serve.workers > 1 each process's counters live in files any process's /metrics
        # reads, and outlive a process that dies: counted at once there (a second's wait
        # showed fewer missing values than rows, and a killed process lost them)
        self._at_once = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.monitor_errors = Counter("scoring_monitor_errors", "Flight monitoring failures "
                                      "(monitoring stops, scoring goes on)", registry=r)

    def count_features(self, names: list[str], X: np.ndarray, unseen: dict) -> None:
        """A request's missing values and unknown category names, by feature. The missing
        values are added up in an array and reach their counters in ``flush_features``
        (each second, by the service's ticker, and before /metrics answers), not a
        Prometheus counter's ``inc`` (a lock and an add) a missing feature a request."""
        counts = monitoring.nan_counts(X)
        with self._pending_lock:
            if names is not self._pending_names:  # another model's features: theirs first
                self._flush_missing()
                self._pending_names = names
                self._pending = np.zeros(len(names), np.int64)
            self._pending += counts
            if self._at_once:
                self._flush_missing()
        for j, n in unseen.items():
            if n > 0:
                self.feature_unseen.labels(names[j]).inc(n)

    def count_tally(self, features) -> None:
        """An Arrow request's counts by feature, as the worker's pipeline keeps them
        (``BatchStats.features``: (kind, feature) -> count): its missing values and unknown
        category names (Arrow requests counted none before: review, issue 50)."""
        for (kind, name), n in features.items():
            if n <= 0:
                continue
            if kind == "missing":
                c = self._missing.get(name)
                if c is None:
                    c = self._missing[name] = self.feature_missing.labels(name)
                c.inc(n)
            elif kind == "unseen":
                self.feature_unseen.labels(name).inc(n)

    def flush_features(self) -> None:
        """The missing values added up since the last flush, to their counters."""
        with self._pending_lock:
            self._flush_missing()

    def _flush_missing(self) -> None:
        pending, names = self._pending, self._pending_names
        if pending is None or not pending.any():
            return
        children = self._missing  # (each looked up once a name)
        for j in np.flatnonzero(pending).tolist():
            c = children.get(names[j])
            if c is None:
                c = children[names[j]] = self.feature_missing.labels(names[j])
            n, pending[j] = int(pending[j]), 0  # (taken before it is added: never twice)
            c.inc(n)

    def answered(self, route: str, status: int) -> None:
        c = self._counts.get((route, status))
        if c is None:
            c = self._counts[(route, status)] = self.requests.labels(route, str(status))
        c.inc()


@dataclass
class _Model:
    """The model answering a request (a hot swap replaces the whole of it)."""

    model: object
    # the Arrow body's (worker.pipeline.Pipeline) with the id column, and the same without
    # one (a body without scoring.id_column): a pair for the loop, a pair for the heavy lane
    # (a pipeline's codec keeps per-message state: one thread at a time uses each)
    pipelines: tuple
    metadata: bytes
    meta: dict  # the same, as it was made (gRPC's ModelMetadata)
    stop_names: np.ndarray
    classifier: bool
    contract: oip.Contract  # each feature's column, category names, missing allowed
    id_header: list  # the response's model-id header
    explain_error: str | None  # why this model gives no reason codes (None: it does)
    id_name: bytes | None  # scoring.id_column, as a schema holds it
    stop_longest: tuple[int, int]  # the longest stop reason, JSON and UTF-8 (answer bound)
    feature_longest: tuple[int, int]  # and feature name
    monitor: object = None  # flight monitoring's window (worker/monitoring.py), or None
    one_row: OneRow | None = None  # one-row JSON answers (onerow.py), None: not this model's
    pending: list = field(default_factory=list)  # requests kept for the monitor (_count)
    pending_rows: int = 0


class Service:
    def __init__(self, settings: Settings, model_path: str, name: str, metrics=None):
        self.settings = settings
        self.path = model_path
        self.name = name
        self.metrics = metrics or ServeMetrics()
        self.serve = settings.serve
        self.scoring = settings.scoring
        self.threads = settings.scoring.threads or default_threads()
        self.lazy_params = dict(settings.scoring.lazy.params)
        if settings.scoring.audit_fraction:
            self.lazy_params["audit_fraction"] = settings.scoring.audit_fraction
        self.rows_seen = 0
        # the one-row path's URL (a name with / or ? is routed as the general path splits it)
        try:
            self._infer_path = None if "/" in name or "?" in name else \
                f"/v2/models/{name}/infer".encode()
        except UnicodeEncodeError:  # (a file name's undecodable bytes: refused at load)
            self._infer_path = None
        self.current: _Model | None = None
        self.watcher = None
        self._staged: _Model | None = None  # prepared, swapped in at the next request
        self._preparing = False
        self._swap = threading.Lock()
        self._parser = Parser()  # the process large JSON requests are parsed in
        self._monitor_lock = threading.Lock()
        self._closing = threading.Event()  # ends the monitoring windows' ticker
        self.metrics.exposition.register(monitoring.Collector(
            lambda: [self.current.monitor] if self.current is not None and
            self.current.monitor is not None else []))

    # ---- the model's life ----------------------------------------------------------------
    def load(self) -> None:
        """Load, check and warm up the model (readiness turns true after); then watch it if
        model.reload. Raises ArtifactError / OSError / ValueError with the reason."""
        from ..lifecycle import ModelWatcher, identity
        from ..model.compiled import load_model

        seen = identity(self.path)
        model = load_model(self.path)
        from ..contract import check_scores

        check_scores(model, self.scoring)
        if self.scoring.lazy.mode != "off":  # the policy's parameters, tried on this model
            model.score_batch(np.zeros((1, model.n_features), np.float32),
                              lazy=self.scoring.lazy.mode, thresholds=self.scoring.thresholds,
                              **self.scoring.lazy.params)
        self._install(self._prepare(model))
        if self.settings.model.reload:
            self.watcher = ModelWatcher(self.path, model, self.settings, self.metrics,
                                        seen=seen, events=False).start()  # no events read
        self.metrics.ready.set(1)
        self._ticker = threading.Thread(target=self._tick, name="serve-ticker", daemon=True)
        self._ticker.start()
        log.info("model ready", name=self.name, model_id=model.model_id[:12],
                 features=model.n_features)

    def _tick(self) -> None:
        """Each second (or a quarter of a monitored window): the missing values added up
        since, to their counters (with serve.workers > 1 they are counted at once); and
        monitoring windows end on time while no request comes (a request also ends one)."""
        while not self._closing.wait(self._period()):
            try:
                self.metrics.flush_features()
            except Exception as exc:  # noqa: BLE001 (the ticker goes on: windows end on time)
                log.error("missing-value counters not updated", error=str(exc)[:300])
            m = self.current
            if m is None or m.monitor is None:
                continue
            try:
                with self._monitor_lock:
                    self._flush(m)
                    m.monitor.tick()
            except Exception as exc:  # noqa: BLE001 (monitoring never stops serving)
                m.monitor = None
                self.metrics.monitor_errors.inc()
                log.error("flight monitoring stops", error=str(exc)[:300])

    def _period(self) -> float:
        """The ticker's: a second, or a quarter of a monitored model's window if shorter (an
        unmonitored model's tiny window_s made an idle server spin)."""
        m = self.current
        if m is None or m.monitor is None:
            return 1.0
        return min(1.0, self.settings.monitoring.window_s / 4)

    def _prepare(self, model) -> _Model:
        from ..pipeline import Pipeline

        # warm up: the kernels' first calls (both thread settings), reason codes if on
        for rows in (1, SMALL_REQUEST_ROWS):
            X = np.zeros((rows, model.n_features), np.float32)
            model.score_batch(X, lazy=self.scoring.lazy.mode, thresholds=self.scoring.thresholds,
                              n_threads=1 if rows < SMALL_REQUEST_ROWS else self.threads,
                              **self.scoring.lazy.params)
        s = self.settings
        arrow = s.model_copy(update={
            "source": s.source.model_copy(update={"format": "arrow"}),
            "sink": s.sink.model_copy(update={"format": "arrow"}),
            "delivery": s.delivery.model_copy(update={
                "max_message_rows": self.serve.max_rows}),
        })
        anonymous_settings = arrow.model_copy(update={"scoring": arrow.scoring.model_copy(
            update={"id_column": None})})
        pipelines = []
        for _ in ("loop", "lane"):
            pipeline = Pipeline(model, arrow, "serve")
            pipelines.append((pipeline, pipeline if not self.scoring.id_column else
                              Pipeline(model, anonymous_settings, "serve")))
        classifier = model.task != "regression"
        explain_on = self.scoring.explain is not None
        outputs = oip.output_specs(classifier) + (list(oip.REASON_OUTPUTS) if explain_on
                                                   else [])
        cats = dict(model.categories or {})
        # a model with category names takes one input a feature (those by name, as BYTES);
        # one without, the matrix of its features in order
        inputs = [{"name": f, "datatype": "BYTES" if f in cats else "FP32", "shape": [-1]}
                  for f in model.feature_names] if cats else \
            [{"name": oip.MATRIX_INPUT, "datatype": "FP32", "shape": [-1, model.n_features]}]
        meta = {
            "name": self.name, "versions": [model.model_id], "platform": "scoring-worker",
            "inputs": inputs,
            "outputs": [{"name": o.name, "datatype": o.datatype,
                         "shape": [-1, -1] if o.name.startswith("reason_") else [-1]}
                        for o in outputs],
            "parameters": {"model_id": model.model_id, "task": model.task,
                           "feature_names": list(model.feature_names),
                           "categories": {f: [str(c) for c in v] for f, v in cats.items()},
                           "allow_missing": self.serve.allow_missing,
                           "thresholds": list(self.scoring.thresholds),
                           "lazy": self.scoring.lazy.mode,
                           "explain": explain_on,
                           "reason_outputs": [o.name for o in oip.REASON_OUTPUTS]},
        }
        explain_error = None
        try:  # reason codes: this artifact has what they need, or the reason it has not
            ex = self.scoring.explain
            model.score_batch(np.zeros((1, model.n_features), np.float32),
                              thresholds=self.scoring.thresholds, n_threads=1,
                              explain=ex.method if ex else "treeshap", top_k=1,
                              explain_min_score=-math.inf)
        except (ValueError, NotImplementedError) as exc:
            explain_error = str(exc)
            if self.scoring.explain is not None:  # asked for every request: cannot serve
                raise ValueError(f"scoring.explain: {exc}") from None
        contract = oip.Contract.of(model, self.serve.allow_missing)
        monitor = None
        if monitoring.enabled(model, self.settings):
            if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
                log.warning("flight monitoring is off: it needs serve.workers 1 (each "
                            "process would judge its own share of the requests)")
            else:
                monitor = monitoring.Monitor(model, self.settings)
                monitoring.announce(model, self.settings)
        return _Model(model, tuple(pipelines), orjson.dumps(meta), meta, STOP_REASONS,
                      classifier, contract,
                      [(b"model-id", model.model_id.encode())], explain_error,
                      self.scoring.id_column.encode() if self.scoring.id_column else None,
                      oip.longest(STOP_REASONS.tolist()), oip.longest(model.feature_names),
                      monitor, one_row=OneRow.of(model, self.name, self.scoring, self.serve,
                                                 contract))

    def _monitor(self, m: _Model, stats) -> None:
        """A request's counts to its model's monitor (the loop's thread and the heavy
        lane's: one at a time); a failure stops monitoring, never the answer."""
        try:
            with self._monitor_lock:
                if m.monitor is not None:
                    self._flush(m)  # (the requests kept before this one first)
                    m.monitor.add(stats)
        except Exception as exc:  # noqa: BLE001
            m.monitor = None
            self.metrics.monitor_errors.inc()
            log.error("flight monitoring stops", error=str(exc)[:300])

    def _count(self, m: _Model, X, score: np.ndarray, decision: np.ndarray) -> None:
        """A scored request's rows, scores and decisions, kept for the model's monitor and
        counted MONITOR_ROWS at a time (and by the ticker, within its period): a one-row
        request pays a list append, not a count and a window's bookkeeping."""
        with self._monitor_lock:
            m.pending.append((X, score, decision))
            m.pending_rows += len(X)
            if m.pending_rows >= MONITOR_ROWS:
                self._flush(m)

    def _flush(self, m: _Model) -> None:
        """The kept requests counted into one stats for the monitor (the lock held); a
        failure stops monitoring, never an answer."""
        from ..pipeline import BatchStats

        pending, m.pending, m.pending_rows = m.pending, [], 0
        if not pending or m.monitor is None:
            return
        X = pending[0][0] if len(pending) == 1 else np.concatenate([p[0] for p in pending])
        score = np.concatenate([p[1] for p in pending])
        stats = BatchStats(rows=len(score))
        try:
            if m.model.reference is not None:
                monitoring.count(m.model, X, score, stats)
            else:  # no profile: the scores' histogram
                stats.scores.append((score, None))
            decision = np.concatenate([p[2] for p in pending]).astype(np.int64)
            for band, n in enumerate(np.bincount(decision).tolist()):
                if n:
                    stats.decisions[band] += n
            m.monitor.add(stats)
        except Exception as exc:  # noqa: BLE001
            m.monitor = None
            self.metrics.monitor_errors.inc()
            log.error("flight monitoring stops", error=str(exc)[:300])

    def _install(self, m: _Model) -> None:
        old = self.current
        self.current = m
        if old is not None:
            self.metrics.model_info.labels(old.model.model_id).set(0)
            if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # there: 0, as the others'
                self.metrics.model_info.remove(old.model.model_id)  # (it cannot remove)
            self.metrics.model_swaps.labels("live").inc()
        self.metrics.model_info.labels(m.model.model_id).set(1)

    def _model(self) -> _Model | None:
        """The model for this request: a new one once it is ready. The watcher verifies a
        new artifact off the request path; it is prepared (warmed up, its pipelines built)
        in a thread of its own too, then swapped in between two requests."""
        if self._staged is not None:
            with self._swap:  # the loop's thread and the heavy lane's: one installs it
                staged, self._staged = self._staged, None
                if staged is not None:
                    self._install(staged)
                    log.info("model swapped in", model_id=staged.model.model_id[:12])
        if self.watcher is not None and not self._preparing:
            with self._swap:
                new = None if self._preparing else self.watcher.take()
                if new is not None:
                    self._preparing = True
                    threading.Thread(target=self._stage, args=(new,), name="model-prepare",
                                     daemon=True).start()
        return self.current

    def _stage(self, model) -> None:
        try:
            self._staged = self._prepare(model)
        except Exception as exc:  # noqa: BLE001 (the running model stays)
            log.warning("model refused: the running model stays", reason=str(exc))
            self.metrics.model_refusals.labels("live", "prepare_failed").inc()
        finally:
            self._preparing = False

    def start_parser(self) -> None:
        """The process large JSON requests are parsed in, started ahead of the first."""
        self._parser.start()

    def close(self) -> None:
        self._closing.set()
        self.metrics.flush_features()
        if self.watcher is not None:
            self.watcher.stop()
        self._parser.close()

    # ---- requests -------------------------------------------------------------------------
    def handle(self, method: bytes, path: bytes, headers: dict[bytes, bytes],
               body: bytes | list, heavy: bool = False) -> tuple[int, bytes, bytes, list]:
        """One request's answer: (status, content type, body, extra headers). Never raises.
        ``body``: bytes, or the pieces it was read in (joined here only where needed: a
        large JSON body goes to its parsing process piece by piece); ``heavy``: called on the
        heavy lane's thread (its own Arrow pipelines, JSON parsed apart)."""
        try:
            if path == self._infer_path and method == b"POST" and type(body) is bytes:
                got = self._one_row(headers, body)
                if got is not None:
                    return got
            return self._route(method, path.split(b"?", 1)[0], headers, body, heavy)
        except oip.RequestError as exc:
            self.metrics.answered("infer", exc.status)
            return exc.status, JSON, _error(exc.message), []
        except Exception as exc:  # noqa: BLE001 (one request never stops the server)
            # the error, never the request's values (a traceback's locals would hold them)
            log.error("request failed", path=path[:200].decode("latin-1"),
                      error=f"{type(exc).__name__}: {exc}"[:500])
            self.metrics.answered("infer", 500)
            return 500, JSON, _error(f"internal error: {type(exc).__name__}"), []

    def _one_row(self, headers: dict, body: bytes):
        """A one-row JSON request of the shape onerow.py answers, answered as the general
        path answers it (the same checks, bytes and counts); None: the general path's."""
        t0 = time.perf_counter()
        m = self._model()
        if m is None or m.one_row is None or _HEADER_LENGTH in headers \
                or b"content-encoding" in headers or \
                headers.get(b"content-type") != b"application/json":
            return None
        got = m.one_row.answer(body)
        if got is None:
            return None
        out, X, missing, score, decision = got
        metrics = self.metrics
        if missing:
            metrics.count_features(m.model.feature_names, X, _NONE_UNSEEN)
        if m.monitor is not None:
            self._count(m, X, score, decision)
        metrics.rows.inc(1)
        metrics.work_units.inc(m.one_row.work)
        self.rows_seen += 1
        metrics.answered("infer", 200)
        metrics.by_kind["json"].observe(time.perf_counter() - t0)
        return 200, JSON, out, m.id_header

    def _route(self, method: bytes, path: bytes, headers: dict, body: bytes, heavy: bool):
        parts = path.strip(b"/").split(b"/")
        if parts[:1] == [b"metrics"] and len(parts) == 1:
            return self._get(method, "metrics", self._metrics_page)
        if parts[:1] != [b"v2"]:
            return self._simple("other", 404, "not found")
        rest = parts[1:]
        if not rest:
            return self._get(method, "server", lambda: (200, JSON, orjson.dumps({
                "name": "scoring-worker", "version": __version__,
                "extensions": ["binary_tensor_data", "arrow_stream"]}), []))
        if rest[0] == b"health" and len(rest) == 2 and rest[1] in (b"live", b"ready"):
            if rest[1] == b"live":
                return self._get(method, "live", lambda: (200, JSON, b"", []))
            ready = self.current is not None
            return self._get(method, "ready", lambda: (
                (200, JSON, b"", []) if ready else (503, JSON, _error("not ready"), [])))
        if rest[0] != b"models" or len(rest) < 2:
            return self._simple("other", 404, "not found")
        name = rest[1].decode("utf-8", "replace")
        tail = rest[2:]
        if name != self.name:
            return self._simple("model", 404, f"unknown model {name[:100]!r} (this server "
                                              f"serves {self.name!r})")
        # the model this request is answered by, a prepared swap installed first: a version
        # is checked against the model that will score (issue 50: version A was answered by
        # model B, and B's URL was 404 until an unversioned request swapped it in)
        m = self._model()
        if len(tail) >= 2 and tail[0] == b"versions":
            version = tail[1].decode("utf-8", "replace")
            if m is None or len(version) < 6 or not m.model.model_id.startswith(version):
                return self._simple("model", 404, version_refused(name, version, m))
            tail = tail[2:]
        if not tail:
            if m is None:
                return self._simple("model", 503, "the model is loading")
            return self._get(method, "model", lambda: (200, JSON, m.metadata, []))
        if tail == [b"ready"]:
            return self._get(method, "model_ready", lambda: (
                (200, JSON, b"", []) if m is not None else
                (503, JSON, _error("the model is loading"), [])))
        if tail == [b"infer"]:
            if method != b"POST":
                return self._simple("infer", 405, "use POST", [(b"allow", b"POST")])
            return self._infer(headers, body, m, heavy)
        return self._simple("other", 404, "not found")

    def _metrics_page(self):
        self.metrics.flush_features()  # (the missing values added up since the last)
        return 200, CONTENT_TYPE_LATEST.encode(), generate_latest(self.metrics.exposition), []

    def _get(self, method: bytes, route: str, answer):
        if method not in (b"GET", b"HEAD"):
            return self._simple(route, 405, "use GET", [(b"allow", b"GET, HEAD")])
        status, ctype, body, extra = answer()
        self.metrics.answered(route, status)
        return status, ctype, body, extra

    def _simple(self, route: str, status: int, message: str, extra: list | None = None):
        self.metrics.answered(route, status)
        return status, JSON, _error(message), extra or []

    def _infer(self, headers: dict, body: bytes | list, m: _Model | None, heavy: bool):
        t0 = time.perf_counter()
        if m is None:
            return self._simple("infer", 503, "the model is loading")
        encoding = headers.get(b"content-encoding")
        if encoding not in (None, b"identity"):
            return self._simple("infer", 415, f"Content-Encoding {encoding[:40]!r} is not "
                                              "supported (send the body uncompressed)")
        ctype = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
        if ctype == ARROW:
            status, out_type, out, extra = self._infer_arrow(m, _whole(body), heavy)
            kind = "arrow"
        else:
            length = headers.get(oip.HEADER_LENGTH.encode())
            if length is not None:
                try:
                    length = int(length)
                except ValueError:
                    raise oip.bad("Inference-Header-Content-Length is not an integer") \
                        from None
            size = len(body) if type(body) is bytes else sum(map(len, body))
            json_size = size if length is None else length  # (a length outside it: 400)
            if json_size > self.serve.max_json_bytes and json_size <= size:
                raise oip.RequestError(413, f"the JSON ({json_size} bytes) is larger than "
                                            f"serve.max_json_bytes ({self.serve.max_json_bytes})"
                                            ": send large requests as binary tensors or Arrow")
            if heavy and json_size > PARSE_APART:
                req = self._parser.parse(body, length, m.contract, self.serve.max_rows,
                                         m.classifier, self.scoring.explain is not None)
            else:
                req = oip.parse_infer(_whole(body), length, m.contract, self.serve.max_rows,
                                      m.classifier, self.scoring.explain is not None)
            arrays = self.infer_tensors(m, req)
            out, head = oip.encode_response(self.name, m.model.model_id, req, arrays)
            status, extra = 200, m.id_header
            if head is not None:
                extra = [*extra, (b"inference-header-content-length", str(head).encode())]
                out_type, kind = b"application/octet-stream", "binary"
            else:
                out_type, kind = JSON, "binary" if length is not None else "json"
        self.metrics.answered("infer", status)
        if status == 200:
            self.metrics.by_kind[kind].observe(time.perf_counter() - t0)
        return status, out_type, out, extra

    def infer_tensors(self, m: _Model, req: oip.InferRequest) -> dict:
        """A parsed request scored: each asked-for output's (datatype, shape, values), every
        bound checked before the work is done (HTTP's JSON and binary bodies, and gRPC)."""
        if req.explain and m.explain_error is not None:
            raise oip.bad(f"reason codes: {m.explain_error}")
        k = 0
        if req.explain:
            self._explain_bounds(len(req.X))
            ex = self.scoring.explain
            k = min(req.top_k or (ex.top_k if ex else 3), m.model.n_features)
        self._answer_bounds(oip.answer_bound(req, len(req.X), k, m.stop_longest,
                                             m.feature_longest),
                            binary_possible=req.binary != set(req.outputs))
        self.metrics.count_features(m.model.feature_names, req.X, req.unseen)
        r = self._score(m, req)
        if m.monitor is not None:
            self._count(m, req.X, r.score, r.decision)
        arrays = oip.output_arrays(r, req.outputs, m.model.feature_names, m.stop_names)
        self.metrics.rows.inc(len(r))
        self.metrics.work_units.inc(int(r.work_units.sum()))
        return arrays

    def _explain_bounds(self, rows: int) -> None:
        """Reason codes cost work and answer bytes a row and a code: bounded before they are
        found (issue 50: 100,000 rows of 64 codes took 1.2 GiB and the loop for seconds);
        a row's codes are at most the model's features (the model caps top_k)."""
        if rows > self.serve.max_explain_rows:
            why = " (scoring.explain is on: every request's rows have them)" if \
                self.scoring.explain is not None else ""
            raise oip.RequestError(413, f"{rows} rows with reason codes{why}, more than "
                                        f"serve.max_explain_rows ({self.serve.max_explain_rows})"
                                        ": send them in smaller requests")

    def _answer_bounds(self, most: int, binary_possible: bool = True) -> None:
        """An answer's size, bounded before it is scored (issue 50: answers past 16 MiB were
        cut off, and rows, outputs and reason codes multiply)."""
        limit = self.serve.max_response_bytes
        if most > limit:
            raise oip.RequestError(413, f"the answer could take {most:,} bytes, more than "
                                        f"serve.max_response_bytes ({limit:,}): ask for fewer "
                                        "rows, outputs or reason codes" +
                                        (", or binary outputs" if binary_possible else ""))

    def _score(self, m: _Model, req: oip.InferRequest):
        s = self.scoring
        n = len(req.X)
        params = self.lazy_params
        if "audit_fraction" in params:
            params = {**params, "audit_seed": self.rows_seen}
        kw = {}
        if req.explain:
            ex = s.explain
            kw = {"explain": ex.method if ex else "treeshap",
                  "top_k": req.top_k or (ex.top_k if ex else 3),
                  # asked for in the request: every row; configured: as the worker does
                  "explain_min_score": ex.min_score if ex else -math.inf}
        r = m.model.score_batch(req.X, lazy=s.lazy.mode, thresholds=s.thresholds,
                                n_threads=1 if n < SMALL_REQUEST_ROWS else self.threads,
                                **params, **kw)
        self.rows_seen += n
        return r

    def _infer_arrow(self, m: _Model, body: bytes, heavy: bool):
        rec = Record("serve", 0, 0, None, body)
        # the id column's name not in the stream's first message (its schema): no id column,
        # the rows are numbered (a name found may be part of another: then tried, then not)
        named, anonymous = m.pipelines[heavy]
        pipeline = named if m.id_name is not None and m.id_name in _schema_bytes(body) \
            else anonymous
        msg = pipeline.decode(rec)
        if isinstance(msg, InvalidMessage) and msg.code == "missing_column" and \
                pipeline is not anonymous and "id column" in msg.detail:
            pipeline = anonymous
            msg = pipeline.decode(rec)
        if isinstance(msg, InvalidMessage):
            status = 413 if msg.code == "too_large" else 400
            # the pipeline is the stream's: its row bound is serve.max_rows here
            detail = msg.detail.replace("delivery.max_message_rows", "serve.max_rows")
            return status, JSON, _error(f"{msg.code}: {detail}"), []
        k = 0
        if self.scoring.explain is not None:  # every row explained
            self._explain_bounds(msg.rows)
            k = min(self.scoring.explain.top_k, m.model.n_features)
        self._answer_bounds(arrow_answer_bound(m, msg.rows, k, len(body)), False)
        pipeline.threads = 1 if msg.rows < SMALL_REQUEST_ROWS else self.threads
        outs, dead, stats = pipeline.process([(rec, msg)])
        if dead:
            h = dict(dead[0].headers)
            return 500 if h.get("error_code") == b"encode_error" else 400, JSON, _error(
                f"{h.get('error_code', b'').decode()}: {h.get('error', b'').decode()}"), []
        self.metrics.rows.inc(stats.rows)
        self.metrics.work_units.inc(stats.work_units)
        self.metrics.count_tally(stats.features)
        if m.monitor is not None:
            self._monitor(m, stats)
        return 200, ARROW, outs[0].value, m.id_header


_HEADER_LENGTH = oip.HEADER_LENGTH.encode()
_NONE_UNSEEN: dict = {}  # (a one-row request's unknown category names: a model without)


def version_refused(name: str, version: str, m: _Model | None) -> str:
    """The 404 for a version not served: which one is, and how a version is named."""
    serves = f" (it serves {m.model.model_id}" if m is not None else " (it serves none yet"
    short = "; a version is the model id or a prefix of 6 or more of its characters" if \
        len(version) < 6 else ""
    return f"model {name!r} has no version {version[:80]!r}{serves}{short})"


def arrow_answer_bound(m: _Model, rows: int, k: int, body_bytes: int) -> int:
    """The most bytes the worker's output stream takes for an Arrow body of ``rows`` rows
    and ``k`` reason codes a row: the numeric columns, the stop reason and reason codes as
    strings with their offsets, the ids as they came (within the body), each buffer's
    padding."""
    return ARROW_OVERHEAD + body_bytes + rows * (
        8 + 8 + 1 + 4 + 4 + m.stop_longest[1] + k * (8 + m.feature_longest[1] + 4))


def _whole(body: bytes | list) -> bytes:
    """A body as bytes: the pieces the server read it in (a large one's), joined."""
    if type(body) is bytes:
        return body
    return body[0] if len(body) == 1 else b"".join(body)


def _schema_bytes(body: bytes) -> bytes:
    """An Arrow IPC stream's first message (the schema), as far as the body holds it: its
    length after the optional continuation marker, bounded by the body."""
    start = 4 if body[:4] == b"\xff\xff\xff\xff" else 0
    n = int.from_bytes(body[start:start + 4], "little", signed=True)
    return body[:start + 4 + max(0, min(n, len(body)))]


def _error(message: str) -> bytes:
    return orjson.dumps({"error": message})
