"""``relaybox messages | api-keys | event-types``: what the sending side published,
the tenant API's keys and the event-type catalog.

The CLI is the operator's: it may act on any tenant's message by id. Options, times
and ``--json`` follow the CLI's grammar (:mod:`relaybox.cli.grammar`).
"""

from __future__ import annotations

import json
from typing import Any

import click

from relaybox.cli.common import Target, app_options, json_option
from relaybox.cli.grammar import CliError, type_option
from relaybox.cli.outbound import _echo, _list, _run, accept_json
from relaybox.outbound import apikeys, catalog, deliveries
from relaybox.outbound.publish import publish
from relaybox.wire import NotJsonNumber, parse_json

__all__ = ["COMMANDS"]


# -- messages ------------------------------------------------------------------------------


@click.group("messages")
def messages_group() -> None:
    """Published messages and their deliveries."""


@messages_group.command("publish")
@app_options
@click.option("--tenant", required=True, help="whose endpoints get it")
@type_option("its event type", required=True)
@click.option("--data", default="{}", help="its data, JSON")
@click.option("--idempotency-key", default=None, help="publishing it again returns the first")
@click.option("--ordering-key", default=None, help="deliver in order with this key's others")
def messages_publish(
    target: Target,
    tenant: str,
    event_type: str,
    data: str,
    idempotency_key: str | None,
    ordering_key: str | None,
) -> None:
    """Publish a message (its own transaction)."""
    box = target.load()
    try:
        payload = parse_json(data)
    except NotJsonNumber as exc:
        raise click.BadParameter(f"--data is not valid JSON: {exc}") from None
    except (ValueError, RecursionError):
        raise click.BadParameter("--data is not valid JSON") from None

    async def send() -> Any:
        async with box.store.transaction() as conn:
            return await publish(
                box,
                conn,
                event_type,
                payload,
                tenant=tenant,
                idempotency_key=idempotency_key,
                ordering_key=ordering_key,
                json_data=True,  # parsed from --data
            )

    message = _run(box, send)
    _echo({**message.to_json(), "created": message.created, "endpoints": message.endpoints})


