"""Endpoint signing secrets are sealed by default: a copy of the database cannot sign
webhooks. SQLite keeps its key in a file beside the database (made once, mode 0600,
never replaced); PostgreSQL needs ``outbound.secrets_key`` and refuses to store a
secret without it; ``relaybox migrate`` seals what older versions stored in plaintext;
``relaybox doctor`` names what is wrong."""

from __future__ import annotations

import asyncio
import base64
import errno
import json
import os
import stat
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import sqlalchemy
import standardwebhooks
from click.testing import CliRunner

from relaybox import FrozenClock, Relaybox
from relaybox.cli import main
from relaybox.config import Settings
from relaybox.config.outbound import OutboundSettings
from relaybox.outbound import configure, create_api_key, endpoints, outbound, seal_secrets
from relaybox.outbound.channels.http import credential_header, record_headers
from relaybox.outbound.endpoints import seal_plaintext
from relaybox.outbound.vault import PREFIX, KeyFile, KeyFileError, SecretsKeyMissing, new_key
from relaybox.store.backend import load_migrations
from relaybox.store.schema_sync import migrate_sync
from tests.conftest import KEYED, Served, _dsn
from tests.integration.test_admin_api import AUTH, TOKEN
from tests.integration.test_endpoint_credentials import TokenServer
from tests.integration.test_portal import portal_for
from tests.support.outbound_app import LOCAL, dispatch_once, endpoint, local, publish_one
from tests.support.procs import Procs, free_port, wait_http
from tests.support.receivers import HttpReceiver, Reply, Seen

# -- helpers ----------------------------------------------------------------------------


async def as_older_versions_stored(box: Relaybox) -> list[str]:
    """Every stored secret written back as the secret itself, which is what versions
    that sealed only with ``outbound.secrets_key`` stored without one. Returns them."""
    vault, store = outbound(box).vault, box.store
    async with store.transaction() as conn:
        rows = await store.outbox.endpoint_secrets_page(conn, 0, 10_000)
        for secret_id, stored in rows:
            await store.outbox.endpoint_secret_swap(conn, secret_id, stored, vault.open(stored))
    return [vault.open(stored) for _, stored in rows]


def secret_forms(secret: str) -> list[bytes]:
    """What must not be found in a copy of the database: the secret as its owner got
    it, its base64 core, and the raw key bytes."""
    core = secret.split("_", 1)[1]
    return [secret.encode(), core.encode(), base64.b64decode(core)]


def clean_env() -> dict[str, str]:
    """The environment without relaybox settings (a fresh deployment's)."""
    return {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith("RELAYBOX_") and not k.startswith("RELAYBOX_TEST_"))
    }


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path, env=clean_env())
    yield p
    p.cleanup()


