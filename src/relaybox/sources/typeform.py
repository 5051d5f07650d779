"""Typeform: ``Typeform-Signature: sha256=<base64 HMAC-SHA256 of the body>``.

What is signed: the raw body, HMAC-SHA256 in base64 keyed with the webhook's
secret. No timestamp: no tolerance.

Identity: ``event_id`` (the same on Typeform's retries), ``event_type``
(``form_response``) and ``form_response.form_id`` as the account.
"""

from __future__ import annotations

from relaybox.sources.scheme import Hmac, Scheme, SchemeSource, factory

__all__ = ["TypeformSource", "typeform"]


class TypeformSource(SchemeSource):
    """Typeform webhooks."""

    provider = "typeform"
    scheme = Scheme(
        Hmac("Typeform-Signature", prefix="sha256=", encoding="base64"),
        event_id="event_id",
        event_type="event_type",
        account="form_response.form_id",
        default_type="form_response",
        default_account="relaybox",
        example=lambda event: {
            "event_id": event.id,
            "event_type": event.type,
            "form_response": {"form_id": event.account, "token": event.id, "answers": []},
        },
    )


typeform = factory(TypeformSource, "A Typeform source; ``secrets`` are webhook secrets.")
