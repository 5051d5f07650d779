"""A local webhook receiver for the dispatch benchmark: 200 on /ok/*, never answers on
/hang/*. Run as its own process (its own core): ``python -m bench.sink PORT [KIND]``.

KIND ``uvicorn`` (the default): a bare ASGI app on uvicorn with httptools + uvloop,
21-24 µs of CPU per request against 54-56 µs for ``aiohttp`` (aiohttp's own web
server). The receiver is not what the bench measures, and a real one runs on another
host: the bare loop runs at the same rate on either, while relaybox, whose PostgreSQL
shares the sink's core, waits longer for a heavier sink's answers (bench/README.md,
"The sink").
"""

from __future__ import annotations

import asyncio
import sys

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


def run_uvicorn(port: int) -> None:
    import uvicorn

    uvicorn.run(
        asgi,
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


KINDS = {"uvicorn": run_uvicorn, "aiohttp": run_aiohttp}


def main() -> None:
    kind = sys.argv[2] if len(sys.argv) > 2 else "uvicorn"
    KINDS[kind](int(sys.argv[1]))


if __name__ == "__main__":
    main()
