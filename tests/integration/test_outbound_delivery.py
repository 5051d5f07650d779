"""Outbound webhooks end to end on SQLite and PostgreSQL: a real local receiver, the
dispatcher in-process, a frozen clock (schedules are proved without sleeping)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator

import pytest
import standardwebhooks
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from relaybox import FrozenClock, Relaybox
from relaybox.outbound import DEFAULT_SCHEDULE, Dispatcher, rotate_secret
from relaybox.outbound.channels.base import Channel, Delivery, Result
from relaybox.outbound.channels.http import HttpChannel
from relaybox.outbound.channels.webhook import WebhookChannel
from tests.support.outbound_app import endpoint, local, outbox_rows, publish_one
from tests.support.receivers import HttpReceiver, Reply


@pytest.fixture
async def dispatcher(box: Relaybox) -> AsyncIterator[Dispatcher]:
    local(box)
    d = box.dispatcher()
    yield d
    await d.close()


async def attempts(box: Relaybox) -> list[dict[str, object]]:
    return await box.store.fetch_all(
        "SELECT attempt, outcome, status_code, error, response, duration"
        " FROM relaybox_outbox_attempts ORDER BY id"
    )


# -- signatures ------------------------------------------------------------------------


async def test_v1_delivery_verifies_with_the_official_library(
    box: Relaybox, clock: FrozenClock, dispatcher: Dispatcher
) -> None:
    clock.set(time.time())  # receivers check webhook-timestamp against their clock
    async with HttpReceiver() as receiver:
        _, secret = await endpoint(box, receiver.url)
        message = await publish_one(box, "pet.adopted", {"petId": "p1", "userId": "u9"})
        assert await dispatcher.run_once() == 1
        [seen] = receiver.requests
    # Recorded and counted once (on PostgreSQL run_once records a plain success with
    # outbox_lease for no slot, whose answer had been misread: the row was written, the
    # attempt never counted, and "outbox_record_failed" logged).
    counted = box.metrics.registry.get_sample_value(
        "relaybox_delivery_results_total", {"channel": "webhook", "status_class": "2xx"}
    )
    assert counted == 1
    assert secret.startswith("whsec_")
    payload = standardwebhooks.Webhook(secret).verify(seen.body, seen.headers)
    assert payload == {
        "id": message.id,
        "type": "pet.adopted",
        "timestamp": payload["timestamp"],
        "data": {"petId": "p1", "userId": "u9"},
        "apiVersion": "v1",
    }
    assert seen.webhook_id == message.id
    assert seen.headers["content-type"] == "application/json"
    [row] = await outbox_rows(box)
    assert (row["status"], row["attempts"], row["last_status"]) == ("sent", 1, 200)
    [attempt] = await attempts(box)
    assert (attempt["outcome"], attempt["status_code"], attempt["response"]) == (
        "sent",
        200,
        '{"ok":true}',
    )


async def test_v1a_delivery_verifies_with_an_independent_ed25519_check(
    box: Relaybox, clock: FrozenClock, dispatcher: Dispatcher
) -> None:
    async with HttpReceiver() as receiver:
        _, public = await endpoint(box, receiver.url, secret_type="ed25519")
        await publish_one(box)
        await dispatcher.run_once()
        [seen] = receiver.requests
    assert public.startswith("whpk_")
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public[5:]))
    version, _, signature = seen.headers["webhook-signature"].partition(",")
    assert version == "v1a"
    signed = f"{seen.webhook_id}.{seen.headers['webhook-timestamp']}.".encode() + seen.body
    key.verify(base64.b64decode(signature), signed)  # raises when it does not match
    assert int(seen.headers["webhook-timestamp"]) == int(clock.now())


async def test_during_a_rotation_either_secret_verifies(
    box: Relaybox, clock: FrozenClock, dispatcher: Dispatcher
) -> None:
    clock.set(time.time())
    async with HttpReceiver() as receiver:
        endpoint_id, old = await endpoint(box, receiver.url)
        new = await rotate_secret(box, endpoint_id, "t1", grace=3600)
        assert new is not None and new != old
        await publish_one(box)
        await dispatcher.run_once()
        clock.advance(3601)  # the old secret has expired: only the new one signs
        await publish_one(box)
        await dispatcher.run_once()
        during, after = receiver.requests
    assert len(during.headers["webhook-signature"].split()) == 2
    for secret in (old, new):
        standardwebhooks.Webhook(secret).verify(during.body, during.headers)
    assert len(after.headers["webhook-signature"].split()) == 1
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(old).verify(after.body, after.headers)


async def test_x_webhook_signature_sha256_header(box: Relaybox, dispatcher: Dispatcher) -> None:
    async with HttpReceiver() as receiver:
        _, secret = await endpoint(box, receiver.url, signature="sha256")
        await publish_one(box)
        await dispatcher.run_once()
        [seen] = receiver.requests
    expected = "sha256=" + hmac.new(secret.encode(), seen.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(seen.headers["x-webhook-signature"], expected)
    assert "webhook-signature" not in seen.headers
    assert seen.headers["webhook-id"] == json.loads(seen.body)["id"]


# -- retries, dead letters, disabling --------------------------------------------------------


async def test_500_follows_the_schedule_then_goes_dead(
    box: Relaybox, clock: FrozenClock, dispatcher: Dispatcher
) -> None:
    async with HttpReceiver(Reply(500, b"boom")) as receiver:
        await endpoint(box, receiver.url)
        await publish_one(box)
        for delay in DEFAULT_SCHEDULE:
            assert await dispatcher.run_once() == 1
            [row] = await outbox_rows(box)
            assert row["status"] == "pending"
            assert row["next_attempt_at"] == pytest.approx(clock.now() + delay)
            clock.advance(delay - 0.01)
            assert await dispatcher.run_once() == 0  # not due yet
            clock.advance(0.01)
        assert await dispatcher.run_once() == 1
        assert len(receiver.requests) == len(DEFAULT_SCHEDULE) + 1 == 8
    [row] = await outbox_rows(box)
    assert (row["status"], row["dead_reason"], row["attempts"]) == ("dead", "exhausted", 8)
    log = await attempts(box)
    assert [a["outcome"] for a in log] == ["retry"] * 7 + ["exhausted"]
    assert {a["status_code"] for a in log} == {500}
    assert log[0]["response"] == "boom"
    assert len({r.webhook_id for r in receiver.requests}) == 1  # stable across retries


async def test_400_is_not_retried(box: Relaybox, dispatcher: Dispatcher) -> None:
    async with HttpReceiver(Reply(400, b"bad field")) as receiver:
        await endpoint(box, receiver.url)
        await publish_one(box)
        await dispatcher.run_once()
        await dispatcher.run_once()
        assert len(receiver.requests) == 1
    [row] = await outbox_rows(box)
    assert (row["status"], row["dead_reason"], row["last_status"]) == ("dead", "rejected", 400)


async def test_410_disables_the_endpoint_and_emits_an_operational_event(
    box: Relaybox, dispatcher: Dispatcher
) -> None:
    async with HttpReceiver(Reply(410)) as receiver:
        endpoint_id, _ = await endpoint(box, receiver.url, max_in_flight=1)
        await publish_one(box)
        await publish_one(box)  # waits behind the first (one in flight per endpoint)
        await dispatcher.run_once()
        await publish_one(box)  # after the disable: no row at all
        assert len(receiver.requests) == 1
    [ep] = await box.store.fetch_all(
        "SELECT status, disabled_reason FROM relaybox_endpoints WHERE id = ?"
        if box.store.backend == "sqlite"
        else "SELECT status, disabled_reason FROM relaybox_endpoints WHERE id = $1",
        [endpoint_id],
    )
    assert (ep["status"], ep["disabled_reason"]) == ("disabled", "gone")
    rows = await outbox_rows(box)
    assert [(r["status"], r["dead_reason"]) for r in rows] == [
        ("dead", "gone"),
        ("dead", "endpoint_disabled"),
    ]
    [event] = await box.store.fetch_all(
        "SELECT tenant, event_type, body FROM relaybox_messages WHERE tenant = 'relaybox'"
    )
    assert event["event_type"] == "relaybox.endpoint.disabled"
    data = json.loads(event["body"])["data"]
    assert (data["endpointId"], data["tenant"], data["reason"]) == (endpoint_id, "t1", "gone")


async def test_429_retry_after_is_honoured_within_the_clamp(
    box: Relaybox, clock: FrozenClock, dispatcher: Dispatcher
) -> None:
    script = [
        Reply(429, headers={"Retry-After": "120"}),
        Reply(503, headers={"Retry-After": "99999"}),
    ]
    async with HttpReceiver(script) as receiver:
        await endpoint(box, receiver.url)
        await publish_one(box)
        await dispatcher.run_once()
        [row] = await outbox_rows(box)
        assert row["next_attempt_at"] == pytest.approx(clock.now() + 120)  # not the 5 s
        clock.advance(120)
        await dispatcher.run_once()
        [row] = await outbox_rows(box)
        assert row["next_attempt_at"] == pytest.approx(clock.now() + 3600)  # clamped
        assert len(receiver.requests) == 2


async def test_a_redirect_is_a_failure_and_is_not_followed(
    box: Relaybox, dispatcher: Dispatcher
) -> None:
    async with HttpReceiver(Reply(302, headers={"Location": "/elsewhere"})) as receiver:
        await endpoint(box, receiver.url)
        await publish_one(box)
        await dispatcher.run_once()
        assert [r.path for r in receiver.requests] == ["/hook"]
    [row] = await outbox_rows(box)
    assert (row["status"], row["dead_reason"], row["last_status"]) == ("dead", "rejected", 302)
    assert "not followed" in row["last_error"]


async def test_a_hanging_receiver_is_aborted_at_the_timeout(
    box: Relaybox, dispatcher: Dispatcher
) -> None:
    async with HttpReceiver(Reply(hang=True)) as receiver:
        await endpoint(box, receiver.url, timeout=0.3)
        await publish_one(box)
        started = time.monotonic()
        await dispatcher.run_once()
        elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 2.0
    [row] = await outbox_rows(box)
    assert row["status"] == "pending" and "timed out after 0.3 s" in row["last_error"]
    [attempt] = await attempts(box)
    assert attempt["outcome"] == "retry" and 0.29 < attempt["duration"] < 2.0
    counted = box.metrics.registry.get_sample_value(
        "relaybox_delivery_results_total", {"channel": "webhook", "status_class": "timeout"}
    )
    assert counted == 1


async def test_an_endpoint_without_a_timeout_of_its_own_waits_5_seconds(box: Relaybox) -> None:
    """The default per-attempt timeout is 5 s (the sending rules relaybox follows; it
    was 15): a receiver that answers later is a timeout to retry."""
    from relaybox.outbound import configure

    configure(box, allow_insecure_loopback=True, allow_networks=["127.0.0.0/8"])
    assert box.outbound.settings.timeout == 5.0
    dispatcher = box.dispatcher()
    try:
        async with HttpReceiver(Reply(hang=True)) as receiver:
            await endpoint(box, receiver.url)  # no timeout of its own
            await publish_one(box)
            started = time.monotonic()
            await dispatcher.run_once()
            elapsed = time.monotonic() - started
    finally:
        await dispatcher.close()
    assert 5.0 <= elapsed < 9.0
    [row] = await outbox_rows(box)
    assert row["status"] == "pending" and "timed out after 5 s" in row["last_error"]


async def test_an_endpoint_failing_for_days_is_disabled(
    box: Relaybox, clock: FrozenClock, dispatcher: Dispatcher
) -> None:
    async with HttpReceiver(Reply(503)) as receiver:
        day = 24 * 3600.0
        endpoint_id, _ = await endpoint(box, receiver.url, schedule=[3 * day, 3 * day])
        await publish_one(box)
        await dispatcher.run_once()
        clock.advance(3 * day)
        await dispatcher.run_once()
        [ep] = await box.store.fetch_all("SELECT status FROM relaybox_endpoints")
        assert ep["status"] == "enabled"  # failing for 3 days: not yet
        clock.advance(3 * day)
        await dispatcher.run_once()
    [ep] = await box.store.fetch_all("SELECT status, disabled_reason FROM relaybox_endpoints")
    assert (ep["status"], ep["disabled_reason"]) == ("disabled", "failing")
    [event] = await box.store.fetch_all(
        "SELECT body FROM relaybox_messages WHERE event_type = 'relaybox.endpoint.disabled'"
    )
    assert json.loads(event["body"])["data"]["endpointId"] == endpoint_id


# -- fencing -------------------------------------------------------------------------------------


async def test_a_late_dispatchers_write_is_refused(
    box: Relaybox, clock: FrozenClock, dispatcher: Dispatcher
) -> None:
    async with HttpReceiver() as receiver:
        await endpoint(box, receiver.url)
        await publish_one(box)
        [first] = await dispatcher._lease(1)
        clock.advance(11)  # the lease (10 s) expired: the row is up for grabs
        other = box.dispatcher()
        [second] = await other._lease(1)
        assert second.uncertain and second.lease_token == first.lease_token + 1
        await dispatcher.handle(first)  # it sends, then its record is refused
        [row] = await outbox_rows(box)
        assert (row["status"], row["lease_token"]) == ("pending", second.lease_token)
        await other.handle(second)
        await other.close()
        assert {r.webhook_id for r in receiver.requests} == {second.message.id}  # type: ignore[union-attr]
    [row] = await outbox_rows(box)
    assert row["status"] == "sent"
    assert [a["outcome"] for a in await attempts(box)] == ["fenced", "uncertain", "sent"]


class _Silent(Channel):
    """A channel that never answers and sets no timer of its own."""

    async def deliver(self, delivery: Delivery) -> Result:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


async def test_a_channel_without_its_own_timer_is_cut_at_the_lease_deadline(
    box: Relaybox,
) -> None:
    """The HTTP channels time their whole attempt (``bounded``); for any other channel
    the dispatcher sets the timer: the attempt ends by the lease's end minus the margin
    kept for recording it, and counts as a timeout to retry."""
    local(box, max_timeout=0.2, timeout=0.2, lease_ttl=5.3).channel("silent", _Silent())
    assert not _Silent.bounded and WebhookChannel.bounded and HttpChannel.bounded
    async with box.store.transaction() as conn:
        await box.store.inbox.outbox_insert(
            conn, channel="silent", key="k1", payload="{}", tenant=None, inbox_id=None,
            now=box.clock.now(),
        )  # fmt: skip
    dispatcher = box.dispatcher()
    started = time.monotonic()
    try:
        assert await dispatcher.run_once() == 1
    finally:
        await dispatcher.close()
    assert 0.3 <= time.monotonic() - started < 2.0
    [row] = await outbox_rows(box)
    assert row["status"] == "pending" and "no answer within 0.3 s" in row["last_error"]
