"""``relaybox`` commands of the sending side: ``dispatch`` and ``endpoints`` (the
``messages``, ``api-keys`` and ``event-types`` groups are :mod:`relaybox.cli.messages`'s).

The CLI is the operator's: it may act on any tenant's endpoint or message by id.
Options, times and ``--json`` follow the CLI's grammar (:mod:`relaybox.cli.grammar`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import click
from pydantic import ValidationError

from relaybox import log
from relaybox.app import Relaybox
from relaybox.cli.common import Target, app_options, json_option, run_db, run_role
from relaybox.cli.grammar import CliError, emit_list, type_option
from relaybox.cli.params import FILTER
from relaybox.cli.table import format_time, print_table
from relaybox.config.loading import validation_problems
from relaybox.outbound import deliveries, endpoints
from relaybox.outbound.catalog import InvalidMessage
from relaybox.outbound.endpoints import EndpointPatch, EndpointSpec, InvalidEndpoint
from relaybox.outbound.vault import SecretsLocked, new_key
from relaybox.store.outbox_rows import Endpoint

__all__ = ["COMMANDS"]


def _run(box: Relaybox, work: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``work`` on ``box`` and close it; database trouble exits 3, a refused
    input exits 2 with its message."""

    # Logs go to stderr so that JSON on stdout stays parseable. Looked up at call time
    # (not bound at import): tests that silence logging patch relaybox.log.
    log.configure_logging(box.settings.log_level, json=box.settings.log_json)

    async def run() -> Any:
        try:
            return await work()
        finally:
            await box.close()

    try:
        return run_db(box, run())
    except (InvalidEndpoint, InvalidMessage, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    except SecretsLocked as exc:
        raise CliError(str(exc), code="secrets_unavailable") from None


def _model(cls: type[EndpointPatch], **fields: Any) -> Any:
    try:
        return cls(**fields)
    except ValidationError as exc:
        raise click.UsageError(validation_problems(exc)) from None


def _echo(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def _header(column: str) -> str:
    """A JSON field as a table's header: ``created_at`` → ``created``,
    ``event_type`` → ``type``, ``message_id`` → ``message``, ``last_error`` → ``last
    error`` (the inbox's tables' words)."""
    if column == "event_type":
        return "type"
    if column == "event_types":
        return "types"
    return column.removesuffix("_at").removesuffix("_id").replace("_", " ")


def _table(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str],
    title: str,
    *,
    drop: Sequence[str] = (),
) -> None:
    """``rows`` (JSON records) under ``columns`` (their fields); times as every table
    prints them; ids and times whole; ``drop``: fields left out first when narrow."""

    def cell(column: str, value: Any) -> Any:
        if column.endswith("_at") and isinstance(value, (int, float)):
            return format_time(value)
        if isinstance(value, list):
            return ", ".join(map(str, value))
        return value

    whole = [c for c in columns if c == "id" or c.endswith(("_id", "_at"))]
    print_table(
        [_header(c) for c in columns],
        ([cell(c, row.get(c)) for c in columns] for row in rows),
        title=title,
        whole=[_header(c) for c in whole],
        drop=[_header(c) for c in drop],
    )


def _list(
    rows: Sequence[dict[str, Any]],
    as_json: bool,
    columns: Sequence[str],
    title: str,
    *,
    drop: Sequence[str] = (),
) -> None:
    """``rows`` as a list command prints them: ``{"items": [...]}`` with ``--json``,
    else the table of :func:`_table`."""
    if as_json:
        emit_list(rows)
    else:
        _table(rows, columns, title, drop=drop)


def _types(values: Sequence[str]) -> list[str] | None:
    """``--type`` given once or more, each maybe comma-separated; ``None`` when not."""
    found = [v.strip() for value in values for v in value.split(",") if v.strip()]
    return found or None


async def _endpoint(box: Relaybox, endpoint_id: str) -> Endpoint:
    found = await endpoints.get_endpoint(box, endpoint_id, None)
    if found is None:
        raise CliError(f"no endpoint {endpoint_id}", code="not_found")
    return found


# -- dispatch ----------------------------------------------------------------------------


@click.command()
@app_options
@click.option("--concurrency", type=int, default=None, help="attempts in flight (default 64)")
def dispatch(target: Target, concurrency: int | None) -> None:
    """Deliver the outbox until SIGTERM/SIGINT (finishing the attempts in flight)."""
    box = target.load_logging()

    box.freeze_startup_heap()
    box.widen_young_gc()
    # It waits for migrations, as serve does.
    run_db(box, run_role(box, lambda: box.dispatcher(concurrency=concurrency)), creates=True)


# -- endpoints -----------------------------------------------------------------------------

_ENDPOINT_COLUMNS = ("id", "tenant", "url", "event_types", "status", "disabled_reason")


@click.group("endpoints")
def endpoints_group() -> None:
    """Tenants' webhook endpoints."""


def _endpoint_options(fn: Any) -> Any:
    for option in reversed(
        (
            type_option(
                "an event type it subscribes to (repeat, or comma-separated; wildcards: pet.*)",
                deprecated=("--events",),
                multiple=True,
            ),
            click.option("--description", default=None, help="free text for its owner"),
            click.option(
                "--signature",
                type=click.Choice(["standard", "sha256"]),
                default=None,
                help="standard: Standard Webhooks headers; sha256: one HMAC header",
            ),
            click.option("--timeout", type=float, default=None, help="seconds per attempt"),
            click.option("--max-in-flight", type=int, default=None, help="attempts at once"),
            click.option("--rate-limit", type=float, default=None, help="deliveries per second"),
            click.option("--filter", type=FILTER, default=None, help="payload filter, JSON"),
            click.option("--ordered/--unordered", default=None, help="ordered delivery per key"),
            click.option(
                "--on-dead",
                type=click.Choice(["hold", "skip"]),
                default=None,
                help="ordered: a dead delivery holds its key's later ones, or not",
            ),
        )
    ):
        fn = option(fn)
    return fn


@endpoints_group.command("list")
@app_options
@click.option("--tenant", default=None, help="only this tenant's")
@json_option
def endpoints_list(target: Target, tenant: str | None, as_json: bool) -> None:
    """List endpoints."""
    box = target.load()
    found = _run(box, lambda: endpoints.list_endpoints(box, tenant, limit=1000))
    rows = [{**e.to_json(), "tenant": e.tenant, "status": e.status} for e in found]
    _list(rows, as_json, _ENDPOINT_COLUMNS, "endpoints", drop=("disabled_reason", "event_types"))


@endpoints_group.command("create")
@app_options
@click.option("--tenant", required=True, help="whose endpoint it is")
@click.option("--url", required=True, help="where deliveries go (https)")
@_endpoint_options
@click.option(
    "--secret-type",
    type=click.Choice(["hmac", "ed25519"]),
    default="hmac",
    show_default=True,
    help="how deliveries are signed",
)
def endpoints_create(
    target: Target,
    tenant: str,
    url: str,
    secret_type: str,
    **fields: Any,
) -> None:
    """Create an endpoint; prints it with its secret (shown to its owner)."""
    box = target.load()
    spec = _model(
        EndpointSpec,
        url=url,
        secret_type=secret_type,
        event_types=_types(fields.pop("event_type")),
        **fields,
    )
    created, secret = _run(box, lambda: endpoints.create_endpoint(box, tenant, spec))
    _echo({**created.to_json(), "tenant": created.tenant, "secret": secret})


@endpoints_group.command("show")
@app_options
@click.argument("endpoint_id")
def endpoints_show(target: Target, endpoint_id: str) -> None:
    """An endpoint, its active secrets and its undelivered rows."""
    box = target.load()

    async def read() -> dict[str, Any]:
        found = await _endpoint(box, endpoint_id)
        return {
            **found.to_json(),
            "tenant": found.tenant,
            "secrets": await endpoints.endpoint_secrets(box, endpoint_id, None),
            "undelivered": await deliveries.list_deliveries(
                box, None, endpoint_id=endpoint_id, undelivered=True, limit=20
            ),
        }

    _echo(_run(box, read))


@endpoints_group.command("update")
@app_options
@click.argument("endpoint_id")
@click.option("--url", default=None, help="where deliveries go (https)")
@_endpoint_options
def endpoints_update(
    target: Target,
    endpoint_id: str,
    url: str | None,
    **fields: Any,
) -> None:
    """Change an endpoint's settings."""
    box = target.load()
    patch = _model(EndpointPatch, url=url, event_types=_types(fields.pop("event_type")), **fields)

    async def update() -> Any:
        found = await _endpoint(box, endpoint_id)
        return await endpoints.update_endpoint(box, endpoint_id, found.tenant, patch)

    _echo(_run(box, update).to_json())


def endpoint_action(
    group: click.Group,
    name: str,
    help_text: str,
    act: Callable[[Relaybox, str], Awaitable[dict[str, Any]]],
    say: Callable[[str, dict[str, Any]], str],
) -> None:
    """``<group> <name> ENDPOINT_ID``: ``act`` on the endpoint, its answer printed as
    JSON (``--json``) or as the sentence ``say`` makes of it."""

    @group.command(name, help=help_text)
    @app_options
    @click.argument("endpoint_id")
    @json_option
    def command(
        target: Target,
        endpoint_id: str,
        as_json: bool,
    ) -> None:
        box = target.load()
        done = _run(box, lambda: act(box, endpoint_id))
        click.echo(json.dumps(done) if as_json else say(endpoint_id, done))


def _switch(name: str, help_text: str, action: Callable[[Relaybox, str], Awaitable[bool]]) -> None:
    async def act(box: Relaybox, endpoint_id: str) -> dict[str, Any]:
        await _endpoint(box, endpoint_id)
        changed = await action(box, endpoint_id)
        return {"endpoint": endpoint_id, "action": name, "changed": changed}

    def say(endpoint_id: str, done: dict[str, Any]) -> str:
        return f"{endpoint_id}: {name}d" if done["changed"] else f"{endpoint_id}: unchanged"

    endpoint_action(endpoints_group, name, help_text, act, say)


async def _delete(box: Relaybox, endpoint_id: str) -> bool:
    found = await _endpoint(box, endpoint_id)
    return await endpoints.delete_endpoint(box, endpoint_id, found.tenant)


_switch("delete", "Delete an endpoint and its secrets.", _delete)


@endpoints_group.command("rotate-secret")
@app_options
@click.argument("endpoint_id")
@click.option("--grace", type=float, default=None, help="seconds the old secret keeps signing")
def endpoints_rotate(target: Target, endpoint_id: str, grace: float) -> None:
    """Add a new secret; the old one signs too until the grace period ends."""
    box = target.load()

    async def rotate() -> str | None:
        await _endpoint(box, endpoint_id)
        return await endpoints.rotate_secret(box, endpoint_id, None, grace=grace)

    _echo({"endpoint": endpoint_id, "secret": _run(box, rotate)})


@endpoints_group.command("new-key")
@json_option
def endpoints_new_key(as_json: bool) -> None:
    """Print a fresh key for outbound.secrets_key (endpoint secrets sealed at rest)."""
    key = new_key()
    click.echo(json.dumps({"key": key}) if as_json else key)


@endpoints_group.command("seal-secrets")
@app_options
def endpoints_seal_secrets(target: Target) -> None:
    """Seal every stored endpoint secret with the first key (outbound.secrets_key,
    else the key file beside a SQLite database): after adding a new key in front to
    rotate. `relaybox migrate` seals the ones older versions stored in plaintext."""
    box = target.load()
    _echo(_run(box, lambda: endpoints.seal_secrets(box)))


def accept_json(group: click.Group) -> None:
    """The commands whose output is JSON already take ``--json`` too, so a script can
    pass it to every command."""
    for command in group.commands.values():
        if not any("--json" in getattr(p, "opts", ()) for p in command.params):
            command.params.append(
                click.Option(
                    ["--json"], is_flag=True, expose_value=False, help="JSON output (the default)"
                )
            )


accept_json(endpoints_group)

COMMANDS = [dispatch, endpoints_group]
