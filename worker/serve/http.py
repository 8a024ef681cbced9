"""HTTP/1.1 for ``scoring-worker serve``: uvicorn's httptools protocol (llhttp through httptools,
uvloop's loop), around ``Service.handle`` as an ASGI app.

uvicorn parses, frames and writes every request and answer (pipelining order, keep-alive,
HTTP/1.0, HEAD, ``Expect: 100-continue``). What it leaves to the application or does not bound,
``BoundedProtocol`` bounds; it counts and times, and parses or writes nothing of HTTP but its own
error answers (issue 50: the hand-written server this replaces had twelve faults):

- a connection past ``serve.max_connections`` is answered 503 and closed (counted, logged);
  the cap is kept below the process's open-file limit (``effective_max_connections``);
- a connection that sends nothing is closed after ``serve.request_timeout_ms``, a request not
  whole by then answered 408; an idle keep-alive connection closed after
  ``serve.keepalive_timeout_ms``, as is one whose answers are not read;
- request target over ``serve.max_header_bytes``: 414; request line and headers: 431; a Host
  not sent exactly once: 400; Upgrade and CONNECT: 400; a transfer coding but chunked: 501;
- a body over ``serve.max_body_bytes``: 413 from its Content-Length before any of it is read
  (and before a 100 Continue), or as soon as a chunked body passes it; bodies held by all
  connections together over ``serve.max_buffered_bytes``: 503;
- chunk extensions and trailer fields count against ``serve.max_header_bytes`` (431), and
  trailer fields are read and dropped: never headers (RFC 9110 6.5.1).

uvicorn's protocol is not a public API: the attributes used here are checked by a test, and
the version is pinned to a minor release in pyproject.toml.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from concurrent.futures import ThreadPoolExecutor

import httptools
import orjson
import structlog
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from .accesslog import AccessLog

log = structlog.get_logger("worker.serve")

LINGER_S = 2.0  # after an error answer: how long the rest of a request is read and dropped
LINGER_BYTES = 8 << 20  # and how much of it
REFUSED_LINGER = 64  # connections answered 503 at the cap still lingering; past it: reset
REFUSED_LINGER_S = 0.25  # and for how long
MAX_HEADER_LINES = 256
MAX_PIPELINED = 128  # requests read ahead of their answers; past it the connection is reset
SLACK = 64 << 10  # one read's worth beyond a bound before it is checked
CHUNK_FRAMING = 16  # bytes a chunk's size line and CRLFs may take ("ffffffff\r\n" + "\r\n")
BODY = "scoring_worker.body"  # the scope extension holding a request's body pieces
PIECE_BYTES = 64 << 10  # body reads smaller than this are joined into pieces of it
MIN_CHUNKS, MIN_CHUNK_BYTES = 4096, 64  # past 4,096 chunks, at least 64 bytes a chunk
RESERVED_FILES = 64  # descriptors kept for the model, metrics, logs and the loop itself

_REASONS = {400: "Bad Request", 408: "Request Timeout", 413: "Content Too Large",
            414: "URI Too Long", 431: "Request Header Fields Too Large",
            501: "Not Implemented", 503: "Service Unavailable"}


def error_bytes(status: int, message: str) -> bytes:
    body = orjson.dumps({"error": message})
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n" % (status, _REASONS[status].encode(), len(body))
            ) + body


def effective_max_connections(configured: int) -> int:
    """``serve.max_connections``, kept below the open-file limit: the soft limit is raised to
    the hard one first; past what is left (less RESERVED_FILES), connections would fail to be
    accepted unanswered and uncounted (issue 50, fault 9)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    room = max(1, soft - RESERVED_FILES) if soft != resource.RLIM_INFINITY else configured
    if configured > room:
        log.warning(f"serve.max_connections ({configured}) is more than the open-file limit "
                    f"allows ({soft} descriptors, {RESERVED_FILES} kept): {room} connections "
                    "at most (raise the limit, e.g. ulimit -n, to allow more)",
                    max_connections=room)
        return room
    return configured


