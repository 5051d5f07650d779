"""A FastAPI shop that embeds relaybox, both directions, on PostgreSQL.

Receiving: Stripe's ``invoice.paid`` grants the workspace 100 credits, once per
invoice, written with the ORM (``ctx.session``) in the worker's transaction.
Sending: completing an order publishes ``order.completed`` with the order's own
``AsyncSession``, so the order and its webhooks commit together or not at all. The
event catalog is in the OpenAPI document's ``webhooks`` (``/docs``).

    export SHOP_DATABASE_URL=postgresql://shop@localhost/shop
    uvicorn examples.fastapi_shop.app:app --port 8000
    relaybox send-test stripe --app examples.fastapi_shop.app:box --url http://127.0.0.1:8000
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy import String
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from relaybox import Context, PermanentError, Relaybox, Secret, document_webhooks, get_box, sources

__all__ = ["app", "box"]


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "shop_orders"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    total_cents: Mapped[int]
    status: Mapped[str] = mapped_column(String(16), default="open")


class Credits(Base):
    __tablename__ = "shop_credits"

    workspace: Mapped[str] = mapped_column(String(64), primary_key=True)
    credits: Mapped[int] = mapped_column(default=0)


box = Relaybox(os.environ.get("SHOP_DATABASE_URL", "postgresql://shop@localhost/shop"))
box.source(
    "stripe",
    sources.stripe(
        secrets=[
            Secret(
                os.environ.get("STRIPE_WEBHOOK_SECRET", "whsec_shop_development"),
                account="acct_shop",
                tenant="workspace_1",
            )
        ]
    ),
)


def grant_key(ctx: Context) -> str:
    return f"stripe:{ctx.event.account}:{ctx.payload['data']['object']['id']}:credits"


@box.handler("stripe", "invoice.paid", business_key=grant_key, fingerprint="credits=100")
async def grant_credits(ctx: Context) -> None:
    invoice = ctx.payload["data"]["object"]
    if invoice.get("amount_paid", 0) <= 0:
        raise PermanentError("invoice.paid with nothing paid")
    if ctx.tenant is None:
        raise PermanentError("no workspace for this Stripe account")
    if await ctx.once():
        credits = await ctx.session.get(Credits, ctx.tenant)
        if credits is None:
            credits = Credits(workspace=ctx.tenant, credits=0)
            ctx.session.add(credits)
        credits.credits += 100  # flushed by relaybox, committed with the event


ORDER_COMPLETED = {
    "type": "object",
    "required": ["orderId", "totalCents"],
    "properties": {"orderId": {"type": "string"}, "totalCents": {"type": "integer"}},
}


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[Any]:
    async with box.store.engine.begin() as conn:  # the shop's tables (Alembic, usually)
        await conn.run_sync(Base.metadata.create_all)
    async with box.lifespan(app) as state:  # relaybox: migrations, worker, dispatcher
        await box.define_event_type(
            "order.completed", description="An order was paid and completed", schema=ORDER_COMPLETED
        )
        yield state


app = FastAPI(title="Shop", lifespan=lifespan)
app.mount("/webhooks", box.receiver)
document_webhooks(app, box)

BoxDep = Annotated[Relaybox, Depends(get_box)]


async def get_session(box: BoxDep) -> AsyncIterator[AsyncSession]:
    async with AsyncSession(box.store.engine, expire_on_commit=False) as session:
        yield session


SessionDep = Annotated[AsyncSession, Depends(get_session)]


class NewOrder(BaseModel):
    id: str
    tenant: str
    total_cents: int


@app.post("/orders", status_code=201)
async def create_order(order: NewOrder, session: SessionDep) -> dict[str, Any]:
    async with session.begin():
        session.add(Order(id=order.id, tenant=order.tenant, total_cents=order.total_cents))
    return {"id": order.id, "status": "open"}


@app.post("/orders/{order_id}/complete")
async def complete_order(order_id: str, session: SessionDep, box: BoxDep) -> dict[str, Any]:
    async with session.begin():  # the order and its webhooks: one transaction
        order = await session.get(Order, order_id, with_for_update=True)
        if order is None:
            raise HTTPException(404, "no such order")
        order.status = "completed"
        message = await box.publish(
            session,
            "order.completed",
            {"orderId": order.id, "totalCents": order.total_cents},
            tenant=order.tenant,
            idempotency_key=f"{order.id}:completed",
        )
    return {"id": order_id, "status": "completed", "message": message.id}


@app.get("/credits/{workspace}")
async def credits(workspace: str, session: SessionDep) -> dict[str, Any]:
    found = await session.get(Credits, workspace)
    return {"workspace": workspace, "credits": found.credits if found else 0}
