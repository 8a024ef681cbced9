"""Prometheus metrics and the health endpoint (loopback by default)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def observe_many(hist: Histogram, values) -> None:
    """``hist.observe(v)`` for every v, in one pass (numpy), for a batch's per-message ages;
    falls back to one observe per value if prometheus_client's histogram changes shape."""
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    bounds = getattr(hist, "_upper_bounds", None)
    buckets, total = getattr(hist, "_buckets", None), getattr(hist, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for v in values.tolist():
            hist.observe(v)
        return
    # observe() counts v in the first bucket whose upper bound is >= v
    counts = np.bincount(np.searchsorted(np.asarray(bounds, dtype=np.float64), values,
                                         side="left"), minlength=len(bounds))
    for i, n in enumerate(counts.tolist()):
        if n:
            buckets[i].inc(n)
    total.inc(float(values.sum()))


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
        self.records_in = Counter("scoring_records_in", "Rows decoded from input messages",
                                  registry=r)
        self.records_out = Counter("scoring_records_out", "Rows scored and delivered",
                                   registry=r)
        self.messages_in = Counter("scoring_messages_in", "Input messages consumed", registry=r)
        self.dead_letters = Counter("scoring_dead_letters", "Messages sent to the dead-letter "
                                    "topic", ["reason"], registry=r)
        self.batch_seconds = Histogram("scoring_batch_seconds", "Decode+score+deliver+commit "
                                       "time per batch", buckets=_LATENCY, registry=r)
        self.kernel_seconds = Histogram("scoring_kernel_seconds", "Kernel time per batch",
                                       buckets=_LATENCY, registry=r)
        self.end_to_end_seconds = Histogram("scoring_end_to_end_seconds", "Commit time minus "
                                            "the input message timestamp",
                                            buckets=_LATENCY + (30, 60), registry=r)
        self.work_units = Counter("scoring_work_units", "Work units (trees or boosting "
                                  "rounds) evaluated", registry=r)
        self.work_units_full = Counter("scoring_work_units_full", "Work units full "
                                       "evaluation would have taken", registry=r)
        self.stop_reasons = Counter("scoring_stop_reasons", "Rows by stop reason", ["reason"],
                                    registry=r)
        self.audit_rows = Counter("scoring_audit_rows", "Rows also fully evaluated by the "
                                  "fidelity audit", registry=r)
        self.audit_disagreements = Counter("scoring_audit_disagreements", "Audited rows whose "
                                           "decision differs from full evaluation", registry=r)
        self.explained_rows = Counter("scoring_explained_rows", "Rows published with reason "
                                      "codes (scoring.explain)", registry=r)
        self.transactions_aborted = Counter("scoring_transactions_aborted", "Aborted "
                                            "transactions (batch reprocessed)", registry=r)
        self.consumer_lag = Gauge("scoring_consumer_lag", "High watermark minus position",
                                  ["partition"], registry=r)
        self.last_batch = Gauge("scoring_last_batch_timestamp", "Unix time of the last "
                                "completed loop iteration", registry=r)
        self.model_info = Gauge("scoring_model_info", "1 for the model scoring now, by role",
                                ["model_id", "role"], registry=r)
        self.model_swaps = Counter("scoring_model_swaps", "Models swapped in while running",
                                   ["role"], registry=r)
        self.shadow_agreement = Counter("scoring_shadow_decisions", "Rows by live and shadow "
                                        "decision band (agreement: the diagonal)",
                                        ["live", "shadow"], registry=r)
        self.shadow_score_diff = Histogram(
            "scoring_shadow_score_difference", "Shadow score minus live score",
            buckets=(-0.5, -0.1, -0.05, -0.01, -0.001, 0.0, 0.001, 0.01, 0.05, 0.1, 0.5),
            registry=r)
        self.shadow_kernel_seconds = Histogram("scoring_shadow_kernel_seconds", "Shadow "
                                               "model kernel seconds per batch", registry=r)
        self.shadow_errors = Counter("scoring_shadow_errors", "Batches the shadow model "
                                     "could not score (the live output is unaffected)",
                                     registry=r)
        self.model_refusals = Counter("scoring_model_refusals", "New model artifacts refused "
                                      "(the running model stayed)", ["role", "reason"],
                                      registry=r)
        # the input contract, per feature the model reads (labels bounded by its features)
        self.feature_missing = Counter("scoring_feature_missing", "Values scored as missing "
                                       "(null, NaN, an absent optional field, an unseen "
                                       "category), by feature", ["feature"], registry=r)
        self.feature_absent = Counter("scoring_feature_absent", "Events without an optional "
                                      "feature's field (source.fields optional)", ["feature"],
                                      registry=r)
        self.feature_unseen = Counter("scoring_feature_unseen_categories", "Category values "
                                      "the model does not know (scored as missing)",
                                      ["feature"], registry=r)
        self.feature_refused = Counter("scoring_feature_refused", "Messages dead-lettered for "
                                       "a feature: missing_field, bad_type, cast_failed, "
                                       "bad_number, schema_mismatch", ["feature", "reason"],
                                       registry=r)
        self.monitor_records = Counter("scoring_monitor_records", "Window records for "
                                       "monitoring.topic, sent or failed", ["result"],
                                       registry=r)
        self.monitor_errors = Counter("scoring_monitor_errors", "Flight monitoring "
                                      "failures (monitoring stops, scoring goes on)",
                                      registry=r)
        self.heartbeat = time.time()
        # /readyz: the loop has partitions to read (or a file) and has committed a batch or
        # found nothing to read (a caught-up consumer is ready too)
        self.ready = False
        # issue 53: a batch completed (not only a loop turn), and a stall (StallWatch) turns
        # /readyz to 503
        self.completed_at = time.time()
        self.stalled = False
        self.since_batch = Gauge("scoring_seconds_since_last_batch", "Seconds since the last "
                                 "batch was delivered (or the worker started)", registry=r)
        self.since_batch.set_function(lambda: time.time() - self.completed_at)
        self.stalled_gauge = Gauge("scoring_stalled", "1 while no batch completes and input "
                                   "waits (health.stall_after_s)", registry=r)
        self.lag_unknown = Gauge("scoring_consumer_lag_unknown", "Owned partitions whose "
                                 "high watermark the brokers did not give (no lag reported "
                                 "for them)", registry=r)

    def count_features(self, tally) -> None:
        """The input contract's per-feature counts of a batch (``BatchStats.features``)."""
        for (kind, feature), n in tally.items():
            if n <= 0:  # (a count is never negative: nothing to add, nothing to raise)
                continue
            if kind == "missing":
                self.feature_missing.labels(feature).inc(n)
            elif kind == "absent":
                self.feature_absent.labels(feature).inc(n)
            elif kind == "unseen":
                self.feature_unseen.labels(feature).inc(n)
            elif kind.startswith("refused:"):
                self.feature_refused.labels(feature, kind[len("refused:"):]).inc(n)

    def completed(self) -> None:
        """A batch was delivered."""
        self.completed_at = time.time()

    def beat(self) -> None:
        self.heartbeat = time.time()
        self.last_batch.set(self.heartbeat)

    def serve(self, host: str, port: int, stale_after_s: float = 60.0,
              max_connections: int = 16, timeout_s: float = 5.0) -> ThreadingHTTPServer:
        """Serve /metrics, /healthz and /readyz from a background thread. Bounded: at most
        ``max_connections`` requests in flight (more are closed at once), and a connection
        that has not sent its request within ``timeout_s`` is dropped."""
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            timeout = timeout_s  # socket timeout for reading the request (slowloris)

            def do_GET(self):  # noqa: N802 (http.server API)
                if self.path.startswith("/metrics"):
                    body, ctype, code = generate_latest(metrics.registry), CONTENT_TYPE_LATEST, 200
                elif self.path.startswith("/readyz"):
                    ok = metrics.ready and time.time() - metrics.heartbeat < stale_after_s \
                        and not metrics.stalled
                    body = b"ready\n" if ok else b"not ready\n"
                    ctype, code = "text/plain", 200 if ok else 503
                elif self.path.startswith(("/healthz", "/health")):
                    ok = time.time() - metrics.heartbeat < stale_after_s
                    body = b"ok\n" if ok else b"stalled\n"
                    ctype, code = "text/plain", 200 if ok else 503
                else:
                    body, ctype, code = b"not found\n", "text/plain", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = _BoundedServer((host, port), Handler, max_connections)
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
        return server


class _BoundedServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with a cap on concurrent connections (one thread each)."""

    daemon_threads = True
    # the listen backlog: socketserver's 5 dropped the SYNs of a burst of connections (each
    # retried a second later) while the serving thread waited for the GIL to accept them
    request_queue_size = 128

    def __init__(self, address, handler, max_connections: int):
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # over the cap: close, start no thread
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()