class Bounds:
    """What every connection of one server shares: its limits and their counts."""

    def __init__(self, service, serve):
        self.service = service
        self.metrics = service.metrics
        self.max_body = serve.max_body_bytes
        self.max_header = serve.max_header_bytes
        self.request_timeout = serve.request_timeout_ms / 1000
        self.keepalive_timeout = serve.keepalive_timeout_ms / 1000
        self.max_connections = effective_max_connections(serve.max_connections)
        self.max_buffered = serve.max_buffered_bytes
        self.open = 0  # connections served (not those answered 503)
        self.refusing = 0  # connections answered 503, lingering
        self.buffered = 0  # request body bytes held, all connections
        self.refused_logged = 0.0
        # request lines: every request with serve.access_log, else 4xx/5xx at a bounded rate
        self.access = AccessLog(getattr(serve, "access_log", False))


def _settle(cycle) -> None:
    """A request's body let go: its bytes leave the server's count (once)."""
    held = getattr(cycle, "sw_held", None)
    if held is not None:
        cycle.sw_held = None
        bounds, n = held
        bounds.buffered -= n


class BoundedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with the bounds above."""

    bounds: Bounds  # set on the subclass a server makes (``protocol_for``)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.access_log = False
        self.closing = False
        self.served = False  # counted in bounds.open
        self.timer: asyncio.TimerHandle | None = None  # the request's (or silence's) deadline
        self.stall: asyncio.TimerHandle | None = None  # answers not read: dropped at this
        self.seen = 0  # bytes received since this request began
        self.body_size = 0
        self.chunks = 0
        self.header_bytes = 0
        self.header_lines = 0
        self.hosts = 0
        self.in_head = True
        self.head_done = False  # headers complete: what on_header gets now are trailers
        self.partial = 0  # the body being read: its bytes in bounds.buffered
        self.req_cycle = None  # the cycle made for the request being read
        self.linger = 0
        self.in_message = False
        self.pieces: list[bytes] = []  # the request's body, as read (small reads joined)
        self.small = bytearray()  # small reads, joined until PIECE_BYTES
        self.in_flight: list = []  # cycles made and not yet answered, in order
        self.deferred: tuple[int, str] | None = None  # an error answered after those
        self.eof = False  # the client closed its side: answer what it asked, then close

    # ---- the connection ------------------------------------------------------------------
    def connection_made(self, transport):
        b = self.bounds
        if b.open >= b.max_connections:
            self.transport = transport
            self.closing = True
            b.metrics.connections_refused.inc()
            now = self.loop.time()
            if now - b.refused_logged > 10:  # at most a line every 10 s
                b.refused_logged = now
                log.warning("connection refused: serve.max_connections are open",
                            max_connections=b.max_connections)
            if b.refusing >= REFUSED_LINGER:
                transport.abort()
                return
            b.refusing += 1
            self.served = None  # counted in bounds.refusing
            message = (f"serve.max_connections ({b.max_connections}) connections are open: "
                       "try again")
            transport.write(error_bytes(503, message))
            self._linger(REFUSED_LINGER_S)
            b.access.said(b"-", b"-", 503, 0, None, transport.get_extra_info("peername"),
                          message)
            return
        super().connection_made(transport)
        b.open += 1
        self.served = True
        b.metrics.connections.set(b.open)
        # a connection that sends nothing is held no longer than a request may take
        self.timer = self.loop.call_later(b.request_timeout, self._silent)

    def connection_lost(self, exc):
        b = self.bounds
        if self.served:
            b.open -= 1
            b.metrics.connections.set(b.open)
        elif self.served is None:
            b.refusing -= 1
        self.served = False
        self._drop_partial()
        for cycle, _ in self.pipeline:  # asked, never started: their bodies are let go
            _settle(cycle)
        for cycle in self.in_flight:
            cycle.disconnected = True
            cycle.message_event.set()
        for t in (self.timer, self.stall):
            if t is not None:
                t.cancel()
        self.timer = self.stall = None
        super().connection_lost(exc)

    def pause_writing(self):
        # answers the client does not read: dropped if it does not within the keep-alive
        # timeout (reading stops too: uvicorn pauses it while an answer waits)
        super().pause_writing()
        if self.stall is None:
            self.stall = self.loop.call_later(self.bounds.keepalive_timeout,
                                              self.transport.abort)

    def resume_writing(self):
        super().resume_writing()
        if self.stall is not None:
            self.stall.cancel()
            self.stall = None

    def _silent(self):
        # no request began within serve.request_timeout_ms: nothing asked, nothing answered
        self.timer = None
        if self.cycle is None or self.cycle.response_complete:
            self.transport.abort()

    def _too_slow(self):
        self.timer = None
        self._fail(408, "the request did not arrive within serve.request_timeout_ms")

    def _drop_partial(self) -> None:
        """The body being read is given up: its bytes leave the server's count."""
        if self.partial:
            self.bounds.buffered -= self.partial
            self.partial = 0
        self.pieces, self.small = [], bytearray()

    def eof_received(self):
        # the client closed its side after its requests: they are answered, then the
        # connection closed (uvicorn closed it at once, losing the answers being found)
        if self.in_flight and not self.in_message:
            self.eof = True
            return True
        return None

    def on_response_complete(self):
        if self.in_flight:
            self.in_flight.pop(0)  # answers complete in the order asked
        if self.timer is not None and not self.in_message:  # keep-alive's timer now
            self.timer.cancel()
            self.timer = None
        super().on_response_complete()
        if not self.in_flight:
            if self.deferred is not None:  # an error after the answers before it
                status, message = self.deferred
                self.deferred = None
                self._answer_error(status, message)
            elif self.eof:
                self.transport.close()

    def data_received(self, data: bytes):
        if self.closing:  # lingering after an error answer: what still comes is dropped
            self.linger += len(data)
            if self.linger > LINGER_BYTES:
                self.transport.abort()
            else:
                self._yield_loop()
            return
        self._unset_keepalive_if_required()
        self.seen += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            if not self.closing:
                self._fail(400, f"malformed HTTP request: {exc}")
        if self.closing:
            return
        if not self.in_head:
            self._yield_loop()
        if not self.in_message and self.timer is None and (
                self.cycle is None or self.cycle.response_complete):  # bytes that begin
            self.timer = self.loop.call_later(self.bounds.request_timeout, self._silent)  # none
        # httptools holds a header's (or trailer's) value until it ends, and reads chunk
        # extensions whatever their size: what is not body is bounded here, a read at a time
        b = self.bounds
        if self.in_head:
            if self.seen > b.max_header + SLACK:
                self._fail(431, "the request line and headers are larger than "
                                "serve.max_header_bytes")
        elif self.seen - self.body_size > 2 * b.max_header + SLACK + \
                CHUNK_FRAMING * self.chunks:
            self._fail(431, "chunk extensions and trailer fields are larger than "
                            "serve.max_header_bytes")

    def _yield_loop(self) -> None:
        """A body is read a read at a time: reading stops until the loop's next turn, so the
        other connections are served between (libuv reads up to 32 times a turn from one
        that keeps sending: eight clients streaming bodies made every other wait ~10 ms)."""
        flow = self.flow
        if flow is not None and not flow.read_paused:
            flow.pause_reading()
            self.loop.call_soon(self._resume_reading)

    def _resume_reading(self) -> None:
        if self.flow is not None and not self.transport.is_closing():
            self.flow.resume_reading()

    def _fail(self, status: int, message: str, route: str = "http") -> None:
        """Answer ``status`` and close the connection (what was read of it is unusable),
        after the answers to the requests before it, in their order (RFC 9112 9.3.2)."""
        if self.closing:
            return
        self.closing = True
        self._drop_partial()
        self.bounds.metrics.answered(route, status)
        mine = self.req_cycle
        if mine is not None and not mine.response_complete:  # its application ends
            mine.disconnected = True
            mine.message_event.set()
            if mine in self.in_flight:
                self.in_flight.remove(mine)
            if any(c is mine for c, _ in self.pipeline):
                self.pipeline = type(self.pipeline)(x for x in self.pipeline
                                                    if x[0] is not mine)
                _settle(mine)
        if self.in_flight:
            self.deferred = (status, message)
            return
        self._answer_error(status, message)

    def _answer_error(self, status: int, message: str) -> None:
        self.transport.write(error_bytes(status, message))
        self._linger()
        self.bounds.access.said(b"-", b"-", status, 0, None, getattr(self, "client", None),
                                message)

    def _linger(self, seconds: float = LINGER_S) -> None:
        # a lingering close: the answer, then our end shut while what the client still sends
        # is read and dropped (closing at once with unread data resets the connection, and
        # the client may lose the answer), for LINGER_S or LINGER_BYTES at most
        t = self.transport
        if self.flow is not None:
            self.flow.resume_reading()
        else:
            t.resume_reading()
        if self.timer is not None:
            self.timer.cancel()
        if t.can_write_eof():
            t.write_eof()
            self.timer = self.loop.call_later(seconds, t.abort)
        else:
            self.timer = None
            t.close()

    # ---- httptools' callbacks ------------------------------------------------------------
    def on_message_begin(self):
        super().on_message_begin()
        self.seen = self.body_size = self.chunks = 0
        self.header_bytes = self.header_lines = self.hosts = 0
        self.in_head, self.head_done = True, False
        self.req_cycle = None
        self.pieces = []
        self.scope["extensions"] = {BODY: self.pieces}
        self.in_message = True
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_later(self.bounds.request_timeout, self._too_slow)

    def on_url(self, url: bytes):
        self.header_bytes += len(url)
        if self.header_bytes > self.bounds.max_header:
            self._fail(414, "the request target is longer than serve.max_header_bytes")
            raise httptools.HttpParserError("too long")
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes):
        self.header_bytes += len(name) + len(value) + 4
        self.header_lines += 1
        if self.header_bytes > self.bounds.max_header * (2 if self.head_done else 1):
            self._fail(431, "the headers are larger than serve.max_header_bytes" if not
                       self.head_done else "the trailer fields are larger than "
                                           "serve.max_header_bytes")
            raise httptools.HttpParserError("too long")
        if self.header_lines > MAX_HEADER_LINES * (2 if self.head_done else 1):
            self._fail(431, f"more than {MAX_HEADER_LINES} header lines")
            raise httptools.HttpParserError("too many")
        if self.head_done:
            return  # a trailer field: read, and dropped (never a header)
        if len(name) == 4 and name.lower() == b"host":
            self.hosts += 1
        super().on_header(name, value)

    def on_headers_complete(self):
        self.in_head = False
        self.head_done = True
        p = self.parser
        if p.should_upgrade():  # Upgrade, CONNECT: refused before any answer
            self._fail(400, "protocol upgrades and CONNECT are not supported")
            raise httptools.HttpParserError("upgrade")
        if self.hosts > 1 or (self.hosts == 0 and p.get_http_version() != "1.0"):
            self._fail(400, "a request must send one Host header (RFC 9112 3.2)")
            raise httptools.HttpParserError("host")
        coding = length = None
        for name, value in self.headers:
            if name == b"transfer-encoding":
                coding = value if coding is None else coding + b"," + value
            elif name == b"content-length":
                length = value
        if coding is not None and coding.strip().lower() != b"chunked":
            self._fail(501, "Transfer-Encoding other than chunked is not supported")
            raise httptools.HttpParserError("coding")
        b = self.bounds
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                n = -1
            if n > b.max_body:
                self._fail(413, f"the body ({n} bytes) is larger than serve.max_body_bytes "
                                f"({b.max_body})", "infer")
                raise httptools.HttpParserError("too large")
        if len(self.pipeline) >= MAX_PIPELINED:
            # requests sent ahead of answers not read (uvicorn reads on while an answer is
            # found): held no further; an answer now would come before the earlier ones
            self._fail(503, "too many requests pipelined")
            raise httptools.HttpParserError("pipelined")
        super().on_headers_complete()
        self.req_cycle = self.cycle
        self.in_flight.append(self.cycle)

    def on_chunk_header(self):
        self.chunks += 1
        # llhttp calls back a chunk at a time: a body in tiny chunks costs the loop a call
        # a byte (60 MiB of 2-byte chunks froze it for seconds)
        if self.chunks > MIN_CHUNKS and self.body_size < MIN_CHUNK_BYTES * self.chunks:
            self._fail(400, f"the body's chunks are smaller than {MIN_CHUNK_BYTES} bytes on "
                            f"average (after {MIN_CHUNKS:,}): send larger chunks")
            raise httptools.HttpParserError("tiny chunks")

    def on_body(self, body: bytes):
        n = len(body)
        self.body_size += n
        b = self.bounds
        if self.body_size > b.max_body:
            self._fail(413, f"the body is larger than serve.max_body_bytes ({b.max_body})",
                       "infer")
            raise httptools.HttpParserError("too large")
        if b.buffered + n > b.max_buffered:
            self._fail(503, "the server holds serve.max_buffered_bytes of request bodies: "
                            "try again", "infer")
            raise httptools.HttpParserError("busy")
        b.buffered += n
        self.partial += n
        # kept as read, for the application to take whole when the message ends (its size
        # is bounded above): uvicorn's growing buffer and 64 KiB hand-overs copied it
        # several times on the loop's thread, and a large body is joined off it; small reads
        # are joined as they come (a bytes object a chunk took 30 times the body's memory)
        if n >= PIECE_BYTES:
            if self.small:
                self.pieces.append(bytes(self.small))
                self.small = bytearray()
            self.pieces.append(body)
        else:
            self.small += body
            if len(self.small) >= PIECE_BYTES:
                self.pieces.append(bytes(self.small))
                self.small = bytearray()

    def on_message_complete(self):
        if self.small:
            self.pieces.append(bytes(self.small))
            self.small = bytearray()
        # the body is the application's now: its bytes leave the count when it is done
        # with them (_settle), not when the connection goes
        self.cycle.sw_held = (self.bounds, self.partial)
        self.partial = 0
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.in_head = True
        self.in_message = False
        self.seen = 0
        super().on_message_complete()


