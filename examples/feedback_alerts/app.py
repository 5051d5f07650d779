"""The feedback alerts example: a signed "new feedback" webhook creates exactly one
initial alert per feedback, shown on a local page.

The operations (proposed here; the provider's contract is unconfirmed):

    initial alert   {source}:{account}:{project}:{feedback}:initial-alert
                    one per feedback, whatever deliveries (re-deliveries, other event
                    ids, a replay) name it -- ctx.once(), UNIQUE in the database
    escalation      {source}:{account}:{project}:{feedback}:escalation:{level}
                    a later, separate operation with its own key: a second alert
    notification    {operation key}:notify:{destination}
                    optional; an outbox row per destination, sent after COMMIT

The feedback reference, the alert, the inbox row's completion and any outbox rows
commit together. Event names, payload fields and the signature scheme live in
``feedback_alerts.toml`` (a generic HMAC source by default), never in this code.

Run it::

    python -m examples.feedback_alerts.app setup     # relaybox tables + the app's tables
    python -m examples.feedback_alerts.app serve     # page on /, receiver on /webhooks/sinalio

Environment: ``RELAYBOX_DATABASE_URL`` (default ``sqlite:///feedback_alerts.db``),
``FEEDBACK_ALERTS_CONFIG`` (another contract file), ``FEEDBACK_ALERTS_SECRET``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import html
import os
import tomllib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox import Clock, ConfigurationError, Context, PermanentError, Relaybox, sources
from relaybox.config import Settings, load_settings
from relaybox.sources.base import extract

__all__ = [
    "DEFAULT_CONFIG",
    "Contract",
    "alert_key",
    "box",
    "build",
    "build_app",
    "create_tables",
    "list_alerts",
    "setup",
]

DEFAULT_CONFIG = Path(__file__).with_name("feedback_alerts.toml")
DEFAULT_DATABASE_URL = "sqlite:///feedback_alerts.db"

_TABLES = (
    # What the app knows of each feedback: referenced by every delivery naming it.
    """
    CREATE TABLE IF NOT EXISTS feedbacks (
        account     TEXT NOT NULL,
        project     TEXT NOT NULL,
        feedback_id TEXT NOT NULL,
        title       TEXT,
        first_event TEXT NOT NULL,
        last_event  TEXT NOT NULL,
        updated_at  DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (account, project, feedback_id)
    )
    """,
    # One row per alert operation; the business key is the primary key, so the
    # database refuses a second initial alert even outside ctx.once().
    """
    CREATE TABLE IF NOT EXISTS feedback_alerts (
        business_key TEXT PRIMARY KEY,
        kind         TEXT NOT NULL CHECK (kind IN ('initial', 'escalation')),
        account      TEXT NOT NULL,
        project      TEXT NOT NULL,
        feedback_id  TEXT NOT NULL,
        title        TEXT,
        event_id     TEXT NOT NULL,
        created_at   DOUBLE PRECISION NOT NULL
    )
    """,
)


@dataclass(frozen=True)
class Contract:
    """The provider's webhook contract as configured (see ``feedback_alerts.toml``)."""

    source: dict[str, Any]
    new_feedback: tuple[str, ...]
    escalation: tuple[str, ...]
    fields: dict[str, str]
    notify_channel: str
    destinations: tuple[str, ...]

    @property
    def source_name(self) -> str:
        return str(self.source.get("name", "sinalio"))

    @classmethod
    def load(cls, path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Contract:
        env = os.environ if env is None else env
        path = Path(path or env.get("FEEDBACK_ALERTS_CONFIG") or DEFAULT_CONFIG)
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigurationError(f"feedback alerts contract {path}: {exc}") from None
        return cls.from_dict(data, env)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Contract:
        env = os.environ if env is None else env
        try:
            source = dict(data["source"])
            events, fields = data["events"], dict(data["fields"])
            new_feedback = tuple(events["new_feedback"])
            escalation = tuple(events.get("escalation", ()))
        except (KeyError, TypeError) as exc:
            raise ConfigurationError(f"feedback alerts contract lacks {exc}") from None
        for needed in ("project", "feedback"):
            if not isinstance(fields.get(needed), str):
                raise ConfigurationError(f"feedback alerts contract: fields.{needed} is required")
        if env.get("FEEDBACK_ALERTS_SECRET"):
            source.pop("secret", None)
            source["secrets"] = [env["FEEDBACK_ALERTS_SECRET"]]
        notify = data.get("notify", {})
        return cls(
            source=source,
            new_feedback=new_feedback,
            escalation=escalation,
            fields=fields,
            notify_channel=str(notify.get("channel", "webhook")),
            destinations=tuple(notify.get("destinations", ())),
        )


def alert_key(source: str, account: str, project: str, feedback: str, operation: str) -> str:
    return f"{source}:{account}:{project}:{feedback}:{operation}"


# -- tables -------------------------------------------------------------------------


async def create_tables(conn: AsyncConnection) -> None:
    """The app's tables (idempotent), created by :func:`setup`, not by handlers."""
    for statement in _TABLES:
        await conn.execute(text(statement))


async def setup(box: Relaybox) -> list[str]:
    applied = await box.migrate()
    async with box.store.transaction() as conn:
        if box.store.backend == "postgres":  # serialise concurrent set-ups
            await conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('feedback_setup'))"))
        await create_tables(conn)
    return applied


