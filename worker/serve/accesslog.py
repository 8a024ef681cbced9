"""``serve``'s request lines (issue 52): every request with ``serve.access_log: true``; by
default only the answers that went wrong (4xx and 5xx; not a health probe's 503), at most
ERRORS_PER_S a second, the rest counted and said with the next line logged
(``errors_not_logged``).

A line names the method, the path (as sent, at most PATH_MAX characters, control characters
escaped: a request cannot forge log lines), the status, the answer's bytes, the time from the
request's end to its answer, the client's address and, for an error, the error the client was
told. Nothing of the request's body is logged."""

from __future__ import annotations

import time

import orjson
import structlog

log = structlog.get_logger("worker.serve")

ERRORS_PER_S = 10
PATH_MAX = 200
ERROR_MAX = 300


def _text(raw, limit: int) -> str:
    s = raw.decode("latin-1") if isinstance(raw, (bytes, bytearray, memoryview)) else str(raw)
    s = s[:limit]
    if not s.isprintable():
        s = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in s)
    return s


def _error(body) -> str:
    """What an error answer told the client (its JSON ``error``), else its text."""
    if isinstance(body, str):
        return _text(body, ERROR_MAX)
    if not body or len(body) > 65536:
        return ""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return _text(bytes(body[:ERROR_MAX]), ERROR_MAX)
    return _text(str(doc.get("error", "")) if isinstance(doc, dict) else "", ERROR_MAX)


def _probe(path) -> bool:
    return bytes(path[:11]) == b"/v2/health/" if isinstance(path, (bytes, bytearray,
                                                                   memoryview)) else False


class AccessLog:
    def __init__(self, every: bool = False, clock=time.monotonic):
        self.every = every
        self.clock = clock
        self._second = -1
        self._this_second = 0
        self._dropped = 0  # error lines over the rate since one was said

    def said(self, method, path, status: int, nbytes: int, t0: float | None, peer,
             error=None) -> bool:
        """Log one answered request if it is to be (returns whether it was). ``t0``: when
        the request ended (time.perf_counter), ``peer``: (host, port), ``error``: the error
        answer's body or message."""
        failed = status >= 400
        if not self.every and (not failed or _probe(path)):
            return False  # (a readiness probe's 503 while starting or stalled is no error)
        if failed:
            second = int(self.clock())
            if second != self._second:
                self._second, self._this_second = second, 0
            if self._this_second >= ERRORS_PER_S:
                self._dropped += 1
                return False
            self._this_second += 1
        fields: dict = {"method": _text(method, 16), "path": _text(path, PATH_MAX),
                        "status": status, "bytes": nbytes}
        if t0 is not None:
            fields["ms"] = round((time.perf_counter() - t0) * 1000, 2)
        if isinstance(peer, (tuple, list)) and len(peer) >= 2:
            fields["client"] = f"{peer[0]}:{peer[1]}"
        if failed:
            fields["error"] = _error(error)
            if self._dropped:
                fields["errors_not_logged"], self._dropped = self._dropped, 0
        (log.warning if status >= 500 else log.info)("request", **fields)
        return True
