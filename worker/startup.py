"""Start-up and shutdown: load the models, open the source and sink, serve metrics, run the
loop; signals (a thread of their own), the exit watchdog, and the exit codes (0 stopped or
done, 1 a dependency down or refused, 2 a configuration error, each one line)."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from functools import partial

import numpy as np
import structlog

from . import chaos, console
from .config import ConfigError, Settings, load_settings
from .io import FatalError, StartupError, open_sink, open_source
from .io.base import CredentialsRejected, NotAuthorized
from .loop import Worker
from .metrics import Metrics

log = structlog.get_logger("worker")


def configure_logging(level: str = "INFO", fmt: str = "console") -> None:
    import logging

    logging.basicConfig(level=getattr(logging, level), stream=sys.stderr, format="%(message)s")
    from . import kafkalog

    kafkalog.set_level(level)
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


# After a stop, the loop gives up on an absent broker after delivery.stop_timeout_ms; some
# librdkafka calls block longer than the timeout they are given (sending offsets to a
# transaction waits for its request, up to socket.timeout.ms, 60 s). So the process exits 0
# at the latest this long after the grace: what is open is uncommitted (a transaction the
# broker aborts, offsets the next owner reads from), so nothing is lost or doubled.
EXIT_MARGIN_S = 10.0
_watchdog = None


def _arm_exit_watchdog(after_s: float) -> None:
    import os
    import threading

    global _watchdog
    if _watchdog is not None:
        return

    def hard_exit():
        log.warning("still waiting for the broker after the stop's grace: exiting now, with "
                    "nothing more committed (an open transaction is aborted by the broker)",
                    waited_s=round(after_s, 1))
        sys.stderr.flush()
        os._exit(0)

    _watchdog = threading.Timer(after_s, hard_exit)
    _watchdog.daemon = True
    _watchdog.start()


class _StopDuringStartup(BaseException):
    """SIGTERM or SIGINT before the loop runs (Kubernetes stops starting pods too); a
    BaseException, so no ``except Exception`` of a start-up step swallows it."""


class _Signals:
    """SIGTERM and SIGINT, from the first line of start-up to the last commit. Python runs a
    signal handler only in the main thread, between bytecodes, so a main thread waiting in a
    librdkafka call (some ignore the timeout they are given) would not notice a stop. Here the
    interpreter's own C handler writes each signal to a socket (``signal.set_wakeup_fd``),
    read by a thread of its own, which calls ``on_stop`` at once. Before the loop runs, a stop
    interrupts the start-up instead (``_StopDuringStartup``, raised in the main thread: the
    start-up's waits are one-second attempts)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.on_stop = None
        self.on_startup_stop = None  # called (from the thread) for a stop before the loop runs
        self.pending = False
        self.armed = False  # the start-up can be interrupted (run's try is entered)
        self._closing = False

    def __enter__(self):
        import socket
        import threading

        self._handlers = {sig: signal.signal(sig, self._handler) for sig in self.SIGNALS}
        self._r, self._w = socket.socketpair()
        self._w.setblocking(False)
        self._old_fd = signal.set_wakeup_fd(self._w.fileno(), warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._wait, name="signals", daemon=True)
        self._thread.start()
        return self

    def _handler(self, *_args):
        if self.on_stop is None:  # start-up: stop it where it is
            self.pending = True
            if self.armed:  # else run's start-up reads pending as soon as it can be stopped
                raise _StopDuringStartup
        # the loop runs: the thread has been told through the socket

    def _wait(self):
        wanted = {int(s) for s in self.SIGNALS}
        while True:
            try:
                data = self._r.recv(64)
            except OSError:
                return
            if not data or self._closing:
                return
            if wanted.intersection(data):
                # first the flag, then the callback: _run sets the callback, then reads the
                # flag, so a stop as the loop is being set up is never lost
                self.pending = True
                if self.on_stop is not None:
                    self.on_stop()
                elif self.on_startup_stop is not None:
                    self.on_startup_stop()

    def __exit__(self, *exc):
        self._closing = True
        signal.set_wakeup_fd(self._old_fd)
        self._w.close()  # ends the thread's recv
        self._thread.join(1.0)
        self._r.close()
        for sig, handler in self._handlers.items():
            if signal.getsignal(sig) == self._handler:
                signal.signal(sig, handler)


stopped_by_signal = False  # the last run ended by SIGTERM/SIGINT (replay then compares nothing)


def run(settings: Settings, summary: bool = True) -> int:
    """Start, run until stopped, summarize; the process exit code. A stop requested during
    start-up (while a coordinator loads, say) ends it there with exit 0: nothing was read."""
    global _watchdog, stopped_by_signal
    configure_logging(settings.logging.level, settings.logging.format)
    with _Signals() as signals:
        chaos.install()
        try:
            # a stop during start-up unwinds it (closing what was opened) within the same
            # bound as a stop of the loop
            signals.on_startup_stop = partial(_arm_exit_watchdog,
                                              settings.delivery.stop_timeout_ms / 1000
                                              + EXIT_MARGIN_S)
            signals.armed = True
            # a stop as the handlers were being installed, or while the modules loaded whose
            # SystemExit CPython lost (worker/cli.py), ends the start-up here
            if signals.pending or sys.modules[__package__].stop_requested_while_loading:
                raise _StopDuringStartup
            return _run(settings, summary, signals)
        except _StopDuringStartup:
            log.info("stopped during start-up")
            return 0
        finally:
            stopped_by_signal = signals.pending
            if _watchdog is not None:  # the run ended in time: no hard exit later
                _watchdog.cancel()
                _watchdog = None


SHOWN_FEATURES = 64  # features the start-up log names one a line (more: a summary line)


def _show_contract(rows) -> None:
    """Where each feature comes from, in the log (``--explain-config`` prints the table)."""
    if len(rows) <= SHOWN_FEATURES:
        for r in rows:
            log.info("input", feature=r.feature, source=r.source, kind=r.kind,
                     required=r.required, cast=r.cast)
        return
    log.info("input contract", features=len(rows), required=sum(r.required for r in rows),
             optional=[r.feature for r in rows if not r.required][:20],
             casts={r.feature: r.cast for r in rows if r.cast},
             listed_by="scoring-worker --config FILE --explain-config")


def _run(settings: Settings, summary: bool, signals: _Signals) -> int:
    from .lifecycle import identity
    from .model.artifact import ArtifactError
    from .model.compiled import load_model

    seen = identity(settings.model.path)  # before loading: a change from here is noticed
    try:
        model = load_model(settings.model.path)
    except FileNotFoundError:
        print(f"config error: model.path: {settings.model.path} does not exist", file=sys.stderr)
        return 2
    except ArtifactError as exc:
        print(f"config error: model.path: {exc}", file=sys.stderr)
        return 2
    try:  # the events' fields as this model reads them (source.fields, scoring.id_column)
        from . import contract

        _show_contract(contract.rows(model, settings))
    except ValueError as exc:
        print(f"config error: {exc}", file=sys.stderr)
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
    shadow = None
    if settings.model.shadow_path:
        shadow_seen = identity(settings.model.shadow_path)
        try:
            shadow = load_model(settings.model.shadow_path)
            from .lifecycle import verify

            verify(shadow, model, settings, events=False)  # it scores the live columns
            missing = [f for f in shadow.feature_names if f not in set(model.feature_names)]
            if missing:  # the columns decoded are the live model's
                raise ValueError("it reads features the live model does not: "
                                 + ", ".join(missing[:10]))
        except FileNotFoundError:
            print(f"config error: model.shadow_path: {settings.model.shadow_path} does not "
                  "exist", file=sys.stderr)
            return 2
        except ArtifactError as exc:
            print(f"config error: model.shadow_path: {exc}", file=sys.stderr)
            return 2
        except Exception as exc:  # noqa: BLE001 (lifecycle.ModelRefused: features, probe)
            print(f"config error: model.shadow_path: {exc}", file=sys.stderr)
            return 2
    metrics = Metrics()
    with contextlib.ExitStack() as stack:
        # every start-up error is one line: exit 2 for what the configuration names (a file
        # that is not a recording, an unknown librdkafka property, a busy port), exit 1 for a
        # dependency that is down
        if "kafka" in (settings.source.type, settings.sink.type):
            log.info("kafka settings", **settings.kafka.masked())  # secrets as '***'
            for warning in settings.kafka.warnings():
                log.warning(warning)
        try:
            source = open_source(settings)
            stack.callback(source.close)
            sink = open_sink(settings)
            stack.callback(sink.close)
        except StartupError as exc:
            line = f"{'config error' if exc.exit_code == 2 else 'error'}: {exc}"
            if settings.logging.format == "json":  # one JSON line among JSON lines
                log.error(line, field=exc.field, exit_code=exc.exit_code)
            else:
                print(line, file=sys.stderr)
            return exc.exit_code
        except ConfigError as exc:  # a secret file that went away since the config was read
            print(exc, file=sys.stderr)
            return 2
        except NotAuthorized as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
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
        if signals.pending:  # a stop whose _StopDuringStartup CPython lost: end here
            raise _StopDuringStartup
        progress = stack.enter_context(console.progress(settings, source))
        worker = Worker(settings, model, source, sink, metrics, progress)

        def on_stop():
            worker.stop()
            _arm_exit_watchdog(settings.delivery.stop_timeout_ms / 1000 + EXIT_MARGIN_S)

        signals.on_stop = on_stop
        if signals.pending:  # a stop that came as the loop was being set up
            on_stop()
        metrics.model_info.labels(model.model_id, "live").set(1)
        if shadow is not None:
            worker.shadow_topic = (settings.sink.shadow_topic if settings.sink.type == "kafka"
                                   else "shadow")
            worker.pipeline.set_shadow(shadow, worker.shadow_topic)
            metrics.model_info.labels(shadow.model_id, "shadow").set(1)
        if settings.model.reload:
            from .lifecycle import ModelWatcher

            worker.watcher = ModelWatcher(settings.model.path, model, settings, metrics,
                                          seen=seen).start()
            stack.callback(worker.watcher.stop)
            if shadow is not None:
                worker.shadow_watcher = ModelWatcher(settings.model.shadow_path, shadow,
                                                     settings, metrics, role="shadow",
                                                     seen=shadow_seen).start()
                stack.callback(worker.shadow_watcher.stop)
        log.info("worker started", model_id=model.model_id[:12], model=settings.model.path,
                 layout=model.layout, kernel=model.kernel,
                 chosen=model.kernel_choice["by"], source=settings.source.type,
                 sink=settings.sink.type,
                 delivery=settings.delivery.mode, lazy=settings.scoring.lazy.mode)
        if settings.scoring.lazy.mode != "off" and model.kernel != "walk":
            log.info("the lazy policy walks the trees (this model's kernel for full "
                     "evaluation, QuickScorer or the oblivious kernel, evaluates every tree "
                     "at once)",
                     kernel=model.kernel, lazy=settings.scoring.lazy.mode)
        _warm_pyarrow()
        t0 = time.perf_counter()
        try:
            rc = worker.run()
        except (NotAuthorized, CredentialsRejected) as exc:  # one line: the permission, the
            print(f"error: {exc}", file=sys.stderr)          # credentials
            return 1
        except FatalError as exc:
            log.error("fatal Kafka error: exiting for a restart", error=str(exc))
            return 1
        elapsed = time.perf_counter() - t0
    t = worker.totals
    log.info("worker stopped", records=t.rows, messages=t.messages,
             dead_letters=sum(t.dead.values()), seconds=round(elapsed, 4),
             audit_rows=t.audit_rows, audit_disagreements=t.audit_disagreements)
    if summary and settings.sink.type == "file":
        console.print_summary(settings, model, worker, elapsed)
    return rc


def _warm_pyarrow() -> None:
    """pyarrow imports pandas (when installed) the first time it converts a Python list
    (``pa.array``: is it pandas-like?); a third of a second that would otherwise stall the
    first batch (the sinks build their records that way). Done before the loop starts."""
    import pyarrow as pa

    pa.array([b""], type=pa.binary())


def _startup_error(field: str, exc: BaseException) -> int:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"config error: {field}: {text}", file=sys.stderr)
    return 2
