"""``relaybox endpoints blocked-keys`` and ``relaybox endpoints release-key``: the
operator's side of ordered delivery per key (:mod:`relaybox.ops.outbound_ordered`). An
endpoint's ``ordered`` and ``on_dead`` are set with ``relaybox endpoints update
--ordered --on-dead hold|skip``. (The inbound side's ordering tools, replay and
reconciliation, are in :mod:`relaybox.cli.ordering`.)"""

from __future__ import annotations

import json

import click

from relaybox.cli.common import Target, action_options, app_options, json_option
from relaybox.cli.grammar import CliError, default_actor
from relaybox.cli.outbound import _list, _run, endpoints_group
from relaybox.ops import outbound_ordered as ordered

__all__ = ["COMMANDS"]

_COLUMNS = ("endpoint_id", "ordering_key", "sequence", "dead", "waiting")


@endpoints_group.command("blocked-keys")
@app_options
@click.argument("endpoint_id", required=False)
@click.option("--tenant", default=None, help="only this tenant's endpoints")
@click.option(
    "--limit", type=click.IntRange(1, 10_000), default=100, show_default=True, help="at most"
)
@json_option
def endpoints_blocked_keys(
    target: Target,
    endpoint_id: str | None,
    tenant: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Ordering keys that dead deliveries hold back (endpoints with on_dead hold)."""
    box = target.load()
    found = _run(
        box,
        lambda: ordered.blocked_keys(box, endpoint_id=endpoint_id, tenant=tenant, limit=limit),
    )
    rows = [b.to_json() for b in found]
    _list(rows, as_json, _COLUMNS, "blocked keys")


@endpoints_group.command("release-key")
@app_options
@click.argument("endpoint_id")
@click.argument("ordering_key")
@action_options("with the action")
def endpoints_release_key(
    target: Target,
    endpoint_id: str,
    ordering_key: str,
    reason: str,
    actor: str | None,
    as_json: bool,
) -> None:
    """Let a key's later deliveries go past its dead ones (which stay dead letters)."""
    box = target.load()
    who = default_actor(actor)
    n = _run(
        box, lambda: ordered.release_key(box, endpoint_id, ordering_key, actor=who, reason=reason)
    )
    if not n:
        raise CliError(
            f"no dead delivery of {endpoint_id} holds {ordering_key!r}", code="not_found"
        )
    if as_json:
        click.echo(json.dumps({"released": n}))
    else:
        click.echo(f"released {ordering_key!r}: {n} dead deliveries no longer hold it")


COMMANDS: list[click.Command] = []