# a body past this is parsed and scored off the loop (a 1,000-row binary request of 64
# features, 256 KiB, is answered inline in about a millisecond: on the lane, the hop and
# the GIL shared with the loop on one core cost a third of its rows/s, make bench-serve)
HEAVY_BODY = 512 << 10
HEAVY_EXPLAINED = 2048  # as is one past this asking for reason codes
# heavy requests waiting for the lane; past it 503 (Retry-After). Their bodies count against
# serve.max_buffered_bytes until they are done: this bounds the wait, not the memory (4 made
# eight clients of 1,000-row requests meet 503s: make bench-serve)
MAX_HEAVY_WAITING = 64
_BUSY = orjson.dumps({"error": f"{MAX_HEAVY_WAITING} large requests wait to be answered: "
                               "try again"})


def _lower_priority() -> None:
    """The heavy lane's thread (and the OpenMP team it starts, which inherits it) yields the
    cores to the loop's thread: a one-row request is not kept waiting by a large one."""
    import os
    import threading

    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)


class Busy(Exception):
    """MAX_HEAVY_WAITING large requests wait for the lane already."""


class Lane:
    """The heavy lane: one thread (nice 10) answering large requests one at a time, HTTP's
    and gRPC's alike, at most MAX_HEAVY_WAITING waiting (``Busy`` past it)."""

    def __init__(self):
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="serve-heavy",
                                           initializer=_lower_priority)
        self.waiting = 0

    async def run(self, fn, *args):
        if self.waiting >= MAX_HEAVY_WAITING:
            raise Busy
        self.waiting += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        finally:
            self.waiting -= 1

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def heavy_lane() -> Lane:
    return Lane()


