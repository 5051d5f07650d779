"""The credits example: each paid invoice grants 100 credits to a workspace, once.

The rule of the product: **one initial grant per eligible invoice**, however many
notifications (different Stripe event ids, re-deliveries, manual repairs) name it.
A refund is a different operation with its own key, never a second run of the grant.

    event key     (source, account, event_id)     "did I already accept this event?"
                  -- relaybox's inbox, UNIQUE
    business key  stripe:{account}:{invoice}:initial-credit-grant
                  -- "did this invoice already grant its credits?" -- ctx.once(), UNIQUE

Run it (see README.md next to this file)::

    python -m examples.credits.app setup            # relaybox tables + the app's tables
    relaybox serve --app examples.credits.app:box   # receiver + worker

Configuration (environment):

- ``RELAYBOX_DATABASE_URL`` (or ``--database-url``): default ``sqlite:///credits.db``;
- ``CREDITS_STRIPE_SECRET``: the endpoint's signing secret (default: a dev value);
- ``CREDITS_TENANTS``: which verified Stripe account is which workspace,
  ``acct_1=ws_1,acct_2=ws_2`` (default ``acct_credits_dev=ws_dev``). Events without a
  Connect ``account`` come from ``CREDITS_ACCOUNT`` (default ``acct_credits_dev``).
  A workspace id inside the payload is never trusted on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Mapping
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox import Clock, Context, PermanentError, Relaybox, sources
from relaybox.config import Settings, load_settings

__all__ = [
    "CREDITS_PER_INVOICE",
    "DEV_ACCOUNT",
    "DEV_SECRET",
    "GrantNotRecordedYet",
    "box",
    "build",
    "configure",
    "create_tables",
    "grant_initial_credits",
    "grant_key",
    "reversal_key",
    "reverse_credits",
    "setup",
]

DEFAULT_DATABASE_URL = "sqlite:///credits.db"
DEV_SECRET = "whsec_credits_dev_secret"  # for local runs only: set CREDITS_STRIPE_SECRET
DEV_ACCOUNT = "acct_credits_dev"
DEV_TENANTS = {DEV_ACCOUNT: "ws_dev"}
CREDITS_PER_INVOICE = 100
EMAIL = "email"  # outbox channel of the confirmation e-mails

_TABLES = (
    # One row per applied operation (a ledger): the grant (+100) and, separately,
    # its reversal (-100). The business key is the primary key, so the database
    # itself refuses a second grant for an invoice even outside ctx.once().
    """
    CREATE TABLE IF NOT EXISTS credit_grants (
        business_key TEXT PRIMARY KEY,
        kind         TEXT NOT NULL CHECK (kind IN ('grant', 'reversal')),
        workspace    TEXT NOT NULL,
        source       TEXT NOT NULL,
        account      TEXT NOT NULL,
        invoice_id   TEXT NOT NULL,
        credits      INTEGER NOT NULL,
        event_id     TEXT NOT NULL,
        created_at   DOUBLE PRECISION NOT NULL,
        CONSTRAINT credit_grants_once UNIQUE (source, account, invoice_id, kind)
    )
    """,
    # Current balance per workspace, changed only by atomic increments.
    """
    CREATE TABLE IF NOT EXISTS workspace_balances (
        workspace  TEXT PRIMARY KEY,
        credits    INTEGER NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    )
    """,
)


class GrantNotRecordedYet(Exception):
    """A refund arrived before the grant it reverses (Stripe does not order events).
    Transient: the worker retries with backoff until the grant exists or the budget
    is used up (dead ``exhausted``, for review)."""


# -- keys ---------------------------------------------------------------------------


def grant_key(source: str, account: str, invoice_id: str) -> str:
    return f"{source}:{account}:{invoice_id}:initial-credit-grant"


def reversal_key(source: str, account: str, invoice_id: str) -> str:
    return f"{source}:{account}:{invoice_id}:credit-reversal"


# -- tables -------------------------------------------------------------------------


async def create_tables(conn: AsyncConnection) -> None:
    """The app's own tables (idempotent). Run once by :func:`setup`, not by handlers:
    on PostgreSQL two concurrent ``CREATE TABLE IF NOT EXISTS`` can still collide."""
    for statement in _TABLES:
        await conn.execute(text(statement))


async def setup(box: Relaybox) -> list[str]:
    """relaybox's migrations, then the app's tables; safe to run again."""
    applied = await box.migrate()
    async with box.store.transaction() as conn:
        if box.store.backend == "postgres":  # serialise concurrent set-ups
            await conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('credits_setup'))"))
        await create_tables(conn)
    return applied


# -- handlers -----------------------------------------------------------------------


def _object(ctx: Context) -> Mapping[str, Any]:
    payload = ctx.payload
    data = payload.get("data") if isinstance(payload, Mapping) else None
    obj = data.get("object") if isinstance(data, Mapping) else None
    if not isinstance(obj, Mapping):
        raise PermanentError(f"{ctx.event.event_type} without data.object")
    return obj


def _workspace(ctx: Context) -> str:
    if not ctx.tenant:
        # The tenant comes from the verified account (configuration), never the payload.
        raise PermanentError(f"account {ctx.event.account!r} is not mapped to a workspace")
    return ctx.tenant


def initial_grant_key(ctx: Context) -> str | None:
    """The operation an ``invoice.paid`` performs, declared with its handler so that
    the worker can claim it with the group's BEGIN (``None``: the event names no
    invoice; the handler refuses it)."""
    try:
        invoice_id = _object(ctx).get("id")
    except PermanentError:
        return None
    if not isinstance(invoice_id, str) or not invoice_id:
        return None
    return grant_key(ctx.event.source, ctx.event.account, invoice_id)


async def grant_initial_credits(ctx: Context) -> None:
    """``invoice.paid`` → +100 credits for the account's workspace, once per invoice.

    Eligible (otherwise ``PermanentError`` → dead letter ``invalid``): the verified
    account maps to a workspace; ``data.object`` is an invoice with an ``id``,
    ``status == "paid"`` and an integer ``amount_paid > 0``.
    """
    invoice = _object(ctx)
    workspace = _workspace(ctx)
    invoice_id = invoice.get("id")
    if not isinstance(invoice_id, str) or not invoice_id:
        raise PermanentError("invoice without an id")
    if invoice.get("object", "invoice") != "invoice":
        raise PermanentError(f"data.object is a {invoice.get('object')!r}, not an invoice")
    if invoice.get("status") != "paid":
        raise PermanentError(f"invoice {invoice_id} is {invoice.get('status')!r}, not 'paid'")
    amount = invoice.get("amount_paid")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        raise PermanentError(f"invoice {invoice_id} has no positive amount_paid")

    event = ctx.event
    key = grant_key(event.source, event.account, invoice_id)
    credits = CREDITS_PER_INVOICE
    # The key is declared with the handler too (initial_grant_key), so the worker may
    # have claimed it with the group's BEGIN: then this asks nothing of the database.
    if await ctx.once(key, fingerprint=f"credits={credits}"):
        now = ctx.box.clock.now()
        await ctx.conn.execute(
            text(
                "INSERT INTO credit_grants (business_key, kind, workspace, source, account,"
                " invoice_id, credits, event_id, created_at)"
                " VALUES (:key, 'grant', :ws, :source, :account, :invoice, :credits, :event,"
                " :now)"
            ),
            {
                "key": key,
                "ws": workspace,
                "source": event.source,
                "account": event.account,
                "invoice": invoice_id,
                "credits": credits,
                "event": event.event_id,
                "now": now,
            },
        )
        await _add_to_balance(ctx, workspace, credits)
        await ctx.outbox.add(
            EMAIL,
            key + ":confirmation",
            {
                "template": "credits-granted",
                "workspace": workspace,
                "invoice": invoice_id,
                "credits": credits,
            },
        )
        return
    # The operation already happened (another event, a re-delivery, a repair): check
    # that what is recorded is this operation, and change nothing.
    row = (
        await ctx.conn.execute(
            text("SELECT workspace, credits FROM credit_grants WHERE business_key = :key"),
            {"key": key},
        )
    ).first()
    if row is None or (row[0], row[1]) != (workspace, credits):
        raise PermanentError(f"{key} is recorded, but not as +{credits} for {workspace}")


async def reverse_credits(ctx: Context) -> None:
    """``charge.refunded`` for an invoice's charge → -100 credits, once per invoice.

    Its own operation (``...:credit-reversal``), never a second run of the grant. Only
    a full refund (``refunded: true``) of a charge that belongs to an invoice reverses
    credits; anything else is recorded without effect. A refund seen before its grant
    is retried later (:class:`GrantNotRecordedYet`). The balance may go negative if the
    credits were already spent: that is for the product to handle, not to hide.
    """
    charge = _object(ctx)
    invoice_id = charge.get("invoice")
    if not isinstance(invoice_id, str) or not invoice_id or charge.get("refunded") is not True:
        return
    workspace = _workspace(ctx)
    event = ctx.event
    granted = (
        await ctx.conn.execute(
            text("SELECT workspace, credits FROM credit_grants WHERE business_key = :key"),
            {"key": grant_key(event.source, event.account, invoice_id)},
        )
    ).first()
    if granted is None:
        raise GrantNotRecordedYet(f"no initial grant recorded for invoice {invoice_id} yet")
    if granted[0] != workspace:
        raise PermanentError(f"invoice {invoice_id} was granted to another workspace")
    key = reversal_key(event.source, event.account, invoice_id)
    credits = -int(granted[1])
    if await ctx.once(key, fingerprint=f"credits={credits}"):
        await ctx.conn.execute(
            text(
                "INSERT INTO credit_grants (business_key, kind, workspace, source, account,"
                " invoice_id, credits, event_id, created_at)"
                " VALUES (:key, 'reversal', :ws, :source, :account, :invoice, :credits,"
                " :event, :now)"
            ),
            {
                "key": key,
                "ws": workspace,
                "source": event.source,
                "account": event.account,
                "invoice": invoice_id,
                "credits": credits,
                "event": event.event_id,
                "now": ctx.box.clock.now(),
            },
        )
        await _add_to_balance(ctx, workspace, credits)
        await ctx.outbox.add(
            EMAIL,
            key + ":notice",
            {
                "template": "credits-reversed",
                "workspace": workspace,
                "invoice": invoice_id,
                "credits": credits,
            },
        )


async def record_only(ctx: Context) -> None:
    """Other Stripe events the endpoint receives are recorded and marked done."""


async def _add_to_balance(ctx: Context, workspace: str, credits: int) -> None:
    # One atomic statement: no read-modify-write race between workers.
    await ctx.conn.execute(
        text(
            "INSERT INTO workspace_balances (workspace, credits, updated_at)"
            " VALUES (:ws, :credits, :now)"
            " ON CONFLICT (workspace) DO UPDATE"
            " SET credits = workspace_balances.credits + excluded.credits,"
            " updated_at = excluded.updated_at"
        ),
        {"ws": workspace, "credits": credits, "now": ctx.box.clock.now()},
    )


# -- wiring -------------------------------------------------------------------------


def tenants_from_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``CREDITS_TENANTS=acct_1=ws_1,acct_2=ws_2`` → ``{"acct_1": "ws_1", ...}``."""
    raw = (os.environ if env is None else env).get("CREDITS_TENANTS", "").strip()
    if not raw:
        return dict(DEV_TENANTS)
    pairs = (item.split("=", 1) for item in raw.split(",") if item.strip())
    return {account.strip(): tenant.strip() for account, tenant in pairs}


