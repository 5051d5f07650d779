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

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from relaybox.errors import MalformedPayload
from relaybox.sources.base import Headers, Identity, Signing
from relaybox.sources.scheme import Example, Hmac, Sample, Scheme, SchemeSource, factory

__all__ = ["GitHubSource", "github"]

_ID_IN_HEADERS = frozenset({"event_id"})


def _login(node: Any) -> str | None:
    login = node.get("login") if isinstance(node, Mapping) else None
    return login if isinstance(login, str) and login else None


def _example(event: Example) -> dict[str, Any]:
    owner = {"login": event.account, "id": 1, "type": "Organization"}
    payload: dict[str, Any] = {}
    if event.action:
        payload["action"] = event.action
    if event.resource == "ping":
        payload.update(zen="Design for failure.", hook_id=1, hook={"type": "Repository"})
    payload["repository"] = {
        "id": 1296269,
        "name": "hello-world",
        "full_name": f"{owner['login']}/hello-world",
        "owner": owner,
    }
    payload["sender"] = {"login": "octocat", "id": 583231, "type": "User"}
    return payload


class GitHubSource(SchemeSource):
    """GitHub repository, organization and App webhooks."""

    provider = "github"
    scheme = Scheme(
        Hmac("X-Hub-Signature-256", prefix="sha256="),
        event_id="header:X-GitHub-Delivery",
        event_type="header:X-GitHub-Event",
        sample=Sample(type="ping", account="octo-org", body=_example, content_type=None),
    )

    def identify(self, headers: Headers, payload: Any) -> Identity:
        # The type is the event header plus the payload's action (``issues.opened``);
        # the account an App installation, else the repository owner or organization.
        identity = super().identify(headers, payload)
        if not isinstance(payload, Mapping):
            raise MalformedPayload("GitHub payload must be a JSON object")
        in_headers = identity.from_headers
        event = identity.event_type
        action = payload.get("action")
        if isinstance(action, str) and action:
            event = f"{event}.{action}"
            in_headers = _ID_IN_HEADERS  # the type is partly the payload's
        return Identity(
            event_id=identity.event_id,
            event_type=event,
            account=_account(payload),
            from_headers=in_headers,
        )

    def signed_headers(self, body: bytes, signing: Signing) -> dict[str, str]:
        # The action travels in the body: the header carries the bare event name.
        name = signing.event_type.partition(".")[0]
        return super().signed_headers(body, replace(signing, event_type=name))


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


github = factory(
    GitHubSource,
    """A GitHub webhook source. ``options`` are :class:`Source` arguments; ``tolerance``
    and ``verify_timestamp`` are accepted but unused (GitHub signs no timestamp).""",
)
