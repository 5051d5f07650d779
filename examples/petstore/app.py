"""A Modern PetstoreAPI, sending side: the store's own code changes pets,
orders and payments and publishes ``pet.adopted``, ``pet.status_changed``,
``order.created``, ``order.completed``, ``payment.succeeded`` and ``payment.failed``
*in the same transaction*. The store's API clients (tenants) register endpoints over
``POST /api/v1/webhooks`` and receive signed webhooks.

    python -m examples.petstore.app setup              # tables, event types (+ schemas)
    python -m examples.petstore.app api-key shop-1     # a key for client "shop-1"
    relaybox serve --app examples.petstore.app:box --roles api,dispatcher
    python -m examples.petstore.app adopt shop-1 pet-1 user-456

Environment: ``RELAYBOX_DATABASE_URL`` (default ``sqlite:///petstore.db``);
``PETSTORE_DEV=1`` lets endpoints be plain-HTTP receivers on this machine (never in
production: HTTPS and the SSRF guard are the defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox import Clock, PermanentError, Relaybox
from relaybox.config import load_settings
from relaybox.outbound import configure, create_api_key, define_event_type

__all__ = [
    "EVENT_TYPES",
    "adopt_pet",
    "box",
    "build",
    "complete_order",
    "create_order",
    "record_payment",
    "setup",
]

DEFAULT_DATABASE_URL = "sqlite:///petstore.db"

_ID = {"type": "string", "minLength": 1}
EVENT_TYPES: dict[str, tuple[str, dict[str, Any]]] = {
    "pet.adopted": (
        "A pet was adopted",
        {
            "type": "object",
            "required": ["petId", "userId", "adoptionDate"],
            "properties": {"petId": _ID, "userId": _ID, "orderId": _ID, "adoptionDate": _ID},
        },
    ),
    "pet.status_changed": (
        "A pet's status changed",
        {
            "type": "object",
            "required": ["petId", "from", "to"],
            "properties": {"petId": _ID, "from": {"type": "string"}, "to": {"type": "string"}},
        },
    ),
    "order.created": (
        "An order was placed",
        {
            "type": "object",
            "required": ["orderId", "petId", "amount"],
            "properties": {"orderId": _ID, "petId": _ID, "amount": {"type": "integer"}},
        },
    ),
    "order.completed": (
        "An order was completed",
        {"type": "object", "required": ["orderId"], "properties": {"orderId": _ID}},
    ),
    "payment.succeeded": (
        "A payment succeeded",
        {
            "type": "object",
            "required": ["orderId", "amount"],
            "properties": {"orderId": _ID, "amount": {"type": "integer"}},
        },
    ),
    "payment.failed": (
        "A payment failed",
        {
            "type": "object",
            "required": ["orderId", "reason"],
            "properties": {"orderId": _ID, "reason": {"type": "string"}},
        },
    ),
}

_TABLES = (
    """
    CREATE TABLE IF NOT EXISTS pets (
        id TEXT PRIMARY KEY, client TEXT NOT NULL, name TEXT NOT NULL, status TEXT NOT NULL
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS orders (
        id TEXT PRIMARY KEY, client TEXT NOT NULL, pet_id TEXT NOT NULL,
        amount INTEGER NOT NULL, status TEXT NOT NULL
    )
    """,
)


async def setup(target: Relaybox) -> None:
    """relaybox's tables, the store's tables, the event-type catalog; idempotent."""
    await target.migrate()
    async with target.store.transaction() as conn:
        for statement in _TABLES:
            await conn.execute(text(statement))
    for name, (description, schema) in EVENT_TYPES.items():
        await define_event_type(target, name, description=description, schema=schema)


# -- the store's own operations: each change and its events commit together -------------


async def _set_pet_status(
    target: Relaybox, conn: AsyncConnection, client: str, pet_id: str, status: str
) -> None:
    row = (
        await conn.execute(
            text("SELECT status FROM pets WHERE id = :id AND client = :client"),
            {"id": pet_id, "client": client},
        )
    ).first()
    if row is None:
        await conn.execute(
            text("INSERT INTO pets (id, client, name, status) VALUES (:id, :c, :id, :s)"),
            {"id": pet_id, "c": client, "s": status},
        )
        previous = "new"
    else:
        previous = row[0]
        if previous == status:
            return
        await conn.execute(
            text("UPDATE pets SET status = :s WHERE id = :id"), {"s": status, "id": pet_id}
        )
    data = {"petId": pet_id, "from": previous, "to": status}
    await target.publish(conn, "pet.status_changed", data, tenant=client)


async def adopt_pet(
    target: Relaybox, client: str, pet_id: str, user_id: str, *, order_id: str | None = None
) -> None:
    """Mark the pet adopted and publish ``pet.status_changed`` + ``pet.adopted``. A pet
    adopted twice raises :class:`PermanentError` and publishes nothing (rollback)."""
    async with target.store.transaction() as conn:
        row = (
            await conn.execute(text("SELECT status FROM pets WHERE id = :id"), {"id": pet_id})
        ).first()
        if row is not None and row[0] == "adopted":
            raise PermanentError(f"pet {pet_id} is already adopted")
        await _set_pet_status(target, conn, client, pet_id, "adopted")
        data = {
            "petId": pet_id,
            "userId": user_id,
            "adoptionDate": _today(target),
            **({"orderId": order_id} if order_id else {}),
        }
        await target.publish(
            conn, "pet.adopted", data, tenant=client, idempotency_key=f"pet.adopted:{pet_id}"
        )


async def create_order(
    target: Relaybox, client: str, order_id: str, pet_id: str, amount: int
) -> None:
    async with target.store.transaction() as conn:
        await conn.execute(
            text(
                "INSERT INTO orders (id, client, pet_id, amount, status)"
                " VALUES (:id, :c, :pet, :amount, 'created')"
            ),
            {"id": order_id, "c": client, "pet": pet_id, "amount": amount},
        )
        await _set_pet_status(target, conn, client, pet_id, "pending")
        data = {"orderId": order_id, "petId": pet_id, "amount": amount}
        await target.publish(conn, "order.created", data, tenant=client)


async def record_payment(
    target: Relaybox, client: str, order_id: str, *, ok: bool, reason: str = ""
) -> None:
    async with target.store.transaction() as conn:
        row = (
            await conn.execute(
                text("SELECT amount FROM orders WHERE id = :id AND client = :c"),
                {"id": order_id, "c": client},
            )
        ).first()
        if row is None:
            raise PermanentError(f"no order {order_id}")
        status = "paid" if ok else "payment_failed"
        await conn.execute(
            text("UPDATE orders SET status = :s WHERE id = :id"), {"s": status, "id": order_id}
        )
        if ok:
            data: dict[str, Any] = {"orderId": order_id, "amount": row[0]}
            await target.publish(conn, "payment.succeeded", data, tenant=client)
        else:
            data = {"orderId": order_id, "reason": reason or "declined"}
            await target.publish(conn, "payment.failed", data, tenant=client)


async def complete_order(target: Relaybox, client: str, order_id: str, user_id: str) -> None:
    """The order is complete: its pet is adopted, in the same transaction."""
    async with target.store.transaction() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT pet_id FROM orders WHERE id = :id AND client = :c AND status = 'paid'"
                ),
                {"id": order_id, "c": client},
            )
        ).first()
        if row is None:
            raise PermanentError(f"order {order_id} is not paid")
        await conn.execute(
            text("UPDATE orders SET status = 'completed' WHERE id = :id"), {"id": order_id}
        )
        await target.publish(conn, "order.completed", {"orderId": order_id}, tenant=client)
        await _set_pet_status(target, conn, client, row[0], "adopted")
        data = {
            "petId": row[0],
            "userId": user_id,
            "orderId": order_id,
            "adoptionDate": _today(target),
        }
        await target.publish(conn, "pet.adopted", data, tenant=client)


def _today(target: Relaybox) -> str:
    return datetime.fromtimestamp(target.clock.now(), UTC).date().isoformat()


# -- wiring ---------------------------------------------------------------------------


def build(database_url: str | None = None, *, clock: Clock | None = None) -> Relaybox:
    settings = load_settings()
    if database_url or not os.environ.get("RELAYBOX_DATABASE_URL"):
        settings = settings.model_copy(
            update={"database_url": database_url or DEFAULT_DATABASE_URL}
        )
    target = Relaybox(settings=settings, clock=clock)
    # A 5 s timeout: clients answer webhooks at once and process them later.
    options: dict[str, Any] = {"timeout": 5.0}
    if os.environ.get("PETSTORE_DEV") == "1":
        options |= {"allow_insecure_loopback": True, "allow_networks": ["127.0.0.0/8", "::1/128"]}
    configure(target, **options)
    return target


box = build()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.petstore.app")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("setup")
    key = commands.add_parser("api-key")
    key.add_argument("client")
    adopt = commands.add_parser("adopt")
    adopt.add_argument("client")
    adopt.add_argument("pet")
    adopt.add_argument("user")
    order = commands.add_parser("order", help="create, pay and complete an order")
    order.add_argument("client")
    order.add_argument("order")
    order.add_argument("pet")
    order.add_argument("user")
    order.add_argument("--amount", type=int, default=2500)
    order.add_argument("--decline", action="store_true", help="the payment fails")
    args = parser.parse_args(argv)

    async def run() -> None:
        try:
            if args.command == "setup":
                await setup(box)
                print("petstore ready: tables and event types", ", ".join(EVENT_TYPES))
            elif args.command == "api-key":
                _, secret = await create_api_key(box, args.client, "petstore example")
                print(secret)
            elif args.command == "adopt":
                await adopt_pet(box, args.client, args.pet, args.user)
            else:
                await create_order(box, args.client, args.order, args.pet, args.amount)
                await record_payment(box, args.client, args.order, ok=not args.decline)
                if not args.decline:
                    await complete_order(box, args.client, args.order, args.user)
        finally:
            await box.close()

    asyncio.run(run())


if __name__ == "__main__":
    main()