async def cli(procs: Procs, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """A ``relaybox`` command as its own process: (exit code, output)."""
    proc = procs.start(args[0], list(args), env)
    code = await proc.wait_exit(60)
    return code, proc.output()


def last_json(output: str) -> Any:
    """The JSON document a command printed (after any log lines)."""
    start = output.rindex("\n{\n") + 1 if "\n{\n" in output else output.index("{")
    return json.loads(output[start:])


async def serve_api(procs: Procs, database_url: str, env: dict[str, str] | None = None) -> str:
    """``relaybox serve --roles api`` (no --app: the deployment's own settings)."""
    port = free_port()
    proc = procs.start(
        "serve",
        ["serve", "--database-url", database_url, "--roles", "api", "--port", str(port)],
        env,
    )
    url = f"http://127.0.0.1:{port}"
    await wait_http(url + "/healthz", within=30, proc=proc)
    return url


async def create_three(http: aiohttp.ClientSession, base: str, key: str) -> list[dict[str, Any]]:
    """Two endpoints (hmac, ed25519) and a rotation, through the tenant API."""
    auth = {"Authorization": f"Bearer {key}"}
    made = []
    for kind in ("hmac", "ed25519"):
        body = {"url": "https://hooks.example.com/x", "secret_type": kind}
        async with http.post(f"{base}/api/v1/endpoints", json=body, headers=auth) as r:
            assert r.status == 201, await r.text()
            made.append(await r.json())
    async with http.post(
        f"{base}/api/v1/endpoints/{made[0]['id']}/secret/rotate", json={}, headers=auth
    ) as r:
        assert r.status == 201, await r.text()
        made.append(await r.json())
    return made


def no_secret_in(blob: bytes, made: list[dict[str, Any]]) -> None:
    assert b"whsec_" not in blob and b"whsk_" not in blob
    for item in made:
        if item["secret"].startswith("whsec_"):
            for form in secret_forms(item["secret"]):
                assert form not in blob, item["secret"]


# -- a copy of the database holds no plaintext signing secret ------------------------------


async def test_a_sqlite_database_copied_from_a_fresh_deployment_holds_no_signing_secret(
    procs: Procs, tmp_path: Path
) -> None:
    """A fresh deployment as an operator makes one (real processes, nothing configured
    about secrets): the database file, its WAL and a copy of it hold no secret."""
    db_file = tmp_path / "deploy" / "relaybox.db"
    url = f"sqlite:///{db_file}"
    code, out = await cli(procs, "migrate", "--database-url", url)
    assert code == 0, out
    code, out = await cli(procs, "api-keys", "create", "--tenant", "t1", "--database-url", url)
    assert code == 0, out
    api_key = last_json(out)["key"]
    base = await serve_api(procs, url)
    async with aiohttp.ClientSession() as http:
        made = await create_three(http, base, api_key)
        auth = {"Authorization": f"Bearer {api_key}"}
        async with http.get(f"{base}/api/v1/endpoints/{made[0]['id']}/secret", headers=auth) as r:
            shown = [s["secret"] for s in (await r.json())["data"]]
    assert sorted(shown) == sorted([made[0]["secret"], made[2]["secret"]])
    Procs.stop(*procs.started)
    files = sorted(p for p in db_file.parent.iterdir() if p.suffix != ".key")
    assert db_file in files
    no_secret_in(b"".join(p.read_bytes() for p in files), made)
    key_file = db_file.with_name("relaybox.db.key")
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    # Every text column, as a copy's reader sees it.
    box = Relaybox(settings=Settings(database_url=url))
    try:
        rows = await box.store.fetch_all("SELECT secret FROM relaybox_endpoint_secrets")
        assert len(rows) == 3 and all(r["secret"].startswith(PREFIX) for r in rows)
    finally:
        await box.close()


async def test_postgres_refuses_to_store_a_secret_without_a_key_and_seals_with_one(
    procs: Procs, pg_url: str
) -> None:
    """No key on PostgreSQL: the tenant API answers 503 naming the setting, nothing is
    stored. With a key: a dump of every row of every relaybox table holds no secret."""
    code, out = await cli(procs, "api-keys", "create", "--tenant", "t1", "--database-url", pg_url)
    assert code == 0, out
    api_key = last_json(out)["key"]
    auth = {"Authorization": f"Bearer {api_key}"}
    base = await serve_api(procs, pg_url)
    async with aiohttp.ClientSession() as http:
        body = {"url": "https://hooks.example.com/x"}
        async with http.post(f"{base}/api/v1/endpoints", json=body, headers=auth) as r:
            assert r.status == 503
            answer = await r.json()
        assert answer["error"] == "secrets_key_missing"
        assert "RELAYBOX_OUTBOUND__SECRETS_KEY" in answer["message"]
        async with http.get(f"{base}/api/v1/endpoints", headers=auth) as r:
            assert (await r.json())["data"] == []  # nothing half-made
        Procs.stop(*procs.started)
        keyed = {"RELAYBOX_OUTBOUND__SECRETS_KEY": new_key()}
        base = await serve_api(procs, pg_url, env=keyed)
        made = await create_three(http, base, api_key)
    conn = await asyncpg.connect(_dsn(pg_url))
    try:
        tables = [
            r["tablename"]
            for r in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE 'relaybox%'"
            )
        ]
        dump = []
        for table in tables:
            dump += [r[0] for r in await conn.fetch(f'SELECT t::text FROM "{table}" t')]
        sealed = await conn.fetch("SELECT secret FROM relaybox_endpoint_secrets")
    finally:
        await conn.close()
    assert "relaybox_endpoint_secrets" in tables and len(sealed) == 3
    no_secret_in("\n".join(dump).encode(), made)


# -- secrets stored in plaintext by older versions --------------------------------------


