"""Silence detection on SQLite and PostgreSQL, with a frozen clock: a source past its
window is announced once (however many hosts check), its traffic's return too; an
endpoint that takes nothing while deliveries wait likewise; learned windows; the
gauges; and the pull recovery a silent GitHub source gets, against a fake GitHub."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import standardwebhooks
from prometheus_client.parser import text_string_to_metric_families

from relaybox import FrozenClock, Relaybox, Secret, sources
from relaybox.config import Settings
from relaybox.config.silence import SilenceSettings
from relaybox.inbound import recovery
from relaybox.silence import SilenceWatch
from relaybox.store import NewDelivery
from tests.conftest import KEYED, Served
from tests.support.fake_github import FakeGitHub
from tests.support.outbound_app import dispatch_once, endpoint, local, publish_one
from tests.support.receivers import HttpReceiver, Reply, Seen

MINUTE = 60.0
HOUR = 3600.0


def make_box(database_url: str, clock: FrozenClock, **silence: Any) -> Relaybox:
    settings = Settings(
        database_url=database_url, outbound=KEYED, silence=SilenceSettings(**silence)
    )
    return Relaybox(settings=settings, clock=clock)


@pytest.fixture
async def boxes(database_url: str, clock: FrozenClock) -> AsyncIterator[Any]:
    made: list[Relaybox] = []

    def make(**silence: Any) -> Relaybox:
        b = make_box(database_url, clock, **silence)
        made.append(b)
        return b

    yield make
    for b in made:
        await b.close()


async def arrive(
    box: Relaybox, source: str, at: float, event_id: str | None = None, *, body: bytes = b"{}"
) -> None:
    raw = body
    delivery = NewDelivery(
        source=source,
        account="a",
        event_id=event_id or uuid.uuid4().hex,
        event_type="ping",
        tenant="t",
        fingerprint=hashlib.sha256(raw).digest(),
        payload=raw,
        headers=None,
        version=None,
        received_at=at,
    )
    async with box.store.transaction() as conn:
        await box.store.inbox.insert(conn, [delivery])


async def events(box: Relaybox, event_type: str) -> list[dict[str, Any]]:
    found = await box.store.fetch_all(
        "SELECT body FROM relaybox_messages WHERE tenant = 'relaybox' AND event_type = "
        f"'{event_type}' ORDER BY created_at, id"
    )
    return [json.loads(r["body"])["data"] for r in found]


async def gauges(box: Relaybox) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    box.metrics._snapshot_read_at = float("-inf")  # a fresh read, not the cached one
    text = (await box.metrics.scrape(box)).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "silent" in sample.name:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def source_gauge(found: dict[Any, float], source: str) -> float:
    return found[("relaybox_source_silent_seconds", (("source", source),))]


async def test_a_silent_source_is_announced_once_and_its_return_too(
    boxes: Any, clock: FrozenClock
) -> None:
    """Past its 30 minutes the source is silent: one event, however many hosts check
    (two boxes, two runs each); the gauge counts since its last arrival; an arrival
    ends it with one relaybox.source.resumed."""
    watched = {"sources": {"s": {"expect_every": "30m"}}}
    box, other = boxes(**watched), boxes(**watched)
    local(box)
    t0 = clock.now()
    await arrive(box, "s", t0)
    clock.advance(29 * MINUTE)
    report = await SilenceWatch(box).run_once()
    assert report.silent["source"] == [] and await events(box, "relaybox.source.silent") == []
    assert source_gauge(await gauges(box), "s") == 0

    clock.advance(2 * MINUTE)
    found = [await SilenceWatch(b).run_once() for b in (box, other, box, other)]
    assert [f.silent["source"] for f in found] == [["s"], [], [], []]
    [silent] = await events(box, "relaybox.source.silent")
    assert silent["source"] == "s" and silent["lastArrivalAt"] == t0
    assert silent["silentSince"] == t0 and silent["silentSeconds"] == 31 * MINUTE
    assert silent["expectedEvery"] == 30 * MINUTE and silent["learned"] is False
    assert source_gauge(await gauges(other), "s") == 31 * MINUTE

    clock.advance(MINUTE)
    await arrive(box, "s", clock.now())
    found = [await SilenceWatch(b).run_once() for b in (other, box)]
    assert [f.resumed["source"] for f in found] == [["s"], []]
    [resumed] = await events(box, "relaybox.source.resumed")
    assert resumed["silentSince"] is not None and resumed["resumedAt"] == clock.now()
    assert source_gauge(await gauges(box), "s") == 0
    assert len(await events(box, "relaybox.source.silent")) == 1


async def test_a_source_that_never_sent_counts_from_the_first_check(
    boxes: Any, clock: FrozenClock
) -> None:
    box = boxes(sources={"quiet": {"expect_every": "1h"}})
    local(box)
    await SilenceWatch(box).run_once()
    clock.advance(HOUR - 1)
    assert (await SilenceWatch(box).run_once()).silent["source"] == []
    clock.advance(2)
    assert (await SilenceWatch(box).run_once()).silent["source"] == ["quiet"]
    [silent] = await events(box, "relaybox.source.silent")
    assert silent["lastArrivalAt"] is None


async def test_only_hours_of_the_window_count(boxes: Any, clock: FrozenClock) -> None:
    """Weekdays 09-17 in Paris, one hour expected: a source that last sent at 16:30
    on a Friday is silent at 09:30 on Monday, not during the weekend."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    paris = ZoneInfo("Europe/Paris")
    window = {"expect_every": "1h", "hours": "09-17", "days": "mon-fri", "timezone": "Europe/Paris"}
    box = boxes(sources={"s": window})
    local(box)
    friday = datetime(2027, 1, 15, 16, 30, tzinfo=paris).timestamp()
    clock.set(friday)
    await arrive(box, "s", friday)
    for day, hour, minute, silent in (
        (15, 23, 0, []),
        (16, 12, 0, []),
        (18, 9, 29, []),
        (18, 9, 31, ["s"]),
    ):
        clock.set(datetime(2027, 1, day, hour, minute, tzinfo=paris).timestamp())
        assert (await SilenceWatch(box).run_once()).silent["source"] == silent, (day, hour)


