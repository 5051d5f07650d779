"""A Flask shop (synchronous SQLAlchemy ``Session``) with relaybox, both directions.

Sending: completing an order takes the stock and publishes ``order.completed`` with
the request's own ``Session`` (:meth:`Relaybox.publish_sync`): the order, the stock and
the webhooks commit together, or none of them (an order whose stock ran out leaves no
message behind).
Receiving: Stripe's ``invoice.paid`` grants the workspace 100 credits once per
invoice, in a plain ``def`` handler that writes with the ORM (``ctx.session``) in the
worker's synchronous transaction, taken from the shop's own engine
(``sync_transaction=engine.begin``). Flask serves WSGI, so relaybox's receiver,
worker and dispatcher run beside it as ``relaybox serve``::

    export SHOP_DATABASE_URL=sqlite:///flask_shop.db     # or postgresql://…
    python -m examples.flask_shop.app setup
    flask --app examples.flask_shop.app run --port 5000
    relaybox serve --app examples.flask_shop.app:box --port 8000    # another shell
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from flask import Flask, abort
from sqlalchemy import Engine, String, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from relaybox import PermanentError, Relaybox, Secret, sources
from relaybox.sync import SyncContext

__all__ = ["Shop", "app", "box", "make_shop"]

DEFAULT_DATABASE_URL = "sqlite:///flask_shop.db"


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "flask_orders"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    product: Mapped[str] = mapped_column(String(64))
    quantity: Mapped[int]
    status: Mapped[str] = mapped_column(String(16), default="open")


class Stock(Base):
    __tablename__ = "flask_stock"

    product: Mapped[str] = mapped_column(String(64), primary_key=True)
    available: Mapped[int]


class Credits(Base):
    __tablename__ = "flask_credits"

    workspace: Mapped[str] = mapped_column(String(64), primary_key=True)
    credits: Mapped[int] = mapped_column(default=0)


class OutOfStock(Exception):
    pass


def sync_engine(database_url: str) -> Engine:
    """The shop's engine: psycopg 3 on PostgreSQL, sqlite3 on SQLite."""
    url = make_url(database_url)
    if url.get_backend_name() == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    return create_engine(url)


def grant_key(ctx: SyncContext) -> str:
    return f"stripe:{ctx.event.account}:{ctx.payload['data']['object']['id']}:credits"


def grant_credits(ctx: SyncContext) -> None:
    """``invoice.paid``: +100 credits for the account's workspace, once per invoice."""
    invoice = ctx.payload["data"]["object"]
    if invoice.get("amount_paid", 0) <= 0:
        raise PermanentError("invoice.paid with nothing paid")
    if ctx.tenant is None:
        raise PermanentError("no workspace for this Stripe account")
    if ctx.once():  # the declared key: UNIQUE, in this transaction
        credits = ctx.session.get(Credits, ctx.tenant)
        if credits is None:
            credits = Credits(workspace=ctx.tenant, credits=0)
            ctx.session.add(credits)
        credits.credits += 100  # flushed by relaybox, committed with the event


class Shop:
    """The shop's parts: its engine, the box (on the same database) and the Flask app."""

    def __init__(self, database_url: str) -> None:
        self.engine = sync_engine(database_url)
        # Handlers' transactions come from the shop's own engine and pool.
        self.box = Relaybox(database_url, sync_transaction=self.engine.begin)
        self.box.source(
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
        self.box.handler(
            "stripe", "invoice.paid", business_key=grant_key, fingerprint="credits=100"
        )(grant_credits)
        self.app = self._routes(Flask(__name__))

    def setup(self) -> None:
        """relaybox's migrations, then the shop's tables (from the command line)."""

        async def migrate() -> None:
            try:
                await self.box.migrate()
            finally:
                await self.box.close()

        asyncio.run(migrate())
        self.create_tables()

    def create_tables(self) -> None:
        """The shop's tables (Alembic, usually)."""
        Base.metadata.create_all(self.engine)

    def _routes(self, app: Flask) -> Flask:
        engine, box = self.engine, self.box

        @app.post("/stock/<product>/<int:available>")
        def set_stock(product: str, available: int) -> dict[str, Any]:
            with Session(engine) as session, session.begin():
                session.merge(Stock(product=product, available=available))
            return {"product": product, "available": available}

        @app.post("/orders/<order_id>/<tenant>/<product>/<int:quantity>")
        def create_order(order_id: str, tenant: str, product: str, quantity: int) -> Any:
            with Session(engine) as session, session.begin():
                order = Order(id=order_id, tenant=tenant, product=product, quantity=quantity)
                session.add(order)
            return {"id": order_id, "status": "open"}, 201

        @app.post("/orders/<order_id>/complete")
        def complete_order(order_id: str) -> Any:
            with Session(engine) as session:
                order = session.get(Order, order_id, with_for_update=True)
                if order is None:
                    abort(404)
                order.status = "completed"
                message = box.publish_sync(
                    session,
                    "order.completed",
                    {"orderId": order.id, "product": order.product, "quantity": order.quantity},
                    tenant=order.tenant,
                    idempotency_key=f"{order.id}:completed",
                )
                try:
                    take_stock(session, order)
                except OutOfStock as exc:
                    session.rollback()  # the order, and its message with it
                    return {"error": str(exc)}, 409
                session.commit()
            return {"id": order_id, "status": "completed", "message": message.id}

        @app.get("/credits/<workspace>")
        def credits(workspace: str) -> dict[str, Any]:
            with Session(engine) as session:
                found = session.get(Credits, workspace)
                return {"workspace": workspace, "credits": found.credits if found else 0}

        return app


def take_stock(session: Session, order: Order) -> None:
    """After the message is published, in the same transaction: the order needs its
    stock, or it does not complete."""
    stock = session.get(Stock, order.product, with_for_update=True)
    if stock is None or stock.available < order.quantity:
        raise OutOfStock(f"{order.product}: not enough in stock for {order.id}")
    stock.available -= order.quantity


def make_shop(database_url: str | None = None) -> Shop:
    return Shop(database_url or os.environ.get("SHOP_DATABASE_URL", DEFAULT_DATABASE_URL))


shop = make_shop()
app = shop.app  # flask --app examples.flask_shop.app run
box = shop.box  # relaybox serve --app examples.flask_shop.app:box


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.flask_shop.app")
    parser.add_argument("command", choices=["setup"])
    parser.parse_args(argv)
    shop.setup()
    print("relaybox tables and the shop's tables are ready")


if __name__ == "__main__":
    main()
