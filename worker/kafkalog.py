"""librdkafka's log lines through the worker's logger (issue 52): structured like every other
line (JSON with ``logging.format: json``), deduplicated and rate-limited, instead of raw
``%3|...|FAIL|...`` lines on stderr (a wrong broker address wrote 234-2,451 of them).

Every Kafka client the worker makes gets ``logger`` (``KafkaConfig.common``): confluent-kafka
then queues librdkafka's lines and hands them to this logger when the client is polled (an
idle sink's producer is polled by the loop's idle pass). Lines below the worker's log level
are dropped first. A line is keyed by its client, its facility and its text without what
varies from one repeat to the next (``after 12ms``, counts; addresses and broker names stay):
the first of a key is logged, repeats within REPEAT_S are counted and said with the next line
of that key after it (``repeated``). At most BURST lines in any WINDOW_S; past that they are
counted and the count said once lines flow again. librdkafka's note that a shared setting
(``kafka.client``) is the other kind of client's ("is a consumer property and will be ignored
by this producer instance") is a debug line: every client gets every setting by design.
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time

import structlog

log = structlog.get_logger("kafka")

REPEAT_S = 60.0  # a key's repeats within this are counted, not logged
BURST = 20  # lines at most in any WINDOW_S
WINDOW_S = 10.0
KEYS = 512  # keys remembered (the oldest forgotten first)
TEXT_MAX = 500  # characters of a line kept

# what varies between repeats of one line: durations, and numbers standing alone (not part of
# an address, a port, a broker's name or id)
_VARYING = re.compile(r"after \d+ms|(?<![\w.:/#\[-])\d+(?![\w.:/\]-])")
_OTHER_KIND = re.compile(r"is a (consumer|producer) property and will be ignored")


class Bridge(logging.Handler):
    def __init__(self, clock=time.monotonic):
        super().__init__(logging.DEBUG)
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: collections.OrderedDict = collections.OrderedDict()  # key -> [t, repeats]
        self._times: collections.deque = collections.deque()
        self._dropped = 0  # lines over the rate, not said yet

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fac, client, text = (record.args if isinstance(record.args, tuple)
                                 and len(record.args) == 3 else ("", "", record.getMessage()))
            text = str(text)[:TEXT_MAX]
            level = record.levelno
            if _OTHER_KIND.search(text):
                level = logging.DEBUG
            if level < self.level:  # below the worker's level: not counted against the rate
                return
            line = self.admit(str(fac), text, str(client))
            if line is None:
                return
            repeated, dropped = line
            fields = {"client": str(client), "facility": str(fac), "message": text}
            if repeated:
                fields["repeated"] = repeated
            if dropped:
                fields["suppressed_lines"] = dropped
            if level >= logging.WARNING:  # (librdkafka's errors are the client's own view:
                log.warning("librdkafka", **fields)  # the worker says what is fatal)
            elif level >= logging.INFO:
                log.info("librdkafka", **fields)
            else:
                log.debug("librdkafka", **fields)
        except Exception:  # noqa: BLE001 (a log line never breaks a client)
            self.handleError(record)

    def admit(self, facility: str, text: str, client: str = "") -> tuple[int, int] | None:
        """Whether this line is said now: (repeats of its key since it was last said, lines
        dropped by the rate limit since one was last said), or None."""
        now = self.clock()
        key = (client, facility, _VARYING.sub("#", text))
        with self._lock:
            entry = self._seen.get(key)
            if entry is not None and now - entry[0] < REPEAT_S:
                entry[1] += 1
                return None
            while self._times and now - self._times[0] >= WINDOW_S:
                self._times.popleft()
            if len(self._times) >= BURST:
                self._dropped += 1
                return None
            self._times.append(now)
            repeated = entry[1] if entry is not None else 0
            self._seen[key] = [now, 0]
            self._seen.move_to_end(key)
            while len(self._seen) > KEYS:
                self._seen.popitem(last=False)
            dropped, self._dropped = self._dropped, 0
            return repeated, dropped


_logger: logging.Logger | None = None


_level = logging.INFO


def set_level(level: str) -> None:
    """The worker's log level (logging.level): lines below it are dropped before counting."""
    global _level
    _level = getattr(logging, level.upper(), logging.INFO)
    if _logger is not None:
        for h in _logger.handlers:
            h.setLevel(_level)


def kafka_logger() -> logging.Logger:
    """The logger every Kafka client of this process is given (one bridge)."""
    global _logger
    if _logger is None:
        lg = logging.getLogger("scoring_worker.librdkafka")
        lg.setLevel(logging.DEBUG)
        lg.propagate = False
        bridge = Bridge()
        bridge.setLevel(_level)
        lg.addHandler(bridge)
        _logger = lg
    return _logger
