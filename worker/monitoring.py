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

from . import _kernels
from .model import reference as R

log = structlog.get_logger("worker.monitoring")


def enabled(model, settings) -> bool:
    on = settings.monitoring.enabled
    return model.reference is not None if on is None else bool(on)


def count(model, X, score: np.ndarray, into) -> None:
    """Add rows ``X`` (the gathered row block or column descriptors) and their ``score`` to
    ``into`` (a BatchStats): feature counts and score bins against the model's profile."""
    p = model.reference
    if p is None:
        return
    cols = X if isinstance(X, _kernels.Columns) else _kernels.Columns.from_numpy(X)
    if into.monitor is None:
        into.monitor = p.new_counts()
        into.score_bins = np.zeros(len(p.score_edges) + 1, np.int64)
    from . import _monitor

    _monitor.count_bins(cols, p.edges, p.n_edges, p.lo, p.hi, into.monitor)
    into.score_bins += R.score_bins(score, p.score_edges)


class Monitor:
    """One model's window and totals; a swap makes a new one (its reference applies)."""

    def __init__(self, model, settings, clock=time.monotonic):
        self.model = model
        self.profile = model.reference
        self.cfg = settings.monitoring
        self.thresholds = list(settings.scoring.thresholds)
        self.clock = clock
        p = self.profile
        self.total = p.new_counts() if p is not None else None
        self.total_scores = np.zeros(len(p.score_edges) + 1, np.int64) if p else None
        self.total_bands = np.zeros(len(self.thresholds) + 1, np.int64)
        self.last: dict | None = None  # the last judged window's figures
        self._open()

    def _open(self) -> None:
        p = self.profile
        self.started = self.clock()
        self.window = p.new_counts() if p is not None else None
        self.window_scores = np.zeros(len(p.score_edges) + 1, np.int64) if p else None
        self.window_bands = np.zeros(len(self.thresholds) + 1, np.int64)
        self.window_rows = 0

    def add(self, stats) -> dict | None:
        """A batch's counts; the window's figures when this closed one (else None)."""
        if stats.monitor is not None and self.window is not None and \
                stats.monitor.shape == self.window.shape:
            self.window += stats.monitor
            self.total += stats.monitor
            self.window_scores += stats.score_bins
            self.total_scores += stats.score_bins
        for band, n in stats.decisions.items():
            if 0 <= band < len(self.window_bands):
                self.window_bands[band] += n
                self.total_bands[band] += n
        self.window_rows += stats.rows
        return self.tick()

    def tick(self) -> dict | None:
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
               "model_id": self.model.model_id, "band_rates": bands.tolist()}
        if p is not None:
            names = self.model.feature_names
            psi = R.feature_psi(self.window, p)
            rows = self.window[np.arange(len(names)), p.n_edges + 1]  # missing
            counted = self.window[0, :p.n_edges[0] + 2].sum() if len(names) else 0
            missing = rows / max(int(counted), 1)
            out_range = (self.window[np.arange(len(names)), p.n_edges + 2] +
                         self.window[np.arange(len(names)), p.n_edges + 3]) / \
                max(int(counted), 1)
            score_psi = R.psi(self.window_scores, p.score_fractions)
            ref_missing = p.fractions[np.arange(len(names)), p.n_edges + 1]
            out.update(feature_psi=dict(zip(names, psi.tolist(), strict=True)),
                       missing_rate=dict(zip(names, missing.tolist(), strict=True)),
                       out_of_range_rate=dict(zip(names, out_range.tolist(), strict=True)),
                       score_psi=score_psi)
            alert = self.cfg.alert_psi
            for j, name in enumerate(names):
                if psi[j] >= alert:
                    log.warning("feature drift", feature=name, psi=round(float(psi[j]), 4),
                                threshold=alert, rows=n)
                if missing[j] - ref_missing[j] >= self.cfg.alert_missing_jump:
                    log.warning("missing rate jump", feature=name,
                                missing_rate=round(float(missing[j]), 4),
                                reference=round(float(ref_missing[j]), 4), rows=n)
            if not math.isnan(score_psi) and score_psi >= alert:
                log.warning("score drift", psi=round(score_psi, 4), threshold=alert, rows=n)
        self.last = out
        return out


class Collector:
    """The monitor's figures for Prometheus, read at scrape from the loop's current monitor:
    cumulative counts (counters) and the last judged window (gauges). Labels are bounded by
    the model's features and bins."""

    def __init__(self, current):
        self.current = current  # () -> Monitor | None

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        mon = self.current()
        if mon is None:
            return
        p, names = mon.profile, mon.model.feature_names
        bands = CounterMetricFamily("scoring_monitor_band_rows", "Scored rows by decision band "
                                    "(monitoring)", labels=["band"])
        for b, n in enumerate(mon.total_bands.tolist()):
            bands.add_metric([str(b)], n)
        yield bands
        if p is not None:
            bins = CounterMetricFamily("scoring_monitor_feature_bin_rows", "Scored rows by "
                                       "feature and reference bin ('missing': NaN, null, an "
                                       "unknown category)", labels=["feature", "bin"])
            out = CounterMetricFamily("scoring_monitor_feature_out_of_range_rows", "Scored "
                                      "values outside the reference's range, by feature and "
                                      "side", labels=["feature", "side"])
            for j, name in enumerate(names):
                m = int(p.n_edges[j])
                row = mon.total[j].tolist()
                for b in range(m + 1):
                    bins.add_metric([name, str(b)], row[b])
                bins.add_metric([name, "missing"], row[m + 1])
                out.add_metric([name, "below"], row[m + 2])
                out.add_metric([name, "above"], row[m + 3])
            yield bins
            yield out
            ref = GaugeMetricFamily("scoring_monitor_feature_reference_missing_rate",
                                    "Share of the reference rows missing the feature",
                                    labels=["feature"])
            for j, name in enumerate(names):
                ref.add_metric([name], float(p.fractions[j, p.n_edges[j] + 1]))
            yield ref
            sb = CounterMetricFamily("scoring_monitor_score_bin_rows", "Scored rows by "
                                     "reference score bin", labels=["bin"])
            for b, n in enumerate(mon.total_scores.tolist()):
                sb.add_metric([str(b)], n)
            yield sb
        last = mon.last
        if last is None:
            return
        g = GaugeMetricFamily("scoring_monitor_window_rows", "Rows in the last judged window")
        g.add_metric([], last["rows"])
        yield g
        g = GaugeMetricFamily("scoring_monitor_band_rate", "Share of the last window's rows "
                              "in each decision band", labels=["band"])
        for b, v in enumerate(last["band_rates"]):
            g.add_metric([str(b)], v)
        yield g
        if "feature_psi" not in last:
            return
        for key, metric, help_ in (
                ("feature_psi", "scoring_monitor_feature_psi", "PSI of the last window "
                 "against the reference, by feature"),
                ("missing_rate", "scoring_monitor_feature_missing_rate", "Share of the last "
                 "window's rows missing the feature"),
                ("out_of_range_rate", "scoring_monitor_feature_out_of_range_rate", "Share of "
                 "the last window's rows outside the reference's range")):
            g = GaugeMetricFamily(metric, help_, labels=["feature"])
            for name, v in last[key].items():
                g.add_metric([name], v)
            yield g
        g = GaugeMetricFamily("scoring_monitor_score_psi", "PSI of the last window's scores "
                              "against the reference")
        g.add_metric([], last["score_psi"])
        yield g
