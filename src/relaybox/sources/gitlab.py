"""GitLab: ``X-Gitlab-Token``, the webhook's secret token sent as is.

GitLab does not sign the body: the secret token configured on the webhook comes back
in ``X-Gitlab-Token`` and is compared in constant time (use HTTPS). No timestamp: no
tolerance.

Identity: the ``Idempotency-Key`` header (GitLab 17.4 and later: the same on every
retry of one event) when present, else ``X-Gitlab-Event-UUID``. The type is the
body's ``object_kind`` (``push``, ``merge_request``, ``pipeline``), else the
``X-Gitlab-Event`` header (``Push Hook``); the account the ``X-Gitlab-Instance``
header (the sending GitLab's URL).
"""

from __future__ import annotations

from relaybox.sources.scheme import Scheme, SchemeSource, Token, factory

__all__ = ["GitLabSource", "gitlab"]


class GitLabSource(SchemeSource):
    """GitLab project, group and system webhooks."""

    provider = "gitlab"
    scheme = Scheme(
        Token("X-Gitlab-Token"),
        event_id=("header:Idempotency-Key", "header:X-Gitlab-Event-UUID"),
        event_type=("object_kind", "header:X-Gitlab-Event"),
        account="header:X-Gitlab-Instance",
        default_type="push",
        example=lambda event: {
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
    )


gitlab = factory(GitLabSource, "A GitLab source; ``secrets`` are webhook secret tokens.")