async def list_alerts(box: Relaybox) -> list[dict[str, Any]]:
    async with box.store.transaction() as conn:
        rows = await conn.execute(
            text(
                "SELECT business_key, kind, project, feedback_id, title, created_at"
                " FROM feedback_alerts ORDER BY created_at DESC, business_key"
            )
        )
        return [dict(r._mapping) for r in rows]


# -- handlers -----------------------------------------------------------------------


class Alerts:
    """The handlers, bound to one contract."""

    def __init__(self, contract: Contract) -> None:
        self.contract = contract

    def _field(self, ctx: Context, name: str, *, required: bool) -> str | None:
        path = self.contract.fields.get(name)
        value = extract(path, ctx.event.headers, ctx.payload) if path else None
        if required and not value:
            raise PermanentError(f"delivery has no {name} at {path!r}")
        return value

    async def new_feedback(self, ctx: Context) -> None:
        """One initial alert per feedback, however many deliveries name it."""
        await self._alert(ctx, "initial", "initial-alert")

    async def escalation(self, ctx: Context) -> None:
        """An escalation is its own operation (one per level): a second, distinct alert."""
        level = self._field(ctx, "escalation", required=False) or "1"
        await self._alert(ctx, "escalation", f"escalation:{level}")

    async def _alert(self, ctx: Context, kind: str, operation: str) -> None:
        event = ctx.event
        project = self._field(ctx, "project", required=True)
        feedback = self._field(ctx, "feedback", required=True)
        title = self._field(ctx, "title", required=False)
        assert project is not None and feedback is not None
        now = ctx.box.clock.now()
        await self._reference(ctx, project, feedback, title, now)
        key = alert_key(event.source, event.account, project, feedback, operation)
        if not await ctx.once(key, fingerprint=kind):
            return  # already alerted: a re-delivery, another event id, or a replay
        await ctx.conn.execute(
            text(
                "INSERT INTO feedback_alerts (business_key, kind, account, project,"
                " feedback_id, title, event_id, created_at)"
                " VALUES (:key, :kind, :account, :project, :feedback, :title, :event, :now)"
            ),
            {
                "key": key,
                "kind": kind,
                "account": event.account,
                "project": project,
                "feedback": feedback,
                "title": title,
                "event": event.event_id,
                "now": now,
            },
        )
        for destination in self.contract.destinations:
            # The destination is part of the key: one notification per destination,
            # and adding a destination later does not resend to the others.
            await ctx.outbox.add(
                self.contract.notify_channel,
                f"{key}:notify:{destination}",
                {
                    "destination": destination,
                    "alert": kind,
                    "project": project,
                    "feedback": feedback,
                    "title": title,
                },
            )

    async def _reference(
        self, ctx: Context, project: str, feedback: str, title: str | None, now: float
    ) -> None:
        await ctx.conn.execute(
            text(
                "INSERT INTO feedbacks (account, project, feedback_id, title, first_event,"
                " last_event, updated_at)"
                " VALUES (:account, :project, :feedback, :title, :event, :event, :now)"
                " ON CONFLICT (account, project, feedback_id) DO UPDATE"
                " SET last_event = excluded.last_event, updated_at = excluded.updated_at,"
                " title = COALESCE(excluded.title, feedbacks.title)"
            ),
            {
                "account": ctx.event.account,
                "project": project,
                "feedback": feedback,
                "title": title,
                "event": ctx.event.event_id,
                "now": now,
            },
        )