async def test_a_learned_window_comes_from_past_gaps(boxes: Any, clock: FrozenClock) -> None:
    """Below learn_min_arrivals nothing is learned and nothing raised; then an arrival
    every 20 minutes for two days, after a 6-hour gap: the 99th percentile gap (20
    minutes: the outlier is above it) times 2 is 40 minutes."""
    box = boxes(sources={"s": {"expect_every": "learn"}}, learn_min_arrivals=50)
    local(box)
    start = clock.now()
    for i in range(10):
        await arrive(box, "s", start + i * 20 * MINUTE)
    clock.set(start + 9 * 20 * MINUTE + 3 * HOUR)
    assert (await SilenceWatch(box).run_once()).silent["source"] == []
    [state] = await box.store.silence.states()
    assert state.learned is None and state.learned_at == clock.now()

    other = boxes(sources={"s": {"expect_every": "learn"}}, learn_min_arrivals=50)
    local(other)
    start = clock.now()
    for i in range(150):
        await arrive(box, "s", start + i * 20 * MINUTE)
    last = start + 149 * 20 * MINUTE
    clock.set(last + 39 * MINUTE)
    # Learned again only after learn_every: this box learns now, the other later.
    await box.store.silence.learned("source", "s", None, now=clock.now() - 7 * HOUR)
    assert (await SilenceWatch(other).run_once()).silent["source"] == []
    [state] = await box.store.silence.states()
    assert state.learned == 40 * MINUTE and state.expected == 40 * MINUTE
    clock.set(last + 41 * MINUTE)
    assert (await SilenceWatch(box).run_once()).silent["source"] == ["s"]
    [silent] = await events(box, "relaybox.source.silent")
    assert silent["learned"] is True and silent["expectedEvery"] == 40 * MINUTE


