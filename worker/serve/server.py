"""The server of ``scoring-worker serve``: one process (or ``serve.workers`` sharing a port),
each an event loop (uvloop's where installed) serving ``Service`` over HTTP/1.1 with uvicorn's
httptools protocol, bounded as ``worker.serve.http`` says (issue 50: a maintained server
replaced the hand-written one; bench/SERVE-RESULTS.md has both measured).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time

import structlog

from .http import protocol_for

log = structlog.get_logger("worker.serve")

SHUTDOWN_S = 5.0  # requests being answered at SIGTERM are given this long


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


def serve_socket(service, sock: socket.socket, on_listening=None, load_first: bool = False,
                 grpc_port: int | None = None, grpc_reuse: bool = False) -> int:
    """Serve on the bound ``sock`` until SIGTERM/SIGINT; load the model in a thread meanwhile
    (live at once, ready once it is loaded), or with ``load_first`` before listening (one of
    several processes on a port: the kernel gives connections only to those listening, so
    none is sent to a process still loading). With ``grpc_port`` (0: one the system picks)
    the protocol's gRPC half too, on the same loop and service (``grpc_reuse``: the port is
    shared with other processes). ``on_listening(http address, grpc port or None)``. Exit
    code: 0, or 2 if the model cannot load."""
    if load_first:
        try:
            service.load()
        except Exception as exc:  # noqa: BLE001 (reported, and the process exits 2)
            _load_failed(exc)
            return 2
        service.start_parser()
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    factory, state, lane = protocol_for(service, loop)
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
            return
        await loop.run_in_executor(None, service.start_parser)

    async def main():
        sock.listen(4096)
        server = await loop.create_server(factory, sock=sock, backlog=4096)
        gserver = gport = None
        if grpc_port is not None:
            from . import kserve_grpc

            gserver, gport = await kserve_grpc.start(service, lane, sock.getsockname()[0],
                                                     grpc_port, grpc_reuse)
        if on_listening is not None:
            on_listening(sock.getsockname(), gport)
        loader = loop.create_task(load())
        await stop.wait()
        server.close()
        if gserver is not None:
            await gserver.stop(SHUTDOWN_S)
        for conn in list(state.connections):  # idle ones closed, the others after answering
            conn.shutdown()
        if state.tasks:
            await asyncio.wait(list(state.tasks), timeout=SHUTDOWN_S)
        # requests still on the heavy lane after SHUTDOWN_S: given up, not logged as
        # uvicorn's errors (their clients see the connection close)
        logging.getLogger("uvicorn.error").disabled = True
        service.close()  # the JSON parsing process first: a parse under way ends
        for task in list(state.tasks):
            task.cancel()
        for conn in list(state.connections):
            conn.transport.abort()
        loader.cancel()

    sys.setswitchinterval(0.001)  # Python on the heavy lane yields the GIL within 1 ms
    try:
        loop.run_until_complete(main())
    finally:
        lane.shutdown()
        service.close()
        loop.close()
    return result["code"]


def _load_failed(exc: BaseException) -> None:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    # a setting the model cannot be served with names itself (scoring.thresholds: ...)
    where = "" if text.startswith(("scoring.", "source.", "serve.")) else "model: "
    print(f"config error: {where}{text}", file=sys.stderr)


def serve_workers(make_service, host: str, port: int, workers: int, on_listening=None,
                  grpc_port: int | None = None) -> int:
    """``workers`` processes, each with its own socket on one port (SO_REUSEPORT: the kernel
    spreads connections) and its own model (and gRPC on ``grpc_port`` the same way); one
    that dies is started again. SIGTERM/SIGINT stop them all."""
    if workers == 1:
        sock = bind(host, port, reuse_port=False)
        return serve_socket(make_service(), sock, on_listening, grpc_port=grpc_port)
    first = bind(host, port, reuse_port=True)  # the port (0: the one the system picked)
    # gRPC's port, held (not listened on) so that 0 resolves once for every process
    grpc_hold = None if grpc_port is None else bind(host, grpc_port, reuse_port=True)
    if grpc_hold is not None:
        grpc_port = grpc_hold.getsockname()[1]
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
                code = serve_socket(make_service(), sock, load_first=True,
                                    grpc_port=grpc_port, grpc_reuse=True)
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
        on_listening(first.getsockname(), grpc_port)
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
