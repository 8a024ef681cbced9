"""A stalled worker that looks stalled (issue 53).

The loop can go on turning while nothing moves: a partition's leader does not answer (the
consumer fetches nothing, the cached high watermark stays where it was and the lag read 0),
or the batch in flight waits on its commit. ``StallWatch`` runs beside the loop: every
``period_s`` it asks the brokers for each owned partition's high watermark (never the cache),
sets the lag gauges (a partition whose watermark does not come has no lag: never a 0 it does
not know; ``scoring_consumer_lag_unknown`` counts them), and when no batch has completed for
``health.stall_after_s`` while input waits (a lag above 0, or a lag not known), says so:
/readyz 503, ``scoring_stalled`` 1, one log line naming what the worker waits on; and one when
a batch completes again.
"""

from __future__ import annotations

import threading
import time

import structlog

log = structlog.get_logger("worker")


class StallWatch:
    def __init__(self, source, metrics, stall_after_s: float, pending=lambda: False,
                 period_s: float = 1.0, lag_every_s: float = 5.0):
        self.source, self.metrics = source, metrics
        self.stall_after_s = stall_after_s
        self.pending = pending  # () -> True while a batch waits on its commit
        self.period_s, self.lag_every_s = period_s, lag_every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lags: dict[str, int] = {}
        self.unknown: list[str] = []
        self._lag_at = 0.0
        self.since: float | None = None  # the stall's start (wall clock), while stalled
        self._last = 0.0  # the last batch's completion when the stall began

    def start(self) -> StallWatch:
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Before the consumer closes (its calls from this thread must be over)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if hasattr(self.source, "close_probe") and (self._thread is None or
                                                     not self._thread.is_alive()):
            self.source.close_probe()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.check(time.time())
            except Exception as exc:  # noqa: BLE001 (the watch never stops the worker)
                log.warning("the stall watch could not read the lag", error=str(exc)[:200])

    def check(self, now: float) -> None:
        m = self.metrics
        if now - self._lag_at >= self.lag_every_s or self.since is not None:
            self.lags, self.unknown = self.source.fresh_lag()
            self._lag_at = now
            m.consumer_lag.clear()
            for part, lag in self.lags.items():
                m.consumer_lag.labels(part).set(lag)
            m.lag_unknown.set(len(self.unknown))
        lost = list(getattr(self.source, "lost", []) or [])
        waiting = bool(self.unknown) or any(v > 0 for v in self.lags.values()) or \
            self.pending() or bool(lost)
        idle_s = now - m.completed_at
        if self.since is None and waiting and idle_s >= self.stall_after_s:
            self.since = now
            self._last = m.completed_at
            m.stalled = True
            m.stalled_gauge.set(1)
            log.warning("stalled: no batch completed while input waits",
                        seconds=round(idle_s, 1), waiting_on=self.waiting_on(),
                        lag=sum(self.lags.values()), lag_unknown=self.unknown[:10])
        elif self.since is not None and (m.completed_at > self._last or not waiting):
            log.info("moving again", stalled_s=round(now - self.since, 1),
                     lag=sum(self.lags.values()))
            self.since = None
            m.stalled = False
            m.stalled_gauge.set(0)

    def waiting_on(self) -> str:
        lost = list(getattr(self.source, "lost", []) or [])
        if lost:
            return (f"the group's coordinator: {', '.join(lost[:5])} lost and not assigned "
                    "again")
        if self.unknown:
            return (f"the brokers leading {', '.join(self.unknown[:5])}"
                    + (f" and {len(self.unknown) - 5} more" if len(self.unknown) > 5 else "")
                    + " (their high watermarks do not come)")
        if self.pending():
            return "the commit of the batch in flight (its transaction or offsets)"
        busy = [p for p, v in self.lags.items() if v > 0]
        return (f"fetching {', '.join(busy[:5])}: lag {sum(self.lags.values())} and no "
                "message read (a partition leader, or the group's coordinator)")
