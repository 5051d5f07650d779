"""GitHub: ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>``.

Only the body is signed, with the webhook secret's UTF-8 bytes. The legacy SHA-1
``X-Hub-Signature`` header is not accepted. The webhook must use content type
``application/json``; form-encoded deliveries are refused as malformed.

GitHub signs no timestamp, so :meth:`GitHubSource.authenticate` returns ``None``
and ``tolerance``/``check_time`` have no effect. Replay protection is the event
key instead: ``X-GitHub-Delivery`` is a GUID per event, kept by redeliveries, so
a replayed request is recognised as a duplicate of the stored event (the
headers it comes in are not signed, so a replay under a *new* GUID would be
stored again: that is GitHub's scheme, nothing here can prevent it).

``event_type`` is the ``X-GitHub-Event`` header plus ``"." + payload["action"]``
when the payload has an action (``issues.opened``, ``pull_request.closed``), so
handlers and ``ignore_types`` patterns can select on the action; events without
one keep the bare name (``push``, ``ping``).

``account`` is the GitHub App installation id when present (the tenant of an
App), else the repository owner's or organization's login (a repository or org
webhook).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from typing import Any

from relaybox.errors import BadSignature, MalformedHeaders, MalformedPayload
from relaybox.sources.base import Headers, Identity, Secret, Source, shared_key

__all__ = ["GitHubSource", "github"]

_SIGNATURE = "x-hub-signature-256"
_DELIVERY = "x-github-delivery"
_EVENT = "x-github-event"
_PREFIX = "sha256="
_IN_HEADERS = frozenset({"event_id", "event_type"})
_ID_IN_HEADERS = frozenset({"event_id"})
_DEFAULT_TYPE = "ping"  # what example() builds and sign() announces when no type is given


def _key(secret: Secret) -> bytes:
    return shared_key("github", secret)


def _compute(key: bytes, body: bytes) -> str:
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def _login(node: Any) -> str | None:
    login = node.get("login") if isinstance(node, Mapping) else None
    return login if isinstance(login, str) and login else None


class GitHubSource(Source):
    """GitHub repository, organization and App webhooks."""

    provider = "github"

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        header = self.signature_header(headers, _SIGNATURE, "X-Hub-Signature-256")
        if not header:
            raise BadSignature("missing X-Hub-Signature-256 header", code="missing_signature")
        if not header.startswith(_PREFIX):
            raise BadSignature("X-Hub-Signature-256 header must start with sha256=")
        given = header[len(_PREFIX) :].lower().encode()

        def matches(secret: Secret) -> bool:
            return hmac.compare_digest(_compute(_key(secret), body).encode(), given)

        return self.try_secrets(matches), None

    def identify(self, headers: Headers, payload: Any) -> Identity:
        delivery = (headers.get(_DELIVERY) or "").strip()
        if not delivery:
            raise MalformedHeaders("missing X-GitHub-Delivery header")
        event = (headers.get(_EVENT) or "").strip()
        if not event:
            raise MalformedHeaders("missing X-GitHub-Event header")
        if not isinstance(payload, Mapping):
            raise MalformedPayload("GitHub payload must be a JSON object")
        in_headers = _IN_HEADERS
        action = payload.get("action")
        if isinstance(action, str) and action:
            event = f"{event}.{action}"
            in_headers = _ID_IN_HEADERS  # the type is partly the payload's
        return Identity(
            event_id=delivery,
            event_type=event,
            account=_account(payload),
            from_headers=in_headers,
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
        signature = _compute(_key(secret or self.secrets[0]), body)
        return {
            _SIGNATURE: _PREFIX + signature,
            _DELIVERY: event_id,
            # The action travels in the body: the header carries the bare event name.
            _EVENT: event_type.partition(".")[0] or _DEFAULT_TYPE,
        }

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        event, _, action = (event_type or _DEFAULT_TYPE).partition(".")
        owner = {"login": self.account or "octo-org", "id": 1, "type": "Organization"}
        payload: dict[str, Any] = {}
        if action:
            payload["action"] = action
        if event == "ping":
            payload.update(zen="Design for failure.", hook_id=1, hook={"type": "Repository"})
        payload["repository"] = {
            "id": 1296269,
            "name": "hello-world",
            "full_name": f"{owner['login']}/hello-world",
            "owner": owner,
        }
        payload["sender"] = {"login": "octocat", "id": 583231, "type": "User"}
        return json.dumps(payload, separators=(",", ":")).encode()


def _account(payload: Mapping[str, Any]) -> str | None:
    installation = payload.get("installation")
    if isinstance(installation, Mapping):
        installation_id = installation.get("id")
        if isinstance(installation_id, (int, str)) and not isinstance(installation_id, bool):
            return str(installation_id)
    repository = payload.get("repository")
    if isinstance(repository, Mapping) and (login := _login(repository.get("owner"))):
        return login
    return _login(payload.get("organization"))


def github(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> GitHubSource:
    """A GitHub webhook source. ``options`` are :class:`Source` arguments; ``tolerance``
    and ``verify_timestamp`` are accepted but unused (GitHub signs no timestamp)."""
    return GitHubSource(secrets=secrets, **options)
