"""The app ``relaybox serve`` runs when given none: the credits example
(examples/credits) in miniature. A Stripe-style ``invoice.paid`` grants 100 credits
to the workspace that the verified account maps to, once per invoice, whatever event
ids name it.

Try it:  relaybox serve   then, in another shell:  relaybox send-test stripe
"""

from __future__ import annotations

from sqlalchemy import text

from relaybox import Context, PermanentError, Relaybox, Secret, sources

DEMO_SECRET = "whsec_relaybox_demo_secret"

DESCRIPTION = (
    "Demo: each Stripe invoice.paid grants 100 credits to workspace_demo, once per invoice "
    "(table demo_balances); other events are only recorded."
)


def make_box() -> Relaybox:
    """A new demo box, with the settings of the environment as they are now (each
    ``relaybox`` command without ``--app`` builds its own)."""
    box = Relaybox()
    box.source(
        "stripe",
        sources.stripe(secrets=[Secret(DEMO_SECRET, account="acct_demo", tenant="workspace_demo")]),
    )
    box.source(
        "demo",
        sources.standard(
            secrets=[Secret("whsec_cmVsYXlib3gtZGVtby1zZWNyZXQ=", tenant="workspace_demo")]
        ),
    )

    @box.handler("stripe", "invoice.paid")
    async def grant_credits(ctx: Context) -> None:
        invoice = ctx.payload.get("data", {}).get("object", {})
        invoice_id = invoice.get("id")
        if not invoice_id:
            raise PermanentError("invoice.paid without data.object.id")
        await ctx.conn.execute(
            text(
                "CREATE TABLE IF NOT EXISTS demo_balances "
                "(workspace TEXT PRIMARY KEY, credits INTEGER NOT NULL)"
            )
        )
        key = f"{ctx.event.source}:{ctx.event.account}:{invoice_id}:initial-credit-grant"
        if await ctx.once(key, fingerprint="credits=100"):
            await ctx.conn.execute(
                text(
                    "INSERT INTO demo_balances (workspace, credits) VALUES (:w, 100) "
                    "ON CONFLICT (workspace) DO UPDATE SET credits = demo_balances.credits + 100"
                ),
                {"w": ctx.tenant},
            )

    @box.handler("*")
    async def accept_everything_else(ctx: Context) -> None:
        """Other demo events are only recorded."""

    return box


box = make_box()
"""The demo box (``--app relaybox.demo:box``)."""
