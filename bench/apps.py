"""The HTTP peers of the accept benchmark, each an ASGI app served by the same uvicorn
stack (httptools + uvloop, one process). Selected with ``BENCH_APP``; all verify the
same Standard Webhooks signature with the same code.

- ``floor``: a raw ASGI app that reads the body, checks the signature, parses the JSON
  and answers 200, storing nothing: the fastest honest way to do the receiving part of
  the job on this stack (no routing, no request or response objects), the floor;
- ``floor-durable``: ``floor`` plus the least that makes its 2xx durable: the event id,
  a SHA-256 of the body, the headers as JSON, and a group commit of the waiting
  requests (one statement a batch: asyncpg, 3 committers, on PostgreSQL; one writer
  thread, ``synchronous=FULL``, on SQLite) before the answer. One unique key, no
  duplicate or conflict reported, no limits, tenants or metrics: the fastest honest way
  to do the whole job on this stack, less everything else a receiver is for;
- ``relaybox-nostore``: relaybox's own receiver with its acceptor replaced by one that
  stores nothing: ``floor`` against it is the receiver's own overhead, it against
  ``relaybox`` the cost of durability alone;
- ``naive``: Starlette + asyncpg, "exists?" then INSERT, one commit per request
  (the way a receiver is usually written first);
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
from relaybox.store import AcceptOutcome

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


def floor_app() -> Any:
    """Raw ASGI: the body, the signature, the JSON, a fixed 200 answer."""
    ok = b'{"status":"verified"}'
    bad = b'{"error":"bad_signature"}'

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if scope["method"] != "POST" or scope["path"] != "/webhooks/bench":
            status, answer = 405, bad
        elif _verify(body, headers):
            json.loads(body)
            status, answer = 200, ok
        else:
            status, answer = 401, bad
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(answer)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    return app


DURABLE_TABLE = (
    "CREATE TABLE durable_events (event_id TEXT PRIMARY KEY, fingerprint BYTEA NOT NULL,"
    " payload BYTEA NOT NULL, headers TEXT NOT NULL)"
)
"""The durable floor's one table (SQLite reads ``BYTEA`` as a blob)."""

_PG_INSERT = (
    "INSERT INTO durable_events SELECT * FROM"
    " unnest($1::text[], $2::bytea[], $3::bytea[], $4::text[]) ON CONFLICT DO NOTHING"
)


def durable_floor_app() -> Any:
    """``floor`` with a durable 2xx: each verified request waits for the COMMIT of the
    batch that holds it (``BENCH_DSN``: PostgreSQL; ``BENCH_SQLITE``: a SQLite file)."""
    import asyncio
    import hashlib

    dsn, path = os.environ.get("BENCH_DSN"), os.environ.get("BENCH_SQLITE")
    committers = 3 if dsn else 1  # SQLite has one writer
    pending: list[tuple[str, bytes, bytes, str, asyncio.Future[None]]] = []
    state: dict[str, Any] = {"running": 0}
    ok = b'{"status":"accepted"}'
    bad = b'{"error":"bad_signature"}'

    async def start() -> None:
        if dsn:
            import asyncpg

            state["pool"] = await asyncpg.create_pool(dsn, min_size=committers, max_size=committers)
        else:
            import sqlite3
            from concurrent.futures import ThreadPoolExecutor

            conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            state["sqlite"], state["thread"] = conn, ThreadPoolExecutor(1)

    def write_sqlite(rows: list[tuple[str, bytes, bytes, str]]) -> None:
        conn = state["sqlite"]
        conn.execute("BEGIN")
        conn.executemany("INSERT OR IGNORE INTO durable_events VALUES (?, ?, ?, ?)", rows)
        conn.execute("COMMIT")

    async def commit() -> None:
        while pending:
            batch = pending[:]
            del pending[:]
            rows = [b[:4] for b in batch]
            try:
                if dsn:
                    async with state["pool"].acquire() as conn:
                        await conn.execute(_PG_INSERT, *map(list, zip(*rows, strict=True)))
                else:
                    loop = asyncio.get_running_loop()
                    await loop.run_in_executor(state["thread"], write_sqlite, rows)
            except Exception as exc:
                for b in batch:
                    b[4].set_exception(exc)
            else:
                for b in batch:
                    b[4].set_result(None)
        state["running"] -= 1

    # The request and the answer are written out as in floor_app, not shared with it:
    # a helper would add a call to every request of both floors.
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] == "lifespan.startup":
                await start()
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if scope["method"] != "POST" or scope["path"] != "/webhooks/bench":
            status, answer = 405, bad
        elif _verify(body, headers):
            json.loads(body)
            done = asyncio.get_running_loop().create_future()
            fingerprint = hashlib.sha256(body).digest()
            pending.append((headers["webhook-id"], fingerprint, body, json.dumps(headers), done))
            if state["running"] < committers:
                state["running"] += 1
                asyncio.get_running_loop().create_task(commit())
            try:
                await done
                status, answer = 200, ok
            except Exception:
                status, answer = 503, bad
        else:
            status, answer = 401, bad
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(answer)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    return app


def verify_app() -> Any:
    """Starlette (routing, ``Request``, ``JSONResponse``): 15-40 µs a request more than
    ``floor``; kept to show that cost, not as the floor."""
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


_ACCEPTED = AcceptOutcome("accepted", 0)


class _NoStoreAcceptor:
    """An acceptor that stores nothing and answers "accepted" at once."""

    committers = 1

    async def accept(self, delivery: Any) -> Any:
        return _ACCEPTED  # made once: an import per request here cost ~24 opcodes

    async def close(self) -> None:
        return None


def relaybox_nostore_app() -> Any:
    """relaybox's receiver, everything but the storage: the same routing, verification,
    parsing and answer, the acceptor replaced."""
    receiver = relaybox_app()
    receiver.inbound._acceptor = _NoStoreAcceptor()
    return receiver


_FACTORIES = {
    "floor": floor_app,
    "floor-durable": durable_floor_app,
    "relaybox-nostore": relaybox_nostore_app,
    "verify": verify_app,
    "naive": naive_app,
    "hookrelay": hookrelay_app,
    "relaybox": relaybox_app,
}


def app() -> Any:
    return _FACTORIES[os.environ["BENCH_APP"]]()
