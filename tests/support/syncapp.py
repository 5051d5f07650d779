"""The credits example's grant written as a plain ``def`` (a synchronous handler), for
in-process tests and for ``relaybox worker --app tests.support.syncapp:box``.

It is registered before the example's own handlers (the first of equally specific
registrations wins), so ``invoice.paid`` runs here, in a worker thread and a
synchronous transaction, with the example's tables, keys and e-mail. Invoices named
``in_fail…`` raise after their effect (nothing of it may commit); ``in_invalid…`` is
refused (dead letter ``invalid``). ``FAULT`` / ``FAULT_MARKER`` as in
:mod:`tests.support.faultapp` (``kill_before_commit``, ``kill_after_commit``,
``poison``: the handler SIGKILLs its process for ``in_poison`` on every attempt).
"""

from __future__ import annotations

import os
from typing import Any

from examples.credits import app as credits
from sqlalchemy import text

from relaybox import PermanentError, Relaybox
from relaybox.errors import ConfigurationError
from relaybox.sync import SyncContext
from tests.support.faultapp import POISON_INVOICE, _die, _kill_once

__all__ = ["box", "grant_sync", "make_box", "register"]


class HandlerFailed(Exception):
    """What the handler raises for an ``in_fail…`` invoice, after its effect."""


def grant_sync(ctx: SyncContext) -> None:
    """+100 credits for the account's workspace once per invoice, an e-mail with it."""
    invoice: dict[str, Any] = ctx.payload["data"]["object"]
    invoice_id = str(invoice["id"])
    if invoice_id.startswith("in_invalid") or not ctx.tenant:
        raise PermanentError(f"invoice {invoice_id} is not eligible")
    if invoice_id == POISON_INVOICE and os.environ.get("FAULT") == "poison":
        _die()  # a segfault, an OOM kill: the handler never returns
    event = ctx.event
    if ctx.once():  # the key the registration declares (credits.initial_grant_key)
        key = credits.grant_key(event.source, event.account, invoice_id)
        ctx.conn.execute(
            text(
                "INSERT INTO credit_grants (business_key, kind, workspace, source, account,"
                " invoice_id, credits, event_id, created_at)"
                " VALUES (:key, 'grant', :ws, :source, :account, :invoice, 100, :event, :now)"
            ),
            {
                "key": key,
                "ws": ctx.tenant,
                "source": event.source,
                "account": event.account,
                "invoice": invoice_id,
                "event": event.event_id,
                "now": ctx.box.clock.now(),
            },
        )
        ctx.conn.execute(
            text(
                "INSERT INTO workspace_balances (workspace, credits, updated_at)"
                " VALUES (:ws, 100, :now) ON CONFLICT (workspace) DO UPDATE"
                " SET credits = workspace_balances.credits + excluded.credits"
            ),
            {"ws": ctx.tenant, "now": ctx.box.clock.now()},
        )
        ctx.outbox.add(credits.EMAIL, key + ":confirmation", {"invoice": invoice_id})
    if invoice_id.startswith("in_fail"):
        raise HandlerFailed(f"the ledger refused invoice {invoice_id}")


def register(box: Relaybox) -> Relaybox:
    """The synchronous grant first, then the example's own handlers and source."""
    box.handler(
        "stripe",
        "invoice.paid",
        business_key=credits.initial_grant_key,
        fingerprint=f"credits={credits.CREDITS_PER_INVOICE}",
    )(grant_sync)
    return credits.configure(box)


def make_box(fault: str | None = None) -> Relaybox:
    fault = os.environ.get("FAULT", "") if fault is None else fault
    box = register(Relaybox(settings=credits.default_settings()))
    if fault == "kill_before_commit":
        box.hooks.before_commit.append(_kill_once)
    elif fault == "kill_after_commit":
        box.hooks.after_commit.append(_kill_once)
    elif fault not in ("", "poison"):
        raise ConfigurationError(f"unknown FAULT {fault!r}")
    return box


box = make_box()
