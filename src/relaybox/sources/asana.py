"""Asana: ``X-Hook-Signature: <hex HMAC-SHA256 of the body>``, after an ``X-Hook-Secret`` handshake.

Creating a webhook, Asana POSTs to the target with an ``X-Hook-Secret`` header and
expects ``200`` with the same header back: relaybox answers so, before any signature
check, and stores nothing (the echo grants nothing). That secret then signs every
event: configure it as the source's secret (Asana sends it only in the handshake, so
capture it where you create the webhook, or from the handshake request itself).

What is signed: the raw body, HMAC-SHA256 in hex. No timestamp: no tolerance.

Asana sends no event id. relaybox derives ``"sha256:" + hex`` of the canonical JSON
of the body (a resend repeats it). The type is ``{resource_type}.{action}`` of the
events when they share one (``task.changed``), ``batch`` otherwise, and
``heartbeat`` for the empty heartbeat deliveries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from relaybox.errors import MalformedPayload
from relaybox.sources.base import Headers, Identity
from relaybox.sources.hooks import Answer, Request
from relaybox.sources.kit import derived_id, path, text
from relaybox.sources.scheme import Example, Hmac, Sample, Scheme, SchemeSource, factory
from relaybox.sources.specs import Digest

__all__ = ["AsanaSource", "asana"]

_HANDSHAKE = "x-hook-secret"
MAX_HOOK_SECRET_CHARS = 256


def _example(event: Example) -> dict[str, Any]:
    return {
        "events": [
            {
                "user": {"gid": "1516", "resource_type": "user"},
                "created_at": event.iso,
                "action": event.action or "changed",
                "resource": {"gid": event.id, "resource_type": event.resource},
                "parent": None,
                "change": {"field": "assignee", "action": "changed"},
            }
        ]
    }


class AsanaSource(SchemeSource):
    """Asana webhooks."""

    provider = "asana"
    scheme = Scheme(
        Hmac("X-Hook-Signature"),
        event_id=Digest(),
        event_type="events",
        sample=Sample(type="task.changed", body=_example),
    )

    def handshake(self, request: Request) -> Answer | None:
        secret = (request.headers.get(_HANDSHAKE) or "").strip()
        if request.method != "POST" or not secret or len(secret) > MAX_HOOK_SECRET_CHARS:
            return None
        return Answer(200, b"", "text/plain", ((_HANDSHAKE, secret),))

    def identify(self, headers: Headers, payload: Any) -> Identity:
        events = payload.get("events") if isinstance(payload, Mapping) else None
        if not isinstance(events, list):
            raise MalformedPayload('Asana payload has no "events"', code="missing_event_type")
        kinds = {
            f"{text(path(e, 'resource', 'resource_type')) or ''}.{text(path(e, 'action')) or ''}"
            for e in events
        }
        kind = (kinds.pop() if len(kinds) == 1 else "batch") if events else "heartbeat"
        return Identity(event_id=derived_id(payload), event_type=kind)


asana = factory(AsanaSource, "An Asana source; ``secrets`` are the webhooks' X-Hook-Secret values.")
