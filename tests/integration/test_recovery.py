"""Pull-based recovery against a local fake of GitHub's deliveries API, on SQLite and
PostgreSQL (GitHub does not redeliver failed webhooks; recovering them is the receiver's job)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from relaybox import Context, Relaybox, sources
from relaybox.config import Settings
from relaybox.inbound.recovery import GitHubDeliveries, RecoveryError, recover
from tests.conftest import Served
from tests.integration.test_replay import invoke, run_cli
from tests.support.fake_github import FakeGitHub

SECRET = "It's a Secret to Everybody"


def issue(number: int, owner: str = "octo-org") -> dict[str, Any]:
    return {
        "action": "opened",
        "issue": {"id": 1000 + number, "number": number, "title": f"Issue {number}"},
        "repository": {
            "id": 1296269,
            "full_name": f"{owner}/hello-world",
            "owner": {"login": owner, "id": 1},
        },
        "sender": {"login": "octocat", "id": 583231},
    }


def closed_port_url() -> str:
    """A URL nobody listens on: the service is down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/webhooks/github"


async def triage_box(database_url: str) -> Relaybox:
    box = Relaybox(settings=Settings(database_url=database_url))
    box.source("github", sources.github(secrets=[SECRET]))
    async with box.store.transaction() as conn:
        await conn.execute(text("CREATE TABLE triaged (issue INTEGER PRIMARY KEY)"))

    @box.handler("github", "issues.opened")
    async def triage(ctx: Context) -> None:
        found = ctx.payload["issue"]["id"]
        if await ctx.once(f"github:{ctx.event.account}:issue:{found}:triage"):
            await ctx.conn.execute(text("INSERT INTO triaged VALUES (:i)"), {"i": found})

    return box


async def test_recover_finds_a_missed_delivery_once(database_url: str, tmp_path: Path) -> None:
    """A delivery made while the service was down is found by `relaybox recover` and
    processed once; running recover again changes nothing."""
    box = await triage_box(database_url)
    cfg = tmp_path / "relaybox.toml"
    cfg.write_text(
        'log_level = "warning"\n[sources.github]\nprovider = "github"\n'
        f"secrets = [{json.dumps(SECRET)}]\n"
    )
    try:
        async with FakeGitHub(secret=SECRET) as github:
            async with Served(box.receiver) as server:
                ok = await github.deliver("issues", issue(1), server.url + "/webhooks/github")
            missed = await github.deliver("issues", issue(2), closed_port_url())
            async with Served(box.receiver) as server:
                await github.deliver("issues", issue(3), server.url + "/webhooks/github")
            assert (ok["status"], missed["status"]) == ("OK", "failed to connect")

            args = [
                "recover", "--source", "github", "--since", "1h",
                "--repo", "octo-org/hello-world", "--hook-id", "42", "--api-url", github.url,
                "--config", str(cfg), "--database-url", database_url, "--json",
            ]  # fmt: skip
            env = {"GITHUB_TOKEN": github.token}
            # The installed entry point once (a process costs ~1 s); in-process after.
            cli = run_cli if database_url.startswith("sqlite") else invoke
            code, out, err = await cli(*args, env=env)
            assert code == 0, err
            first = json.loads(out)
            assert (first["listed"], first["present"]) == (3, 2)
            assert first["missing"] == first["ingested"] == [missed["guid"]]

            await box.worker().run_once()
            code, out, err = await invoke(*args, env=env)
            assert code == 0, err
            second = json.loads(out)
            assert (second["listed"], second["present"], second["missing"]) == (3, 3, [])
            assert await box.worker().run_once() == 0

        triaged = await box.store.fetch_all("SELECT issue FROM triaged ORDER BY issue")
        assert [t["issue"] for t in triaged] == [1001, 1002, 1003]
        rows = await box.store.fetch_all(
            "SELECT event_id, account, status, recovered_via FROM relaybox_inbox ORDER BY id"
        )
        assert [r["status"] for r in rows] == ["done"] * 3
        [recovered] = [r for r in rows if r["recovered_via"]]
        assert recovered["event_id"] == missed["guid"] and recovered["account"] == "octo-org"
        assert recovered["recovered_via"] == (
            f"github-api:delivery/{missed['id']} (signature matched)"
        )
        audit = await box.store.fetch_all("SELECT event_id, action FROM relaybox_recoveries")
        assert audit == [{"event_id": missed["guid"], "action": "ingested"}]
    finally:
        await box.close()


