"""DocuSign Connect (JSON, HMAC): ``X-DocuSign-Signature-1`` (``-2``, ... per key).

What is signed: the raw body, HMAC-SHA256 in base64, one header per active Connect
HMAC key (``X-DocuSign-Signature-1`` for the first key, ``-2`` for the second...);
any may match any configured key. No timestamp: no tolerance.

DocuSign sends no event id. relaybox derives
``{data.envelopeId}:{event}:{generatedDateTime}`` (a retry repeats all three), the
type is ``event`` (``envelope-completed``) and the account ``data.accountId``. A retry
raises ``retryCount``, so the fingerprint leaves it out.
"""

from __future__ import annotations

from relaybox.sources.scheme import Hmac, Scheme, SchemeSource, factory

__all__ = ["DocuSignSource", "docusign"]

_KEYS = 10
"""Headers read: DocuSign signs with each active key, numbered from 1."""


class DocuSignSource(SchemeSource):
    """DocuSign Connect notifications (JSON, HMAC)."""

    provider = "docusign"
    scheme = Scheme(
        Hmac(
            tuple(f"X-DocuSign-Signature-{n}" for n in range(1, _KEYS + 1)),
            encoding="base64",
        ),
        event_id="{data.envelopeId}:{event}:{generatedDateTime}",
        event_type="event",
        account="data.accountId",
        unstable=("retryCount",),
        default_type="envelope-completed",
        default_account="a1b2c3d4-0000-4000-8000-relayboxtest",
        example=lambda event: {
            "event": event.type,
            "apiVersion": "v2.1",
            "uri": f"/restapi/v2.1/accounts/{event.account}/envelopes/{event.id}",
            "retryCount": 0,
            "configurationId": 10001,
            "generatedDateTime": event.iso,
            "data": {"accountId": event.account, "userId": "relaybox", "envelopeId": event.id},
        },
    )


docusign = factory(DocuSignSource, "A DocuSign Connect source; ``secrets`` are Connect HMAC keys.")
