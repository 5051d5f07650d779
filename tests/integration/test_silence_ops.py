"""Silence detection as an operator meets it, on SQLite and PostgreSQL: the
dashboard's badge, ``relaybox maintenance --once`` and ``relaybox doctor``, and a real
``relaybox serve`` process (receiver and maintenance roles) that finds a source silent,
shows it on /metrics and announces it, then its return when a delivery arrives."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from relaybox import FrozenClock, Relaybox
from relaybox.config import Settings
from relaybox.config.silence import SilenceSettings
from relaybox.silence import SilenceWatch
from tests.conftest import KEYED, SECRETS_KEY, Served
from tests.integration.test_admin_api import TOKEN
from tests.integration.test_ops_cli import Invoke, cli_runner
from tests.integration.test_silence import arrive, events
from tests.support.outbound_app import local
from tests.support.procs import Procs, wait_until

SECRET = "silence-ops-secret"
CONFIG = f"""
log_level = "warning"
[outbound]
secrets_key = "{SECRETS_KEY}"
[sources.github]
provider = "github"
secrets = [{json.dumps(SECRET)}]
[silence.sources.github]
expect_every = "{{every}}"
"""


@pytest.fixture
def cli() -> Iterator[Invoke]:
    yield from cli_runner()


async def test_the_dashboard_shows_a_silent_source(database_url: str) -> None:
    clock = FrozenClock(time.time())
    silence = SilenceSettings(sources={"s": {"expect_every": "30m"}})  # type: ignore[dict-item]
    settings = Settings(
        database_url=database_url, admin_token=TOKEN, outbound=KEYED, silence=silence
    )
    box = Relaybox(settings=settings, clock=clock)
    local(box)
    try:
        await arrive(box, "s", clock.now())
        async with (
            Served(box.asgi(roles=("admin",))) as served,
            aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http,
        ):
            login = {"token": TOKEN, "next": "/admin/"}
            async with http.post(served.url + "/admin/login", data=login) as r:
                assert r.status == 200
            await SilenceWatch(box).run_once()
            async with http.get(served.url + "/admin/") as r:
                page = await r.text()
            assert 'data-metric="silent">0<' in page and "data-silent-source" not in page
            clock.advance(45 * 60)
            await SilenceWatch(box).run_once()
            async with http.get(served.url + "/admin/") as r:
                page = await r.text()
            assert 'data-metric="silent">1<' in page
            assert 'data-silent-source="s"' in page and "45m 0s" in page
    finally:
        await box.close()


async def test_maintenance_once_and_doctor_name_the_silence(
    cli: Invoke, database_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "relaybox.toml"
    config.write_text(CONFIG.format(every="1h"))
    box = Relaybox(settings=Settings(database_url=database_url, outbound=KEYED))
    try:
        await arrive(box, "github", time.time() - 2 * 3600)
    finally:
        await box.close()
    args = ["--config", str(config), "--database-url", database_url, "--json"]
    first = json.loads((await cli("maintenance", "--once", *args)).stdout)
    assert first["silence"]["silent"] == {"source": ["github"], "endpoint": []}
    again = json.loads((await cli("maintenance", "--once", *args)).stdout)
    assert again["silence"]["silent"] == {"source": [], "endpoint": []}
    doctor = json.loads((await cli("doctor", *args)).stdout)
    [finding] = [c for c in doctor["checks"] if c["check"] == "silence"]
    assert finding["status"] == "warn" and "source github (nothing for 2h 0m)" in finding["detail"]
    assert doctor["ok"] is True  # a warning: the exit code stays 0


def github_delivery(guid: str) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"zen": "Keep it logically awesome.", "hook_id": 1}).encode()
    signature = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": "ping",
        "X-GitHub-Delivery": guid,
        "X-Hub-Signature-256": f"sha256={signature}",
    }
    return body, headers


@pytest.mark.slow
async def test_a_real_server_finds_a_source_silent_and_its_return(
    database_url: str, tmp_path: Path
) -> None:
    """``relaybox serve --roles receiver,maintenance`` checking every 0.2 s, a
    GitHub source expected every 2 s: it goes silent (on /metrics, an event), a
    signed delivery over HTTP ends it (a resumed event); the server stops cleanly."""
    config = tmp_path / "relaybox.toml"
    config.write_text(CONFIG.format(every="2s"))
    procs = Procs(tmp_path)
    box = Relaybox(settings=Settings(database_url=database_url, outbound=KEYED))
    try:
        server = await _serve(procs, database_url, config, {"RELAYBOX_SILENCE__CHECK_EVERY": "0.2"})

        async def gauge() -> float | None:
            async with aiohttp.ClientSession() as http, http.get(server.url + "/metrics") as r:
                text = await r.text()
            for line in text.splitlines():
                if line.startswith('relaybox_source_silent_seconds{source="github"}'):
                    return float(line.split()[-1])
            return None

        async def silent() -> Any:
            value = await gauge()
            return value is not None and value > 0

        await wait_until(silent, within=20, what="the source silent on /metrics", procs=procs)
        await wait_until(
            lambda: events(box, "relaybox.source.silent"),
            within=10,
            what="relaybox.source.silent",
            procs=procs,
        )
        body, headers = github_delivery(str(uuid.uuid4()))
        async with aiohttp.ClientSession() as http:
            async with http.post(server.url + "/webhooks/github", data=body, headers=headers) as r:
                assert r.status == 200, await r.text()

        async def resumed() -> Any:
            return await events(box, "relaybox.source.resumed")

        [back] = await wait_until(resumed, within=10, what="relaybox.source.resumed", procs=procs)
        assert back["source"] == "github"
        # Once resumed it may go silent again after 2 s more: at most one more event.
        assert len(await events(box, "relaybox.source.silent")) in (1, 2)
        assert Procs.stop(server) == [0]
    finally:
        procs.cleanup()
        await box.close()


async def _serve(procs: Procs, database_url: str, config: Path, env: dict[str, str]) -> Any:
    from tests.support.procs import free_port, wait_http

    port = free_port()
    args = ["serve", "--config", str(config), "--database-url", database_url]
    args += ["--roles", "receiver,maintenance", "--host", "127.0.0.1", "--port", str(port)]
    server = procs.start("serve", args, env)
    server.url = f"http://127.0.0.1:{port}"
    await wait_http(server.url + "/healthz", proc=server)
    return server


@pytest.mark.slow
async def test_relaybox_maintenance_runs_the_check_until_sigterm(
    database_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "relaybox.toml"
    config.write_text(CONFIG.format(every="1s"))
    procs = Procs(tmp_path)
    box = Relaybox(settings=Settings(database_url=database_url, outbound=KEYED))
    try:
        args = ["maintenance", "--config", str(config), "--database-url", database_url]
        proc = procs.start("maintenance", args, {"RELAYBOX_SILENCE__CHECK_EVERY": "0.2"})
        [silent] = await wait_until(
            lambda: events(box, "relaybox.source.silent"),
            within=20,
            what="relaybox.source.silent from relaybox maintenance",
            procs=procs,
        )
        assert silent["source"] == "github" and silent["lastArrivalAt"] is None
        assert Procs.stop(proc) == [0]
    finally:
        procs.cleanup()
        await box.close()
