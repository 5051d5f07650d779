"""The credits example with fault injection, for tests that run real processes, and
the helpers tests use to build and deliver its Stripe events.

``relaybox serve|worker --app tests.support.faultapp:box`` reads at import:

``FAULT``
    ``kill_before_commit``  SIGKILL itself in ``hooks.before_commit`` (the business
                            transaction is still open: everything rolls back);
    ``kill_after_commit``   SIGKILL itself in ``hooks.after_commit`` (committed, but
                            the process dies before it can do anything else);
    ``poison``              the ``invoice.paid`` handler SIGKILLs its process for the
                            invoice ``in_poison``, on every attempt;
    ``freeze``              the ``invoice.paid`` handler grants the credits (its
                            statements run, its transaction stays open) and then
                            SIGSTOPs its process: a handler stuck after its first
                            statements, its connection idle in transaction.
``FAULT_MARKER``
    A file path: the ``kill_*`` faults fire only in the process that creates this file
    (``O_EXCL``), so the worker started after the crash runs normally.

The rest of the configuration is the example's own (``RELAYBOX_*``, ``CREDITS_*``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Mapping
from typing import Any

from examples.credits import app as credits

from relaybox import Context, Relaybox
from relaybox.errors import ConfigurationError

__all__ = [
    "POISON_INVOICE",
    "box",
    "charge_refunded",
    "invoice_paid",
    "make_box",
    "post_asgi",
    "signed",
]

POISON_INVOICE = "in_poison"


def _first_time() -> bool:
    marker = os.environ.get("FAULT_MARKER")
    if not marker:
        return True
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


async def _kill_once(ids: list[int]) -> None:
    if ids and _first_time():
        _die()


async def grant_unless_poison(ctx: Context) -> None:
    invoice = ctx.payload.get("data", {}).get("object", {})
    if invoice.get("id") == POISON_INVOICE:
        _die()  # a segfault, an OOM kill: the handler never returns
    await credits.grant_initial_credits(ctx)


async def grant_then_freeze(ctx: Context) -> None:
    await credits.grant_initial_credits(ctx)
    if _first_time():
        os.kill(os.getpid(), signal.SIGSTOP)


def make_box(fault: str | None = None) -> Relaybox:
    fault = os.environ.get("FAULT", "") if fault is None else fault
    box = Relaybox(settings=credits.default_settings())
    if fault == "poison":
        # Registered before the example's handlers: the first of equally specific
        # registrations wins.
        box.handler("stripe", "invoice.paid")(grant_unless_poison)
    elif fault == "freeze":
        box.handler("stripe", "invoice.paid")(grant_then_freeze)
    credits.configure(box)
    if fault == "kill_before_commit":
        box.hooks.before_commit.append(_kill_once)
    elif fault == "kill_after_commit":
        box.hooks.after_commit.append(_kill_once)
    elif fault not in ("", "poison", "freeze"):
        raise ConfigurationError(f"unknown FAULT {fault!r}")
    return box


box = make_box()


# -- events -------------------------------------------------------------------------


def _event(
    event_id: str, event_type: str, obj: Mapping[str, Any], account: str | None
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "id": event_id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": 1_700_000_000,
        "type": event_type,
        "livemode": False,
        "data": {"object": dict(obj)},
    }
    if account is not None:  # a Connect event: the account is part of what is signed
        event["account"] = account
    return event


def invoice_paid(
    event_id: str, invoice_id: str, *, account: str | None = None, **fields: Any
) -> dict[str, Any]:
    invoice = {
        "id": invoice_id,
        "object": "invoice",
        "status": "paid",
        "amount_paid": 2000,
        "currency": "usd",
        **fields,
    }
    return _event(event_id, "invoice.paid", invoice, account)


def charge_refunded(
    event_id: str, invoice_id: str | None, *, account: str | None = None, refunded: bool = True
) -> dict[str, Any]:
    charge = {
        "id": f"ch_{invoice_id}",
        "object": "charge",
        "invoice": invoice_id,
        "amount_refunded": 2000 if refunded else 500,
        "refunded": refunded,
    }
    return _event(event_id, "charge.refunded", charge, account)


def signed(
    box: Relaybox, event: Mapping[str, Any], now: float | None = None
) -> tuple[bytes, dict[str, str]]:
    """The body and headers Stripe would send (signed with the box's first secret)."""
    body = json.dumps(event, separators=(",", ":")).encode()
    when = box.clock.now() if now is None else now
    headers = box.sources["stripe"].sign(
        body, event_id=event["id"], event_type=event["type"], now=when
    )
    return body, {**headers, "content-type": "application/json"}


async def post_asgi(box: Relaybox, event: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """Deliver a signed event through the box's real receiver, in process (no socket):
    verification, tenant mapping and the group-committing acceptor all run."""
    body, headers = signed(box, event)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/stripe",
        "raw_path": b"/stripe",
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        + [(b"content-length", str(len(body)).encode())],
    }
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)  # the receiver never reads past the body
        return {"type": "http.disconnect"}

    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    await box.receiver(scope, receive, send)
    return messages[0]["status"], json.loads(messages[1]["body"])
