"""Pipedrive webhooks (v2): HTTP Basic credentials, no signature.

Pipedrive signs nothing; a webhook is created with ``http_auth_user`` and
``http_auth_password``, sent as ``Authorization: Basic``. The secret is
``"user:password"`` (compared in constant time). No timestamp: no tolerance.

Identity: ``{meta.entity}:{meta.entity_id}:{meta.action}:{meta.id}:{meta.timestamp}``
(what changed, how and when; a retry repeats it and raises ``meta.attempt``, so only
``data`` counts for the fingerprint), ``{meta.entity}.{meta.action}``
(``deal.change``) as the type and ``meta.company_id`` as the account.
"""

from __future__ import annotations

from relaybox.sources.scheme import BasicAuth, Scheme, SchemeSource, factory

__all__ = ["PipedriveSource", "pipedrive"]


class PipedriveSource(SchemeSource):
    """Pipedrive webhooks (v2)."""

    provider = "pipedrive"
    scheme = Scheme(
        BasicAuth(),
        event_id="{meta.entity}:{meta.entity_id}:{meta.action}:{meta.id?}:{meta.timestamp?}",
        event_type="{meta.entity}.{meta.action}",
        account="meta.company_id",
        version="meta.version",
        fingerprint_path="data",
        default_type="deal.change",
        default_account="12882925",
        example=lambda event: {
            "meta": {
                "action": event.type.partition(".")[2] or "change",
                "entity": event.type.partition(".")[0],
                "entity_id": event.id,
                "id": event.id,
                "company_id": event.account,
                "version": "2.0",
                "attempt": 1,
                "host": "relaybox.pipedrive.com",
                "timestamp": event.iso,
            },
            "data": {"id": event.id, "title": "relaybox test deal", "status": "open"},
            "previous": None,
        },
    )


pipedrive = factory(PipedriveSource, "A Pipedrive source; ``secrets`` are ``user:password``.")
