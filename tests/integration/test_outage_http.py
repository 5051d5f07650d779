"""Every HTTP surface while the database is out of reach: the receiver, the tenant API,
the admin API, the dashboard, the portal and ``/healthz`` answer 503 with a body that
says so — never a 500, a traceback or a stall — and serve again once it is back.

PostgreSQL is cut off by a TCP proxy between relaybox and the shared server (the server
itself is never touched); its pool exhausted by connections held elsewhere, which makes
every surface wait ``pool_timeout`` and answer 503. SQLite: a database file that can no
longer be opened (its directory made unreadable) and one locked by another writer.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy.engine import make_url
from standardwebhooks import Webhook

from relaybox import Relaybox, sources
from relaybox.config import Settings
from relaybox.outbound import create_api_key
from relaybox.portal import portal_link
from relaybox.sources.base import Secret
from tests.conftest import KEYED, Served, create_pg_database, drop_pg_database
from tests.support.outbound_app import local
from tests.support.proxy import TcpProxy

TOKEN = "outage-admin-token-0123456789"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
ROLES = ("receiver", "api", "admin")


@dataclass
class Surfaces:
    """A served box and what each surface needs: an API key, a dashboard session, a
    portal session."""

    base: str
    api_key: str
    admin_cookie: str
    portal_path: str
    portal_cookies: dict[str, str]


def signed(msg_id: str) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"type": "order.paid", "data": {"id": msg_id}}).encode()
    ts = datetime.now(tz=UTC)
    return body, {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(ts.timestamp())),
        "webhook-signature": Webhook(SECRET).sign(msg_id, ts, body.decode()),
        "content-type": "application/json",
    }


def make_box(url: str, **settings: Any) -> Relaybox:
    box = Relaybox(
        settings=Settings(
            database_url=url, admin_token=TOKEN, outbound=KEYED, accept_timeout=5, **settings
        )
    )
    box.source("std", sources.standard(secrets=[Secret(SECRET, tenant="t1")]))
    local(box)
    return box


async def prepare(box: Relaybox, base: str, http: aiohttp.ClientSession) -> Surfaces:
    """Sessions and keys made while the database answers."""
    _, api_key = await create_api_key(box, "t1", "outage")
    async with http.post(
        base + "/admin/login", data={"token": TOKEN, "next": "/admin/"}, allow_redirects=False
    ) as r:
        assert r.status == 303, await r.text()
        admin_cookie = r.cookies["relaybox_admin"].value
    link = portal_link(box, "t1")
    async with http.get(base + link.url, allow_redirects=False) as r:
        assert r.status == 303, await r.text()
        portal_path = r.headers["location"].removeprefix(base)
        portal_cookies = {k: v.value for k, v in r.cookies.items()}
    return Surfaces(base, api_key, admin_cookie, portal_path, portal_cookies)


async def walk(s: Surfaces, http: aiohttp.ClientSession, msg_id: str) -> dict[str, Any]:
    """One request to each surface: ``{surface: (status, content type, body)}``."""
    body, headers = signed(msg_id)
    requests: dict[str, tuple[str, str, dict[str, Any]]] = {
        "receiver": ("POST", "/webhooks/std", {"data": body, "headers": headers}),
        "tenant api": (
            "GET",
            "/api/v1/endpoints",
            {"headers": {"Authorization": f"Bearer {s.api_key}"}},
        ),
        "tenant api publish": (
            "POST",
            "/api/v1/messages",
            {
                "headers": {"Authorization": f"Bearer {s.api_key}"},
                "json": {"event_type": "order.paid", "data": {"id": msg_id}},
            },
        ),
        "admin api": (
            "GET",
            "/admin/api/v1/inbox",
            {"headers": {"Authorization": f"Bearer {TOKEN}"}},
        ),
        "dashboard": ("GET", "/admin/", {"cookies": {"relaybox_admin": s.admin_cookie}}),
        "dashboard inbox": ("GET", "/admin/inbox", {"cookies": {"relaybox_admin": s.admin_cookie}}),
        "portal": ("GET", s.portal_path, {"cookies": s.portal_cookies}),
        "healthz": ("GET", "/healthz", {}),
    }

    async def one(method: str, path: str, kw: dict[str, Any]) -> tuple[int, str, str, float]:
        cookies = kw.pop("cookies", None)
        started = time.monotonic()
        async with (
            aiohttp.ClientSession(cookies=cookies) as session,
            session.request(method, s.base + path, allow_redirects=False, **kw) as r,
        ):
            text = await r.text()
            return r.status, r.headers.get("content-type", ""), text, time.monotonic() - started

    answers = await asyncio.gather(*(one(*req) for req in requests.values()))
    return dict(zip(requests, answers, strict=True))


def assert_unavailable(answers: dict[str, Any], within: float) -> None:
    for surface, (status, ctype, text, took) in answers.items():
        assert status == 503, f"{surface}: {status} {text[:300]}"
        assert "Traceback" not in text and "Internal Server Error" not in text, surface
        assert re.search(r"unavailable|database", text, re.I), f"{surface}: {text[:300]}"
        assert took < within, f"{surface} took {took:.1f} s"
        if ctype.startswith("application/json"):
            answer = json.loads(text)
            assert "unavailable" in (answer.get("error"), answer.get("status")), text


def assert_serving(answers: dict[str, Any]) -> None:
    for surface, (status, _, text, _) in answers.items():
        assert status in (200, 202), f"{surface}: {status} {text[:300]}"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_postgres_cut_off(http: aiohttp.ClientSession) -> None:
    url = await create_pg_database()
    u = make_url(url)
    proxy = await TcpProxy(host=u.host or "127.0.0.1", port=u.port or 5432).start()
    via_proxy = u.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    box = make_box(via_proxy)
    try:
        async with Served(box.asgi(roles=ROLES)) as served:
            s = await prepare(box, served.url, http)
            assert_serving(await walk(s, http, "msg_before"))

            proxy.cut()
            assert_unavailable(await walk(s, http, "msg_during"), within=10)
            assert_unavailable(await walk(s, http, "msg_during2"), within=10)

            proxy.restore()
            for _ in range(50):  # pooled connections of the outage are dropped as met
                answers = await walk(s, http, "msg_after")
                if all(a[0] in (200, 202) for a in answers.values()):
                    break
                await asyncio.sleep(0.1)
            assert_serving(answers)
    finally:
        await box.close()
        await proxy.close()
        await drop_pg_database(url)


async def test_postgres_pool_exhausted(http: aiohttp.ClientSession) -> None:
    """Every pooled connection held elsewhere: each surface waits ``pool_timeout`` for
    one, then answers 503."""
    url = await create_pg_database()
    box = make_box(url, pool_size=1, pool_overflow=0, pool_timeout=1.0)
    try:
        async with Served(box.asgi(roles=ROLES)) as served:
            s = await prepare(box, served.url, http)
            assert_serving(await walk(s, http, "msg_before"))
            held = await box.store.engine.connect()  # type: ignore[attr-defined]
            try:
                answers = await walk(s, http, "msg_during")
            finally:
                await held.close()
            # The receiver's accept uses relaybox's own pool and still answers.
            receiver = answers.pop("receiver")
            assert receiver[0] == 202 or receiver[0] == 200, receiver
            assert_unavailable(answers, within=5)
            assert_serving(await walk(s, http, "msg_after"))
    finally:
        await box.close()
        await drop_pg_database(url)


async def test_sqlite_file_gone(http: aiohttp.ClientSession, tmp_path: Path) -> None:
    """The database file out of reach (its folder moved away, as an unmounted volume):
    nothing can open it. (Made unreadable by its mode would not stop the root user.)"""
    folder = tmp_path / "db"
    folder.mkdir()
    box = make_box(f"sqlite:///{folder / 'relaybox.db'}", pool_timeout=2.0)
    await box.store.migrate()
    try:
        async with Served(box.asgi(roles=ROLES)) as served:
            s = await prepare(box, served.url, http)
            assert_serving(await walk(s, http, "msg_before"))
            await box.store.engine.dispose()  # type: ignore[attr-defined]
            folder.rename(tmp_path / "elsewhere")
            try:
                assert_unavailable(await walk(s, http, "msg_during"), within=10)
            finally:
                (tmp_path / "elsewhere").rename(folder)
            assert_serving(await walk(s, http, "msg_after"))
    finally:
        await box.close()


@pytest.mark.slow
async def test_sqlite_locked_by_another_process(
    http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """Another process keeps the file's write lock (a frozen writer, a long migration):
    relaybox's transactions all take that lock first, so every surface waits out the
    10 s lock wait (or ``pool_timeout`` behind the one that waits) and answers 503."""
    path = tmp_path / "relaybox.db"
    box = make_box(f"sqlite:///{path}", pool_timeout=2.0)
    await box.store.migrate()
    try:
        async with Served(box.asgi(roles=ROLES)) as served:
            s = await prepare(box, served.url, http)
            assert_serving(await walk(s, http, "msg_before"))
            other = sqlite3.connect(path, isolation_level=None)
            try:
                other.execute("BEGIN IMMEDIATE")
                assert_unavailable(await walk(s, http, "msg_during"), within=15)
            finally:
                other.execute("ROLLBACK")
                other.close()
            assert_serving(await walk(s, http, "msg_after"))
    finally:
        await box.close()
