"""Endpoint headers and credentials on SQLite and PostgreSQL: validation through the
tenant API (real uvicorn), Basic / bearer / custom headers at a real receiver, OAuth2
client credentials against a local token server (real HTTP on a free port)."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import standardwebhooks
from aiohttp import web
from click.testing import CliRunner

from relaybox import FrozenClock, Relaybox
from relaybox.cli import main
from relaybox.outbound import configure, create_api_key, outbound, seal_secrets
from relaybox.outbound.deliveries import redeliver
from relaybox.outbound.endpoints import EndpointPatch, secrets_at_rest, update_endpoint
from relaybox.outbound.vault import new_key
from tests.conftest import Served
from tests.support.outbound_app import dispatch_once, endpoint, local, outbox_rows, publish_one
from tests.support.receivers import HttpReceiver, Reply, Seen


class Api:
    def __init__(self, http: aiohttp.ClientSession, base: str, key: str) -> None:
        self.http, self.base, self.key = http, base, key

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        auth = {"Authorization": f"Bearer {self.key}"}
        async with self.http.request(method, self.base + path, json=body, headers=auth) as r:
            return r.status, (await r.json() if r.status != 204 else None)


@pytest.fixture
async def api(box: Relaybox) -> AsyncIterator[Api]:
    local(box)
    _, key = await create_api_key(box, "t1", "tests")
    async with Served(box.asgi(roles=("api",))) as served, aiohttp.ClientSession() as http:
        yield Api(http, served.url + "/api/v1", key)


class TokenServer:
    """An OAuth2 token endpoint: counts requests, hands out tok1, tok2, ... (``prefix``
    1, 2, ...)."""

    def __init__(
        self,
        expires_in: float | None = 60,
        status: int = 200,
        pad: int = 0,
        host: str = "127.0.0.1",
        prefix: str = "tok",
    ) -> None:
        self.expires_in, self.status, self.pad, self.host = expires_in, status, pad, host
        self.prefix = prefix
        self.requests: list[tuple[dict[str, str], dict[str, str]]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/oauth/token"

    async def _token(self, request: web.Request) -> web.Response:
        form = {k: str(v) for k, v in (await request.post()).items()}
        self.requests.append((dict(request.headers), form))
        if self.status != 200:
            return web.json_response({"error": "invalid_client"}, status=self.status)
        answer: dict[str, Any] = {"access_token": f"{self.prefix}{len(self.requests)}"}
        answer["token_type"] = "Bearer"
        if self.expires_in is not None:
            answer["expires_in"] = self.expires_in
        if self.pad:
            answer["padding"] = "x" * self.pad
        return web.json_response(answer)

    async def __aenter__(self) -> TokenServer:
        app = web.Application()
        app.router.add_post("/oauth/token", self._token)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


async def attempts(box: Relaybox) -> list[dict[str, Any]]:
    return await box.store.fetch_all(
        "SELECT attempt, outcome, status_code, error FROM relaybox_outbox_attempts ORDER BY id"
    )


# -- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"X-Team": "a\r\nX-Evil: 1"}, "control character"),
        ({"X-Team": "a\nb"}, "control character"),
        ({"Host": "internal.example"}, "'Host' may not be set"),
        ({"content-length": "5"}, "may not be set"),
        ({"Transfer-Encoding": "chunked"}, "may not be set"),
        ({"webhook-signature": "v1,forged"}, "may not be set"),
        ({"Authorization": "Bearer x"}, "set credentials instead"),
        ({"X Team": "a"}, "is not an HTTP token"),
        ({f"X-H{i}": "v" for i in range(21)}, "at most 20 custom headers"),
        ({"X-Big": "v" * 5000}, "more than the 4096 allowed"),
    ],
)
async def test_bad_headers_are_refused_with_a_clear_422(
    api: Api, headers: dict[str, str], expected: str
) -> None:
    status, answer = await api.call(
        "POST", "/endpoints", {"url": "http://127.0.0.1:9/hook", "headers": headers}
    )
    assert status == 422, answer
    assert answer["error"] == "invalid_endpoint"
    assert expected in answer["message"]
    status, answer = await api.call("GET", "/endpoints")
    assert answer["data"] == []  # nothing was created


async def test_a_patch_with_bad_headers_changes_nothing(api: Api) -> None:
    status, created = await api.call(
        "POST", "/endpoints", {"url": "http://127.0.0.1:9/hook", "headers": {"X-Team": "blue"}}
    )
    assert status == 201
    path = f"/endpoints/{created['id']}"
    status, answer = await api.call("PATCH", path, {"headers": {"Host": "x"}})
    assert (status, answer["error"]) == (422, "invalid_endpoint")
    status, found = await api.call("GET", path)
    assert found["headers"] == {"X-Team": "blue"}


async def test_credentials_are_sealed_and_never_shown_again(box: Relaybox, api: Api) -> None:
    status, created = await api.call(
        "POST",
        "/endpoints",
        {
            "url": "http://127.0.0.1:9/hook",
            "credentials": {"type": "basic", "username": "relay", "password": "s3cret-pw"},
        },
    )
    assert status == 201
    assert created["credentials"] == {"type": "basic", "set": True}
    path = f"/endpoints/{created['id']}"
    shown = [(await api.call("GET", p))[1] for p in (path, "/endpoints")]
    for answer in (created, *shown):
        assert "s3cret-pw" not in json.dumps(answer)
    [row] = await box.store.fetch_all(
        "SELECT credentials, credentials_type FROM relaybox_endpoints"
    )
    assert row["credentials_type"] == "basic"
    assert "s3cret-pw" not in row["credentials"] and "relay" not in row["credentials"]
    status, answer = await api.call("PATCH", path, {"description": "no change to them"})
    assert answer["credentials"] == {"type": "basic", "set": True}
    status, answer = await api.call("PATCH", path, {"credentials": {"type": "none"}})
    assert (status, answer["credentials"]) == (200, None)
    status, answer = await api.call(
        "PATCH", path, {"credentials": {"type": "basic", "username": "a:b", "password": "x"}}
    )
    assert status == 422 and "may not contain ':'" in answer["message"]
    status, answer = await api.call(
        "PATCH",
        path,
        {
            "credentials": {
                "type": "oauth2",
                "token_url": "http://10.0.0.1/token",
                "client_id": "c",
                "client_secret": "s",
            }
        },
    )
    assert status == 422 and answer["message"].startswith("token_url:")


OAUTH2 = {"type": "oauth2", "client_id": "c", "client_secret": "s"}


@pytest.mark.parametrize(
    ("token_url", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data/iam/token", "a link-local address"),
        ("https://169.254.169.254/token", "a link-local address"),
        ("http://10.0.0.1/token", "a private or reserved address"),
        ("https://10.0.0.1:8443/oauth/token", "a private or reserved address"),
        ("https://192.168.1.20/token", "a private or reserved address"),
        ("https://[fd00::1]/token", "a private or reserved address"),
        ("https://[::ffff:10.0.0.1]/token", "an IPv4-mapped IPv6 address"),
        ("https://100.64.0.7/token", "a carrier-grade NAT address"),
        ("https://0xa.0.0.1/token", "non-canonical form"),
    ],
)
async def test_an_oauth2_token_url_at_a_private_address_is_refused_when_saved(
    box: Relaybox, api: Api, token_url: str, reason: str
) -> None:
    credentials = {**OAUTH2, "token_url": token_url}
    status, answer = await api.call(
        "POST", "/endpoints", {"url": "http://127.0.0.1:9/hook", "credentials": credentials}
    )
    assert (status, answer["error"]) == (422, "invalid_endpoint"), answer
    assert answer["message"].startswith("token_url: ") and reason in answer["message"]
    assert (await api.call("GET", "/endpoints"))[1]["data"] == []  # nothing was created

    status, created = await api.call("POST", "/endpoints", {"url": "http://127.0.0.1:9/hook"})
    assert status == 201
    path = f"/endpoints/{created['id']}"
    status, answer = await api.call("PATCH", path, {"credentials": credentials})
    assert (status, answer["error"]) == (422, "invalid_endpoint")
    assert answer["message"].startswith("token_url: ") and reason in answer["message"]
    assert (await api.call("GET", path))[1]["credentials"] is None  # nothing was set
    [row] = await box.store.fetch_all("SELECT credentials FROM relaybox_endpoints")
    assert row["credentials"] is None


async def test_an_oauth2_token_url_in_an_allowed_network_is_accepted(
    box: Relaybox, api: Api
) -> None:
    # The refusal above is the network rule: an operator who allows the network (a
    # token server on a private link) may save the same URL.
    local(box, allow_networks=["127.0.0.0/8", "10.0.0.0/8"])
    credentials = {**OAUTH2, "token_url": "https://10.0.0.1:8443/oauth/token"}
    status, created = await api.call(
        "POST", "/endpoints", {"url": "http://127.0.0.1:9/hook", "credentials": credentials}
    )
    assert status == 201, created
    assert created["credentials"] == {"type": "oauth2", "set": True}


async def _refused_at_fetch(box: Relaybox, tokens: TokenServer, receiver: HttpReceiver) -> str:
    """Publish one message, dispatch it once: the attempt's error, after checking that
    neither the token server nor the receiver was reached and the delivery is dead at
    once as ``blocked`` (like an endpoint URL the guard refuses: every retry would be
    refused the same way)."""
    await publish_one(box)
    assert await dispatch_once(box) == 1
    assert tokens.requests == []  # the token request was never made
    assert receiver.requests == []  # nothing is sent without a token
    [attempt] = await attempts(box)
    assert attempt["outcome"] == "blocked" and attempt["status_code"] is None
    [row] = await outbox_rows(box)
    assert (row["status"], row["dead_reason"], row["attempts"]) == ("dead", "blocked", 1)
    return str(attempt["error"])


async def test_an_oauth2_token_host_resolving_to_a_forbidden_address_is_refused_at_fetch(
    box: Relaybox, clock: FrozenClock
) -> None:
    # The token server listens on 127.0.0.2; the endpoint's receiver on 127.0.0.1, the
    # only address allowed. A name passes the check when saved (no DNS then) and
    # resolves to the token server's address when used: the guard refuses it there, so
    # a request that went past the guard would reach a live server and be counted.
    async def resolver(host: str, port: int) -> list[str]:
        return ["127.0.0.2"] if host == "tokens.example.test" else [host]

    local(box, allow_networks=["127.0.0.1/32"], resolver=resolver)
    async with TokenServer(host="127.0.0.2") as tokens, HttpReceiver() as receiver:
        await endpoint(
            box,
            receiver.url,
            credentials={
                **OAUTH2,
                "token_url": f"http://tokens.example.test:{tokens.port}/oauth/token",
            },
        )
        error = await _refused_at_fetch(box, tokens, receiver)
    assert error.startswith(
        "OAuth2 token: refused by the SSRF guard: tokens.example.test resolves to"
        " a loopback address: to deliver there, add its network to outbound.allow_networks"
    )


async def test_an_oauth2_token_url_refused_by_settings_changed_after_save(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box, allow_networks=["127.0.0.0/8"])
    async with TokenServer(host="127.0.0.2") as tokens, HttpReceiver() as receiver:
        await endpoint(box, receiver.url, credentials={**OAUTH2, "token_url": tokens.url})
        # The operator narrows the allowed networks: the saved token URL is now outside.
        local(box, allow_networks=["127.0.0.1/32"])
        error = await _refused_at_fetch(box, tokens, receiver)
        assert error.startswith(
            "OAuth2 token: refused by the SSRF guard: 127.0.0.2 resolves to a loopback address"
            ": to deliver there, add its network to outbound.allow_networks"
        )
        # Allowed again, the dead delivery sent again by hand gets its token and goes out.
        local(box, allow_networks=["127.0.0.0/8"])
        [row] = await outbox_rows(box)
        assert await redeliver(box, row["message_id"], tenant="t1") == 1
        assert await dispatch_once(box) == 1
        assert len(tokens.requests) == 1
        [seen] = receiver.requests
        assert seen.headers["authorization"] == "Bearer tok1"


async def test_an_invalid_oauth2_token_url_at_fetch_is_dead_blocked(
    box: Relaybox, clock: FrozenClock
) -> None:
    """A token URL aiohttp cannot read (stored before the checks, or edited in the
    database) fails the same way every time: dead at once, ``blocked``."""
    local(box)
    async with TokenServer() as tokens, HttpReceiver() as receiver:
        spec = {**OAUTH2, "token_url": "http://[::1/oauth/token"}
        await endpoint(box, receiver.url, credentials={**OAUTH2, "token_url": tokens.url})
        sealed = outbound(box).vault.seal(json.dumps(spec))
        async with box.store.transaction() as conn:
            [(endpoint_id, stored)] = await box.store.credentials.endpoint_credentials_page(
                conn, "", 10
            )
            assert await box.store.credentials.endpoint_credentials_swap(
                conn, endpoint_id, stored, sealed
            )
        error = await _refused_at_fetch(box, tokens, receiver)
    assert error == "OAuth2 token: refused by the SSRF guard: not a valid URL"


# -- delivery -------------------------------------------------------------------------------


async def test_basic_bearer_and_custom_headers_arrive_at_a_real_receiver(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box)
    clock.set(time.time())
    async with HttpReceiver() as receiver:
        basic_id, basic_secret = await endpoint(
            box,
            receiver.url,
            headers={"X-Team": "blue", "X-Trace": "42"},
            credentials={"type": "basic", "username": "relay", "password": "pw:with:colons"},
        )
        await endpoint(
            box, receiver.url + "?bearer", credentials={"type": "bearer", "token": "tk_abc.123"}
        )
        await endpoint(box, receiver.url + "?plain")
        await publish_one(box)
        assert await dispatch_once(box) == 3
        by_path = {seen.path: seen for seen in receiver.requests}
    basic, bearer, plain = by_path["/hook"], by_path["/hook?bearer"], by_path["/hook?plain"]
    expected = "Basic " + base64.b64encode(b"relay:pw:with:colons").decode()
    assert basic.headers["authorization"] == expected
    assert (basic.headers["x-team"], basic.headers["x-trace"]) == ("blue", "42")
    standardwebhooks.Webhook(basic_secret).verify(basic.body, basic.headers)  # still signed
    assert bearer.headers["authorization"] == "Bearer tk_abc.123"
    assert "x-team" not in bearer.headers
    assert "authorization" not in plain.headers
    # Changing the headers takes effect on the next attempt.
    patch = EndpointPatch(headers={"X-Team": "green"})
    assert await update_endpoint(box, basic_id, "t1", patch) is not None
    async with HttpReceiver() as receiver:
        patch = EndpointPatch(url=receiver.url)
        await update_endpoint(box, basic_id, "t1", patch)
        await publish_one(box)
        await dispatch_once(box)
        got = [s for s in receiver.requests]
    assert [s.headers["x-team"] for s in got] == ["green"]
    assert "x-trace" not in got[0].headers


async def test_oauth2_token_is_fetched_cached_and_fetched_again_after_expiry(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box, oauth2_token_margin=30)
    tokens_seen: list[str] = []

    def answer(seen: Seen) -> Reply:
        tokens_seen.append(seen.headers.get("authorization", ""))
        return Reply(200)

    async with TokenServer(expires_in=60) as tokens, HttpReceiver(answer) as receiver:
        await endpoint(
            box,
            receiver.url,
            credentials={
                "type": "oauth2",
                "token_url": tokens.url,
                "client_id": "my app",
                "client_secret": "cs&1",
                "scope": "webhooks:write",
            },
        )
        d = box.dispatcher()
        try:
            await publish_one(box)
            assert await d.run_once() == 1
            await publish_one(box)
            assert await d.run_once() == 1  # the cached token
            clock.advance(29)  # 60 s minus the 30 s margin: still good
            await publish_one(box)
            await d.run_once()
            clock.advance(2)  # past expiry minus the margin: fetched again
            await publish_one(box)
            await d.run_once()
        finally:
            await d.close()
        requests = tokens.requests
    assert tokens_seen == ["Bearer tok1"] * 3 + ["Bearer tok2"]
    assert len(requests) == 2
    headers, form = requests[0]
    assert form == {"grant_type": "client_credentials", "scope": "webhooks:write"}
    # client_secret_basic: id and secret form-encoded, then Basic (RFC 6749 2.3.1)
    assert headers["Authorization"] == "Basic " + base64.b64encode(b"my+app:cs%261").decode()


async def test_oauth2_a_401_fetches_a_new_token_once(box: Relaybox, clock: FrozenClock) -> None:
    local(box)

    def answer(seen: Seen) -> Reply:
        # The first token is refused (revoked early); later ones are good.
        return Reply(401) if seen.headers["authorization"] == "Bearer tok1" else Reply(200)

    async with TokenServer(expires_in=3600) as tokens, HttpReceiver(answer) as receiver:
        await endpoint(
            box,
            receiver.url,
            credentials={
                "type": "oauth2",
                "token_url": tokens.url,
                "client_id": "c",
                "client_secret": "s",
            },
        )
        await publish_one(box)
        await dispatch_once(box)
        seen = [s.headers["authorization"] for s in receiver.requests]
    assert seen == ["Bearer tok1", "Bearer tok2"]
    [attempt] = await attempts(box)
    assert (attempt["outcome"], attempt["status_code"]) == ("sent", 200)


async def test_oauth2_token_failures_are_retried_like_a_5xx(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box)
    async with TokenServer(status=401) as tokens, HttpReceiver() as receiver:
        await endpoint(
            box,
            receiver.url,
            credentials={
                "type": "oauth2",
                "token_url": tokens.url,
                "client_id": "c",
                "client_secret": "wrong",
            },
        )
        await publish_one(box)
        await dispatch_once(box)
        assert receiver.requests == []  # nothing sent without a token
    [attempt] = await attempts(box)
    assert attempt["outcome"] == "retry"
    assert attempt["error"] == "OAuth2 token: HTTP 401 from the token URL"
    [row] = await box.store.fetch_all("SELECT status FROM relaybox_outbox")
    assert row["status"] == "pending"


# -- CLI ------------------------------------------------------------------------------------


def test_cli_sets_headers_and_credentials(
    monkeypatch: pytest.MonkeyPatch, database_url: str
) -> None:
    for key in list(os.environ):
        if key.startswith("RELAYBOX_") and not key.startswith("RELAYBOX_TEST_"):
            monkeypatch.delenv(key)
    runner = CliRunner()

    def run(*args: str, code: int = 0, stdin: str | None = None) -> str:
        result = runner.invoke(
            main,
            [*args, "--app", "tests.support.outbound_app:box", "--database-url", database_url],
            prog_name="relaybox",
            input=stdin,
        )
        assert result.exit_code == code, (result.output, result.exception)
        return result.output if code else result.stdout

    created = json.loads(
        run("endpoints", "create", "--tenant", "t1", "--url", "https://hooks.example.com/x")
    )
    endpoint_id = created["id"]
    shown = json.loads(run("endpoints", "headers", endpoint_id, "--set", "X-Team=blue"))
    assert shown["headers"] == {"X-Team": "blue"}
    refused = run("endpoints", "headers", endpoint_id, "--set", "Host=evil", code=2)
    assert "'Host' may not be set" in refused
    shown = json.loads(
        run("endpoints", "credentials", endpoint_id, "--type", "bearer", "--token", "-",
            stdin="tk_from_stdin\n")
    )  # fmt: skip
    assert shown["credentials"] == {"type": "bearer", "set": True}
    assert "tk_from_stdin" not in run("endpoints", "show", endpoint_id)
    shown = json.loads(run("endpoints", "credentials", endpoint_id, "--type", "none"))
    assert shown["credentials"] is None
    assert json.loads(run("endpoints", "headers", endpoint_id, "--clear"))["headers"] == {}


async def test_an_oversized_token_answer_is_a_failed_attempt(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box, oauth2_token_bytes=1024)
    async with TokenServer(pad=200_000) as tokens, HttpReceiver() as receiver:
        await endpoint(
            box,
            receiver.url,
            credentials={"type": "oauth2", "token_url": tokens.url, "client_id": "c",
                         "client_secret": "s"},
        )  # fmt: skip
        await publish_one(box)
        await dispatch_once(box)
        assert receiver.requests == []
    [attempt] = await attempts(box)
    assert attempt["outcome"] == "retry"
    assert attempt["error"] == "OAuth2 token: the answer is over 1024 bytes"


async def test_credentials_follow_a_key_rotation(box: Relaybox, clock: FrozenClock) -> None:
    """seal-secrets reseals credentials with the signing secrets; a credential no key
    opens holds the delivery (retried with the reason), never sent without it."""
    old, new = new_key(), new_key()
    local(box, secrets_key=old)
    async with HttpReceiver() as receiver:
        await endpoint(box, receiver.url, credentials={"type": "bearer", "token": "tk_rot"})
        configure(box, secrets_key=f"{new},{old}")
        assert await secrets_at_rest(box) == {"plaintext": 0, "current": 0, "older": 2, "locked": 0}
        assert await seal_secrets(box) == {"sealed": 2, "already": 0}
        configure(box, secrets_key=new)  # the old key can go
        await publish_one(box)
        await dispatch_once(box)
        [seen] = receiver.requests
        assert seen.headers["authorization"] == "Bearer tk_rot"
        configure(box, secrets_key=new_key())  # a key that opens nothing
        await publish_one(box)
        await dispatch_once(box)
        assert len(receiver.requests) == 1