async def test_an_endpoint_that_takes_nothing_while_deliveries_wait(
    boxes: Any, clock: FrozenClock
) -> None:
    """An endpoint answering 503 for two hours with a delivery waiting is silent (one
    event, the gauges count it); one success ends it. An endpoint with nothing to
    take is never silent, and the operational tenant's own endpoints are not watched."""
    box = boxes(endpoints={"expect_every": "1h"})
    local(box)
    healthy = False

    def answer(seen: Seen) -> Reply:
        return Reply(200) if healthy else Reply(503)

    async with HttpReceiver(Reply(200)) as ops, HttpReceiver(answer) as customer:
        await endpoint(box, ops.url, tenant="relaybox", event_types=["relaybox.source.*"])
        idle, _ = await endpoint(box, ops.url, tenant="t2")
        ep, _ = await endpoint(box, customer.url, schedule=[60.0] * 30)
        await publish_one(box)
        await dispatch_once(box)
        clock.advance(59 * MINUTE)
        assert (await SilenceWatch(box).run_once()).silent["endpoint"] == []
        clock.advance(2 * MINUTE)
        await dispatch_once(box)
        found = [await SilenceWatch(box).run_once() for _ in range(2)]
        assert [f.silent["endpoint"] for f in found] == [[ep], []]
        [silent] = await events(box, "relaybox.endpoint.silent")
        assert silent["endpointId"] == ep and silent["lastSuccessAt"] is None
        assert silent["waitingSince"] is not None and silent["tenant"] == "t1"
        g = await gauges(box)
        assert g[("relaybox_silent_endpoints", ())] == 1
        assert g[("relaybox_endpoint_silent_seconds", ())] == 61 * MINUTE
        states = await box.store.fetch_all("SELECT name FROM relaybox_silences")
        assert {s["name"] for s in states} == {ep, idle}

        healthy = True
        clock.advance(2 * MINUTE)
        await dispatch_once(box)
        [row] = await box.store.fetch_all(
            f"SELECT last_success_at FROM relaybox_endpoints WHERE id = '{ep}'"
        )
        assert row["last_success_at"] == clock.now()
        assert (await SilenceWatch(box).run_once()).resumed["endpoint"] == [ep]
        assert len(await events(box, "relaybox.endpoint.resumed")) == 1
        g = await gauges(box)
        assert g[("relaybox_silent_endpoints", ())] == 0
        assert g[("relaybox_endpoint_silent_seconds", ())] == 0


async def test_last_success_is_written_at_most_once_a_minute(
    boxes: Any, clock: FrozenClock
) -> None:
    box = boxes()
    local(box)
    async with HttpReceiver(Reply(200)) as customer:
        ep, _ = await endpoint(box, customer.url)
        seen = []
        for step in (0, 30, 31, 30):
            clock.advance(step)
            await publish_one(box)
            await dispatch_once(box)
            [row] = await box.store.fetch_all(
                f"SELECT last_success_at FROM relaybox_endpoints WHERE id = '{ep}'"
            )
            seen.append(row["last_success_at"] - clock.now())
    assert seen == [0, -30, 0, -30]


async def test_a_silent_github_source_gets_one_recovery_run(boxes: Any, clock: FrozenClock) -> None:
    """The delivery GitHub made while the receiver was down is brought in by the
    recovery the silence starts (once: a second check starts none)."""
    secret = "silence-github-secret"
    clock.set(time.time())
    box = boxes(sources={"github": {"expect_every": "10m"}})
    local(box)
    box.source("github", sources.github(secrets=[Secret(secret)]))
    payload = {"action": "opened", "issue": {"id": 7}, "repository": {"full_name": "o/r"}}
    async with FakeGitHub(secret=secret) as github:
        recovery.register(
            box,
            "github",
            lambda: recovery.GitHubDeliveries(
                token=github.token, repo="octo-org/hello-world", hook_id=42, api_url=github.url
            ),
        )
        async with Served(box.receiver) as server:
            ok = await github.deliver("issues", payload, server.url + "/webhooks/github")
        missed = await github.deliver(
            "issues", {**payload, "issue": {"id": 8}}, "http://127.0.0.1:9/"
        )
        assert ok["status"] == "OK" and missed["status"] != "OK"
        clock.advance(11 * MINUTE)
        report = await SilenceWatch(box).run_once()
        assert report.silent["source"] == ["github"]
        assert report.recoveries["github"]["ingested"] == [missed["guid"]]
        again = await SilenceWatch(box).run_once()
        assert again.recoveries == {}
    rows = await box.store.fetch_all(
        "SELECT event_id, recovered_via FROM relaybox_inbox ORDER BY id"
    )
    assert [r["event_id"] for r in rows] == [ok["guid"], missed["guid"]]
    assert rows[1]["recovered_via"].startswith("github-api:")


