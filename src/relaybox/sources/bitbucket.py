"""Bitbucket Cloud: ``X-Hub-Signature: sha256=<hex HMAC-SHA256 of the body>``.

What is signed: the raw body, HMAC-SHA256 in hex keyed with the webhook's secret.
No timestamp: no tolerance.

Identity: the ``X-Request-UUID`` header (one per webhook request; Bitbucket's
documentation does not say whether a retry keeps it, so a retry with a new one is
stored as a second event of the same content), ``X-Event-Key`` as the type
(``repo:push``, ``pullrequest:created``), and the ``X-Hook-UUID`` header as the
account (the webhook that sent it).
"""

from __future__ import annotations

from relaybox.sources.scheme import Hmac, Scheme, SchemeSource, factory

__all__ = ["BitbucketSource", "bitbucket"]


class BitbucketSource(SchemeSource):
    """Bitbucket Cloud webhooks."""

    provider = "bitbucket"
    scheme = Scheme(
        Hmac("X-Hub-Signature", prefix="sha256="),
        event_id="header:X-Request-UUID",
        event_type="header:X-Event-Key",
        account="header:X-Hook-UUID",
        default_type="repo:push",
        default_account="{relaybox-test-hook}",
        example=lambda event: {
            "repository": {"full_name": "relaybox/test", "uuid": "{relaybox-test-repo}"},
            "actor": {"display_name": "relaybox"},
            "push": {"changes": []},
        },
    )


bitbucket = factory(BitbucketSource, "A Bitbucket Cloud source; ``secrets`` are webhook secrets.")
