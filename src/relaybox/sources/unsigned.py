"""Providers that sign nothing and are data only: the delivery carries a shared
credential, HTTP Basic (a secret is ``"user:password"``) or a token sent as is,
compared in constant time (use HTTPS). A :class:`~relaybox.sources.preset_rows.Preset` row
each, published as in :mod:`relaybox.sources.providers`.
"""

from __future__ import annotations

from relaybox.sources.preset_rows import Preset, publish_all
from relaybox.sources.scheme import BasicAuth, Sample, Scheme, Token

__all__ = [
    "PRESETS",
    "PUBLISHED",
    "ChargebeeSource",
    "GitLabSource",
    "PipedriveSource",
    "chargebee",
    "gitlab",
    "pipedrive",
]

PRESETS: tuple[Preset, ...] = (
    Preset(
        "chargebee",
        "ChargebeeSource",
        Scheme(
            BasicAuth(),
            event_id="id",
            event_type="event_type",
            version="api_version",
            sample=Sample(
                type="subscription_created",
                body=lambda event: {
                    "id": event.id,
                    "occurred_at": int(event.now),
                    "source": "admin_console",
                    "object": "event",
                    "api_version": "v2",
                    "content": {"subscription": {"id": "relaybox-sub", "status": "active"}},
                    "event_type": event.type,
                    "webhook_status": "scheduled",
                },
            ),
        ),
        doc="""Chargebee webhooks: Chargebee signs nothing, the endpoint is protected by
        HTTP Basic credentials (a secret is ``"user:password"``).""",
        factory_doc="A Chargebee source; ``secrets`` are ``user:password``.",
    ),
    Preset(
        "gitlab",
        "GitLabSource",
        Scheme(
            Token("X-Gitlab-Token"),
            event_id=("header:Idempotency-Key", "header:X-Gitlab-Event-UUID"),
            event_type=("object_kind", "header:X-Gitlab-Event"),
            account="header:X-Gitlab-Instance",
            sample=Sample(
                type="push",
                body=lambda event: {
                    "object_kind": event.type,
                    "event_name": event.type,
                    "ref": "refs/heads/main",
                    "checkout_sha": "da1560886d4f094c3e6c9ef40349f7d38b5d27d7",
                    "project": {"id": 15, "path_with_namespace": "relaybox/test"},
                },
                headers=lambda event: {
                    "X-Gitlab-Event": event.type.replace("_", " ").title() + " Hook",
                    "X-Gitlab-Event-UUID": event.id,
                },
            ),
        ),
        doc="""GitLab project, group and system webhooks: GitLab signs nothing, the
        webhook's secret token comes back as sent (use HTTPS). ``Idempotency-Key``
        (GitLab 17.4 and later) is the same on every retry of one event.""",
        factory_doc="A GitLab source; ``secrets`` are webhook secret tokens.",
    ),
    Preset(
        "pipedrive",
        "PipedriveSource",
        Scheme(
            BasicAuth(),
            event_id="{meta.entity}:{meta.entity_id}:{meta.action}:{meta.id?}:{meta.timestamp?}",
            event_type="{meta.entity}.{meta.action}",
            account="meta.company_id",
            version="meta.version",
            fingerprint_path="data",
            sample=Sample(
                type="deal.change",
                account="12882925",
                body=lambda event: {
                    "meta": {
                        "action": event.action or "change",
                        "entity": event.resource,
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
            ),
        ),
        doc="""Pipedrive webhooks (v2): Pipedrive signs nothing, a webhook is created with
        HTTP Basic credentials (a secret is ``"user:password"``). A retry raises
        ``meta.attempt``, so only ``data`` counts for the fingerprint.""",
        factory_doc="A Pipedrive source; ``secrets`` are ``user:password``.",
    ),
)

PUBLISHED = publish_all(PRESETS, __name__)
"""Each provider's class and factory, by provider name."""

ChargebeeSource, chargebee = PUBLISHED["chargebee"]
GitLabSource, gitlab = PUBLISHED["gitlab"]
PipedriveSource, pipedrive = PUBLISHED["pipedrive"]
