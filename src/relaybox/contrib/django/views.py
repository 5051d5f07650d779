"""The receiving endpoint as a Django view: ``POST <prefix>/<source>`` with the
verification, accept rules and answers of :class:`relaybox.inbound.receiver.Receiver` (its
``open`` and ``answer``), the 2xx sent only after the COMMIT that holds the delivery.

An async view: under ASGI it awaits the accept without holding a thread; under WSGI
Django runs it to completion in the request's thread. The raw body is read here,
within the source's limit; Django's CSRF check and form parsing never see it."""

from __future__ import annotations

import json
import time
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from relaybox.contrib.django import get_box
from relaybox.contrib.django.portal import run_async
from relaybox.errors import RejectedDelivery
from relaybox.inbound.receiver import Reply, over_limit, rejected
from relaybox.sources.hooks import Answer

__all__ = ["receive"]

_CHUNK = 65536


@csrf_exempt
async def receive(request: HttpRequest, source: str) -> HttpResponse:
    box = get_box()
    started = time.perf_counter()
    scope = _scope(request, source)
    found, headers, reply = box.receiver.open(scope)
    if reply is None and found is not None:
        try:
            body = _read(request, found.max_body)
        except RejectedDelivery as exc:
            reply = rejected(exc)
        else:
            reply = await run_async(box.receiver.answer(found, scope, headers, body))
    assert reply is not None
    box.metrics.observe_accept(reply[0], time.perf_counter() - started)
    return _response(reply)


def _scope(request: HttpRequest, source: str) -> dict[str, Any]:
    """The request as the ASGI receiver reads it: method, source, headers (lowercase
    names, latin-1 as on the wire), query string and the URL as requested."""
    full = request.get_full_path()
    path = full.partition("?")[0]
    return {
        "type": "http",
        "method": request.method,
        "path": "/" + source,
        "root_path": "",
        "raw_path": path.encode("latin-1", "replace"),
        "query_string": request.META.get("QUERY_STRING", "").encode("latin-1", "replace"),
        "headers": [
            (name.lower().encode("latin-1"), value.encode("latin-1", "replace"))
            for name, value in request.headers.items()
        ],
        "scheme": request.scheme,
        "server": (request.META.get("SERVER_NAME", "localhost"), _port(request)),
    }


def _port(request: HttpRequest) -> int | None:
    port = str(request.META.get("SERVER_PORT", ""))
    return int(port) if port.isdigit() else None


def _read(request: HttpRequest, limit: int) -> bytes:
    """The raw body, refused (413) as soon as it is over ``limit``."""
    chunks: list[bytes] = []
    size = 0
    try:
        while chunk := request.read(_CHUNK):
            size += len(chunk)
            if size > limit:
                raise over_limit(limit)
            chunks.append(chunk)
    except OSError:  # UnreadablePostError: the client went away mid-body
        raise RejectedDelivery("client disconnected", code="disconnected") from None
    return b"".join(chunks)


def _response(reply: Reply) -> HttpResponse:
    status, body, extra = reply
    if isinstance(body, Answer):
        response = HttpResponse(body.body, status=status, content_type=body.content_type)
        for name, value in body.headers:
            response[name] = value
    else:
        response = HttpResponse(
            json.dumps(body).encode(), status=status, content_type="application/json"
        )
    for raw_name, raw_value in extra:
        response[raw_name.decode("latin-1")] = raw_value.decode("latin-1")
    return response
