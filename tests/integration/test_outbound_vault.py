"""Endpoint secrets sealed at rest (``outbound.secrets_key``): what the database holds,
deliveries a real receiver verifies, a wrong key, key rotation, secrets stored before a
key was set, the API's answer and the operator's commands; SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import standardwebhooks
from click.testing import CliRunner
from pydantic import ValidationError

from relaybox import FrozenClock, Relaybox
from relaybox.cli import main
from relaybox.config import Settings
from relaybox.config.outbound import OutboundSettings
from relaybox.outbound import configure, create_api_key, seal_secrets
from relaybox.outbound.endpoints import endpoint_secrets
from relaybox.outbound.vault import PREFIX, SecretsKeyMissing, SecretsLocked, Vault, new_key
from tests.conftest import Served
from tests.integration.test_hardening_secrets import as_older_versions_stored
from tests.support.outbound_app import dispatch_once, endpoint, local, outbox_rows, publish_one
from tests.support.receivers import HttpReceiver

OLD, NEW = new_key(), new_key()


async def stored(box: Relaybox) -> list[str]:
    rows = await box.store.fetch_all("SELECT secret FROM relaybox_endpoint_secrets ORDER BY id")
    return [r["secret"] for r in rows]


# -- the vault on its own ------------------------------------------------------------


def test_the_first_key_seals_and_every_key_opens() -> None:
    old, both, new = Vault(OLD), Vault(f"{NEW}, {OLD}"), Vault(NEW)
    sealed = old.seal("whsec_abc")
    assert sealed.startswith(PREFIX) and "whsec_abc" not in sealed
    assert sealed != old.seal("whsec_abc")  # a fresh IV every time
    assert both.open(sealed) == "whsec_abc"
    with pytest.raises(SecretsLocked, match=r"no key in outbound\.secrets_key opens"):
        new.open(sealed)
    with pytest.raises(SecretsLocked, match="secrets_key is not set"):
        Vault(None).open(sealed)
    assert [v.state(sealed) for v in (old, both, new, Vault(None))] == [
        "current",
        "older",
        "locked",
        "locked",
    ]
    assert new.state("whsec_abc") == "plaintext"
    moved = both.reseal(sealed)
    assert moved is not None and new.open(moved) == "whsec_abc"
    assert both.reseal(moved) is None  # already under the first key
    # Plaintext (stored by older versions) is read as it is, and sealed by reseal;
    # without a key nothing is stored in plaintext instead.
    assert new.open("whsec_plain") == "whsec_plain"
    with pytest.raises(SecretsKeyMissing, match=r"set outbound\.secrets_key"):
        Vault(None).seal("whsec_plain")
    with pytest.raises(SecretsKeyMissing):
        Vault(None).reseal("whsec_plain")
    resealed = new.reseal("whsec_plain")
    assert resealed is not None and new.open(resealed) == "whsec_plain"


def test_the_setting_names_a_bad_key_and_never_shows_a_good_one() -> None:
    with pytest.raises(ValidationError, match="key 2 is not a Fernet key"):
        OutboundSettings(secrets_key=f"{OLD},not-a-key")
    assert OutboundSettings(secrets_key="").secrets_key is None  # an empty variable: unset
    settings = OutboundSettings(secrets_key=OLD)
    assert OLD not in repr(settings) and OLD not in settings.model_dump_json()


# -- end to end -----------------------------------------------------------------------


async def test_sealed_secrets_sign_deliveries_that_verify(
    box: Relaybox, clock: FrozenClock
) -> None:
    clock.set(time.time())
    local(box, secrets_key=OLD)
    async with HttpReceiver() as receiver:
        endpoint_id, secret = await endpoint(box, receiver.url)
        await endpoint(box, receiver.url, secret_type="ed25519")
        for value in await stored(box):
            assert value.startswith(PREFIX) and "whsec_" not in value and "whsk_" not in value
        shown = await endpoint_secrets(box, endpoint_id, "t1")
        assert shown is not None and [s["secret"] for s in shown] == [secret]
        await publish_one(box)
        assert await dispatch_once(box) == 2
        seen = next(r for r in receiver.requests if "v1," in r.headers["webhook-signature"])
    standardwebhooks.Webhook(secret).verify(seen.body, seen.headers)
    assert [r["status"] for r in await outbox_rows(box)] == ["sent", "sent"]


async def test_a_wrong_key_holds_deliveries_until_the_right_one_returns(
    box: Relaybox, clock: FrozenClock
) -> None:
    """Nothing goes out unsigned or wrongly signed: the delivery retries with the reason,
    the API answers 503; rotating to a new key and sealing again makes it flow."""
    clock.set(time.time())
    local(box, secrets_key=OLD)
    async with HttpReceiver() as receiver:
        endpoint_id, secret = await endpoint(box, receiver.url)
        configure(box, secrets_key=NEW)  # the old key was lost from the configuration
        await publish_one(box)
        assert await dispatch_once(box) == 1
        assert receiver.requests == []
        [row] = await outbox_rows(box)
        assert row["status"] == "pending"
        assert "no key in outbound.secrets_key opens" in row["last_error"]
        with pytest.raises(SecretsLocked):
            await endpoint_secrets(box, endpoint_id, "t1")

        configure(box, secrets_key=f"{NEW},{OLD}")  # rotation: new first, old still opens
        assert await seal_secrets(box) == {"sealed": 1, "already": 0}
        assert await seal_secrets(box) == {"sealed": 0, "already": 1}
        configure(box, secrets_key=NEW)  # the old key can go
        clock.advance(10)  # the first retry's delay (5 s, no jitter in tests)
        assert await dispatch_once(box) == 1
        [seen] = receiver.requests
    standardwebhooks.Webhook(secret).verify(seen.body, seen.headers)
    assert [r["status"] for r in await outbox_rows(box)] == ["sent"]


async def test_secrets_stored_in_plaintext_by_older_versions_keep_working_then_get_sealed(
    box: Relaybox, clock: FrozenClock
) -> None:
    clock.set(time.time())
    local(box, secrets_key=OLD)
    async with HttpReceiver() as receiver:
        _, secret = await endpoint(box, receiver.url)
        assert await as_older_versions_stored(box) == [secret]
        assert await stored(box) == [secret]
        await publish_one(box)
        assert await dispatch_once(box) == 1
        assert await seal_secrets(box) == {"sealed": 1, "already": 0}
        [value] = await stored(box)
        assert value.startswith(PREFIX) and secret not in value
        await publish_one(box, data={"petId": "p2"})
        assert await dispatch_once(box) == 1
        first, second = receiver.requests
    for seen in (first, second):
        standardwebhooks.Webhook(secret).verify(seen.body, seen.headers)


async def test_the_api_answers_503_when_no_key_opens_the_secret(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box, secrets_key=OLD)
    _, key = await create_api_key(box, "t1", "tests")
    endpoint_id, secret = await endpoint(box, "https://hooks.example.com/x")
    async with Served(box.asgi(roles=("api",))) as served, aiohttp.ClientSession() as http:
        url = f"{served.url}/api/v1/endpoints/{endpoint_id}/secret"
        auth = {"Authorization": f"Bearer {key}"}
        async with http.get(url, headers=auth) as r:
            assert r.status == 200
            assert [s["secret"] for s in (await r.json())["data"]] == [secret]
        configure(box, secrets_key=NEW)
        async with http.get(url, headers=auth) as r:
            assert r.status == 503
            assert (await r.json())["error"] == "secrets_locked"


def test_operator_commands_make_a_key_and_seal(
    monkeypatch: pytest.MonkeyPatch, database_url: str, tmp_path: Path
) -> None:
    for name in list(os.environ):
        if name.startswith("RELAYBOX_") and not name.startswith("RELAYBOX_TEST_"):
            monkeypatch.delenv(name)
    runner = CliRunner()

    def run(*args: str, key: str | None = None, code: int = 0) -> Any:
        config = tmp_path / "relaybox.toml"
        config.write_text(f'[outbound]\nsecrets_key = "{key}"\n' if key else "")
        result = runner.invoke(
            main,
            [*args, "--config", str(config), "--database-url", database_url],
            prog_name="relaybox",
        )
        assert result.exit_code == code, (result.output, result.exception)
        return result

    made = runner.invoke(main, ["endpoints", "new-key"], prog_name="relaybox").stdout.strip()
    assert Vault(made).sealing
    created = json.loads(
        run(
            "endpoints", "create", "--tenant", "t1", "--url", "https://hooks.example.com/x",
            key=made,
        ).stdout
    )  # fmt: skip
    assert doctor(run, key=made) == ("ok", "1 endpoint secret(s) sealed")
    asyncio.run(_as_older_versions_stored(database_url, made))
    assert doctor(run, key=made) == ("warn", "1 in plaintext and 0 under an older key")
    assert json.loads(run("endpoints", "seal-secrets", key=made).stdout) == {
        "sealed": 1,
        "already": 0,
    }
    shown = json.loads(run("endpoints", "show", created["id"], key=made).stdout)
    assert [s["secret"] for s in shown["secrets"]] == [created["secret"]]
    locked = run("endpoints", "show", created["id"], code=1)  # the key is missing
    assert "endpoint secrets are sealed and" in locked.output
    assert doctor(run, key=made) == ("ok", "1 endpoint secret(s) sealed")
    rotated = f"{new_key()},{made}"
    assert doctor(run, key=rotated) == ("warn", "0 in plaintext and 1 under an older key")
    assert doctor(run, key=new_key(), code=1)[0] == "fail"


async def _as_older_versions_stored(database_url: str, key: str) -> None:
    b = Relaybox(settings=Settings(database_url=database_url), clock=FrozenClock(0))
    configure(b, secrets_key=key)
    try:
        await as_older_versions_stored(b)
    finally:
        await b.close()


def doctor(run: Any, *, key: str | None, code: int = 0) -> tuple[str, str]:
    """``relaybox doctor``'s secrets check: (status, the start of its detail)."""
    checks = json.loads(run("doctor", "--json", key=key, code=code).stdout)["checks"]
    [found] = [c for c in checks if c["check"] == "secrets"]
    return found["status"], found["detail"].split(":")[0]
