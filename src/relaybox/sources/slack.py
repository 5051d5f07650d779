"""Slack Events API: ``X-Slack-Signature: v0=<hex>`` and ``X-Slack-Request-Timestamp``.

What is signed: ``f"v0:{timestamp}:".encode() + body`` (the timestamp exactly as
sent in its header), HMAC-SHA256 hex keyed with the app's signing secret. The
timestamp is checked in both directions after the signature matched.

Identity, from the Events API JSON envelope
(``{"type": "event_callback", "event_id": "Ev..", "team_id": "T..", "event": {...}}``):
``event_id`` (kept by Slack's retries, which add ``X-Slack-Retry-Num``), the inner
``event.type`` (``message``, ``app_mention``) or else the envelope type, and
``team_id`` as the account (the signing secret is per app, so the team is what
tells installations apart).

Two envelopes carry no ``event_id``; they get a synthetic, stable one instead of
being refused:

* ``url_verification`` (the endpoint handshake): ``"url_verification:" + challenge``,
  type ``url_verification``. The source answers it (:meth:`SlackSource.challenge`:
  ``{"challenge": ...}``) once the signature matched, and nothing is stored.
* ``app_rate_limited``: ``"app_rate_limited:{team_id}:{minute_rate_limited}"``.

Form-encoded requests, signed the same way, are decoded to a dict:

* interactivity (``payload=<JSON>``): the handler sees the JSON inside ``payload``;
  the type is its ``type`` (``block_actions``, ``view_submission``, ``shortcut``,
  ...), the account ``team.id``, and the id its ``trigger_id`` (unique per user
  interaction, the same on a resend); without one, ``"sha256:" + hex`` of the
  canonical JSON of the payload;
* slash commands (``command=/deploy&text=...``): the form fields; type
  ``slash_command``, account ``team_id``, id ``trigger_id``.

Both are answered with an empty 200 (Slack shows nothing and expects the app to
follow up through ``response_url`` or the API).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from relaybox.errors import MalformedPayload
from relaybox.sources.base import Headers, Identity, Verified, canonical_json
from relaybox.sources.bodies import decode_form
from relaybox.sources.hooks import Answer
from relaybox.sources.scheme import Example, Hmac, Sample, Scheme, SchemeSource, factory

__all__ = ["SlackSource", "slack"]


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _example(event: Example) -> dict[str, Any]:
    if event.type == "url_verification":
        return {"token": "relaybox-test", "challenge": event.id, "type": event.type}
    return {
        "token": "relaybox-test",
        "team_id": event.account,
        "api_app_id": "A0000000000",
        "event": {
            "type": event.type,
            "channel": "C0000000000",
            "user": "U0000000000",
            "text": "relaybox test event",
            "ts": f"{event.now:.6f}",
            "event_ts": f"{event.now:.6f}",
        },
        "type": "event_callback",
        "event_id": event.id,
        "event_time": int(event.now),
    }


class SlackSource(SchemeSource):
    """Slack Events API requests (JSON)."""

    provider = "slack"
    scheme = Scheme(
        Hmac(
            "X-Slack-Signature",
            "v0:{timestamp}:{body}",
            prefix="v0=",
            timestamp="header:X-Slack-Request-Timestamp",
        ),
        event_id="event_id",
        event_type="type",
        account="team_id",
        sample=Sample(type="message", account="T0000000000", body=_example, content_type=None),
    )

    def decode(self, headers: Headers, body: bytes) -> Any:
        if body.lstrip()[:1] in (b"{", b"["):
            return self.parse(body)
        fields = decode_form(body, self.body_limits)
        inner = fields.get("payload")
        if isinstance(inner, str):
            payload = self.parse(inner.encode("utf-8"))
            if not isinstance(payload, dict):
                raise MalformedPayload("Slack payload= must be a JSON object")
            return payload
        return fields

    def identify(self, headers: Headers, payload: Any) -> Identity:
        if not isinstance(payload, Mapping):
            raise MalformedPayload("Slack payload must be a JSON object")
        if not _events_api(payload):
            return _form_identity(payload)
        envelope_type = _text(payload.get("type"))
        team = _text(payload.get("team_id"))
        if envelope_type == "url_verification":
            challenge = _text(payload.get("challenge"))
            if challenge is None:
                raise MalformedPayload('url_verification has no "challenge"')
            return Identity(event_id=f"url_verification:{challenge}", event_type=envelope_type)
        if envelope_type == "app_rate_limited":
            minute = payload.get("minute_rate_limited")
            return Identity(
                event_id=f"app_rate_limited:{team or ''}:{minute}",
                event_type=envelope_type,
                account=team,
            )
        event_id = _text(payload.get("event_id"))
        if event_id is None:
            raise MalformedPayload('Slack payload has no "event_id"', code="missing_event_id")
        event = payload.get("event")
        event_type = _text(event.get("type")) if isinstance(event, Mapping) else None
        event_type = event_type or envelope_type
        if event_type is None:
            raise MalformedPayload('Slack payload has no "type"', code="missing_event_type")
        return Identity(event_id=event_id, event_type=event_type, account=team)

    def challenge(self, verified: Verified) -> Answer | None:
        payload = verified.payload
        if verified.event_type == "url_verification" and isinstance(payload, Mapping):
            return Answer.json({"challenge": payload.get("challenge")})
        return None

    def acknowledge(self, verified: Verified, status: str) -> Answer | None:
        if isinstance(verified.payload, Mapping) and not _events_api(verified.payload):
            return Answer(200, b"", "text/plain")
        return None


_ENVELOPES = frozenset({"event_callback", "url_verification", "app_rate_limited"})


def _events_api(payload: Mapping[str, Any]) -> bool:
    """An Events API envelope (JSON), as opposed to an interactivity payload or a
    slash command (form-encoded)."""
    return payload.get("type") in _ENVELOPES or "event_id" in payload


def _form_identity(payload: Any) -> Identity:
    fallback = "sha256:" + hashlib.sha256(canonical_json(payload)).hexdigest()
    trigger = _text(payload.get("trigger_id"))
    if "command" in payload and "type" not in payload:
        return Identity(
            event_id=trigger or fallback,
            event_type="slash_command",
            account=_text(payload.get("team_id")),
        )
    team = payload.get("team")
    account = _text(team.get("id")) if isinstance(team, Mapping) else None
    event_type = _text(payload.get("type"))
    if event_type is None:
        raise MalformedPayload('Slack payload has no "type"', code="missing_event_type")
    return Identity(event_id=trigger or fallback, event_type=event_type, account=account)


slack = factory(
    SlackSource,
    """A Slack Events API source; ``secrets`` are app signing secrets. ``options`` are
    :class:`Source` arguments (``tolerance``, ``tenants`` keyed by team id, ...).""",
)