async def test_redeliver_mode_and_pagination(database_url: str) -> None:
    """``mode="redeliver"`` asks GitHub to send the missed deliveries again; they
    arrive signed, through the receiver. Listing follows the Link cursor and stops
    at ``since``."""
    box = await triage_box(database_url)
    try:
        async with FakeGitHub(secret=SECRET) as github, Served(box.receiver) as server:
            target = server.url + "/webhooks/github"
            long_ago = time.time() - 7200
            await github.deliver("issues", issue(1), closed_port_url(), when=long_ago)
            missed = [await github.deliver("issues", issue(n), closed_port_url()) for n in (2, 3)]
            github.hook_url = target  # the service is back
            for n in (4, 5, 6):
                await github.deliver("issues", issue(n))
            deliveries = GitHubDeliveries(
                token=github.token,
                repo="octo-org/hello-world",
                hook_id=42,
                api_url=github.url,
                per_page=2,
            )
            async with deliveries:
                report = await recover(
                    box, "github", deliveries, since=time.time() - 3600, mode="redeliver"
                )
                again = await recover(box, "github", deliveries, since=time.time() - 3600)
            assert report.redelivery_requested == [m["guid"] for m in missed]
            assert (again.listed, again.present, again.missing) == (5, 5, [])
            assert any("cursor=v1_" in call for call in github.api_calls)
            assert not any(
                call.endswith("/attempts") and "1000" in call for call in github.api_calls
            )
        await box.worker().run_once()
        triaged = await box.store.fetch_all("SELECT issue FROM triaged ORDER BY issue")
        assert [t["issue"] for t in triaged] == [1002, 1003, 1004, 1005, 1006]
        rows = await box.store.fetch_all("SELECT recovered_via FROM relaybox_inbox")
        assert {r["recovered_via"] for r in rows} == {None}  # redelivered: ordinary rows
    finally:
        await box.close()


async def test_bytes_that_cannot_be_reproduced_are_ingested_on_the_apis_word(
    database_url: str,
) -> None:
    """The API returns parsed JSON: when re-serialising it does not give the signed
    bytes back, the delivery is still ingested (the API token authenticated it) and
    its identity comes from the payload, as the receiver would have read it."""
    box = await triage_box(database_url)
    try:
        async with FakeGitHub(secret=SECRET) as github:
            missed = await github.deliver(
                "issues", issue(7, owner="acme"), closed_port_url(), compact=False
            )
            async with GitHubDeliveries(
                token=github.token, repo="octo-org/hello-world", hook_id=42, api_url=github.url
            ) as deliveries:
                report = await recover(box, "github", deliveries, since=time.time() - 60)
                dry = await recover(box, "github", deliveries, since=time.time() - 60, dry_run=True)
            bad = GitHubDeliveries(
                token="wrong", repo="octo-org/hello-world", hook_id=42, api_url=github.url
            )
            with pytest.raises(RecoveryError, match="401"):
                await recover(box, "github", bad, since=0)
            await bad.close()
        down = GitHubDeliveries(
            token="t", repo="o/r", hook_id=1, api_url=closed_port_url().rsplit("/webhooks", 1)[0]
        )
        async with down:
            with pytest.raises(RecoveryError, match="unreachable"):
                await recover(box, "github", down, since=0)
        assert report.ingested == [missed["guid"]] and dry.missing == []
        [row] = await box.store.fetch_all(
            "SELECT account, event_type, status, recovered_via FROM relaybox_inbox"
        )
        assert (row["account"], row["event_type"], row["status"]) == (
            "acme",
            "issues.opened",
            "pending",
        )
        assert row["recovered_via"].endswith("(signature not reproducible)")
    finally:
        await box.close()
