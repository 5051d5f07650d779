"""relaybox.testing: the pytest plugin's fixtures, signed deliveries for every provider,
and a test of the credits example written only with the kit, which catches a broken
handler."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from examples.credits import app as credits

from relaybox import Context, FrozenClock, Relaybox, sources
from relaybox.cli import main
from relaybox.errors import BadSignature
from relaybox.testing import TEST_SECRETS, Harness, signed_delivery, test_source
from tests.conftest import Served

NOW = 1_800_000_000.0
PROVIDERS = sorted(set(sources.PROVIDERS) - {"hmac"})


@pytest.mark.parametrize("provider", PROVIDERS)
def test_signed_delivery_is_accepted_by_the_provider_and_a_changed_byte_is_not(
    provider: str,
) -> None:
    source = test_source(provider)
    delivery = signed_delivery(provider, now=NOW)
    headers = {**delivery.headers, ":url": delivery.url}
    verified = source.verify(headers, delivery.body, NOW)
    assert verified.event_id
    credentials = ("postmark", "gitlab", "mailgun", "adyen", "msgraph", "okta", "pipedrive")
    if provider in (*credentials, "chargebee"):
        return  # credentials or signature fields, not the body bytes, are what is checked
    with pytest.raises(BadSignature):
        tampered = delivery.tampered()
        source.verify({**tampered.headers, ":url": delivery.url}, tampered.body, NOW)


def test_every_provider_has_a_test_secret() -> None:
    assert set(PROVIDERS) <= set(TEST_SECRETS)


async def test_every_provider_through_a_harness(
    relaybox_harness: Callable[..., Any],
) -> None:
    def configure(box: Any) -> None:
        for provider in PROVIDERS:
            box.source(provider, test_source(provider))

    harness: Harness = await relaybox_harness(configure)
    for provider in PROVIDERS:
        delivery = harness.signed(provider)
        first = await harness.deliver(delivery)
        again = await harness.deliver(delivery)
        assert 200 <= first.status < 300 and 200 <= again.status < 300, (provider, first)
        rows = await harness.inbox(provider)
        # Dropbox notifications have no identity (identical bodies for different
        # changes): each request is its own event, by design.
        assert len(rows) == (2 if provider == "dropbox" else 1), provider
        assert rows[0]["payload"] == delivery.body


# -- the credits example, tested with the kit only ---------------------------------------


def invoice_paid(event_id: str, invoice: str, **fields: Any) -> dict[str, Any]:
    obj = {"id": invoice, "object": "invoice", "status": "paid", "amount_paid": 2000, **fields}
    return {"id": event_id, "object": "event", "type": "invoice.paid", "data": {"object": obj}}


async def check_credits(harness: Harness) -> None:
    """What the credits example promises, asserted with relaybox.testing alone."""
    grant = credits.grant_key("stripe", credits.DEV_ACCOUNT, "in_1")
    # Two notifications of one invoice, one of them re-delivered: one grant.
    for event_id in ("evt_1", "evt_1", "evt_2"):
        await harness.send("stripe", event_id=event_id, payload=invoice_paid(event_id, "in_1"))
    assert len(await harness.inbox("stripe")) == 2
    await harness.drain_worker()
    await harness.assert_status("evt_1", "done")
    await harness.assert_status("evt_2", "done")
    await harness.assert_business_key(grant, fingerprint="credits=100")
    [mail] = await harness.assert_outbox(credits.EMAIL, count=1)
    assert mail["payload"]["credits"] == 100 and mail["tenant"] == "ws_dev"
    # An invoice that is not paid grants nothing and goes to dead letters as invalid.
    await harness.send(
        "stripe", event_id="evt_3", payload=invoice_paid("evt_3", "in_3", status="open")
    )
    await harness.drain_worker()
    await harness.assert_dead("evt_3", "invalid")
    await harness.assert_no_business_key(credits.grant_key("stripe", credits.DEV_ACCOUNT, "in_3"))
    # A forged delivery is refused and stores nothing.
    forged = harness.signed("stripe", payload=invoice_paid("evt_4", "in_4")).tampered()
    assert (await harness.deliver(forged)).status == 401
    assert await harness.inbox("stripe", "evt_4") == []


async def test_the_credits_example_keeps_its_promises(
    relaybox_harness: Callable[..., Any],
) -> None:
    harness = await relaybox_harness(credits.configure, setup=credits.setup)
    await check_credits(harness)


async def grant_without_once(ctx: Context) -> None:
    """A broken grant handler: it forgets ctx.once(), so every notification of an
    invoice grants (and e-mails) again."""
    invoice = ctx.payload["data"]["object"]
    key = credits.grant_key(ctx.event.source, ctx.event.account, invoice["id"])
    if invoice.get("status") != "paid":
        return
    await ctx.outbox.add(credits.EMAIL, f"{key}:{ctx.event.event_id}", {"credits": 100})


async def test_the_kit_catches_a_broken_grant_handler(
    relaybox_harness: Callable[..., Any],
) -> None:
    def broken(box: Any) -> None:
        box.handler("stripe", "invoice.paid")(grant_without_once)  # registered first: wins
        credits.configure(box)

    harness = await relaybox_harness(broken, setup=credits.setup)
    with pytest.raises(AssertionError, match="recorded 0 times"):
        await check_credits(harness)


async def test_inline_harness_runs_the_handler_with_the_accept(
    relaybox_harness: Callable[..., Any],
) -> None:
    harness = await relaybox_harness(credits.configure, setup=credits.setup, inline=True)
    await harness.send("stripe", event_id="evt_i", payload=invoice_paid("evt_i", "in_i"))
    await harness.assert_status("evt_i", "done")
    assert await harness.run_worker() == 0
    await harness.assert_business_key(credits.grant_key("stripe", credits.DEV_ACCOUNT, "in_i"))


async def test_signed_delivery_fixture_and_clock(
    signed_delivery: Callable[..., Any], relaybox_clock: Any
) -> None:
    delivery = signed_delivery("stripe", event_type="invoice.paid", now=relaybox_clock.now())
    verified = test_source("stripe").verify(delivery.headers, delivery.body, relaybox_clock.now())
    assert (verified.event_type, verified.event_id) == ("invoice.paid", delivery.event_id)


# -- relaybox send-test knows every provider ---------------------------------------------


async def test_send_test_reaches_a_receiver_for_every_provider(tmp_path: Path) -> None:
    lines = [f'database_url = "sqlite:///{tmp_path / "send.db"}"']
    for provider in PROVIDERS:
        lines += [f"[sources.{provider}]", f'provider = "{provider}"']
        lines.append(f"secrets = [{json.dumps(TEST_SECRETS[provider])}]")
    config = tmp_path / "relaybox.toml"
    config.write_text("\n".join(lines) + "\n")
    box = Relaybox(config=config)
    await box.migrate()
    runner = CliRunner()
    sent: dict[str, str] = {}
    try:
        async with Served(box.receiver) as served:
            for provider in PROVIDERS:
                result = await asyncio.to_thread(
                    runner.invoke,
                    main,
                    ["send-test", provider, "--config", str(config), "--url", served.url],
                )
                assert result.exit_code == 0, (provider, result.output)
                assert "-> 200 " in result.output, (provider, result.output)
                answer = result.output.split("-> 200 ", 1)[1]
                if answer.startswith("{"):  # relaybox's own answer names the event
                    named = json.loads(answer).get("event_id")
                    if named:  # (a handshake's answer names none)
                        sent[provider] = named
            # "--event-id: a given one resends": the event id an earlier send printed,
            # sent again, is the same bytes (a duplicate), not other content under a
            # known id (quarantine: the first send's body carried the time of the send).
            assert "stripe" in sent and "github" in sent, sent
            for provider in sent:
                result = await asyncio.to_thread(
                    runner.invoke,
                    main,
                    [
                        "send-test",
                        provider,
                        "--config",
                        str(config),
                        "--url",
                        served.url,
                        "--event-id",
                        sent[provider],
                    ],
                )
                assert result.exit_code == 0, (provider, result.output)
        kit = Harness(box, FrozenClock(NOW))
        for provider in ("stripe", "github"):  # the id they print is the one they send
            assert len(await kit.inbox(provider)) == 1, provider
        assert await box.store.fetch_all("SELECT source FROM relaybox_quarantine") == []
    finally:
        await box.close()


# -- a fresh project: the docs' first test, pytest's default settings --------------------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "testing.md"


def _docs_file(name: str) -> str:
    """The Python block of docs/testing.md introduced by a line naming ``name``."""
    text = DOCS.read_text()
    at = text.index(f"`{name}`:")
    start = text.index("```python\n", at) + len("```python\n")
    return text[start : text.index("```\n", start)]


def test_the_docs_first_test_passes_in_a_new_project_with_default_settings(
    tmp_path: Path,
) -> None:
    """docs/testing.md's ``myapp.py`` and ``test_myapp.py``, as written, in a project
    with no pytest settings at all: pytest-asyncio in its default strict mode (the
    suite's own ``asyncio_mode = auto`` hid that the fixture failed there)."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "myapp"\nversion = "0"\n')
    (tmp_path / "myapp.py").write_text(_docs_file("myapp.py"))
    (tmp_path / "test_myapp.py").write_text(_docs_file("test_myapp.py"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
    assert not (tmp_path / "app.db").exists()  # the app's own database was never touched


async def test_a_harness_borrows_the_apps_box_and_gives_it_back(
    relaybox_harness: Callable[..., Any], tmp_path: Path
) -> None:
    """The app's module-level box (the README's shape) is tested as it is: its sources
    and handlers, on the test database and clock, and its own database afterwards."""
    own = f"sqlite:///{tmp_path / 'own.db'}"
    box = Relaybox(own)
    box.source("stripe", test_source("stripe", account="acct_1"))
    seen: list[str] = []

    @box.handler("stripe", "invoice.paid")
    async def grant(ctx: Context) -> None:
        seen.append(ctx.event.event_id)
        await ctx.outbox.add("email", f"grant:{ctx.event.event_id}", {"ok": True})

    kit: Harness = await relaybox_harness(box, inline=True)
    assert kit.box is box and kit.store is box.store
    assert box.settings.database_url != own and isinstance(box.clock, FrozenClock)
    await kit.send("stripe", event_id="evt_1", payload=invoice_paid("evt_1", "in_1"))
    assert seen == ["evt_1"]
    await kit.assert_outbox("email", count=1)
    await kit.close()
    assert box.settings.database_url == own and not isinstance(box.clock, FrozenClock)
    assert box.sources["stripe"].inline is False
    assert not (tmp_path / "own.db").exists()


async def test_a_running_box_is_refused_with_what_to_do(
    relaybox_harness: Callable[..., Any], tmp_path: Path
) -> None:
    box = Relaybox(f"sqlite:///{tmp_path / 'own.db'}", clock=FrozenClock(NOW))
    async with box.running(roles=("worker",), receiver=False):
        with pytest.raises(RuntimeError, match="before the app starts"):
            await relaybox_harness(box)