def _unless_gone(cycle, handle, method, path, headers, pieces):
    """``handle`` on the heavy lane, unless the client left while it waited (None)."""
    if cycle is not None and cycle.disconnected:
        return None
    return handle(method, path, headers, pieces, True)


def make_app(service, lane: Lane | None = None, access: AccessLog | None = None):
    """``service.handle`` as an ASGI application: the request's headers as they were when the
    head ended (trailers never reach it), its path as sent (absolute-form targets routed by
    their path), one answer with its length. A large request (a body past HEAVY_BODY, or past
    HEAVY_EXPLAINED asking for reason codes) is answered on ``lane``, one at a time, so the
    loop goes on reading and answering the others (the kernels and TreeSHAP release the GIL);
    more than MAX_HEAVY_WAITING of them waiting are answered 503 with Retry-After."""
    handle = service.handle
    explain_on = service.scoring.explain is not None

    async def app(scope, receive, send):
        cycle = getattr(receive, "__self__", None)  # uvicorn's (its disconnected flag)
        try:
            await answer(scope, receive, send, cycle)
        finally:
            if cycle is not None:
                _settle(cycle)

    async def answer(scope, receive, send, cycle):
        headers: dict[bytes, bytes] = {}
        for k, v in scope["headers"]:
            if k in headers:  # a repeated header: its values joined, as HTTP says
                headers[k] += b"," + v
            else:
                headers[k] = v
        while True:  # the body is the protocol's (BODY): receive() says when it has ended
            msg = await receive()
            if msg["type"] != "http.request":
                return
            if not msg.get("more_body"):
                break
        t0 = time.perf_counter()
        pieces = scope["extensions"][BODY]
        n = sum(map(len, pieces))
        method, path = scope["method"].encode(), scope["raw_path"]
        if lane is not None and (n > HEAVY_BODY or n > HEAVY_EXPLAINED and (
                explain_on or any(b"reason_" in p for p in pieces))):
            try:
                got = await lane.run(_unless_gone, cycle, handle, method, path, headers,
                                     pieces)
            except Busy:
                service.metrics.answered("infer", 503)
                got = 503, b"application/json", _BUSY, [(b"retry-after", b"1")]
            if got is None:  # the client left while the request waited: not done
                return
            status, ctype, out, extra = got
        else:
            body = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            status, ctype, out, extra = handle(method, path, headers, body)
        if access is not None:
            access.said(method, path, status, len(out), t0, scope.get("client"),
                        out if status >= 400 else None)
        start = {"type": "http.response.start", "status": status,
                 "headers": [(b"content-type", ctype), (b"content-length", b"%d" % len(out)),
                             *extra]}
        if cycle is None or len(out) > COALESCE or cycle.disconnected or method == b"HEAD":
            await send(start)
            await send({"type": "http.response.body", "body": out})
            return
        # a small answer in one write: uvicorn writes the head and the body apart (two
        # sends, two segments); its writes go through _Coalesced while it sends them
        real = cycle.transport
        cycle.transport = _Coalesced(real)
        try:
            await send(start)
            await send({"type": "http.response.body", "body": out})
        finally:
            cycle.transport.flush()
            cycle.transport = real

    return app