async def test_migrate_seals_plaintext_secrets_in_batches_and_deliveries_still_verify(
    database_url: str, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows as older versions stored them are sealed by the migration path, in batches,
    by two processes at once without harm; deliveries verify with the official
    library before and after, and a key rotation afterwards still works."""
    clock.set(time.time())
    monkeypatch.setattr(endpoints, "_SEAL_BATCH", 2)  # five secrets: three batches
    postgres = database_url.startswith("postgres")
    # SQLite: the default (the key file); PostgreSQL: a configured key.
    key = new_key() if postgres else None
    settings = Settings(database_url=database_url, outbound=OutboundSettings(secrets_key=key))
    box = Relaybox(settings=settings, clock=clock)
    other = Relaybox(settings=settings, clock=clock)
    configure(box, **{**LOCAL, "secrets_key": key})
    configure(other, **{**LOCAL, "secrets_key": key})
    try:
        async with HttpReceiver() as receiver:
            made = [await endpoint(box, receiver.url, tenant=f"t{i}") for i in range(5)]
            plain = await as_older_versions_stored(box)
            assert sorted(plain) == sorted(s for _, s in made)
            n = await endpoints.secrets_at_rest(box)
            assert n["plaintext"] == 5
            await publish_one(box, tenant="t0")
            assert await dispatch_once(box) == 1

            # Two processes migrating at once (the step `relaybox migrate` and
            # Relaybox.migrate() run): each secret sealed exactly once, none lost.
            results = await asyncio.gather(seal_plaintext(box), seal_plaintext(other))
            assert sum(r["sealed"] for r in results) == 5
            assert all(r["plaintext"] == 0 for r in results)
            stored = await box.store.fetch_all(
                "SELECT secret FROM relaybox_endpoint_secrets ORDER BY id"
            )
            assert all(r["secret"].startswith(PREFIX) for r in stored)
            assert not any(s in r["secret"] for r in stored for _, s in made)
            assert await endpoints.secrets_at_rest(box) == {
                "plaintext": 0,
                "current": 5,
                "older": 0,
                "locked": 0,
            }
            assert await box.migrate() == []  # idempotent: nothing left to seal
            assert await seal_plaintext(box) == {"sealed": 0, "plaintext": 0}

            for i in range(5):
                await publish_one(box, tenant=f"t{i}", data={"petId": f"p{i}"})
            assert await dispatch_once(box) == 5

            # Rotation: a new key in front, seal-secrets, the old key can go.
            current = outbound(box).settings.secrets_key
            old = current.get_secret_value() if current else KeyFile(key_file(database_url)).read()
            newer = new_key()
            configure(box, secrets_key=f"{newer},{old}")
            assert await seal_secrets(box) == {"sealed": 5, "already": 0}
            configure(box, secrets_key=newer)
            await publish_one(box, tenant="t1", data={"petId": "last"})
            assert await dispatch_once(box) == 1
            seen = list(receiver.requests)
    finally:
        await box.close()
        await other.close()
    assert len(seen) == 7
    for request in seen:  # each verifies with the secret its endpoint's owner holds
        assert _verifies(request, [s for _, s in made]), request.body


def _verifies(request: Any, secrets: list[str]) -> bool:
    for secret in secrets:
        try:
            standardwebhooks.Webhook(secret).verify(request.body, request.headers)
            return True
        except standardwebhooks.WebhookVerificationError:
            continue
    return False


def key_file(database_url: str) -> Path:
    return Path(database_url.removeprefix("sqlite:///") + ".key")


# -- the key file -----------------------------------------------------------------------


@pytest.mark.parametrize("links", [True, False], ids=["hard-links", "no-hard-links"])
def test_concurrent_creators_end_with_one_key_file_of_mode_0600(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, links: bool
) -> None:
    if not links:  # a file system without hard links: O_CREAT | O_EXCL on the name

        def no_link(*_: Any) -> None:
            raise OSError(errno.EPERM, "Operation not permitted")

        monkeypatch.setattr(os, "link", no_link)
    path = tmp_path / "relaybox.db.key"
    start = threading.Barrier(8)
    keys: list[str] = []
    failures: list[BaseException] = []

    def make() -> None:
        start.wait()
        try:
            keys.append(KeyFile(path).read_or_create())
        except BaseException as exc:  # reported below: a thread's exception is otherwise lost
            failures.append(exc)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not failures, failures
    assert len(keys) == 8 and len(set(keys)) == 1
    assert path.read_text().strip() == keys[0]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["relaybox.db.key"]  # no temporary left


def test_a_key_file_finished_between_the_read_and_the_look_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A creator without hard links wrote its key right after this process read the
    file empty and before it looked at its size: the key is read, not refused."""
    path = tmp_path / "relaybox.db.key"
    key = KeyFile(path).create()
    keys = KeyFile(path)
    read = keys.read
    reads = []

    def empty_first() -> str | None:
        reads.append(1)
        if len(reads) == 1:  # what the first read saw, a moment before the write
            return keys._parse(b"")
        return read()

    monkeypatch.setattr(keys, "read", empty_first)
    assert keys.read_or_create() == key


async def test_two_processes_starting_at_once_share_one_key(procs: Procs, tmp_path: Path) -> None:
    """Two ``relaybox endpoints create`` on a fresh database at once: one key file,
    and each secret opens with it."""
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    code, out = await cli(procs, "migrate", "--database-url", url)
    assert code == 0, out
    args = ["endpoints", "create", "--url", "https://hooks.example.com/x", "--database-url", url]
    started = [procs.start(f"create{i}", [*args, "--tenant", f"t{i}"]) for i in range(2)]
    codes = [await p.wait_exit(60) for p in started]
    assert codes == [0, 0], [p.tail() for p in started]
    secrets = {last_json(p.output())["id"]: last_json(p.output())["secret"] for p in started}
    path = tmp_path / "fresh.db.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    box = Relaybox(settings=Settings(database_url=url))
    try:
        for endpoint_id, secret in secrets.items():
            shown = await endpoints.endpoint_secrets(box, endpoint_id, None)
            assert shown is not None and [s["secret"] for s in shown] == [secret]
    finally:
        await box.close()


@pytest.mark.parametrize("broken", ["not a key\n", "", "directory"])
async def test_an_invalid_key_file_is_a_clear_error_and_is_never_replaced(
    tmp_path: Path, clock: FrozenClock, broken: str
) -> None:
    url = f"sqlite:///{tmp_path / 'relaybox.db'}"
    path = tmp_path / "relaybox.db.key"
    if broken == "directory":  # unreadable as a file (tests run as root: no chmod 000)
        path.mkdir()
    else:
        path.write_text(broken)
        # written a minute ago: a short file changed within the last seconds is read
        # again for a while, since a creator without hard links may still be writing it
        os.utime(path, (time.time() - 60, time.time() - 60))
    box = Relaybox(settings=Settings(database_url=url), clock=clock)
    try:
        with pytest.raises(KeyFileError, match=r"relaybox\.db\.key .*(no valid key|cannot be)"):
            await box.migrate()
        configure(box, **{**LOCAL, "secrets_key": None})
        _, api_key = await create_api_key(box, "t1", "tests")
        async with Served(box.asgi(roles=("api",))) as served, aiohttp.ClientSession() as http:
            async with http.post(
                f"{served.url}/api/v1/endpoints",
                json={"url": "https://hooks.example.com/x"},
                headers={"Authorization": f"Bearer {api_key}"},
            ) as r:
                assert r.status == 503
                answer = await r.json()
        assert answer["error"] == "secrets_key_file"
        assert "restore it from your backup" in answer["message"]
    finally:
        await box.close()
    if broken == "directory":
        assert path.is_dir()
    else:
        assert path.read_text() == broken  # untouched
    args = ["endpoints", "create", "--tenant", "t1", "--url", "https://x.example.com/"]
    result = await asyncio.to_thread(CliRunner().invoke, main, [*args, "--database-url", url])
    assert result.exit_code == 2, result.output
    assert "relaybox.db.key" in result.output


def test_without_a_key_postgres_refuses_and_sealing_is_never_plaintext(pg_url: str) -> None:
    box = Relaybox(settings=Settings(database_url=pg_url))
    vault = outbound(box).vault
    assert not vault.sealing and vault.key_file is None
    with pytest.raises(SecretsKeyMissing, match="RELAYBOX_OUTBOUND__SECRETS_KEY"):
        vault.seal("whsec_abc")


# -- doctor ------------------------------------------------------------------------------


def _doctor(database_url: str, tmp_path: Path, *, key: str | None = None) -> tuple[int, dict]:
    config = tmp_path / "doctor.toml"
    config.write_text(f'[outbound]\nsecrets_key = "{key}"\n' if key else "")
    result = CliRunner().invoke(
        main, ["doctor", "--json", "--config", str(config), "--database-url", database_url]
    )
    checks = {c["check"]: c for c in json.loads(result.stdout)["checks"]}
    return result.exit_code, checks


async def test_doctor_names_a_missing_key_plaintext_secrets_and_an_open_key_file(
    database_url: str, tmp_path: Path, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("RELAYBOX_") and not name.startswith("RELAYBOX_TEST_"):
            monkeypatch.delenv(name)
    postgres = database_url.startswith("postgres")
    key = new_key() if postgres else None
    if postgres:
        code, checks = await asyncio.to_thread(_doctor, database_url, tmp_path)
        assert code == 5
        assert checks["secrets_key"]["status"] == "fail"
        assert "outbound.secrets_key is not set" in checks["secrets_key"]["detail"]
    else:
        code, checks = await asyncio.to_thread(_doctor, database_url, tmp_path)
        assert code == 0 and checks["secrets_key"]["status"] == "ok"
        assert "made when the first endpoint secret is stored" in checks["secrets_key"]["detail"]

    box = Relaybox(settings=Settings(database_url=database_url), clock=clock)
    configure(box, **{**LOCAL, "secrets_key": key})
    try:
        for i in range(3):
            await endpoint(box, "https://hooks.example.com/x", tenant=f"t{i}")
        await as_older_versions_stored(box)
    finally:
        await box.close()
    code, checks = await asyncio.to_thread(_doctor, database_url, tmp_path, key=key)
    assert code == 0
    assert checks["secrets"]["status"] == "warn"
    assert checks["secrets"]["detail"].startswith("3 in plaintext")

    config = tmp_path / "migrate.toml"
    if postgres:  # without the key: nothing sealed, and it says how many remain
        config.write_text("")
        unkeyed = await asyncio.to_thread(
            CliRunner().invoke,
            main,
            ["migrate", "--config", str(config), "--database-url", database_url],
        )
        assert unkeyed.exit_code == 0, unkeyed.output
        assert "3 endpoint secret(s) remain in plaintext" in unkeyed.stderr
    config.write_text(f'[outbound]\nsecrets_key = "{key}"\n' if key else "")
    migrated = await asyncio.to_thread(
        CliRunner().invoke,
        main,
        ["migrate", "--config", str(config), "--database-url", database_url],
    )
    assert migrated.exit_code == 0, migrated.output
    assert "sealed 3 endpoint secret(s) stored in plaintext" in migrated.stdout
    code, checks = await asyncio.to_thread(_doctor, database_url, tmp_path, key=key)
    assert code == 0, checks
    assert checks["secrets"] == {
        "check": "secrets",
        "status": "ok",
        "detail": "3 endpoint secret(s) sealed",
    }
    if not postgres:
        path = key_file(database_url)
        assert "mode 0600" in checks["secrets_key"]["detail"]
        path.chmod(0o644)
        code, checks = await asyncio.to_thread(_doctor, database_url, tmp_path)
        assert code == 5
        assert checks["secrets_key"]["status"] == "fail"
        assert f"chmod 600 {path}" in checks["secrets_key"]["detail"]


async def test_a_lost_key_file_is_never_silently_replaced(
    tmp_path: Path, clock: FrozenClock
) -> None:
    """The database holds secrets sealed with the key file's key and the file is gone:
    relaybox refuses to make a new key (it would split the secrets between two keys
    once the old one is restored) until the file is back."""
    url = f"sqlite:///{tmp_path / 'relaybox.db'}"
    path = tmp_path / "relaybox.db.key"

    async def fresh_box() -> Relaybox:
        b = Relaybox(settings=Settings(database_url=url), clock=clock)
        configure(b, **{**LOCAL, "secrets_key": None})
        return b

    box = await fresh_box()
    try:
        await box.migrate()
        first_id, first = await endpoint(box, "https://hooks.example.com/a")
    finally:
        await box.close()
    saved = path.read_bytes()
    path.unlink()
    box = await fresh_box()
    try:
        with pytest.raises(KeyFileError, match=r"relaybox\.db\.key is missing.*restore it"):
            await endpoint(box, "https://hooks.example.com/b")
        assert not path.exists()
        path.write_bytes(saved)
        path.chmod(0o600)
        second_id, second = await endpoint(box, "https://hooks.example.com/b")
        for endpoint_id, secret in ((first_id, first), (second_id, second)):
            shown = await endpoints.endpoint_secrets(box, endpoint_id, None)
            assert shown is not None and [s["secret"] for s in shown] == [secret]
    finally:
        await box.close()


async def test_serve_and_dispatch_refuse_to_start_with_an_invalid_key_file(
    procs: Procs, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'relaybox.db'}"
    code, out = await cli(procs, "migrate", "--database-url", url)
    assert code == 0, out
    (tmp_path / "relaybox.db.key").write_text("not a key\n")
    for args in (
        ["migrate"],
        ["serve", "--roles", "api,dispatcher", "--no-migrate", "--port", str(free_port())],
        ["dispatch"],
    ):
        code, out = await cli(procs, *args, "--database-url", url)
        assert code == 2, out
        assert "relaybox.db.key holds no valid key" in out and "Traceback" not in out
    assert (tmp_path / "relaybox.db.key").read_text() == "not a key\n"


# -- endpoint credentials are never in the attempt log ---------------------------------


class Secrets:
    """Credentials of one run, each unique to it (a hit cannot be a coincidence)."""

    def __init__(self) -> None:
        run = uuid.uuid4().hex[:12]
        self.password = f"pw-{run}-basic"
        self.token = f"tk-{run}-bearer"
        self.access = f"at-{run}-oauth-"  # the token server's prefix: at-…-1, at-…-2
        self.client_secret = f"cs-{run}-client"
        self.api_key = f"ak-{run}-custom"
        self.cookie = f"sc-{run}-cookie"

    def sealed(self) -> list[str]:
        """What no byte of the database may hold: the credentials (sealed at rest), the
        headers they make, the tokens fetched with them, the receiver's cookie."""
        basic = base64.b64encode(f"relay:{self.password}".encode()).decode()
        client = base64.b64encode(f"relay-client:{self.client_secret}".encode()).decode()
        return [self.password, basic, self.token, self.access, self.client_secret, client,
                self.cookie]  # fmt: skip

    def shown(self) -> list[str]:
        """What no surface may show: the above and the custom X-Api-Key header's value
        (which the endpoint keeps as it keeps its other custom headers)."""
        return [*self.sealed(), self.api_key]


def no_credential_in(text: str, found: list[str], where: str) -> None:
    leaked = [value for value in found if value in text]
    assert not leaked, f"{where} shows {leaked}"


async def test_endpoint_credentials_are_on_no_surface_and_in_no_database_byte(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Endpoints with Basic, bearer and OAuth2 credentials and one with a custom
    ``X-Api-Key`` header, at a receiver that echoes every request header in its answer
    and sets a cookie. After a delivery to each, no surface that shows attempts (the
    tenant API, the portal's pages, the admin API, the dashboard's pages, ``relaybox
    messages show``) and no byte of the database (the SQLite file; every relaybox
    table of PostgreSQL as text) holds a credential: the attempt log names each
    header with the value ``[redacted]``, and still shows the signature."""
    for name in list(os.environ):
        if name.startswith("RELAYBOX_") and not name.startswith("RELAYBOX_TEST_"):
            monkeypatch.delenv(name)
    s = Secrets()

    def echo(seen: Seen) -> Reply:
        cookie = {"Set-Cookie": f"session={s.cookie}; HttpOnly"}
        return Reply(200, json.dumps(seen.headers).encode(), headers=cookie)

    settings = Settings(database_url=database_url, admin_token=TOKEN, outbound=KEYED)
    box = Relaybox(settings=settings)
    local(box)
    try:
        async with TokenServer(prefix=s.access) as tokens, HttpReceiver(echo) as receiver:
            basic = {"type": "basic", "username": "relay", "password": s.password}
            await endpoint(box, receiver.url + "?basic", credentials=basic)
            bearer = {"type": "bearer", "token": s.token}
            await endpoint(box, receiver.url + "?bearer", credentials=bearer)
            oauth2 = {"type": "oauth2", "token_url": tokens.url, "client_id": "relay-client",
                      "client_secret": s.client_secret}  # fmt: skip
            await endpoint(box, receiver.url + "?oauth2", credentials=oauth2)
            await endpoint(box, receiver.url + "?custom", headers={"X-Api-Key": s.api_key})
            message = await publish_one(box)
            assert await dispatch_once(box) == 4
            sent = {seen.path: seen.headers for seen in receiver.requests}
        # Each credential went out (and came back in the answer, which echoes it).
        assert sent["/hook?basic"]["authorization"].startswith("Basic ")
        assert sent["/hook?bearer"]["authorization"] == f"Bearer {s.token}"
        assert sent["/hook?oauth2"]["authorization"] == f"Bearer {s.access}1"
        assert sent["/hook?custom"]["x-api-key"] == s.api_key

        # The attempt log: every credential header named, its value redacted.
        rows = await box.store.fetch_all(
            "SELECT headers, response FROM relaybox_outbox_attempts ORDER BY id"
        )
        assert len(rows) == 4
        for row in rows:
            recorded = json.loads(row["headers"])
            request, response = dict(recorded["request"]), dict(recorded["response"])
            hidden = "X-Api-Key" if "X-Api-Key" in request else "Authorization"
            assert request[hidden] == "[redacted]", request
            assert request["webhook-signature"].startswith("v1,")  # an HMAC: shown
            assert response["Set-Cookie"] == "[redacted]"
            assert "[redacted]" in row["response"]  # the echoed credential, cut out
            assert json.loads(row["response"])["webhook-id"] == message.id

        _, api_key = await create_api_key(box, "t1", "tests")
        pages: dict[str, str] = {}
        async with (
            Served(box.asgi(roles=("api", "admin"))) as served,
            aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http,
        ):
            base = served.url

            async def get(path: str, headers: dict[str, str] | None = None) -> str:
                async with http.get(base + path, headers=headers) as r:
                    assert r.status == 200, (path, r.status)
                    return await r.text()

            tenant = {"Authorization": f"Bearer {api_key}"}
            for path in (f"/messages/{message.id}/attempts", f"/messages/{message.id}"):
                pages[f"tenant API {path}"] = await get("/api/v1" + path, tenant)
            portal = await portal_for(box, http, base, "t1")
            for path in (f"/messages/{message.id}", "/messages"):
                pages[f"portal {path}"] = (await portal.get(path))[1]
            pages["admin API"] = await get(f"/admin/api/v1/messages/{message.id}", AUTH)
            async with http.post(
                base + "/admin/login", data={"token": TOKEN, "next": "/admin/"}
            ) as r:
                assert r.status == 200
            for path in (f"/admin/messages/{message.id}", "/admin/deliveries"):
                pages[f"dashboard {path}"] = await get(path)
        shown = await asyncio.to_thread(
            CliRunner().invoke,
            main,
            ["messages", "show", message.id, "--database-url", database_url],
        )
        assert shown.exit_code == 0, shown.output
        pages["relaybox messages show"] = shown.stdout
        for where, text in pages.items():
            no_credential_in(text, s.shown(), where)
        with_attempts = (
            f"tenant API /messages/{message.id}/attempts",
            f"portal /messages/{message.id}",
            "admin API",
            f"dashboard /admin/messages/{message.id}",
            "relaybox messages show",
        )
        for where in with_attempts:  # each shows the attempts' headers, redacted
            assert "[redacted]" in pages[where] and "webhook-signature" in pages[where], where

        # The database: the attempts hold none of them, and nothing else holds a sealed one.
        attempts = await box.store.fetch_all("SELECT * FROM relaybox_outbox_attempts")
        no_credential_in(repr(attempts), s.shown(), "relaybox_outbox_attempts")
        if database_url.startswith("postgres"):
            dump = await _postgres_dump(database_url)
            no_credential_in("\n".join(dump.values()), s.sealed(), "the database")
            custom = [t for t, text in dump.items() if s.api_key in text]
            assert custom == ["relaybox_endpoints"]  # its custom headers, as configured
    finally:
        await box.close()
    if database_url.startswith("sqlite"):
        db_file = Path(database_url.removeprefix("sqlite:///"))
        files = [p for p in db_file.parent.iterdir() if p.name.startswith(db_file.name)]
        blob = b"".join(p.read_bytes() for p in files if p.suffix != ".key")
        no_credential_in(blob.decode("latin-1"), s.sealed(), "the SQLite file")


async def _postgres_dump(database_url: str) -> dict[str, str]:
    """Every row of every relaybox table as PostgreSQL writes it as text, by table."""
    conn = await asyncpg.connect(_dsn(database_url))
    try:
        tables = [
            r["tablename"]
            for r in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE 'relaybox%'"
            )
        ]
        return {
            table: "\n".join(r[0] for r in await conn.fetch(f'SELECT t::text FROM "{table}" t'))
            for table in tables
        }
    finally:
        await conn.close()


# Header names: the first ones carry a credential by their name, the others do not.
CREDENTIAL_NAMES = ["Authorization", "proxy-authorization", "Cookie", "X-Api-Key", "X-API-KEY",
                    "Api_Key", "apikey", "X-Auth-Token", "Private-Token", "X-Client-Secret",
                    "X-Password", "X-Session-Id", "X-Credentials"]  # fmt: skip
OTHER_NAMES = ["webhook-id", "webhook-timestamp", "webhook-signature", "X-Webhook-Signature",
               "Content-Type", "Idempotency-Key", "User-Agent", "X-Team", "X-Key-Id"]  # fmt: skip


def _as_relaybox_records(
    request: list[tuple[str, str]], response: list[tuple[str, str]]
) -> dict[str, list[list[str]]]:
    """What relaybox records now of the same fields."""
    return {
        "request": [[n, "[redacted]" if credential_header(n) else v] for n, v in request],
        "response": [[n, "[redacted]" if n.lower() == "set-cookie" else v] for n, v in response],
    }


async def test_migrate_redacts_the_credentials_earlier_versions_kept_in_the_attempt_log(
    box: Relaybox,
) -> None:
    """Attempt rows as earlier versions recorded them (credential headers in clear):
    the migration ``attempt_credentials`` writes each credential as ``[redacted]``,
    every other field kept in its place, by the same names relaybox redacts now; rows
    with nothing to redact are not rewritten, and running it again (the sync path
    Django's migrations take) changes nothing."""
    basic = "Basic " + base64.b64encode(b"relay:pw-older-version").decode()
    older = {
        "basic": (
            [
                ("User-Agent", "relaybox-webhooks/1"),
                ("webhook-id", "msg_1"),
                ("webhook-signature", "v1,K5oZfzN95Z9UVu1E/H+pI4="),
                ("Authorization", basic),
                ("X-Team", 'Zoë → 東京 "q" \\'),
                ("Content-Type", "application/json"),
            ],
            [
                ("Date", "Fri, 04 Dec 2026 20:00:00 GMT"),
                ("Set-Cookie", "sid=ck-older-version"),
                ("Server", "uvicorn"),
            ],
        ),
        "names": (
            [(name, f"value-of-{name}") for name in [*CREDENTIAL_NAMES, *OTHER_NAMES]],
            [("set-cookie", "a=b"), ("WWW-Authenticate", 'Bearer realm="x"')],
        ),
        "plain": (
            [("webhook-id", "msg_2"), ("X-Session-Note", "[redacted]")],
            [("Access-Control-Allow-Credentials", "true"), ("X-Token-Count", "2")],
        ),
        "redacted": ([("Authorization", "[redacted]")], [("Set-Cookie", "[redacted]")]),
        "empty": ([], []),
    }
    texts = {key: record_headers(req, resp, 4096) for key, (req, resp) in older.items()}
    [(version, name)] = [
        (v, f"{v:04d}_{n}")
        for v, n, _ in load_migrations(box.store.backend)
        if n == "attempt_credentials"
    ]
    undo = sqlalchemy.text("DELETE FROM relaybox_migrations WHERE version = :version")
    insert = sqlalchemy.text(
        "INSERT INTO relaybox_outbox_attempts"
        " (outbox_id, attempt, started_at, duration, outcome, response, headers)"
        " VALUES (:outbox_id, 1, 0, 0, 'sent', :key, :headers)"
    )
    async with box.store.transaction() as conn:
        for i, key in enumerate([*texts, None]):
            await conn.execute(
                insert, {"outbox_id": i, "key": key, "headers": texts.get(key or "")}
            )
        await conn.execute(undo, {"version": version})

    async def stored() -> dict[str | None, str | None]:
        rows = await box.store.fetch_all("SELECT response, headers FROM relaybox_outbox_attempts")
        return {r["response"]: r["headers"] for r in rows}

    assert await box.store.migrate() == [name]
    after = await stored()
    for key, (request, response) in older.items():
        assert json.loads(after[key] or "") == _as_relaybox_records(request, response), key
    for key in ("plain", "redacted", "empty"):  # nothing to redact: not rewritten
        assert after[key] == texts[key], key
    assert after[None] is None
    dump = repr(after)
    for value in ("pw-older-version", basic.split()[1], "ck-older-version", "value-of-X-Api"):
        assert value not in dump
    assert "value-of-X-Team" in dump and "K5oZfzN95Z9UVu1E/H+pI4=" in dump

    def again() -> list[str]:
        with box.store.sync.transaction() as sync:
            sync.execute(undo, {"version": version})
            return migrate_sync(sync)

    assert await asyncio.to_thread(again) == [name]
    assert await stored() == after
