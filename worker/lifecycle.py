"""Model hot swap: watch ``model.path``, load and verify a new artifact away from the run loop,
hand it over to be swapped in between two batches.

The watcher polls the file's identity (device, inode, size, modification time; following a
symlink, as Kubernetes volumes swap theirs) every ``model.reload_interval_ms``. A change that
holds still for one more poll is loaded (the artifact's checksum refuses a file still being
written), checked (the running model's feature names cover the new one's, unless
``model.allow_feature_change``), probed on hostile rows with the configured lazy policy and
thresholds, and warmed up; then ``take()`` hands it to the loop, which swaps it in between two
batches. A refused file leaves the running model in place, is logged with its reason and
counted, and is not tried again until it changes.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import structlog

log = structlog.get_logger("worker.model")

PROBE_VALUES = (0.0, -0.0, np.nan, np.inf, -np.inf, 1e30, -1e30, 1.0, -1.0, 0.5)


class ModelRefused(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def identity(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def verify(candidate, running, settings, events: bool = True) -> None:
    """Raise ModelRefused unless ``candidate`` can replace ``running`` under ``settings``
    (``events``: it reads the source's events itself, as the live model of the worker does;
    a shadow scores the live model's columns, and serve reads no events)."""
    if not settings.model.allow_feature_change:
        new = [f for f in candidate.feature_names if f not in set(running.feature_names)]
        if new:
            raise ModelRefused("feature_change", "features the running model does not read "
                               f"(set model.allow_feature_change): {', '.join(new[:10])}")
    if events:  # the events' fields as the candidate reads them (a feature named like the id)
        from .pipeline import reader_for

        try:
            reader_for(candidate, settings, strict=False)
        except ValueError as exc:
            raise ModelRefused("fields", str(exc)) from None
    from .contract import check_scores

    try:  # thresholds (and explain.min_score) that cannot band its scores, as at start-up
        check_scores(candidate, settings.scoring)
    except ValueError as exc:
        raise ModelRefused("thresholds", str(exc)) from None
    # probe rows: every value the wire may carry, in every feature, through the configured
    # lazy policy and thresholds (as the start-up check does)
    n = candidate.n_features
    X = np.empty((len(PROBE_VALUES) + 1, n), dtype=np.float32)
    for i, v in enumerate(PROBE_VALUES):
        X[i] = v
    X[-1] = np.linspace(-3, 3, n, dtype=np.float32)
    lazy = settings.scoring.lazy
    try:
        r = candidate.score_batch(X, lazy=lazy.mode, thresholds=settings.scoring.thresholds,
                                  n_threads=1, **lazy.params)
    except Exception as exc:  # noqa: BLE001 (refused, with the reason)
        raise ModelRefused("probe_failed", f"{type(exc).__name__}: {exc}") from None
    if len(r.score) != len(X) or np.isnan(r.score).any():
        raise ModelRefused("probe_failed", "the probe rows did not all score")


class ModelWatcher:
    """Background watcher of one artifact path (see the module docstring)."""

    def __init__(self, path: str, running, settings, metrics=None, role: str = "live",
                 seen=None, events: bool | None = None):
        self.path, self.settings, self.metrics, self.role = path, settings, metrics, role
        # whether its models read the source's events (verify): the worker's live model
        self.events = role == "live" if events is None else events
        self.interval = settings.model.reload_interval_ms / 1000
        self.running_id = running.model_id
        self._running = running
        # what is loaded (or was refused): the identity read before ``running`` was loaded,
        # so a file replaced during start-up is still noticed
        self._seen = seen if seen is not None else identity(path)
        self._ready = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"model-watch-{role}",
                                        daemon=True)

    def start(self) -> ModelWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def take(self):
        """The verified, warmed-up model waiting to be swapped in (once), or None."""
        model, self._ready = self._ready, None
        if model is not None:
            self._running = model
            self.running_id = model.model_id
        return model

    def _loop(self):
        pending = None
        while not self._stop.wait(self.interval):
            ident = identity(self.path)
            if ident is None or ident == self._seen or self._ready is not None:
                pending = None
                continue
            if ident != pending:  # changed: load once it holds still for one more poll
                pending = ident
                continue
            pending = None
            self._seen = ident
            self._try(ident)

    def _try(self, ident) -> None:
        from .model.artifact import ArtifactError
        from .model.compiled import load_model

        t0 = time.perf_counter()
        try:
            try:
                candidate = load_model(self.path)
            except (ArtifactError, OSError, ValueError) as exc:
                raise ModelRefused("unreadable", str(exc).splitlines()[0]) from None
            if candidate.model_id == self.running_id and \
                    candidate.kernel == getattr(self._running, "kernel", candidate.kernel) and \
                    candidate.meta.get("reference") == getattr(
                        self._running, "meta", {}).get("reference"):
                # the same artifact, rewritten (a new kernel choice is a swap, and so is a new
                # reference profile: the same model, judged against other data)
                return
            verify(candidate, self._running, self.settings, events=self.events)
            # warm up: the kernels' first batch, off the loop
            warm = np.zeros((256, candidate.n_features), dtype=np.float32)
            candidate.score_batch(warm, thresholds=self.settings.scoring.thresholds)
        except Exception as exc:  # noqa: BLE001 (the watcher thread never dies)
            if not isinstance(exc, ModelRefused):
                exc = ModelRefused("probe_failed", f"{type(exc).__name__}: {exc}")
            log.warning("model refused: the running model stays", role=self.role,
                        path=self.path, reason=exc.reason, detail=exc.detail,
                        running=self.running_id[:12])
            if self.metrics is not None:
                self.metrics.model_refusals.labels(self.role, exc.reason).inc()
            return
        log.info("model verified: swapping it in at the next batch boundary", role=self.role,
                 model_id=candidate.model_id[:12], load_ms=round(
                     (time.perf_counter() - t0) * 1000, 1))
        self._ready = candidate
