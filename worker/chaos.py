"""Pauses and stalls at chosen points of the loop, for the chaos suite (tests/chaos.py); inert
otherwise.

From outside, a test cannot tell where the loop is, so a pause cannot be aimed. With
``SCORING_WORKER_CHAOS`` naming a control file, SIGUSR1 reads it (``pause POINT`` or
``stall POINT SECONDS``) and arms that point; the next pass through it then

- *pause*: stops the whole process with SIGSTOP, as a GC pause, a frozen VM or CPU
  throttling would (librdkafka's threads stop too); the suite sees the process stopped and
  sends SIGCONT when the pause is over;
- *stall*: sleeps that long on the passing thread only, as a slow step would, while
  librdkafka's threads go on (heartbeats continue; ``max.poll.interval.ms`` runs out).

Unset (production), no handler is installed and a point costs one module-global test.

Points: ``poll`` (before a consume call), ``score`` (a batch decoded, before scoring),
``commit`` (the batch produced and its offsets sent, before the transaction commits or the
producer flushes; in the helper thread when commits overlap).
"""

from __future__ import annotations

import os
import signal
import time

import structlog

CONTROL = os.environ.get("SCORING_WORKER_CHAOS", "")
armed: tuple[str, str, float] | None = None  # (what, point, seconds) for the next pass


def _arm(*_args) -> None:
    global armed
    try:
        what, where, *rest = open(CONTROL).read().split()  # noqa: SIM115 (a few bytes)
        armed = (what, where, float(rest[0]) if rest else 0.0)
    except (OSError, ValueError):
        armed = None


def install() -> None:
    """Called once at start-up, on the main thread."""
    if CONTROL:
        signal.signal(signal.SIGUSR1, _arm)


def point(name: str) -> None:
    global armed
    if armed is not None and armed[1] == name:
        (what, _where, seconds), armed = armed, None
        structlog.get_logger("worker.chaos").warning(f"chaos: {what} at {name}",
                                                     seconds=seconds)
        if what == "pause":
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            time.sleep(seconds)
