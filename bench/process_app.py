"""The process benchmark's application: the seed's credits example as a user writes
it (SQLAlchemy ``text()`` on the handler's connection)."""

from __future__ import annotations

from sqlalchemy import text

from relaybox import Context, Relaybox

box = Relaybox()

GRANT = text("UPDATE bench_balances SET credits = credits + 100 WHERE workspace = :w")


@box.handler("bench", "invoice.paid")
async def grant(ctx: Context) -> None:
    invoice = ctx.payload["invoice"]
    workspace = ctx.payload["workspace"]
    key = f"bench:acct:{invoice}:initial-credit-grant"
    if await ctx.once(key, fingerprint="credits=100"):
        await ctx.conn.execute(GRANT, {"w": workspace})
        await ctx.outbox.add("email", key + ":confirmation", {"workspace": workspace})