# -- wiring -------------------------------------------------------------------------


def configure(box: Relaybox, contract: Contract) -> Relaybox:
    """Add the source and handlers of ``contract`` to ``box``."""
    options = dict(contract.source)
    name = str(options.pop("name", "sinalio"))
    box.source(name, sources.from_config(options))
    alerts = Alerts(contract)
    for event_type in contract.new_feedback:
        box.handler(name, event_type)(alerts.new_feedback)
    for event_type in contract.escalation:
        box.handler(name, event_type)(alerts.escalation)
    return box


def build(
    database_url: str | None = None,
    *,
    contract: Contract | None = None,
    settings: Settings | None = None,
    clock: Clock | None = None,
) -> Relaybox:
    if settings is None:
        settings = load_settings()
        if not os.environ.get("RELAYBOX_DATABASE_URL"):
            settings = settings.model_copy(update={"database_url": DEFAULT_DATABASE_URL})
    box = Relaybox(database_url, settings=settings, clock=clock)
    return configure(box, contract or Contract.load())


def build_app(box: Relaybox, *, roles: Sequence[str] = ("worker",)) -> Any:
    """The page (``/``) and the receiver (``/webhooks/{source}``); ``roles`` run in
    the background while the app is up (none in tests that drive the worker)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse
    from starlette.routing import Mount, Route

    async def page(_: Request) -> HTMLResponse:
        rows = "".join(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>".format(
                *(html.escape(str(a[k] or "")) for k in ("kind", "project", "feedback_id", "title"))
            )
            for a in await list_alerts(box)
        )
        return HTMLResponse(
            "<!doctype html><html><head><meta charset='utf-8'><title>Feedback alerts</title>"
            "</head><body><h1>Feedback alerts</h1><table><thead><tr><th>alert</th>"
            "<th>project</th><th>feedback</th><th>title</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></body></html>"
        )

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        await box.start(tuple(roles))
        try:
            yield
        finally:
            await box.close()

    return Starlette(
        routes=[Route("/", page), Mount("/webhooks", app=box.receiver)], lifespan=lifespan
    )


box = build()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.feedback_alerts.app")
    parser.add_argument("command", choices=["setup", "serve"])
    parser.add_argument("--database-url", default=None, help="default: RELAYBOX_DATABASE_URL")
    parser.add_argument("--config", default=None, help="the contract file (TOML)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    target = box
    if args.database_url or args.config:
        target = build(args.database_url, contract=Contract.load(args.config))
    if args.command == "setup":

        async def run() -> list[str]:
            try:
                return await setup(target)
            finally:
                await target.close()

        applied = asyncio.run(run())
        print("relaybox migrations applied: " + (", ".join(applied) or "none (up to date)"))
        print("feedback tables ready: feedbacks, feedback_alerts")
        return
    import uvicorn

    names = ", ".join(f"/webhooks/{name}" for name in target.sources)
    print(f"alerts on http://{args.host}:{args.port}/   receiver on {names}")
    uvicorn.run(build_app(target), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
