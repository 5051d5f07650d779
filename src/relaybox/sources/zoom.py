"""Zoom: ``x-zm-signature: v0=<hex>`` and ``x-zm-request-timestamp``.

What is signed: ``f"v0:{timestamp}:".encode() + body`` (the timestamp header's text),
HMAC-SHA256 in hex keyed with the app's webhook secret token. The timestamp (Unix
seconds; a value above 10**12 is read as milliseconds) is checked against
``tolerance`` in both directions.

``endpoint.url_validation`` (the endpoint check Zoom runs when the URL is saved and
every 72 hours) is answered, once its signature matched, with ``{"plainToken",
"encryptedToken"}`` where ``encryptedToken`` is the hex HMAC-SHA256 of
``plainToken`` keyed with the secret token (the one configured for the verified
account, else the first); nothing is stored.

Zoom sends no event id. relaybox derives ``"sha256:" + hex`` of the canonical JSON
of ``{event, event_ts, payload}``: Zoom's retries repeat the event with its
``event_ts`` (milliseconds of the event), so a retry has the same key and a new
event does not. The type is ``event`` (``meeting.started``), the account
``payload.account_id``.
"""

from __future__ import annotations

from typing import Any

from relaybox.errors import MalformedPayload
from relaybox.sources.base import Verified
from relaybox.sources.hooks import Answer
from relaybox.sources.kit import digest, path, text
from relaybox.sources.scheme import Example, Hmac, Sample, Scheme, SchemeSource, factory
from relaybox.sources.specs import Digest

__all__ = ["ZoomSource", "zoom"]

_VALIDATION = "endpoint.url_validation"


def _example(event: Example) -> dict[str, Any]:
    if event.type == _VALIDATION:
        return {"payload": {"plainToken": event.id}, "event_ts": event.ms, "event": _VALIDATION}
    return {
        "event": event.type,
        "event_ts": event.ms,
        "payload": {
            "account_id": event.account,
            "object": {"id": event.id, "uuid": event.id, "topic": "relaybox test"},
        },
    }


class ZoomSource(SchemeSource):
    """Zoom webhooks (event subscriptions)."""

    provider = "zoom"
    scheme = Scheme(
        Hmac(
            "x-zm-signature",
            "v0:{timestamp}:{body}",
            prefix="v0=",
            timestamp="header:x-zm-request-timestamp",
            unit="auto",
        ),
        event_id=Digest(("event", "event_ts", "payload")),
        event_type="event",
        account="payload.account_id",
        sample=Sample(type="meeting.started", account="relaybox-test-account", body=_example),
    )

    def challenge(self, verified: Verified) -> Answer | None:
        if verified.event_type != _VALIDATION:
            return None
        plain = text(path(verified.payload, "payload", "plainToken"))
        if plain is None:
            raise MalformedPayload("endpoint.url_validation has no payload.plainToken")
        secret = next((s for s in self.secrets if s.account == verified.account), self.secrets[0])
        encrypted = digest(self.key(secret), plain.encode()).hex()
        return Answer.json({"plainToken": plain, "encryptedToken": encrypted})


zoom = factory(ZoomSource, "A Zoom source; ``secrets`` are the app's webhook secret tokens.")
