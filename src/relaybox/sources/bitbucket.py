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

import hashlib
import hmac
import json
from collections.abc import Iterable
from typing import Any

from relaybox.errors import BadSignature, MalformedHeaders
from relaybox.sources.base import Headers, Identity, Secret, Source, shared_key
from relaybox.sources.kit import require_header, unhex

__all__ = ["BitbucketSource", "bitbucket"]

_SIGNATURE = "x-hub-signature"


def _compute(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).digest()


class BitbucketSource(Source):
    """Bitbucket Cloud webhooks."""

    provider = "bitbucket"

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        header = require_header(headers, _SIGNATURE, "X-Hub-Signature")
        if not header.startswith("sha256="):
            raise BadSignature("X-Hub-Signature must start with sha256=")
        given = unhex(header[7:], "X-Hub-Signature")
        return self.try_secrets(
            lambda s: hmac.compare_digest(_compute(shared_key("bitbucket", s), body), given)
        ), None

    def identify(self, headers: Headers, payload: Any) -> Identity:
        request = (headers.get("x-request-uuid") or "").strip()
        event_key = (headers.get("x-event-key") or "").strip()
        if not request or not event_key:
            raise MalformedHeaders("missing X-Request-UUID or X-Event-Key header")
        hook = (headers.get("x-hook-uuid") or "").strip() or None
        return Identity(event_id=request, event_type=event_key, account=hook)

    def sign(
        self,
        body: bytes,
        *,
        event_id: str,
        event_type: str,
        now: float,
        secret: Secret | None = None,
    ) -> dict[str, str]:
        key = shared_key("bitbucket", secret or self.secrets[0])
        return {
            _SIGNATURE: "sha256=" + _compute(key, body).hex(),
            "x-request-uuid": event_id,
            "x-event-key": event_type or "repo:push",
            "x-hook-uuid": self.account or "{relaybox-test-hook}",
            "content-type": "application/json",
        }

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        document = {
            "repository": {"full_name": "relaybox/test", "uuid": "{relaybox-test-repo}"},
            "actor": {"display_name": "relaybox"},
            "push": {"changes": []},
        }
        return json.dumps(document, separators=(",", ":")).encode()


def bitbucket(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> BitbucketSource:
    """A Bitbucket Cloud source; ``secrets`` are webhook secrets."""
    return BitbucketSource(secrets=secrets, **options)
