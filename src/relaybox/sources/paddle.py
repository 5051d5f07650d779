"""Paddle Billing: ``Paddle-Signature: ts=<unix>;h1=<hex>``.

What is signed: ``f"{ts}:".encode() + body``, HMAC-SHA256 in hex keyed with the
notification destination's secret key (``pdl_ntfset_...``, its UTF-8 bytes), as the
``paddle-python-sdk``'s ``Verifier`` computes it. Any ``h1`` entry may match (Paddle
sends one per active secret while a secret is rotated); other keys are ignored.

The timestamp is checked against ``tolerance`` in both directions. Paddle's SDK
allows 5 seconds, and so does this source by default (``tolerance`` to widen it
when clocks drift).

Identity: ``event_id`` (``evt_...``, the same on Paddle's retries) and
``event_type`` (``transaction.completed``). Paddle Classic (``p_signature``, RSA) is
a different scheme and is not supported.
"""

from __future__ import annotations

from relaybox.sources.scheme import Entries, Hmac, Scheme, SchemeSource, factory

__all__ = ["PaddleSource", "paddle"]

DEFAULT_TOLERANCE = 5.0


class PaddleSource(SchemeSource):
    """Paddle Billing notifications."""

    provider = "paddle"
    scheme = Scheme(
        Hmac("Paddle-Signature", "{timestamp}:{body}", entries=Entries(";", "ts", "h1")),
        event_id="event_id",
        event_type="event_type",
        tolerance=DEFAULT_TOLERANCE,
        default_type="transaction.completed",
        example=lambda event: {
            "event_id": event.id,
            "event_type": event.type,
            "occurred_at": event.iso,
            "notification_id": "ntf_" + event.id,
            "data": {"id": "txn_relaybox_test", "status": "completed"},
        },
    )


paddle = factory(
    PaddleSource, "A Paddle Billing source; ``secrets`` are notification destination secret keys."
)
