"""The receiver's side of :mod:`relaybox.sources.hooks`: the request a handshake sees,
the URL a URL-signing source verifies, and sending an :class:`Answer`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from relaybox.sources.base import Source
from relaybox.sources.bodies import parse_query
from relaybox.sources.hooks import Answer, Request

if TYPE_CHECKING:
    from starlette.types import Scope, Send

__all__ = ["handshake", "request_url", "send_answer"]


def request_url(scope: Scope, headers: dict[str, str]) -> str:
    """The URL as the sender requested it: scheme, ``Host`` header, the path as sent
    (percent-encoding kept) and the query string. Behind a proxy that changes any of
    these, configure the source's public ``url``."""
    scheme = scope.get("scheme", "http")
    host = headers.get("host")
    if not host:
        server = scope.get("server") or ("localhost", None)
        host = server[0] if server[1] in (None, 80, 443) else f"{server[0]}:{server[1]}"
    raw_path = scope.get("raw_path")
    path = raw_path.decode("latin-1") if raw_path else scope.get("root_path", "") + scope["path"]
    query = scope.get("query_string", b"").decode("latin-1")
    return f"{scheme}://{host}{path}" + (f"?{query}" if query else "")


def handshake(source: Source, scope: Scope, headers: dict[str, str], body: bytes) -> Answer | None:
    """Ask ``source`` whether this request is an unsigned handshake (its answer) or
    not (``None``). The query string is parsed within the source's body limits."""
    if type(source).handshake is Source.handshake:
        return None  # the common case costs nothing
    query = parse_query(scope.get("query_string", b""), source.body_limits)
    request = Request(
        method=scope["method"],
        url=request_url(scope, headers),
        query=query,
        headers=headers,
        body=body,
    )
    return source.handshake(request)


async def send_answer(send: Send, answer: Answer) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": answer.status,
            "headers": [
                (b"content-type", answer.content_type.encode("latin-1")),
                (b"content-length", str(len(answer.body)).encode()),
                *((k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers),
            ],
        }
    )
    await send({"type": "http.response.body", "body": answer.body})
