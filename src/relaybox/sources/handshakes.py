"""Providers known mostly for their handshake: Microsoft Graph, X (Twitter), Dropbox.

**Microsoft Graph change notifications** (``msgraph``). Creating a subscription
POSTs ``?validationToken=<token>`` with an empty body: relaybox answers 200 with the
token as ``text/plain`` before any check, stores nothing. Notifications are not
signed; each item of ``value`` carries the ``clientState`` given when subscribing,
which must equal a configured secret (constant-time). Notifications carry no id:
relaybox derives ``"sha256:" + hex`` of the canonical JSON of ``value`` (a resend
repeats it; a change of a resource has a new ``@odata.etag`` in ``resourceData``).
Type: the items' ``changeType`` or ``lifecycleEvent`` when they share one, else
``batch``; account ``tenantId``. Rich notifications' ``validationTokens`` (JWTs)
are not checked.

**X (Twitter) Account Activity** (``twitter``). The CRC check is a ``GET
?crc_token=<token>``, answered ``{"response_token": "sha256=<base64 HMAC-SHA256
(consumer secret, crc_token)>"}``. Events carry ``x-twitter-webhooks-signature:
sha256=<base64 HMAC-SHA256(consumer secret, body)>``. No id: ``"sha256:" + hex`` of
the canonical JSON of the body (the events in it carry their own ids). Type: the
body's ``*_events`` key (``tweet_create_events``); account ``for_user_id``.

**Dropbox** (``dropbox``). The endpoint check is a ``GET ?challenge=<value>``,
echoed as ``text/plain`` with ``X-Content-Type-Options: nosniff``. Notifications
carry ``X-Dropbox-Signature: <hex HMAC-SHA256(app secret, body)>``. A notification
only says *which accounts changed*; two different changes can produce identical
bodies, so content is not an identity: every request gets its own id
(``request:<uuid>``), so no notification is dropped as a duplicate (the handler's
``list_folder/continue`` with its cursor is idempotent). Type ``list_folder``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from relaybox.errors import BadSignature, MalformedPayload
from relaybox.sources.base import (
    Headers,
    Identity,
    Secret,
    Signing,
    Source,
    constant_time_equal,
)
from relaybox.sources.hooks import Answer, Request
from relaybox.sources.kit import b64, derived_id, digest, json_object, text
from relaybox.sources.scheme import Hmac, Sample, Scheme, SchemeSource, factory
from relaybox.sources.specs import Digest

__all__ = [
    "DropboxSource",
    "MicrosoftGraphSource",
    "TwitterSource",
    "dropbox",
    "msgraph",
    "twitter",
]


def _first(query: Mapping[str, Any], name: str) -> str | None:
    value = query.get(name)
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, str) and value else None


# -- Microsoft Graph ------------------------------------------------------------------


class MicrosoftGraphSource(Source):
    """Microsoft Graph change notifications (``clientState`` as the secret)."""

    provider = "msgraph"

    def handshake(self, request: Request) -> Answer | None:
        token = _first(request.query, "validationToken")
        if token is None or request.method != "POST":
            return None
        return Answer.text(token)

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        items = _graph_items(self.parse(body))
        states = [item.get("clientState") for item in items]
        if not all(isinstance(s, str) and s for s in states):
            raise BadSignature("a notification has no clientState", code="missing_signature")
        return self.try_secrets(
            lambda s: all(constant_time_equal(s.value, str(state)) for state in states)
        ), None

    def identify(self, headers: Headers, payload: Any) -> Identity:
        items = _graph_items(payload)
        kinds = {text(i.get("changeType")) or text(i.get("lifecycleEvent")) or "" for i in items}
        tenants = {text(i.get("tenantId")) or "" for i in items}
        return Identity(
            event_id=derived_id(payload.get("value")),
            event_type=(kinds.pop() if len(kinds) == 1 else "") or "batch",
            account=(tenants.pop() if len(tenants) == 1 else "") or None,
        )

    def signed_headers(self, body: bytes, signing: Signing) -> dict[str, str]:
        return {"content-type": "application/json"}

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        item = {
            "subscriptionId": "relaybox-test-subscription",
            "changeType": event_type or "created",
            "clientState": self.secrets[0].value,
            "resource": f"Users/relaybox/Messages/{event_id}",
            "resourceData": {"id": event_id, "@odata.etag": f'W/"{event_id}"'},
            "tenantId": self.account or "relaybox-test-tenant",
        }
        return json.dumps({"value": [item]}, separators=(",", ":")).encode()


def _graph_items(payload: Any) -> list[Mapping[str, Any]]:
    value = payload.get("value") if isinstance(payload, Mapping) else None
    if not isinstance(value, list) or not value or not all(isinstance(i, Mapping) for i in value):
        raise MalformedPayload('Graph notification has no "value" items')
    return value


# -- X (Twitter) ------------------------------------------------------------------------


class TwitterSource(SchemeSource):
    """X (Twitter) Account Activity API webhooks (consumer secret as the secret)."""

    provider = "twitter"
    scheme = Scheme(
        Hmac("x-twitter-webhooks-signature", prefix="sha256=", encoding="base64"),
        event_id=Digest(),
        event_type="event",
        account="for_user_id",
        sample=Sample(
            type="tweet_create_events",
            account="2244994945",
            body=lambda event: {
                "for_user_id": event.account,
                event.type: [{"id_str": event.id, "text": "relaybox test"}],
            },
        ),
    )

    def handshake(self, request: Request) -> Answer | None:
        token = _first(request.query, "crc_token")
        if token is None or request.method != "GET":
            return None
        mac = b64(digest(self.key(self.secrets[0]), token.encode()))
        return Answer.json({"response_token": "sha256=" + mac})

    def identify(self, headers: Headers, payload: Any) -> Identity:
        # The type is the body's ``*_events`` key: the events carry their own ids.
        document = json_object(payload, "X")
        kinds = sorted(k for k in document if k.endswith("_events"))
        return Identity(
            event_id=derived_id(document),
            event_type=kinds[0] if kinds else "event",
            account=text(document.get("for_user_id")),
        )


# -- Dropbox ----------------------------------------------------------------------------


class DropboxSource(SchemeSource):
    """Dropbox webhooks (app secret as the secret)."""

    provider = "dropbox"
    scheme = Scheme(
        Hmac("X-Dropbox-Signature"),
        event_id=Digest(),
        event_type="list_folder",
        sample=Sample(
            type="list_folder",
            body=lambda event: {
                "list_folder": {"accounts": [f"dbid:{event.id}"]},
                "delta": {"users": [12345678]},
            },
        ),
    )

    def handshake(self, request: Request) -> Answer | None:
        challenge = _first(request.query, "challenge")
        if challenge is None or request.method != "GET":
            return None
        return Answer.text(challenge)

    def identify(self, headers: Headers, payload: Any) -> Identity:
        # Two different changes can arrive as identical bodies: every request is its own.
        json_object(payload, "Dropbox")
        return Identity(event_id=f"request:{uuid.uuid4()}", event_type="list_folder")


msgraph = factory(
    MicrosoftGraphSource,
    "A Microsoft Graph source; ``secrets`` are subscriptions' ``clientState`` values.",
)
twitter = factory(
    TwitterSource, "An X (Twitter) Account Activity source; ``secrets`` are consumer secrets."
)
dropbox = factory(DropboxSource, "A Dropbox source; ``secrets`` are app secrets.")
