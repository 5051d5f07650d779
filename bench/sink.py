"""A local webhook receiver for the dispatch benchmark: 200 on /ok/*, never answers on
/hang/*. Run as its own process (its own core): ``python -m bench.sink PORT [KIND]``.

KIND ``record`` (the latency and slow benchmarks): the same stack, and it also notes
when each request arrived (``time.time()``, by ``webhook-id``; ``GET /times`` returns
them as JSON), answers ``/slow/<ms>/*`` after that many milliseconds, and ``/flaky/*``
with a 500 the first time it sees a ``webhook-id``.

KIND ``uvicorn`` (the default): a bare ASGI app on uvicorn with httptools + uvloop,
21-24 µs of CPU per request against 54-56 µs for ``aiohttp`` (aiohttp's own web
server). The receiver is not what the bench measures, and a real one runs on another
host: the bare loop runs at the same rate on either, while relaybox, whose PostgreSQL
shares the sink's core, waits longer for a heavier sink's answers (bench/RUNS.md,
"The sink").
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from starlette.types import Receive, Scope, Send

_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")],
}
_BODY = {"type": "http.response.body", "body": b"ok"}


async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    if scope["path"].startswith("/hang/"):
        await asyncio.sleep(3600)
    await send(_START)
    await send(_BODY)


_FAIL = {**_START, "status": 500}
_arrived: dict[str, list[float]] = {}


async def recording(scope: Scope, receive: Receive, send: Send) -> None:
    """``asgi`` plus arrival times, slow paths and failing-once paths (KIND ``record``)."""
    if scope["type"] != "http":
        return
    at = time.time()
    path: str = scope["path"]
    if scope["method"] == "GET" and path == "/times":
        body = json.dumps(_arrived).encode()
        await send({**_START, "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
        return
    while (await receive()).get("more_body"):
        pass
    key = next((v.decode() for k, v in scope["headers"] if k == b"webhook-id"), "")
    seen = _arrived.setdefault(key, [])
    seen.append(at)
    if path.startswith("/hang/"):
        await asyncio.sleep(3600)
    elif path.startswith("/slow/"):
        await asyncio.sleep(int(path.split("/")[2]) / 1000)
    await send(_FAIL if path.startswith("/flaky/") and len(seen) == 1 else _START)
    await send(_BODY)


def run_uvicorn(port: int, app: Any = asgi) -> None:
    import uvicorn

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning",
    )


def run_aiohttp(port: int) -> None:
    from aiohttp import web

    async def ok(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text="ok")

    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(3600)
        return web.Response(text="late")

    app = web.Application()
    app.router.add_post("/ok/{tail:.*}", ok)
    app.router.add_post("/hang/{tail:.*}", hang)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def run_recording(port: int) -> None:
    run_uvicorn(port, recording)


KINDS = {"uvicorn": run_uvicorn, "aiohttp": run_aiohttp, "record": run_recording}


def main() -> None:
    kind = sys.argv[2] if len(sys.argv) > 2 else "uvicorn"
    KINDS[kind](int(sys.argv[1]))


if __name__ == "__main__":
    main()