def stripe_source(env: Mapping[str, str] | None = None) -> sources.StripeSource:
    env = os.environ if env is None else env
    return sources.stripe(
        secrets=[env.get("CREDITS_STRIPE_SECRET") or DEV_SECRET],
        account=env.get("CREDITS_ACCOUNT") or DEV_ACCOUNT,
        tenants=tenants_from_env(env),
    )


def configure(box: Relaybox, env: Mapping[str, str] | None = None) -> Relaybox:
    """Add the credits integration to an existing Relaybox: the ``stripe`` source
    (configured from ``env``, default ``os.environ``) and its handlers."""
    box.source("stripe", stripe_source(env))
    box.handler(
        "stripe",
        "invoice.paid",
        business_key=initial_grant_key,
        fingerprint=f"credits={CREDITS_PER_INVOICE}",
    )(grant_initial_credits)
    box.handler("stripe", "charge.refunded")(reverse_credits)
    box.handler("stripe", "*")(record_only)
    return box


def default_settings() -> Settings:
    """``RELAYBOX_*`` settings; the database defaults to ``sqlite:///credits.db``."""
    settings = load_settings()
    if not os.environ.get("RELAYBOX_DATABASE_URL"):
        settings = settings.model_copy(update={"database_url": DEFAULT_DATABASE_URL})
    return settings


def build(
    database_url: str | None = None,
    *,
    settings: Settings | None = None,
    clock: Clock | None = None,
) -> Relaybox:
    return configure(Relaybox(database_url, settings=settings or default_settings(), clock=clock))


box = build()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.credits.app")
    parser.add_argument("command", choices=["setup"])
    parser.add_argument("--database-url", default=None, help="default: RELAYBOX_DATABASE_URL")
    args = parser.parse_args(argv)
    target = build(args.database_url) if args.database_url else box

    async def run() -> list[str]:
        try:
            return await setup(target)
        finally:
            await target.close()

    applied = asyncio.run(run())
    print("relaybox migrations applied: " + (", ".join(applied) or "none (up to date)"))
    print("credits tables ready: credit_grants, workspace_balances")


if __name__ == "__main__":
    main()
