"""The HTTP/1.1 server of ``scoring-worker serve``: asyncio (uvloop's loop where installed)
with httptools' parser (llhttp, the parser uvicorn uses), around ``Service.handle``.

Chosen by measurement (bench/serve.py, bench/SERVE-RESULTS.md): uvicorn with httptools and
granian ran the same ``Service`` behind their ASGI interfaces; this one, without the ASGI
layer, answered the most one-row requests per second on one core.

Bounds, each answered and counted, never a crash: a body over ``serve.max_body_bytes``
(413 from its Content-Length before a byte of it is read, or as soon as a chunked body
passes it; the connection is closed), request line and headers over
``serve.max_header_bytes`` (431), a request not complete within
``serve.max_request_timeout_ms`` (408: slow clients), an idle keep-alive connection (closed
after ``serve.keepalive_timeout_ms``), more than ``serve.max_connections`` open (closed at
once). A request is answered in the loop's thread: scoring a row takes microseconds, and a
request's answer is written before the next one on the connection is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time

import httptools
import orjson
import structlog

log = structlog.get_logger("worker.serve")

_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed",
            408: b"Request Timeout", 413: b"Content Too Large", 415: b"Unsupported Media Type",
            431: b"Request Header Fields Too Large", 500: b"Internal Server Error",
            501: b"Not Implemented", 503: b"Service Unavailable"}


def response_bytes(status: int, ctype: bytes, body: bytes, extra: list, keep_alive: bool,
                   head_only: bool = False) -> bytes:
    parts = [b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n"
             % (status, _REASONS.get(status, b"Error"), ctype, len(body))]
    for k, v in extra:
        parts.append(k + b": " + v + b"\r\n")
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    if not head_only:
        parts.append(body)
    return b"".join(parts)


LINGER_S = 2.0  # after an error answer: how long the rest of a request is read and dropped
LINGER_BYTES = 8 << 20  # and how much of it
MAX_HEADER_LINES = 256
WRITE_HIGH = 1 << 20  # answers waiting for the client past this: stop reading from it
WRITE_MAX = 16 << 20  # past this (pipelined requests answered from one read): closed


class _Limits:
    __slots__ = ("max_body", "max_header", "request_timeout", "keepalive_timeout",
                 "max_connections", "max_buffered")

    def __init__(self, serve):
        self.max_body = serve.max_body_bytes
        self.max_header = serve.max_header_bytes
        self.request_timeout = serve.request_timeout_ms / 1000
        self.keepalive_timeout = serve.keepalive_timeout_ms / 1000
        self.max_connections = serve.max_connections
        self.max_buffered = serve.max_buffered_bytes


class _State:
    """What every connection of one server shares."""

    def __init__(self, service, limits: _Limits):
        self.service, self.limits = service, limits
        self.open = 0
        self.connections: set = set()
        self.buffered = 0  # request body bytes held, all connections (serve.max_buffered_bytes)


class HttpProtocol(asyncio.Protocol):
    __slots__ = ("state", "loop", "transport", "parser", "url", "headers", "body", "size",
                 "header_bytes", "header_lines", "head_seen", "in_head", "timer", "closing",
                 "t0", "buffered", "stalled")

    def __init__(self, state: _State, loop):
        self.state, self.loop = state, loop
        self.transport = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.size = 0
        self.header_bytes = 0
        self.header_lines = 0
        self.head_seen = 0  # bytes received since the request began, until its headers end
        self.in_head = True
        self.timer = None
        self.closing = False
        self.buffered = 0  # this request's body bytes counted in the server's budget
        self.stalled = False  # answers wait for a client that does not read them

    # ---- the connection ------------------------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport
        st = self.state
        if st.open >= st.limits.max_connections:
            st.service.metrics.connections_refused.inc()
            self.closing = True
            transport.abort()  # over the cap: closed at once, nothing read
            return
        st.open += 1
        st.connections.add(self)
        st.service.metrics.connections.set(st.open)
        transport.set_write_buffer_limits(high=WRITE_HIGH)
        self._arm(st.limits.keepalive_timeout, self._idle)

    def connection_lost(self, exc):
        st = self.state
        if self in st.connections:
            st.connections.discard(self)
            st.open -= 1
            st.service.metrics.connections.set(st.open)
        self._release()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def pause_writing(self):
        # the client is not reading its answers: read nothing more from it until it does,
        # and drop it if it does not within the keep-alive timeout (no request re-arms it)
        self.stalled = True
        self.transport.pause_reading()
        self._arm(self.state.limits.keepalive_timeout, self._idle)

    def resume_writing(self):
        self.stalled = False
        if not self.closing:
            self.transport.resume_reading()
            self._arm(self.state.limits.request_timeout, self._too_slow)

    def _arm(self, after: float, then) -> None:
        if self.stalled and then != self._idle:
            return  # the stall's deadline stands
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_later(after, then)

    def _idle(self):
        # abort, not close: a close waits for the answers a client that stopped reading
        # never takes, and would hold the connection (and its slot) for ever
        self.timer = None
        if self.transport is not None:
            self.transport.abort()

    def _too_slow(self):
        self.timer = None
        self._fail(408, "the request did not arrive within serve.request_timeout_ms")

    def _release(self) -> None:
        if self.buffered:
            self.state.buffered -= self.buffered
            self.buffered = 0

    def data_received(self, data: bytes):
        if self.closing:  # lingering after an error answer: what still comes is dropped
            self.size += len(data)
            if self.size > LINGER_BYTES:
                self.transport.abort()
            return
        if self.in_head:
            self.head_seen += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            if not self.closing:
                self._fail(400, f"malformed HTTP request: {exc}")
        # httptools keeps a header's value until it ends: bounded here, a chunk at a time
        if self.in_head and not self.closing and \
                self.head_seen > self.state.limits.max_header + 65536:
            self._fail(431, "the request line and headers are larger than "
                            "serve.max_header_bytes")

    def _fail(self, status: int, message: str, route: str = "http") -> None:
        """Answer ``status`` and close the connection (what was read of it is unusable)."""
        if self.closing:
            return
        self.closing = True
        self._release()
        self.body = []
        self.state.service.metrics.answered(route, status)
        self.transport.write(response_bytes(status, b"application/json",
                                            orjson.dumps({"error": message}), [], False))
        # a lingering close: the answer, then our end shut while what the client still sends
        # is read and dropped (closing at once with unread data resets the connection, and
        # the client may lose the answer), for LINGER_S or LINGER_BYTES at most
        self.size = 0
        self.transport.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._arm(LINGER_S, self.transport.abort)
        else:
            self.transport.close()

    # ---- httptools' callbacks ------------------------------------------------------------
    def on_message_begin(self):
        self.url = b""
        self.headers = {}
        self.body = []
        self.size = 0
        self.header_bytes = 0
        self.header_lines = 0
        self.t0 = time.perf_counter()
        self._arm(self.state.limits.request_timeout, self._too_slow)

    def on_url(self, url: bytes):
        self.url += url
        self.header_bytes += len(url)
        if self.header_bytes > self.state.limits.max_header:
            self._fail(431, "the request line is longer than serve.max_header_bytes")
            raise httptools.HttpParserError("too long")

    def on_header(self, name: bytes, value: bytes):
        self.header_bytes += len(name) + len(value) + 4
        self.header_lines += 1
        if self.header_bytes > self.state.limits.max_header:
            self._fail(431, "the headers are larger than serve.max_header_bytes")
            raise httptools.HttpParserError("too long")
        if self.header_lines > MAX_HEADER_LINES:
            self._fail(431, f"more than {MAX_HEADER_LINES} header lines")
            raise httptools.HttpParserError("too many")
        name = name.lower()
        if name in self.headers:  # a repeated header: its values joined, as HTTP says
            self.headers[name] += b"," + value
        else:
            self.headers[name] = value

    def on_headers_complete(self):
        self.in_head = False
        if self.parser.should_upgrade():  # Upgrade, CONNECT: refused before any answer
            self._fail(400, "protocol upgrades and CONNECT are not supported")
            raise httptools.HttpParserError("upgrade")
        coding = self.headers.get(b"transfer-encoding")
        if coding is not None and coding.strip().lower() != b"chunked":
            self._fail(501, "Transfer-Encoding other than chunked is not supported")
            raise httptools.HttpParserError("coding")
        length = self.headers.get(b"content-length")
        limits = self.state.limits
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                n = -1
            if n > limits.max_body:
                self._fail(413, f"the body ({n} bytes) is larger than serve.max_body_bytes "
                                f"({limits.max_body})", "infer")
                raise httptools.HttpParserError("too large")

    def on_body(self, body: bytes):
        self.size += len(body)
        limits = self.state.limits
        if self.size > limits.max_body:
            self._fail(413, f"the body is larger than serve.max_body_bytes "
                            f"({limits.max_body})", "infer")
            raise httptools.HttpParserError("too large")
        st = self.state
        if st.buffered + len(body) > limits.max_buffered:
            self._fail(503, "the server holds serve.max_buffered_bytes of request bodies: "
                            "try again", "infer")
            raise httptools.HttpParserError("busy")
        st.buffered += len(body)
        self.buffered += len(body)
        self.body.append(body)

    def on_message_complete(self):
        self.in_head = True
        self.head_seen = 0
        if self.closing:
            return
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body = []
        self._release()
        method = self.parser.get_method()
        keep_alive = self.parser.should_keep_alive()
        status, ctype, out, extra = self.state.service.handle(method, self.url, self.headers,
                                                              body)
        self.transport.write(response_bytes(status, ctype, out, extra, keep_alive,
                                            method == b"HEAD"))
        if self.transport.get_write_buffer_size() > WRITE_MAX:
            # pipelined requests whose answers are not read: the client is not keeping up
            self.closing = True
            self.transport.abort()
            return
        if keep_alive:
            self._arm(self.state.limits.keepalive_timeout, self._idle)
        else:
            self.closing = True
            self.transport.close()
            self._arm(self.state.limits.keepalive_timeout, self._idle)  # abort if stuck


def new_event_loop():
    """uvloop's loop where it is installed (about twice asyncio's requests/s), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def bind(host: str, port: int, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def serve_socket(service, sock: socket.socket, on_listening=None, load_first: bool = False
                 ) -> int:
    """Serve on the bound ``sock`` until SIGTERM/SIGINT; load the model in a thread meanwhile
    (live at once, ready once it is loaded), or with ``load_first`` before listening (one of
    several processes on a port: the kernel gives connections only to those listening, so
    none is sent to a process still loading). Exit code: 0, or 2 if the model cannot
    load."""
    if load_first:
        try:
            service.load()
        except Exception as exc:  # noqa: BLE001 (reported, and the process exits 2)
            _load_failed(exc)
            return 2
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    state = _State(service, _Limits(service.serve))
    stop = asyncio.Event()
    result = {"code": 0}

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def load():
        if load_first:
            return
        try:
            await loop.run_in_executor(None, service.load)
        except Exception as exc:  # noqa: BLE001 (reported, and the server exits 2)
            _load_failed(exc)
            result["code"] = 2
            stop.set()

    async def main():
        sock.listen(4096)
        server = await loop.create_server(lambda: HttpProtocol(state, loop), sock=sock,
                                          backlog=4096)
        if on_listening is not None:
            on_listening(sock.getsockname())
        loader = loop.create_task(load())
        await stop.wait()
        server.close()
        for conn in list(state.connections):  # finish nothing half-read: close them
            if conn.transport is not None:
                conn.transport.close()
        loader.cancel()

    try:
        loop.run_until_complete(main())
    finally:
        service.close()
        loop.close()
    return result["code"]


def _load_failed(exc: BaseException) -> None:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"config error: model: {text}", file=sys.stderr)


