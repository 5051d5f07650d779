"""What a source can answer besides "stored": handshakes and provider-specific 2xx bodies.

Three hooks of :class:`~relaybox.sources.base.Source`, each returning an
:class:`Answer` or ``None`` (go on as usual):

``handshake(request)``
    before any signature check, for any method: a verification challenge that a
    provider sends unsigned (Microsoft Graph's ``validationToken``, the X/Twitter
    CRC ``GET``, Dropbox's ``GET ?challenge=``). Nothing is stored. A handshake
    answer never grants anything: it only echoes (or signs) the challenge.
``challenge(verified)``
    after the signature matched, before anything is stored: a signed handshake
    (Slack ``url_verification``, Zoom ``endpoint.url_validation``, Discord ``PING``).
    Nothing is stored.
``acknowledge(verified, status)``
    after the COMMIT, the 2xx body the provider expects instead of relaybox's JSON
    (Adyen's ``[accepted]``, an empty TwiML ``<Response/>`` for Twilio, Discord's
    deferred interaction response).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["URL_HEADER", "Answer", "Request"]

URL_HEADER = ":url"
"""Pseudo-header under which the receiver passes the request URL to sources that sign
it (``signs_url``). No HTTP/1.1 client can send a header with this name (``:`` is not
a token character), so it cannot be forged; it is stored with the delivery's headers
so a stored delivery can be verified again."""


@dataclass(frozen=True)
class Request:
    """An incoming request as a handshake sees it."""

    method: str
    url: str
    query: Mapping[str, Any]
    headers: Mapping[str, str]
    body: bytes = b""


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: status, body bytes, content type and extra headers."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = field(default=())

    @classmethod
    def json(cls, value: Any, status: int = 200) -> Answer:
        return cls(status, json.dumps(value, separators=(",", ":")).encode(), "application/json")

    @classmethod
    def text(cls, value: str, status: int = 200, content_type: str = "text/plain") -> Answer:
        return cls(
            status,
            value.encode("utf-8"),
            f"{content_type}; charset=utf-8",
            (("x-content-type-options", "nosniff"),),
        )
