"""Large JSON requests parsed in a process apart (issue 50): orjson holds the GIL for the whole
of a parse (~150 ms for 16 MiB of numbers), which would stop the loop's thread answering
anyone else. The parsing process gets the body through a pipe, piece by piece as it was read
(written from the buffers, the GIL released while they are), runs ``oip.parse_infer``, the
same code as in the server's process, and sends back only what a request is (its rows as
float32, its outputs); only that is unpickled here."""

from __future__ import annotations

import multiprocessing
import threading

import structlog

from . import oip

log = structlog.get_logger("worker.serve")


def _main(conn) -> None:
    """The parsing process: (pieces, arguments), then the body's pieces, in; ("ok",
    request) or ("error", status, message) out; until the pipe closes."""
    while True:
        try:
            pieces, args = conn.recv()
            body = b"".join([conn.recv_bytes() for _ in range(pieces)])
        except (EOFError, OSError):
            return
        try:
            out = ("ok", oip.parse_infer(body, *args))
        except oip.RequestError as exc:
            out = ("error", exc.status, exc.message)
        except Exception as exc:  # noqa: BLE001 (answered 500 by the server, never raised)
            out = ("error", 500, f"internal error: {type(exc).__name__}")
        del body
        conn.send(out)


class Parser:
    """The parsing process, started on first use and again after it died; one request at a
    time."""

    def __init__(self):
        self._lock = threading.Lock()
        self._proc = None
        self._conn = None
        self._closed = False

    def parse(self, body: bytes | list, *args) -> oip.InferRequest:
        """``oip.parse_infer(body, *args)`` there; ``body``: bytes, or the pieces it was
        read in (written one after the other, never joined here)."""
        pieces = [body] if type(body) is bytes else body
        with self._lock:
            try:
                if self._proc is None or not self._proc.is_alive():
                    self._start()
                self._conn.send((len(pieces), args))
                for p in pieces:
                    self._conn.send_bytes(p)
                out = self._conn.recv()
            except (EOFError, OSError):
                log.warning("the JSON parsing process died: starting another")
                self._stop()
                raise oip.RequestError(503, "the request could not be parsed: try again") \
                    from None
        if out[0] == "ok":
            return out[1]
        raise oip.RequestError(out[1], out[2])

    def start(self) -> None:
        """Started ahead of the first large request (spawning takes a second of CPU)."""
        with self._lock:
            if self._proc is None:
                self._start()

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        conn, child = ctx.Pipe()
        proc = ctx.Process(target=_main, args=(child,), name="serve-json-parser", daemon=True)
        proc.start()  # (a second of CPU; close() may come meanwhile, from another thread)
        child.close()
        # kept once started: close() saw None, or the started process (a SIGTERM while it
        # started found it unstarted, and the shutdown failed: AttributeError, exit 1)
        self._conn, self._proc = conn, proc
        if self._closed:
            self.close()

    def _stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        self._proc = self._conn = None

    def close(self) -> None:
        """At shutdown: the process killed at once, not after the parse under way (a large
        request took the lock for half a minute, and SIGTERM waited for it); the parse
        waiting on it ends with 503."""
        self._closed = True
        proc = self._proc
        if proc is not None:
            proc.kill()
            proc.join(5)
