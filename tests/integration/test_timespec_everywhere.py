"""One time grammar everywhere a time is taken (relaybox.timespec): the admin API's
filters and bodies, the dashboard's filter forms and the tenant API take epoch seconds,
``2h`` (counted back from the box's clock) and ISO 8601 alike, and answer 400 naming
the forms for anything else, a time past year 9999 or not finite (``1e999``) included.
Both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from relaybox import FrozenClock, Relaybox
from relaybox.outbound import create_api_key
from relaybox.outbound.replays import ReplayRunner
from relaybox.timespec import TIME_FORMS
from tests.conftest import Served
from tests.integration.test_admin_api import AUTH, TOKEN, admin, seed  # noqa: F401
from tests.integration.test_outbound_api import Api
from tests.support.outbound_app import endpoint, local

API = "/admin/api/v1"
BAD = ["1e999", "inf", "nan", "99999999999999", "99999999999w", "yesterday", "-5"]


async def test_admin_api_and_dashboard_filters_take_every_form(
    admin: tuple[Relaybox, Any],  # noqa: F811
    clock: FrozenClock,
) -> None:
    box, client = admin
    ids = await seed(box, clock)
    # seed() received its first three events 60 s before the last two, at clock time.
    now = clock.now()
    newest = {ids["new-1"]}

    async def listed(**params: str) -> set[int]:
        r = await client.get(API + "/inbox", params=params, headers=AUTH)
        assert r.status_code == 200, r.text
        return {e["id"] for e in r.json()["items"]}

    every = await listed()
    assert await listed(since="30s") == await listed(since=str(now - 30)) == newest
    iso = "2000-01-01T00:00:00Z"
    assert await listed(since=iso) == every
    assert await listed(until="30s") == {ids["bad-1"], ids["lost-1"], ids["ok-1"]}
    r = await client.get(API + "/dead", params={"since": "1h", "until": "0s"}, headers=AUTH)
    assert r.status_code == 200 and {e["id"] for e in r.json()["items"]} == {
        ids["bad-1"], ids["lost-1"],
    }  # fmt: skip
    for bad in BAD:
        r = await client.get(API + "/inbox", params={"since": bad}, headers=AUTH)
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"] == "invalid_request", r.text
    # Bodies too: a JSON number is epoch seconds, a string any form.
    for since in ("2h", now - 7200, "1970-01-02T00:00:00Z"):
        r = await client.post(
            API + "/dead/retry",
            json={"reason": "outage over", "since": since, "source": "nope"},
            headers=AUTH,
        )
        assert r.status_code == 200, (since, r.text)
    r = await client.post(API + "/dead/retry", json={"reason": "r", "since": "1e999"}, headers=AUTH)
    assert r.status_code == 400 and TIME_FORMS in r.text, r.text

    # The dashboard's filter forms: the same words, typed text shown back.
    await client.post("/admin/login", data={"token": TOKEN, "next": "/admin/"})
    for page in ("/admin/inbox", "/admin/dead"):
        r = await client.get(page, params={"since": "2h", "until": "0s"})
        assert r.status_code == 200, (page, r.text)
        assert 'name="since" value="2h"' in r.text and "epoch s)" not in r.text
        r = await client.get(page, params={"since": "1e999"})
        assert r.status_code == 400 and "1e999" in r.text, (page, r.text)
    shown = (await client.get("/admin/inbox", params={"since": "30s"})).text
    assert f"/admin/inbox/{ids['new-1']}" in shown and f"/admin/inbox/{ids['bad-1']}" not in shown


@pytest.fixture
async def tenant_api(box: Relaybox) -> AsyncIterator[Api]:
    local(box)
    _, key = await create_api_key(box, "t1", "tests")
    async with Served(box.asgi(roles=("api",))) as served, aiohttp.ClientSession() as http:
        yield Api(http, served.url + "/api/v1", key)


async def test_tenant_api_recover_and_replay_missing_take_every_form(
    box: Relaybox, tenant_api: Api
) -> None:
    ep_id, _ = await endpoint(box, "https://hooks.example.com/x", tenant="t1")
    for since in ("2h", 1_700_000_000, "2026-01-01T00:00:00Z", "1700000000"):
        status, answer = await tenant_api.call(
            "POST", f"/endpoints/{ep_id}/recover", {"since": since, "until": "0s"}
        )
        assert (status, answer) == (202, {"recovered": 0}), (since, answer)
        status, answer = await tenant_api.call(
            "POST", f"/endpoints/{ep_id}/replay-missing", {"since": since}
        )
        assert status == 202, (since, answer)
        ran = await ReplayRunner(box).run_once(answer["id"])  # one job an endpoint at a time
        assert ran is not None and ran.status == "done", (since, ran)
    for since in ("1e999", "99999999999w", "tomorrow", True, -1, 10**20):
        status, answer = await tenant_api.call(
            "POST", f"/endpoints/{ep_id}/recover", {"since": since}
        )
        assert status in (400, 422) and "since" in answer["message"], (since, answer)
