"""Flight monitoring (issue 51): what the model sees and says, against its reference profile
(model/reference.py), counted in the scoring pass and judged a window at a time.

The pipeline counts each scored group's rows (``count``: the native counter, one pass over the
staged rows) and scores into the batch's stats; the loop hands every batch's counts to the
``Monitor``, which keeps them cumulatively (Prometheus counters, read at scrape: any window
can be taken in PromQL) and for the current window (``monitoring.window_s``). When a window
closes with at least ``monitoring.min_rows`` rows, it computes each feature's PSI, missing
rate and out-of-range rate, the score's PSI and the decision-band rates, sets them as gauges
and logs one warning per threshold crossed.
"""

from __future__ import annotations

import math
import time

import numpy as np
import structlog

from . import _monitor
from .model import reference as R

log = structlog.get_logger("worker.monitoring")
# a classifier's score bins where the model has no reference profile: tenths of probability
DEFAULT_SCORE_EDGES = np.round(np.arange(1, 10) / 10, 1)


def enabled(model, settings) -> bool:
    """Monitoring on for ``model``: unless monitoring.enabled is false. Without a reference
    profile it keeps the decision-band counts only (``counts``: against a profile)."""
    return settings.monitoring.enabled is not False


def counts(model, settings) -> bool:
    """Rows counted against the model's reference profile: on, and the model has one."""
    return enabled(model, settings) and model.reference is not None


def announce(model, settings, role: str = "live") -> None:
    """One start-up line: what monitoring does for this model."""
    cfg = settings.monitoring
    if not enabled(model, settings):
        return
    if model.reference is None:
        say = log.warning if cfg.enabled else log.info
        say("flight monitoring without a reference profile: decision bands only (compile "
            "with --reference, or scoring-worker profile, for drift and data quality)",
            role=role, model_id=model.model_id[:12])
        return
    log.info("flight monitoring on", role=role, model_id=model.model_id[:12],
             reference_rows=model.reference.rows, window_s=cfg.window_s,
             alert_psi=cfg.alert_psi, topic=cfg.topic)


def nan_counts(X: np.ndarray) -> np.ndarray:
    """Each column's NaN values in the row block ``X`` (int64): a float32 block in one native
    pass (numpy's count_nonzero(isnan(X), axis=0) takes about five times as long:
    bench/monitor_micro.py), anything else by numpy."""
    counts = _monitor.missing_counts(X)
    return counts if counts is not None else np.count_nonzero(np.isnan(X), axis=0)


def count(model, X, score: np.ndarray, into, role: str = "live") -> None:
    """Add rows ``X`` (the gathered row block or column descriptors) and their ``score`` to
    ``into`` (a BatchStats): feature counts and score bins against the model's profile,
    under ``role`` (live, shadow)."""
    p = model.reference
    if p is None:
        return
    pair = into.monitor.get(role)
    if pair is None or pair[2] is not p:  # counts against another profile: not mixed
        pair = into.monitor[role] = (p.new_counts(),
                                     np.zeros(len(p.score_edges) + 1, np.int64), p)
    p.plan.count(X, pair[0], score, pair[1])  # (a row block read where it lies)


