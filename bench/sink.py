"""A local webhook receiver for the dispatch benchmark: 200 on /ok/*, never answers
on /hang/*. Run as its own process (its own core): python -m bench.sink PORT"""

from __future__ import annotations

import asyncio
import sys

from aiohttp import web


async def ok(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(text="ok")


async def hang(request: web.Request) -> web.Response:
    await asyncio.sleep(3600)
    return web.Response(text="late")


def main() -> None:
    app = web.Application()
    app.router.add_post("/ok/{tail:.*}", ok)
    app.router.add_post("/hang/{tail:.*}", hang)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)


if __name__ == "__main__":
    main()
