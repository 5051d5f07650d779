"""Notion: ``X-Notion-Signature: sha256=<hex HMAC-SHA256 of the body>``.

What is signed: the raw body, HMAC-SHA256 in hex keyed with the subscription's
``verification_token``. No timestamp: no tolerance.

When a subscription is created, Notion POSTs ``{"verification_token": "..."}``
unsigned, and the token must be pasted back into Notion's integration settings.
relaybox answers that request 200 before any signature check, stores nothing, and
logs (logger ``relaybox.sources.notion``, WARNING) that a token arrived, with the
token, so the operator can paste it and configure it as the source's secret.

Identity: ``id`` (the same on Notion's retries), ``type`` (``page.created``) and
``workspace_id`` as the account.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from relaybox.sources.hooks import Answer, Request
from relaybox.sources.scheme import Hmac, Sample, Scheme, SchemeSource, factory

__all__ = ["NotionSource", "notion"]

logger = logging.getLogger(__name__)
MAX_VERIFICATION_BODY = 1024
"""Bytes of a verification request: a token in a one-key object is far shorter."""


class NotionSource(SchemeSource):
    """Notion integration webhooks."""

    provider = "notion"
    scheme = Scheme(
        Hmac("X-Notion-Signature", prefix="sha256="),
        event_id="id",
        event_type="type",
        account="workspace_id",
        sample=Sample(
            type="page.created",
            account="13950b26-c203-4f3b-b97d-93ec06319565",
            body=lambda event: {
                "id": event.id,
                "timestamp": event.iso,
                "workspace_id": event.account,
                "subscription_id": "29d75c0d-5546-4414-8459-7b7a92f1fc4b",
                "integration_id": "0ef2e755-4912-8096-91c1-00376a88a5ca",
                "type": event.type,
                "authors": [{"id": "c7c11cca-1d73-471d-9b6e-bdef51470190", "type": "person"}],
                "attempt_number": 1,
                "entity": {"id": "153104cd-477e-809d-8dc4-ff2d96ae3090", "type": "page"},
                "data": {"parent": {"id": "13950b26-c203-4f3b-b97d-93ec06319565", "type": "space"}},
            },
        ),
    )

    def handshake(self, request: Request) -> Answer | None:
        if request.method != "POST" or request.headers.get("x-notion-signature"):
            return None
        if len(request.body) > MAX_VERIFICATION_BODY:
            return None
        try:
            document = json.loads(request.body)
        except ValueError:
            return None
        token = document.get("verification_token") if isinstance(document, Mapping) else None
        if not isinstance(token, str) or not token or len(document) != 1:
            return None
        logger.warning(
            "notion source %s: verification_token %s received; paste it into Notion "
            "and configure it as this source's secret",
            self.name,
            token,
        )
        return Answer(200, b"", "text/plain")


notion = factory(NotionSource, "A Notion source; ``secrets`` are verification tokens.")
