"""``serve``'s request lines (issue 52): every request with ``serve.access_log: true``; by
default only the answers that went wrong (4xx and 5xx; not a readiness probe's 503), at most
ERRORS_PER_S a second for the 4xx and as many for the 5xx (a flood of one does not hide the
other), the rest counted and said with the next line of their kind logged
(``errors_not_logged``).

A line names the method, the path (as sent, at most PATH_MAX characters, control characters
escaped: a request cannot forge log lines), the status, the answer's bytes, the time from the
request's end to its answer, the client's address and, for an error, the error the client was
told (which may quote a name the request gave, an input's or a datatype, at most ERROR_MAX
characters). No body, header or value is logged. Logging never fails an answer: a log that
cannot be written (a closed pipe, a full disk) drops the line."""

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


def _probe(path, status: int) -> bool:
    """A readiness or liveness probe told 503 (starting, swapping, stalled): no error."""
    return status == 503 and isinstance(path, (bytes, bytearray, memoryview)) and \
        bytes(path[:11]) == b"/v2/health/"


class AccessLog:
    def __init__(self, every: bool = False, clock=time.monotonic):
        self.every = every
        self.clock = clock
        # per kind (4: 4xx, 5: 5xx): [the second, lines said in it, lines over the rate]
        self._kinds = {4: [-1, 0, 0], 5: [-1, 0, 0]}

    def said(self, method, path, status: int, nbytes: int, t0: float | None, peer,
             error=None) -> bool:
        """Log one answered request if it is to be (returns whether it was); never raises.
        ``t0``: when the request ended (time.perf_counter), ``peer``: (host, port),
        ``error``: the error answer's body or message."""
        try:
            return self._said(method, path, status, nbytes, t0, peer, error)
        except Exception:  # noqa: BLE001 (a log that cannot be written never fails an answer)
            return False

    def _said(self, method, path, status, nbytes, t0, peer, error) -> bool:
        failed = status >= 400
        if not self.every and (not failed or _probe(path, status)):
            return False
        kind = None
        if failed:
            kind = self._kinds[5 if status >= 500 else 4]
            second = int(self.clock())
            if second != kind[0]:
                kind[0], kind[1] = second, 0
            if kind[1] >= ERRORS_PER_S:
                kind[2] += 1
                return False
            kind[1] += 1
        fields: dict = {"method": _text(method, 16), "path": _text(path, PATH_MAX),
                        "status": status, "bytes": nbytes}
        if t0 is not None:
            fields["ms"] = round((time.perf_counter() - t0) * 1000, 2)
        if isinstance(peer, (tuple, list)) and len(peer) >= 2:
            fields["client"] = f"{peer[0]}:{peer[1]}"
        if kind is not None:
            fields["error"] = _error(error)
            if kind[2]:
                fields["errors_not_logged"], kind[2] = kind[2], 0
        (log.warning if status >= 500 else log.info)("request", **fields)
        return True
