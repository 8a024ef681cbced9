"""The run loop: collect a batch from the source (decoding each message as it arrives), hand
it to the pipeline, deliver its outputs through the sink and commit; rollbacks, splits, model
swaps and readiness between two batches. It knows no message format and no Kafka."""

from __future__ import annotations

import time

import numpy as np
import structlog

from . import monitoring
from .config import Settings
from .formats import InvalidMessage, Message
from .io import BatchRolledBack
from .io.records import Record
from .metrics import Metrics, observe_many
from .model.compiled import CompiledModel
from .monitoring import Monitor
from .pipeline import BatchStats, Pipeline
from .report import ScoreSample

log = structlog.get_logger("worker")


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
        # flight monitoring: the live model's window and totals, and the shadow's (None: off
        # or no profile); a swap of either starts its own anew (_sync_monitors)
        self.monitor: Monitor | None = None
        self.shadow_monitor: Monitor | None = None
        self.publisher = monitoring.Publisher(settings.producer_config(False),
                                              settings.monitoring.topic, self.metrics) \
            if settings.monitoring.topic else None
        self._sync_monitors()
        self.metrics.registry.register(monitoring.Collector(
            lambda: [m for m in (self.monitor, self.shadow_monitor) if m is not None]))
        self.totals = BatchStats()
        self.sample = ScoreSample()
        # messages polled past a batch bound, decoded, for the next batch
        self._held: list[tuple[Record, Message | InvalidMessage]] = []
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
        self._delivering = False  # a batch's delivery has begun and not ended

    def stop(self, *_args) -> None:
        if not self._stop:
            self._stop = True
            self._stop_deadline = (time.monotonic()
                                   + self.settings.delivery.stop_timeout_ms / 1000)

    def _give_up(self) -> bool:
        """A stop was asked for and its grace (delivery.stop_timeout_ms) has passed."""
        return self._stop and time.monotonic() >= self._stop_deadline

    def _collect(self) -> list[tuple[Record, Message | InvalidMessage]]:
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
                if isinstance(decoded, InvalidMessage):
                    n_rows, n_bytes = 0, len(rec.value or b"")
                else:
                    n_rows, n_bytes = decoded.rows, max(len(rec.value), decoded.nbytes)
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
        # a Kafka source: lag from the brokers and stalls said, beside the loop (issue 53)
        watch = None
        if hasattr(self.source, "fresh_lag"):
            from .stall import StallWatch

            m.completed()  # (the stall clock starts with the loop)
            watch = StallWatch(self.source, m, self.settings.health.stall_after_s,
                               pending=lambda: self._pending is not None or
                               self._delivering).start()
        try:
            while not self._stop:
                if self.watcher is not None and self.watcher._ready is not None:
                    self._swap(self.watcher.take())
                if self.shadow_watcher is not None and self.shadow_watcher._ready is not None:
                    self._swap_shadow(self.shadow_watcher.take())
                if watch is None:
                    now = time.time()
                    if now - last_lag > 5:  # lag of the partitions we own right now
                        m.consumer_lag.clear()
                        for part, lag in self.source.lag().items():
                            m.consumer_lag.labels(part).set(lag)
                        last_lag = now
                items = self._collect()
                if not items:
                    self._complete()  # idle: settle the batch in flight
                    if self._pending is None:
                        self._mark_ready()
                        idle = getattr(self.sink, "idle", None)
                        if idle is not None:
                            idle()  # (a Kafka sink serves its client's log lines)
                    if self.source.exhausted:
                        break
                    self._idle_monitors()
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
                self._delivering = True  # (the stall watch: a delivery in progress)
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
            if watch is not None:
                watch.stop()
            if committer is not None:
                if self._pending is not None and self._pending[1] is not None:
                    self._pending[1].result()  # an error escaped: the commit ends, unused
                    self._pending = None
                committer.shutdown(wait=True)
        for mon in (self.monitor, self.shadow_monitor):  # the last window, however short
            if mon is not None:
                try:
                    mon.close()
                except Exception as exc:  # noqa: BLE001 (the run's result stands)
                    log.error("flight monitoring's last window failed", error=str(exc)[:300])
        if self.publisher is not None:
            self.publisher.close()
        return 0

    def _monitor(self, stats: BatchStats) -> None:
        """A batch's counts to the monitors; a failure here stops monitoring, never the
        loop (counted in scoring_monitor_errors)."""
        errors = stats.monitor_errors
        try:
            self._sync_monitors()
            for mon in (self.monitor, self.shadow_monitor):
                if mon is not None:
                    mon.add(stats)
        except Exception as exc:  # noqa: BLE001
            errors += 1
            log.error("flight monitoring stops", error=str(exc)[:300])
            self.monitor = self.shadow_monitor = None
            self.pipeline.monitor_on = False
            self.pipeline.monitoring = self.pipeline.monitoring_shadow = False
        if errors:
            self.metrics.monitor_errors.inc(errors)

    def _idle_monitors(self) -> None:
        """Nothing to score: the monitors' windows still end on time."""
        try:
            for mon in (self.monitor, self.shadow_monitor):
                if mon is not None:
                    mon.tick()
        except Exception as exc:  # noqa: BLE001 (monitoring never stops the loop)
            log.error("flight monitoring stops", error=str(exc)[:300])
            self.monitor = self.shadow_monitor = None
            self.pipeline.monitor_on = False
            self.pipeline.monitoring = self.pipeline.monitoring_shadow = False
            self.metrics.monitor_errors.inc()

    def _sync_monitors(self) -> None:
        """A monitor for the live model and one for the shadow, each of the model scoring
        now: one of a model swapped out is judged on what it saw and replaced."""
        live = self.model if self.pipeline.monitor_on else None
        sh = self.pipeline.shadow
        shadow = sh.model if sh is not None and self.pipeline.monitor_on else None
        for attr, model, role in (("monitor", live, "live"),
                                  ("shadow_monitor", shadow, "shadow")):
            mon = getattr(self, attr)
            if mon is not None and mon.model is model:
                continue
            if mon is not None:
                mon.close()
            mon = Monitor(model, self.settings, role) if model is not None else None
            if mon is not None:
                monitoring.announce(model, self.settings, role)
            if mon is not None and self.publisher is not None:
                mon.on_window = self.publisher.publish
            setattr(self, attr, mon)

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
        self._sync_monitors()  # the new model's reference applies from its first batch
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
        self._delivering = False
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
        self._delivering = False
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
        m.completed()
        m.messages_in.inc(stats.messages)
        m.records_in.inc(stats.rows_in)
        m.records_out.inc(stats.rows)
        for reason, n in stats.dead.items():
            m.dead_letters.labels(reason).inc(n)
        if stats.features:
            m.count_features(stats.features)
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
        self._monitor(stats)
        m.beat()
        for score, work in stats.scores:
            self.sample.add(score, work)
        stats.scores = []  # the run keeps its bounded sample, not every score
        self.totals.add(stats)
        self.totals.rows_in += stats.rows_in
        self.totals.messages += stats.messages
        self.totals.dead.update(stats.dead)