class Monitor:
    """One model's window and totals; a swap makes a new one (its reference applies)."""

    def __init__(self, model, settings, role: str = "live", clock=time.monotonic):
        self.model = model
        self.role = role
        self.profile = model.reference
        self.cfg = settings.monitoring
        self.thresholds = list(settings.scoring.thresholds)
        self.clock = clock
        p = self.profile
        # the score's bins: the profile's; without one, a classifier's probabilities in
        # tenths (a histogram with no reference to compare), a regression none
        self.score_edges = p.score_edges if p is not None else \
            DEFAULT_SCORE_EDGES if model.task != "regression" else None
        self.total = p.new_counts() if p is not None else None
        self.total_scores = self._score_bins()
        self.total_bands = np.zeros(len(self.thresholds) + 1, np.int64)
        self.last: dict | None = None  # the last judged window's figures
        self.on_window = None  # called with each judged window's figures (Publisher)
        self._open()

    def _open(self) -> None:
        p = self.profile
        self.started = self.clock()
        self.started_at = time.time()
        self.window = p.new_counts() if p is not None else None
        self.window_scores = self._score_bins()
        self.window_bands = np.zeros(len(self.thresholds) + 1, np.int64)
        self.window_rows = 0
        self.window_counted = 0  # rows counted against the profile (monitoring can stop)

    def _score_bins(self) -> np.ndarray | None:
        return np.zeros(len(self.score_edges) + 1, np.int64) \
            if self.score_edges is not None else None

    def add(self, stats) -> dict | None:
        """A batch's counts, to the window open when it arrived: the figures of the window
        that ended before it, if one did (else None)."""
        judged = self.tick()
        pair = stats.monitor.get(self.role)
        # a batch counted against another model's profile (scored before a swap) is not
        # this model's to judge
        if pair is not None and self.window is not None and pair[2] is self.profile:
            self.window += pair[0]
            self.total += pair[0]
            self.window_scores += pair[1]
            self.total_scores += pair[1]
        elif self.profile is None and self.score_edges is not None and self.role == "live":
            for score, _work in stats.scores:  # no profile: the published scores' histogram
                bins = R.score_bins(np.asarray(score, np.float64), self.score_edges)
                self.window_scores += bins
                self.total_scores += bins
        bands = stats.decisions if self.role == "live" else stats.shadow_bands
        for band, n in bands.items():
            if 0 <= band < len(self.window_bands):
                self.window_bands[band] += n
                self.total_bands[band] += n
        self.window_rows += stats.rows
        if pair is not None and pair[2] is self.profile:
            self.window_counted += int(pair[0][0, :int(self.profile.n_edges[0]) + 2].sum()) \
                if len(self.profile.n_edges) else 0
        return judged

    def tick(self) -> dict | None:
        """The window judged and a new one opened, once it has lasted window_s (called with
        each batch, and while the loop is idle)."""
        if self.clock() - self.started < self.cfg.window_s:
            return None
        out = self.close()
        self._open()
        return out

    def close(self) -> dict | None:
        """The window's figures (None: fewer rows than monitoring.min_rows), warnings
        logged."""
        n = self.window_rows
        if n < self.cfg.min_rows:
            return None
        p = self.profile
        bands = self.window_bands / max(int(self.window_bands.sum()), 1)
        out = {"rows": n, "seconds": round(self.clock() - self.started, 3),
               "start": round(self.started_at, 3), "end": round(time.time(), 3),
               "model_id": self.model.model_id, "role": self.role,
               "band_rows": self.window_bands.tolist(), "band_rates": bands.tolist()}
        if p is not None and self.window_counted >= self.cfg.min_rows:
            # judged on the rows counted (all scored rows, unless monitoring stopped)
            names = self.model.feature_names
            out.update(R.judge(self.window, self.window_scores, p, names))
            psi = np.asarray(list(out["feature_psi"].values()), np.float64)
            missing = np.asarray(list(out["missing_rate"].values()), np.float64)
            ref_missing = p.fractions[np.arange(len(names)), p.n_edges + 1]
            score_psi = out["score_psi"]
            alert = self.cfg.alert_psi
            for j, name in enumerate(names):
                if psi[j] >= alert:
                    log.warning("feature drift", feature=name, psi=round(float(psi[j]), 4),
                                threshold=alert, rows=n, role=self.role)
                if missing[j] - ref_missing[j] >= self.cfg.alert_missing_jump:
                    log.warning("missing rate jump", feature=name,
                                missing_rate=round(float(missing[j]), 4),
                                reference=round(float(ref_missing[j]), 4),
                                threshold=self.cfg.alert_missing_jump, rows=n,
                                role=self.role)
            if not math.isnan(score_psi) and score_psi >= alert:
                log.warning("score drift", psi=round(score_psi, 4), threshold=alert, rows=n,
                            role=self.role)
        self.last = out
        if self.on_window is not None:
            self.on_window(out)
        return out