COALESCE = 64 * 1024  # answers up to this size are written with their head in one write


class _Coalesced:
    """A transport for one answer: its first write (the head) held until the second (the
    body) and written with it; anything else is the real transport's."""

    __slots__ = ("_real", "_held")

    def __init__(self, real):
        self._real = real
        self._held = None

    def write(self, data) -> None:
        if self._held is None:
            self._held = bytes(data)
            return
        head, self._held = self._held, b""
        self._real.write(head + data if head else data)

    def flush(self) -> None:
        """The head, if no body followed it (the client gone: nothing)."""
        if self._held and not self._real.is_closing():
            self._real.write(self._held)
        self._held = b""

    def close(self) -> None:
        self.flush()
        self._real.close()

    def __getattr__(self, name):
        return getattr(self._real, name)


def protocol_for(service, loop):
    """A protocol factory for ``loop.create_server``, the server state its connections share
    (graceful shutdown reads it) and the heavy lane (shut down after)."""
    serve = service.serve
    lane = heavy_lane()
    bounds = Bounds(service, serve)
    config = Config(make_app(service, lane, bounds.access), http=BoundedProtocol,
                    interface="asgi3",
                    lifespan="off", ws="none", log_config=None, access_log=False,
                    proxy_headers=False, server_header=False, date_header=False,
                    timeout_keep_alive=serve.keepalive_timeout_ms / 1000)
    config.load()
    state = ServerState()
    cls = type("Protocol", (BoundedProtocol,), {"bounds": bounds})

    def factory():
        return cls(config=config, server_state=state, app_state={}, _loop=loop)

    return factory, state, lane
