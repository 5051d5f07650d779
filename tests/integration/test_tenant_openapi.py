"""The tenant API's OpenAPI document (docs/tenant-openapi.json): the committed copy is
current, and schemathesis drives a real server (uvicorn on a free port, SQLite and
PostgreSQL) with requests generated from it, valid and invalid: no answer is a 500,
and every answer's status, content type, headers and body conform to the document.
Each generated call to a path with an id runs twice: with the generated id and with
one of the tenant's real endpoints or messages, so the handlers behind the 404 run too."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from relaybox import Relaybox
from relaybox.config import Settings
from relaybox.outbound import create_api_key, define_event_type
from relaybox.outbound.openapi import REGENERATE, openapi_document, render
from tests.conftest import KEYED, Served, create_pg_database, drop_pg_database
from tests.support.outbound_app import endpoint, local, publish_one

COMMITTED = Path(__file__).parents[2] / "docs" / "tenant-openapi.json"
SCHEMA = schemathesis.openapi.from_dict(json.loads(COMMITTED.read_text()))
# Unknown query parameters are ignored by the API, as HTTP APIs usually do; the key is
# the test's own (a request without it is a 401, checked in tests/integration/test_outbound_api.py).
SCHEMA.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    allow_extra_parameters=True,
    with_security_parameters=False,
)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


def test_the_committed_document_is_current() -> None:
    assert COMMITTED.exists(), f"docs/tenant-openapi.json is missing: run `{REGENERATE}`"
    assert COMMITTED.read_text() == render(openapi_document()), (
        f"docs/tenant-openapi.json is stale: run `{REGENERATE}` and commit it"
    )


def test_every_route_of_the_api_is_documented(box: Relaybox) -> None:
    from starlette.routing import Route

    from relaybox.outbound.api import build_api

    local(box)
    served = {
        (method.lower(), route.path)
        for route in build_api(box).routes
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"
    }
    documented = {
        (method, path) for path, item in openapi_document()["paths"].items() for method in item
    }
    assert served == documented


@dataclass
class Live:
    """A relaybox API server in a thread of its own (schemathesis calls it synchronously)."""

    url: str = ""
    key: str = ""
    endpoints: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    loop: asyncio.AbstractEventLoop | None = None
    box: Relaybox | None = None

    def run(self, coro: Any) -> Any:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Live]:
    state = Live()
    folder = tmp_path_factory.mktemp("openapi")
    ready, stop = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    async def serve() -> None:
        if request.param == "sqlite":
            url = f"sqlite:///{folder / 'relaybox.db'}"
        else:
            url = await create_pg_database()
        box = Relaybox(settings=Settings(database_url=url, outbound=KEYED))
        try:
            await box.migrate()
            # A high publish rate: the fuzzing publishes many messages in a row.
            local(box, publish_rate=10_000, publish_burst=10_000)
            _, state.key = await create_api_key(box, "client-42")
            await define_event_type(
                box, "order.paid", schema={"type": "object", "required": ["orderId"]}
            )
            for _ in range(3):
                state.endpoints.append(
                    (await endpoint(box, "http://127.0.0.1:9/x", tenant="client-42"))[0]
                )
                state.messages.append(
                    (await publish_one(box, "pet.adopted", tenant="client-42")).id
                )
            async with Served(box.asgi(roles=("api",))) as served:
                state.url, state.loop, state.box = served.url, asyncio.get_running_loop(), box
                ready.set()
                await asyncio.to_thread(stop.wait)
        except BaseException as exc:  # reported to the test thread
            failed.append(exc)
            ready.set()
        finally:
            await box.close()
            if request.param == "postgres":
                await drop_pg_database(url)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    ready.wait(120)
    if failed:
        raise failed[0]
    try:
        yield state
    finally:
        stop.set()
        thread.join(60)


_SESSION = requests.Session()


@SCHEMA.parametrize()
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_the_api_conforms_to_its_document(case: Any, live: Live) -> None:
    headers = {"Authorization": f"Bearer {live.key}"}
    base = live.url + "/api/v1"
    case.call_and_validate(base_url=base, session=_SESSION, headers=headers, checks=CHECKS)
    if "id" in (case.path_parameters or {}):
        path = case.path
        real = live.messages if path.startswith("/messages") else live.endpoints
        if case.method.lower() == "delete":
            target = live.run(endpoint(live.box, "http://127.0.0.1:9/x", tenant="client-42"))[0]
        else:
            target = real[0]
        case.path_parameters = {**case.path_parameters, "id": target}
        case.call_and_validate(base_url=base, session=_SESSION, headers=headers, checks=CHECKS)