def serve_workers(make_service, host: str, port: int, workers: int, on_listening=None) -> int:
    """``workers`` processes, each with its own socket on one port (SO_REUSEPORT: the kernel
    spreads connections) and its own model; one that dies is started again. SIGTERM/SIGINT
    stop them all."""
    if workers == 1:
        sock = bind(host, port, reuse_port=False)
        return serve_socket(make_service(), sock, on_listening)
    first = bind(host, port, reuse_port=True)  # the port (0: the one the system picked)
    # metrics: every process writes its values to files here, any of them answers /metrics
    # (prometheus_client's multiprocess mode, chosen before a metric is made)
    import tempfile

    from prometheus_client import multiprocess
    from prometheus_client import values as prom_values

    metrics_dir = tempfile.mkdtemp(prefix="scoring-worker-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    prom_values.ValueClass = prom_values.get_value_class()
    port = first.getsockname()[1]
    children: dict[int, int] = {}
    stopping = False

    def spawn(i: int) -> None:
        pid = os.fork()
        if pid == 0:  # the child: its own socket on the port, its own loop and model
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                sock = first if i == 0 else bind(host, port, reuse_port=True)
                code = serve_socket(make_service(), sock, load_first=True)
            finally:
                os._exit(code)
        children[pid] = i

    def on_stop(*_):
        nonlocal stopping
        stopping = True
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    for i in range(workers):
        spawn(i)
    if on_listening is not None:
        on_listening(first.getsockname())
    code = 0
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        i = children.pop(pid, None)
        if i is None:
            continue
        multiprocess.mark_process_dead(pid)
        rc = os.waitstatus_to_exitcode(status)
        if rc == 2:  # the model cannot load: it will not in a new process either
            code = 2
            on_stop()
        elif not stopping:
            log.warning("serve worker exited: starting another", worker=i, exit_code=rc)
            time.sleep(0.5)
            spawn(i)
    import shutil

    shutil.rmtree(metrics_dir, ignore_errors=True)
    return code