async def test_hosts_checking_at_once_raise_the_silence_once(
    boxes: Any, clock: FrozenClock
) -> None:
    """Four boxes (four hosts' connections) run the check at the same moment, each
    having read the state before any acts on it (a barrier): one event, and one
    host's report names the silence; the same for its end."""
    watched = {"sources": {"s": {"expect_every": "30m"}}, "endpoints": {"expect_every": "1h"}}
    hosts = [boxes(**watched) for _ in range(4)]
    barrier = asyncio.Barrier(len(hosts))
    for b in hosts:
        local(b)
        read = b.store.silence.rows

        async def read_then_wait(kind: Any, read: Any = read) -> Any:
            found = await read(kind)
            if kind == "source":
                await asyncio.wait_for(barrier.wait(), 10)
            return found

        setattr(b.store.silence, "rows", read_then_wait)  # noqa: B010
    await arrive(hosts[0], "s", clock.now())
    await asyncio.gather(*(SilenceWatch(b).run_once() for b in hosts))  # the rows exist
    clock.advance(31 * MINUTE)
    reports = await asyncio.gather(*(SilenceWatch(b).run_once() for b in hosts))
    assert sorted(len(r.silent["source"]) for r in reports) == [0, 0, 0, 1]
    assert len(await events(hosts[0], "relaybox.source.silent")) == 1
    await arrive(hosts[0], "s", clock.now())
    reports = await asyncio.gather(*(SilenceWatch(b).run_once() for b in hosts))
    assert sorted(len(r.resumed["source"]) for r in reports) == [0, 0, 0, 1]
    assert len(await events(hosts[0], "relaybox.source.resumed")) == 1


async def test_a_recovery_that_fails_is_reported_and_the_check_goes_on(
    boxes: Any, clock: FrozenClock
) -> None:
    box = boxes(sources={"github": {"expect_every": "10m"}, "other": {"expect_every": "10m"}})
    local(box)
    box.source("github", sources.github(secrets=[Secret("x")]))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    recovery.register(
        box,
        "github",
        lambda: recovery.GitHubDeliveries(token="t", repo="o/r", hook_id=1, api_url=closed),
    )
    await arrive(box, "github", clock.now())
    await arrive(box, "other", clock.now())
    clock.advance(11 * MINUTE)
    report = await SilenceWatch(box).run_once()
    assert sorted(report.silent["source"]) == ["github", "other"]
    assert "GitHub API unreachable" in report.recoveries["github"]["error"]
    assert "other" not in report.recoveries  # no delivery log: no recovery
    assert len(await events(box, "relaybox.source.silent")) == 2


async def test_the_operators_endpoint_receives_the_silence_signed(
    boxes: Any, clock: FrozenClock
) -> None:
    clock.set(time.time() - 31 * MINUTE)  # signed now: the receiver checks the time
    box = boxes(sources={"s": {"expect_every": "30m"}})
    local(box)
    async with HttpReceiver(Reply(204)) as ops:
        _, secret = await endpoint(box, ops.url, tenant="relaybox", event_types=["relaybox.*"])
        await arrive(box, "s", clock.now())
        clock.advance(31 * MINUTE)
        await SilenceWatch(box).run_once()
        await dispatch_once(box)
        [seen] = ops.requests
        body = standardwebhooks.Webhook(secret).verify(seen.body, seen.headers)
        assert body["type"] == "relaybox.source.silent" and body["data"]["source"] == "s"
