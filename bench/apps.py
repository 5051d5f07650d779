"""The HTTP peers of the accept benchmark, each an ASGI app served by the same uvicorn
stack (httptools + uvloop, one process). Selected with ``BENCH_APP``; all verify the
same Standard Webhooks signature with the same code.

- ``verify``: checks the signature, stores nothing (the floor);
- ``naive``: Starlette + asyncpg, "exists?" then INSERT, one commit per request
  (seed 003's pattern);
- ``hookrelay``: hookrelay's FastAPI router on PostgreSQL (or SQLite);
- ``relaybox``: relaybox's receiver (group commit) on ``BENCH_DB_URL``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from relaybox import Relaybox, Secret, sources
from relaybox.config import Settings
from relaybox.errors import RejectedDelivery

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
_source = sources.standard(secrets=[Secret(SECRET)])


def _verify(body: bytes, headers: Any) -> bool:
    try:
        _source.authenticate({k.lower(): v for k, v in headers.items()}, body, _now(), True)
    except RejectedDelivery:
        return False
    return True


def _now() -> float:
    import time

    return time.time()


def verify_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def receive(request: Request) -> JSONResponse:
        body = await request.body()
        if not _verify(body, request.headers):
            return JSONResponse({"error": "bad_signature"}, status_code=401)
        json.loads(body)
        return JSONResponse({"status": "verified"})

    return Starlette(routes=[Route("/webhooks/bench", receive, methods=["POST"])])


def naive_app() -> Any:
    import asyncio

    import asyncpg
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    pool: dict[str, Any] = {}
    lock = asyncio.Lock()

    async def receive(request: Request) -> JSONResponse:
        body = await request.body()
        if not _verify(body, request.headers):
            return JSONResponse({"error": "bad_signature"}, status_code=401)
        payload = json.loads(body)
        event_id = request.headers["webhook-id"]
        async with lock:
            if "p" not in pool:
                pool["p"] = await asyncpg.create_pool(
                    os.environ["BENCH_DSN"], min_size=8, max_size=16
                )
        async with pool["p"].acquire() as conn:
            exists = await conn.fetchval("SELECT 1 FROM naive_events WHERE event_id = $1", event_id)
            if not exists:
                await conn.execute(
                    "INSERT INTO naive_events (event_id, payload) VALUES ($1, $2) "
                    "ON CONFLICT (event_id) DO NOTHING",
                    event_id,
                    json.dumps(payload),
                )
        return JSONResponse({"status": "duplicate" if exists else "accepted"})

    return Starlette(routes=[Route("/webhooks/bench", receive, methods=["POST"])])


def hookrelay_app() -> Any:
    from fastapi import FastAPI
    from hookrelay.fastapi import create_webhook_router
    from sqlalchemy.ext.asyncio import create_async_engine

    url = os.environ["BENCH_SQLALCHEMY_URL"]
    engine = create_async_engine(url, pool_size=16, max_overflow=0)
    if url.startswith("sqlite"):
        from hookrelay.backends.sqlite import SQLiteBackend as Backend
    else:
        from hookrelay.backends.postgres import PostgresBackend as Backend
    backend = Backend(engine)
    app = FastAPI()
    app.include_router(
        create_webhook_router(
            backend=backend,
            source="bench",
            path="/webhooks/bench",
            verify_signature=_verify,
            idempotency_key=lambda payload: payload.get("id"),
        )
    )
    return app


def relaybox_app() -> Any:
    from relaybox.log import configure_logging

    configure_logging("info")
    box = Relaybox(settings=Settings(database_url=os.environ["BENCH_DB_URL"]))
    box.source("bench", sources.standard(secrets=[Secret(SECRET)]))
    return box.receiver


_FACTORIES = {
    "verify": verify_app,
    "naive": naive_app,
    "hookrelay": hookrelay_app,
    "relaybox": relaybox_app,
}


def app() -> Any:
    return _FACTORIES[os.environ["BENCH_APP"]]()