@messages_group.command("list")
@app_options
@click.option("--tenant", default=None, help="only this tenant's")
@type_option("only this event type", deprecated=("--event-type",))
@click.option("--limit", type=int, default=50, show_default=True, help="at most this many")
@json_option
def messages_list(
    target: Target,
    tenant: str | None,
    event_type: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Messages, newest first."""
    box = target.load()
    found = _run(
        box, lambda: deliveries.list_messages(box, tenant, event_type=event_type, limit=limit)
    )
    rows = [{**m.to_json(), "tenant": m.tenant} for m in found]
    _list(rows, as_json, ("id", "tenant", "event_type", "created_at"), "messages", drop=("tenant",))


@messages_group.command("show")
@app_options
@click.argument("message_id")
def messages_show(target: Target, message_id: str) -> None:
    """A message, its deliveries and every attempt."""
    box = target.load()

    async def read() -> dict[str, Any]:
        message = await deliveries.get_message(box, message_id, None)
        if message is None:
            raise CliError(f"no message {message_id}", code="not_found")
        return {
            **message.to_json(),
            "tenant": message.tenant,
            "deliveries": await deliveries.list_deliveries(box, None, message_id=message_id),
            "attempts": await deliveries.list_attempts(box, message_id, None),
        }

    _echo(_run(box, read))


@messages_group.command("redeliver")
@app_options
@click.argument("message_id")
@click.option("--endpoint", "endpoint_id", default=None, help="only to this endpoint")
@json_option
def messages_redeliver(
    target: Target,
    message_id: str,
    endpoint_id: str | None,
    as_json: bool,
) -> None:
    """Send a message again (same webhook-id) to endpoints whose delivery finished."""
    box = target.load()
    count = _run(
        box, lambda: deliveries.redeliver(box, message_id, tenant=None, endpoint_id=endpoint_id)
    )
    if count == 0:
        raise CliError(
            f"message {message_id} has no finished delivery to send again (no such message,"
            " or still pending)",
            code="nothing_to_redeliver",
        )
    click.echo(json.dumps({"queued": count}) if as_json else f"{count} deliveries queued again")


@messages_group.command("undelivered")
@app_options
@click.option("--tenant", default=None, help="only this tenant's")
@click.option("--endpoint", "endpoint_id", default=None, help="only this endpoint's")
@click.option("--limit", type=int, default=100, show_default=True, help="at most this many")
@json_option
def messages_undelivered(
    target: Target,
    tenant: str | None,
    endpoint_id: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Deliveries not sent yet: pending, dead (with the reason) and held."""
    box = target.load()
    rows = _run(
        box,
        lambda: deliveries.list_deliveries(
            box, tenant, endpoint_id=endpoint_id, undelivered=True, limit=limit
        ),
    )
    columns = ("id", "message_id", "endpoint_id", "channel", "status", "dead_reason")
    _list(
        rows,
        as_json,
        (*columns, "attempts", "last_error"),
        "undelivered",
        drop=("channel", "attempts", "dead_reason", "endpoint_id"),
    )


# -- API keys and the event-type catalog ---------------------------------------------------


@click.group("api-keys")
def api_keys_group() -> None:
    """Tenant keys for /api/v1."""


@api_keys_group.command("create")
@app_options
@click.option("--tenant", required=True, help="the tenant the key acts for")
@click.option("--name", default="", help="a label for the key")
def api_keys_create(target: Target, tenant: str, name: str) -> None:
    """Create a key; it is printed once and stored only as a hash."""
    box = target.load()
    key_id, key = _run(box, lambda: apikeys.create_api_key(box, tenant, name))
    _echo({"id": key_id, "tenant": tenant, "key": key})


@api_keys_group.command("list")
@app_options
@click.option("--tenant", default=None, help="only this tenant's")
@json_option
def api_keys_list(target: Target, tenant: str | None, as_json: bool) -> None:
    """Keys (never the keys themselves)."""
    box = target.load()
    rows = _run(box, lambda: apikeys.list_api_keys(box, tenant))
    _list(rows, as_json, ("id", "tenant", "name", "created_at", "revoked_at"), "API keys")


@api_keys_group.command("revoke")
@app_options
@click.argument("key_id")
@json_option
def api_keys_revoke(target: Target, key_id: str, as_json: bool) -> None:
    """Revoke a key at once."""
    box = target.load()
    if not _run(box, lambda: apikeys.revoke_api_key(box, key_id)):
        raise CliError(f"no active key {key_id}", code="not_found")
    click.echo(json.dumps({"id": key_id, "revoked": True}) if as_json else f"{key_id}: revoked")


@click.group("event-types")
def event_types_group() -> None:
    """The catalog of published event types."""


@event_types_group.command("define")
@app_options
@click.argument("name")
@click.option("--description", default="", help="what it means, for subscribers")
@click.option("--schema", "schema_file", type=click.File("r"), default=None, help="JSON Schema")
@click.option(
    "--subject",
    default=None,
    help="where its messages name their subject (data.customer.id): for relaybox erase",
)
def event_types_define(
    target: Target,
    name: str,
    description: str,
    schema_file: Any,
    subject: str | None,
) -> None:
    """Add or replace an event type; publishing checks data against its schema and
    indexes each message under the subject at its subject path."""
    box = target.load()
    try:
        schema = parse_json(schema_file.read()) if schema_file else None
    except (ValueError, RecursionError) as exc:
        message = f"not a JSON document: {exc}"[:200]
        raise click.BadParameter(message, param_hint="--schema") from None
    defined = _run(
        box,
        lambda: catalog.define_event_type(
            box, name, description=description, schema=schema, subject=subject
        ),
    )
    _echo({**defined.to_json(), "subject": defined.subject})


@event_types_group.command("list")
@app_options
@json_option
def event_types_list(target: Target, as_json: bool) -> None:
    """The catalog."""
    box = target.load()
    rows = [
        {**t.to_json(), "subject": t.subject}
        for t in _run(box, lambda: catalog.list_event_types(box))
    ]
    _list(rows, as_json, ("name", "description", "subject"), "event types")


for _group in (messages_group, api_keys_group, event_types_group):
    accept_json(_group)

COMMANDS = [messages_group, api_keys_group, event_types_group]
