"""Zendesk: ``X-Zendesk-Webhook-Signature`` and ``X-Zendesk-Webhook-Signature-Timestamp``.

What is signed: the timestamp header's text, then the raw body, with no separator;
HMAC-SHA256 in base64 keyed with the webhook's signing secret (Zendesk's documented
``base64(HMACSHA256(TIMESTAMP + BODY))``). The timestamp (RFC 3339) is checked
against ``tolerance``.

Identity, from an event-subscription webhook: ``id`` (else the
``X-Zendesk-Webhook-Invocation-Id`` header), ``type``
(``zen:event-type:ticket.created``) and ``account_id``. A trigger or automation
webhook sends the JSON body you wrote: give it ``id`` and ``type`` fields.
"""

from __future__ import annotations

from relaybox.sources.scheme import Hmac, Scheme, SchemeSource, factory

__all__ = ["ZendeskSource", "zendesk"]


class ZendeskSource(SchemeSource):
    """Zendesk webhooks."""

    provider = "zendesk"
    scheme = Scheme(
        Hmac(
            "X-Zendesk-Webhook-Signature",
            "{timestamp}{body}",
            encoding="base64",
            timestamp="header:X-Zendesk-Webhook-Signature-Timestamp",
            unit="iso",
        ),
        event_id=("id", "header:X-Zendesk-Webhook-Invocation-Id"),
        event_type="type",
        account="account_id",
        default_type="zen:event-type:ticket.created",
        default_account="10000001",
        example=lambda event: {
            "account_id": int(event.account) if event.account.isdigit() else event.account,
            "detail": {"id": "35436", "subject": "relaybox test", "status": "NEW"},
            "event": {},
            "id": event.id,
            "subject": "zen:ticket:35436",
            "time": event.iso,
            "type": event.type,
            "zendesk_event_version": "2022-11-06",
        },
        headers=lambda event: {"X-Zendesk-Webhook-Invocation-Id": event.id},
    )


zendesk = factory(ZendeskSource, "A Zendesk source; ``secrets`` are webhook signing secrets.")
