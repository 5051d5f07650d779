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

import json
from collections.abc import Iterable, Mapping
from typing import Any

from relaybox.errors import MalformedHeaders
from relaybox.sources.base import Headers, Identity, Secret, Source, constant_time_equal
from relaybox.sources.kit import require_header, text

__all__ = ["GitLabSource", "gitlab"]

_TOKEN = "x-gitlab-token"


class GitLabSource(Source):
    """GitLab project, group and system webhooks."""

    provider = "gitlab"

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        given = require_header(headers, _TOKEN, "X-Gitlab-Token").encode()
        return self.try_secrets(lambda s: constant_time_equal(s.value.encode(), given)), None

    def identify(self, headers: Headers, payload: Any) -> Identity:
        event_id = headers.get("idempotency-key") or headers.get("x-gitlab-event-uuid") or ""
        if not event_id.strip():
            raise MalformedHeaders("missing Idempotency-Key or X-Gitlab-Event-UUID header")
        kind = text(payload.get("object_kind")) if isinstance(payload, Mapping) else None
        event_type = kind or (headers.get("x-gitlab-event") or "").strip()
        return Identity(
            event_id=event_id.strip(),
            event_type=event_type,
            account=(headers.get("x-gitlab-instance") or "").strip() or None,
        )

    def sign(
        self,
        body: bytes,
        *,
        event_id: str,
        event_type: str,
        now: float,
        secret: Secret | None = None,
    ) -> dict[str, str]:
        kind = event_type or "push"
        return {
            _TOKEN: (secret or self.secrets[0]).value,
            "x-gitlab-event": kind.replace("_", " ").title() + " Hook",
            "x-gitlab-event-uuid": event_id,
            "idempotency-key": event_id,
            "content-type": "application/json",
        }

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        document = {
            "object_kind": event_type or "push",
            "event_name": event_type or "push",
            "ref": "refs/heads/main",
            "checkout_sha": "da1560886d4f094c3e6c9ef40349f7d38b5d27d7",
            "project": {"id": 15, "path_with_namespace": "relaybox/test"},
        }
        return json.dumps(document, separators=(",", ":")).encode()


def gitlab(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> GitLabSource:
    """A GitLab source; ``secrets`` are webhook secret tokens."""
    return GitLabSource(secrets=secrets, **options)
