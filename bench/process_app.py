"""The process benchmark's applications: the seed's credits example as a user writes
it (SQLAlchemy ``text()`` on the handler's connection, ``box``), and the same handler
with its statement on the driver's connection (``ctx.driver``, ``driver_box``): the
statement the raw-SQL floor runs on asyncpg, run on asyncpg."""

from __future__ import annotations

from sqlalchemy import text

from relaybox import Context, Relaybox

box = Relaybox()

GRANT = text("UPDATE bench_balances SET credits = credits + 100 WHERE workspace = :w")


def grant_key(ctx: Context) -> str:
    return f"bench:acct:{ctx.payload['invoice']}:initial-credit-grant"


@box.handler("bench", "invoice.paid", business_key=grant_key, fingerprint="credits=100")
async def grant(ctx: Context) -> None:
    key = grant_key(ctx)
    if await ctx.once(key, fingerprint="credits=100"):
        workspace = ctx.payload["workspace"]
        await ctx.conn.execute(GRANT, {"w": workspace})
        await ctx.outbox.add("email", key + ":confirmation", {"workspace": workspace})


driver_box = Relaybox()


@driver_box.handler("bench", "invoice.paid", business_key=grant_key, fingerprint="credits=100")
async def grant_on_driver(ctx: Context) -> None:
    key = grant_key(ctx)
    if await ctx.once(key, fingerprint="credits=100"):
        workspace = ctx.payload["workspace"]
        await ctx.driver.execute(
            "UPDATE bench_balances SET credits = credits + 100 WHERE workspace = $1", workspace
        )
        await ctx.outbox.add("email", key + ":confirmation", {"workspace": workspace})
