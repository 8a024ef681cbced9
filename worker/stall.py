"""A stalled worker that looks stalled (issue 53).

The loop can go on turning while nothing moves: a partition's leader does not answer (the
consumer fetches nothing, its cached high watermark stays where it was and the lag read 0),
or the batch in flight waits on its commit. ``StallWatch`` runs beside the loop: every
``lag_every_s`` it asks the brokers for each owned partition's end (the last stable offset, one
ListOffsets through an admin client of its own, never the consumer's cache) and sets the lag
gauges (a partition whose end does not come has no lag: never a 0 it does not know;
``scoring_consumer_lag_unknown`` counts them). The worker waits on something when input came
that no batch has taken (a partition's end moved since the last completed batch: a lag alone
is not input waiting, since transaction markers and aborted records keep a caught-up lag above
0), an end does not come, partitions were lost and not assigned again, or a delivery is in
progress. Waiting, and no batch completed for ``health.stall_after_s``: /readyz 503,
``scoring_stalled`` 1, one log line naming what it waits on; one more when a batch completes
or nothing is waited on any longer.
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
        self.pending = pending  # () -> True while a batch is being delivered or committed
        self.period_s, self.lag_every_s = period_s, lag_every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lags: dict[str, int] = {}
        self.ends: dict[str, int] = {}
        self.unknown: list[str] = []
        self._lag_at = 0.0
        # each partition's end when the last batch completed (input since: waiting)
        self._ends_at_batch: dict[str, int] = {}
        self._batch_seen = None
        self.since: float | None = None  # the stall's start (wall clock), while stalled
        self._last = 0.0  # the last batch's completion when the stall began
        self._failed_at = 0.0  # the last "could not read" warning (one a minute)

    def start(self) -> StallWatch:
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Before the consumer closes; bounded (a query in flight ends within its timeout,
        the thread is a daemon)."""
        self._stop.set()
        if self._thread is not None:
            # past a stop's grace the brokers did not answer: a query in flight is not waited
            # for (the worker exits within delivery.stop_timeout_ms + 2 s)
            late = getattr(self.source, "stopping", None)
            self._thread.join(0.2 if callable(late) and late() else 4)
        if hasattr(self.source, "close_probe"):
            self.source.close_probe()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.check(time.time())
            except Exception as exc:  # noqa: BLE001 (the watch never stops the worker)
                now = time.time()
                if now - self._failed_at > 60:
                    self._failed_at = now
                    log.warning("the stall watch could not read the lag", error=str(exc)[:200])
                self.unknown = ["(the lag query failed)"]

    def check(self, now: float) -> None:
        m = self.metrics
        if getattr(self.source, "closing", False):
            return
        if now - self._lag_at >= self.lag_every_s or self.since is not None:
            self.lags, self.ends, self.unknown = self.source.fresh_lag()
            self._lag_at = now
            m.consumer_lag.clear()
            for part, lag in self.lags.items():
                m.consumer_lag.labels(part).set(lag)
            m.lag_unknown.set(len(self.unknown))
        if self._batch_seen != m.completed_at:  # a batch completed: input so far is taken
            self._batch_seen = m.completed_at
            self._ends_at_batch = dict(self.ends)
        arrived = [p for p, end in self.ends.items()
                   if end > self._ends_at_batch.get(p, end) and self.lags.get(p, 1) > 0]
        lost = list(getattr(self.source, "lost", []) or [])
        waiting = bool(self.unknown) or bool(arrived) or bool(lost) or self.pending()
        idle_s = now - m.completed_at
        if self.since is None and waiting and idle_s >= self.stall_after_s:
            self.since = now
            self._last = m.completed_at
            m.stalled = True
            m.stalled_gauge.set(1)
            log.warning("stalled: no batch completed while input waits",
                        seconds=round(idle_s, 1), waiting_on=self.waiting_on(arrived, lost),
                        lag=sum(self.lags.values()), lag_unknown=self.unknown[:10])
        elif self.since is not None and (m.completed_at > self._last or not waiting):
            log.info("moving again", stalled_s=round(now - self.since, 1),
                     lag=sum(self.lags.values()))
            self.since = None
            m.stalled = False
            m.stalled_gauge.set(0)

    def waiting_on(self, arrived: list[str], lost: list[str]) -> str:
        if lost:
            return (f"the group's coordinator: {', '.join(lost[:5])} lost and not assigned "
                    "again")
        if self.unknown:
            return (f"the brokers leading {', '.join(self.unknown[:5])}"
                    + (f" and {len(self.unknown) - 5} more" if len(self.unknown) > 5 else "")
                    + " (their ends do not come)")
        if self.pending():
            return "the delivery of the batch in hand (its produce, transaction or offsets)"
        return (f"reading {', '.join(arrived[:5])}: input came (lag "
                f"{sum(self.lags.values())}) and no batch took it")