class Publisher:
    """monitoring.topic: one JSON record a judged window, keyed by the model id, from a
    producer of its own (idempotent, not in the batches' transactions: a refused or slow
    monitoring record never holds a batch back). Sent and failed records are counted."""

    def __init__(self, conf: dict, topic: str, metrics):
        from confluent_kafka import Producer

        conf = {k: v for k, v in conf.items() if k not in ("transactional.id",
                                                             "transaction.timeout.ms")}
        conf["delivery.report.only.error"] = False
        self.producer = Producer(conf)
        self.topic = topic
        self.metrics = metrics

    def publish(self, doc: dict) -> None:
        import orjson

        value = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
        try:
            self.producer.produce(self.topic, value=value, key=doc["model_id"].encode(),
                                  headers=[("content-type", b"application/json")],
                                  on_delivery=self._report)
        except Exception as exc:  # noqa: BLE001 (a window record never stops the loop)
            self.metrics.monitor_records.labels("failed").inc()
            log.warning("flight monitoring's window record not sent", error=str(exc)[:200])
        self.producer.poll(0)

    def _report(self, err, _msg) -> None:
        self.metrics.monitor_records.labels("failed" if err else "sent").inc()
        if err is not None:
            log.warning("flight monitoring's window record refused", topic=self.topic,
                        error=str(err)[:200])

    def close(self, timeout_s: float = 5.0) -> None:
        self.producer.flush(timeout_s)


class Collector:
    """The monitors' figures for Prometheus, read at scrape from the loop's current monitors
    (live, and the shadow's when one runs): cumulative counts (counters) and the last judged
    window (gauges). Labels are bounded by the models' features and bins, and the two
    roles."""

    def __init__(self, current):
        self.current = current  # () -> list[Monitor]

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        def counter(name, help_, labels):
            return CounterMetricFamily(name, help_, labels=["role", *labels])

        def gauge(name, help_, labels=()):
            return GaugeMetricFamily(name, help_, labels=["role", *labels])

        fams = {
            "bands": counter("scoring_monitor_band_rows", "Scored rows by decision band "
                             "(monitoring)", ["band"]),
            "bins": counter("scoring_monitor_feature_bin_rows", "Scored rows by feature and "
                            "reference bin ('missing': NaN, null, an unknown category)",
                            ["feature", "bin"]),
            "out": counter("scoring_monitor_feature_out_of_range_rows", "Scored values "
                           "outside the reference's range, by feature and side",
                           ["feature", "side"]),
            "ref": gauge("scoring_monitor_feature_reference_missing_rate", "Share of the "
                         "reference rows missing the feature", ["feature"]),
            "scores": counter("scoring_monitor_score_bin_rows", "Scored rows by reference "
                              "score bin", ["bin"]),
            "rows": gauge("scoring_monitor_window_rows", "Rows in the last judged window"),
            "rate": gauge("scoring_monitor_band_rate", "Share of the last window's rows in "
                          "each decision band", ["band"]),
            "feature_psi": gauge("scoring_monitor_feature_psi", "PSI of the last window "
                                 "against the reference, by feature", ["feature"]),
            "missing_rate": gauge("scoring_monitor_feature_missing_rate", "Share of the last "
                                  "window's rows missing the feature", ["feature"]),
            "out_of_range_rate": gauge("scoring_monitor_feature_out_of_range_rate", "Share "
                                       "of the last window's rows outside the reference's "
                                       "range", ["feature"]),
            "score_psi": gauge("scoring_monitor_score_psi", "PSI of the last window's scores "
                               "against the reference"),
        }
        for mon in self.current():
            _collect(mon, fams)
        yield from fams.values()


def _collect(mon: Monitor, f: dict) -> None:
    p, names, role = mon.profile, mon.model.feature_names, mon.role
    for b, n in enumerate(mon.total_bands.tolist()):
        f["bands"].add_metric([role, str(b)], n)
    if p is not None:
        for j, name in enumerate(names):
            m = int(p.n_edges[j])
            row = mon.total[j].tolist()
            for b in range(m + 1):
                f["bins"].add_metric([role, name, str(b)], row[b])
            f["bins"].add_metric([role, name, "missing"], row[m + 1])
            f["out"].add_metric([role, name, "below"], row[m + 2])
            f["out"].add_metric([role, name, "above"], row[m + 3])
            f["ref"].add_metric([role, name], float(p.fractions[j, m + 1]))
    if mon.total_scores is not None:
        for b, n in enumerate(mon.total_scores.tolist()):
            f["scores"].add_metric([role, str(b)], n)
    last = mon.last
    if last is None:
        return
    f["rows"].add_metric([role], last["rows"])
    for b, v in enumerate(last["band_rates"]):
        f["rate"].add_metric([role, str(b)], v)
    if "feature_psi" not in last:
        return
    for key in ("feature_psi", "missing_rate", "out_of_range_rate"):
        for name, v in last[key].items():
            f[key].add_metric([role, name], v)
    f["score_psi"].add_metric([role], last["score_psi"])
