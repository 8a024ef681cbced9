"""The serve ``Service`` behind ASGI, for the server comparison in bench/serve.py only: the
same routes and scoring as ``scoring-worker serve``, carried by uvicorn or granian instead
of its own asyncio + httptools server.

    SERVE_MODEL=model.swm SERVE_NAME=m uvicorn bench.serve_asgi:app --http httptools ...
"""

from __future__ import annotations

import os

from worker.config import load_settings
from worker.serve.service import Service

_settings = load_settings(None, defaults={"source": {"type": "file", "path": os.devnull}},
                          model={"path": os.environ["SERVE_MODEL"]})
service = Service(_settings, os.environ["SERVE_MODEL"], os.environ.get("SERVE_NAME", "model"))
service.load()
_MAX_BODY = _settings.serve.max_body_bytes


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    chunks, size, more = [], 0, True
    while more:
        msg = await receive()
        body = msg.get("body", b"")
        size += len(body)
        if size > _MAX_BODY:
            await send({"type": "http.response.start", "status": 413, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        chunks.append(body)
        more = msg.get("more_body", False)
    headers = {k.lower(): v for k, v in scope["headers"]}
    status, ctype, out, extra = service.handle(scope["method"].encode(),
                                               scope["path"].encode(), headers,
                                               b"".join(chunks))
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype),
                            (b"content-length", str(len(out)).encode()), *extra]})
    await send({"type": "http.response.body", "body": out})
