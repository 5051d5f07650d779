"""A timestamp no clock can hold (400 digits) is a 4xx for every provider that signs
one, never an OverflowError (the receiver would answer 503 and the sender retry forever)."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from relaybox import sources
from relaybox.errors import RejectedDelivery

NOW = 1_800_000_000.0
HUGE = "9" * 400


def test_paddle_huge_ts() -> None:
    src = sources.paddle(secrets=["pdl_ntfset_secret"])
    body = b'{"event_id":"evt_1","event_type":"transaction.paid","data":{}}'
    with pytest.raises(RejectedDelivery) as exc:
        src.verify({"paddle-signature": f"ts={HUGE};h1=00"}, body, NOW)
    assert exc.value.status in (400, 401)


def test_calendly_huge_t() -> None:
    src = sources.calendly(secrets=["calendly-key"])
    body = b'{"event":"invitee.created","payload":{}}'
    with pytest.raises(RejectedDelivery) as exc:
        src.verify({"calendly-webhook-signature": f"t={HUGE},v1=00"}, body, NOW)
    assert exc.value.status in (400, 401)


def test_mailgun_huge_timestamp_correctly_signed() -> None:
    key = "mailgun-signing-key"
    src = sources.mailgun(secrets=[key])
    token = "t" * 50
    signature = hmac.new(key.encode(), (HUGE + token).encode(), hashlib.sha256).hexdigest()
    body = json.dumps(
        {
            "signature": {"timestamp": HUGE, "token": token, "signature": signature},
            "event-data": {"id": "e1", "event": "delivered"},
        }
    ).encode()
    with pytest.raises(RejectedDelivery) as exc:
        src.verify({"content-type": "application/json"}, body, NOW)
    assert exc.value.status in (400, 401)


def test_linear_huge_webhook_timestamp_correctly_signed() -> None:
    src = sources.linear(secrets=["lin_wh_secret"])
    body = json.dumps(
        {"action": "create", "type": "Issue", "data": {"id": "i1"}, "webhookTimestamp": int(HUGE)}
    ).encode()
    headers = src.sign(body, event_id="d1", event_type="Issue.create", now=NOW)
    with pytest.raises(RejectedDelivery) as exc:
        src.verify(headers, body, NOW)
    assert exc.value.status in (400, 401)
