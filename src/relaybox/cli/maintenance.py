"""``relaybox stats | purge | maintenance | erase | erasures``: the queues' numbers
now, retention's purge of old payloads (once or on a schedule), erasing one subject
(data-protection requests) and the record of erasures."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import click

from relaybox.cli.common import Target, app_options
from relaybox.cli.grammar import actor_option, default_actor, reason_option
from relaybox.cli.ops import _act, _console, _emit, _iso, _json_option, _run, load_box
from relaybox.timespec import parse_duration

__all__ = ["COMMANDS"]


# -- stats ----------------------------------------------------------------------


@click.command()
@app_options
@_json_option
def stats(target: Target, as_json: bool) -> None:
    """Queue numbers: the same snapshot /metrics exports and the dashboard shows."""
    from relaybox.ops import inbound as ops

    box = load_box(target)
    s = _run(box, lambda: ops.stats(box), as_json=as_json)

    def human() -> None:
        from rich.table import Table

        t = Table("", "", title="relaybox", show_header=False)
        t.add_row("pending", str(s.pending))
        t.add_row("oldest pending", ops.age_text(s.oldest_pending_age_seconds))
        t.add_row("retrying", str(s.retrying))
        t.add_row("done", str(s.done))
        t.add_row("ignored", str(s.ignored))
        t.add_row("dead", str(s.dead))
        for reason, n in s.dead_by_reason.items():
            t.add_row(f"  {reason}", str(n))
        t.add_row("discarded", str(s.discarded))
        t.add_row("quarantined", str(s.quarantined))
        t.add_row("outbox pending", str(s.outbox.pending))
        t.add_row("outbox dead", str(s.outbox.dead))
        _console().print(t)

    _emit(s, as_json, human)


# -- purge ----------------------------------------------------------------------


@click.command()
@app_options
@click.option(
    "--older-than",
    help="finished longer ago than this, inbox and outbox alike, whatever the ages of "
    "tenants and sources (default: each row at its own age, from the settings)",
)
@click.option("--batch", type=int, help="rows per transaction (default: the setting)")
@click.option("--dry-run", is_flag=True, help="count what would be purged, change nothing")
@_json_option
def purge(
    target: Target,
    older_than: str | None,
    batch: int | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Drop payloads of events and deliveries that finished long ago (keys, outcome and
    business keys stay; pending, dead and quarantined events, pending and held
    deliveries keep theirs)."""
    from relaybox import retention

    age = None if older_than is None else parse_duration(older_than)
    if batch is not None and batch < 1:
        raise click.UsageError("--batch must be positive")
    box = load_box(target)

    async def go() -> retention.PurgeResult:
        if dry_run or as_json:
            return await retention.purge(box, older_than=age, batch=batch, dry_run=dry_run)
        counted = await retention.count_candidates(box, older_than=age)
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        with Progress(
            TextColumn("purging payloads"),
            BarColumn(),
            MofNCompleteColumn(),
            console=_err_console(),
            transient=False,
        ) as bar:
            task = bar.add_task("purge", total=sum(counted.values()))
            return await retention.purge(
                box, older_than=age, batch=batch, progress=lambda n: bar.advance(task, n)
            )

    result = _run(box, go, as_json=as_json)
    verb = "would purge" if dry_run else "purged"
    _emit(
        result.as_dict(),
        as_json,
        lambda: click.echo(
            f"{verb} {result.inbox} event payload(s) and {result.quarantine} quarantine "
            f"payload(s) finished before {_iso(result.cutoff)}; {result.outbox} delivery "
            f"payload(s) finished and {result.messages} message body(ies) published before "
            f"{_iso(result.outbox_cutoff)}"
            + (f"; forgot {result.keys} key(s) past their keys window" if result.keys else "")
        ),
    )


def _err_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


# -- maintenance ----------------------------------------------------------------


@click.command()
@app_options
@click.option("--once", is_flag=True, help="one pass, then exit")
@_json_option
def maintenance(target: Target, once: bool, as_json: bool) -> None:
    """Run the scheduled maintenance (retention purge, and the silence check of the
    sources and endpoints [silence] watches) until SIGTERM; with several processes on
    one PostgreSQL, one of them purges at a time (advisory lock)."""
    from relaybox.retention import Maintenance
    from relaybox.silence import SilenceWatch

    box = load_box(target)
    runner = Maintenance(box)
    watch = SilenceWatch(box)
    if once:

        async def both() -> tuple[Any, Any]:
            result = await runner.run_once()
            found = await watch.run_once() if watch.watching else None
            return result, found

        result, found = _run(box, both, as_json=as_json)
        data = {
            "ran": result is not None,
            **(result.as_dict() if result else {}),
            "silence": found.as_dict() if found is not None else None,
        }

        def human() -> None:
            click.echo(
                "another process holds the maintenance lock: skipped"
                if result is None
                else f"purged {result.inbox} event, {result.quarantine} quarantine, "
                f"{result.outbox} delivery payload(s) and {result.messages} message body(ies)"
            )
            if found is not None:
                for kind in ("source", "endpoint"):
                    for name in found.silent[kind]:
                        click.echo(f"{kind} {name} went silent")
                    for name in found.resumed[kind]:
                        click.echo(f"{kind} {name} resumed")

        _emit(data, as_json, human)
        return

    async def loop() -> None:
        running = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            running.add_signal_handler(sig, _both_stop(runner, watch))
        await asyncio.gather(runner.run(), watch.run())

    _run(box, loop, as_json=as_json)


def _both_stop(runner: Any, watch: Any) -> Any:
    def stop() -> None:
        runner.stop()
        watch.stop()

    return stop


# -- erase ----------------------------------------------------------------------


@click.command()
@app_options
@click.option(
    "--subject", help="the subject's id, as a source's subject path or a publish named it"
)
@click.option(
    "--tenant", help="a tenant: the events received for it and every message published to it"
)
@reason_option("with the erasure (the request's reference)")
@actor_option
@click.option("--batch", type=int, help="rows per transaction (default: erasure.batch)")
@_json_option
def erase(
    target: Target,
    subject: str | None,
    tenant: str | None,
    reason: str,
    actor: str | None,
    batch: int | None,
    as_json: bool,
) -> None:
    """Erase every payload, header and response excerpt relaybox holds of a subject
    (or a tenant), here and now, in batches; keys, fingerprints, statuses and outcomes
    stay. Rows still pending are left for the maintenance job, which empties them once
    they finish (the erasure's status is then ``waiting``, see ``relaybox erasures``)."""
    from relaybox import erasure as erasing
    from relaybox.store.erasure import Erasure

    if (subject is None) == (tenant is None):
        raise click.UsageError("give --subject or --tenant (one of them)")
    if batch is not None and batch < 1:
        raise click.UsageError("--batch must be positive")
    who = default_actor(actor)
    box = load_box(target)

    async def go() -> Erasure:
        return await erasing.erase(
            box, subject=subject, tenant=tenant, actor=who, reason=reason, batch=batch
        )

    done = _run(box, go, as_json=as_json)

    def human() -> None:
        rows = done.rows
        click.echo(
            f"erasure {done.id}: emptied {rows['inbox']} event(s), {rows['quarantine']} "
            f"quarantine entry(ies), {rows['outbox']} delivery(ies), {rows['attempts']} "
            f"delivery attempt(s), {rows['messages']} message(s), "
            f"{rows['inbox_attempts']} handler attempt error(s), "
            f"{rows['projections']} projection state(s)"
        )
        if done.finished_at is None:
            click.echo(
                f"{done.waiting} row(s) still pending: emptied by the maintenance job once "
                f"they finish (relaybox erasures {done.id})"
            )

    _emit(done.as_dict(), as_json, human)


@click.command()
@app_options
@click.argument("erasure_id", type=int, required=False)
@_json_option
def erasures(
    target: Target,
    erasure_id: int | None,
    as_json: bool,
) -> None:
    """The latest erasures (or one): who asked, when, what, rows emptied by kind."""
    from relaybox.errors import NotFound
    from relaybox.store.erasure import Erasure

    box = load_box(target)

    async def go() -> list[Erasure]:
        if erasure_id is None:
            return await box.store.erasure.latest()
        one = await box.store.erasure.get(erasure_id)
        if one is None:
            raise NotFound(f"no erasure {erasure_id}")
        return [one]

    found = _run(box, go, as_json=as_json)

    def human() -> None:
        from rich.table import Table

        t = Table("id", "status", "scope", "actor", "created", "rows", "waiting", "reason")
        for e in found:
            d = e.as_dict()
            t.add_row(
                str(e.id),
                d["status"],
                e.tenant if e.scope == "tenant" else f"subject {d['subject_digest'][:12]}…",
                e.actor,
                _iso(e.created_at),
                ", ".join(f"{k} {v}" for k, v in e.rows.items() if v) or "none",
                str(e.waiting),
                e.reason,
            )
        _console().print(t)

    _emit(
        {"items": [e.as_dict() for e in found]} if erasure_id is None else found[0].as_dict(),
        as_json,
        human,
    )


# -- retention ------------------------------------------------------------------


@click.group("retention")
def retention_group() -> None:
    """Payload ages and keys windows per tenant (and per source, from the
    configuration)."""


def _ages_line(view: Any) -> str:
    from relaybox.ops.inbound import age_text

    inbound = (
        "its events' source's or the global age"
        if view.payload_max_age is None
        else age_text(view.payload_max_age)
    )
    keys = "for good" if view.keys_max_age is None else age_text(view.keys_max_age)
    return (
        f"{view.tenant}: events {inbound} ({view.payload_origin}), deliveries and messages "
        f"{age_text(view.outbox_payload_max_age)} ({view.outbox_origin}), idempotency keys "
        f"{keys} ({view.keys_origin})"
    )


@retention_group.command("show")
@app_options
@click.argument("tenant", required=False)
@_json_option
def retention_show(
    target: Target, tenant: str | None,
    as_json: bool,
) -> None:  # fmt: skip
    """The ages that apply: global, per source and per tenant (or one tenant's), and
    where each comes from (api, config, default)."""
    from relaybox.ops import retention as policies

    box = load_box(target)
    if tenant is not None:
        one = _run(box, lambda: policies.tenant_ages(box, tenant), as_json=as_json)
        _emit(one, as_json, lambda: click.echo(_ages_line(one)))
        return
    found = _run(box, lambda: policies.overview(box, limit=500), as_json=as_json)

    def human() -> None:
        from relaybox.ops.inbound import age_text

        def keys(age: float | None) -> str:
            return "for good" if age is None else age_text(age)

        click.echo(
            f"global: events {age_text(found.payload_max_age)}, deliveries and messages "
            f"{age_text(found.outbox_payload_max_age)}, keys {keys(found.keys_max_age)}"
        )
        for s in found.sources:
            click.echo(
                f"source {s.source}: events {age_text(s.payload_max_age)}, "
                f"keys {keys(s.keys_max_age)}"
            )
        if found.day_indexes:
            click.echo(
                "keys tables' index by day: "
                + ", ".join(
                    f"{table} {'yes' if has else 'no'}"
                    for table, has in sorted(found.day_indexes.items())
                )
            )
        for t in found.tenants.items:
            click.echo(_ages_line(t))
        if found.tenants.next is not None:
            click.echo("(the first 500 tenants: GET /admin/api/v1/retention lists them all)")

    _emit(found, as_json, human)


@retention_group.command("set")
@app_options
@click.argument("tenant")
@click.option("--payload-max-age", help="events received for the tenant: 7d, 12h, seconds")
@click.option("--outbox-payload-max-age", help="deliveries to the tenant and their messages: 90d")
@click.option(
    "--keys-max-age",
    help="how long the idempotency keys of the tenant's messages are kept: 365d (at least 1d)",
)
@actor_option
@_json_option
def retention_set(
    target: Target,
    tenant: str,
    payload_max_age: str | None,
    outbox_payload_max_age: str | None,
    keys_max_age: str | None,
    actor: str | None,
    as_json: bool,
) -> None:
    """Set a tenant's ages in the database (they win over the configuration file's;
    one left out is the file's or the default); the next purge applies them. A keys
    window forgets the idempotency keys of the tenant's messages first seen longer ago:
    a publish with such a key then creates a new message."""
    from pydantic import ValidationError

    from relaybox.ops import retention as policies
    from relaybox.ops.inbound import age_text

    if payload_max_age is None and outbox_payload_max_age is None and keys_max_age is None:
        raise click.UsageError(
            "give --payload-max-age, --outbox-payload-max-age, --keys-max-age or some of "
            "them (to go back to the configuration's ages: relaybox retention clear TENANT)"
        )
    ages = {
        "payload_max_age": None if payload_max_age is None else parse_duration(payload_max_age),
        "outbox_payload_max_age": None
        if outbox_payload_max_age is None
        else parse_duration(outbox_payload_max_age),
        "keys_max_age": None if keys_max_age is None else parse_duration(keys_max_age),
    }
    try:
        request = policies.TenantPolicyRequest(**ages)
    except ValidationError as exc:
        first = exc.errors()[0]
        bound = first.get("ctx", {})
        message = str(first["msg"])
        if "ge" in bound:  # seconds, said as the age the option takes
            message = f"at least {age_text(float(bound['ge']))}"
        elif "le" in bound:
            message = f"at most {age_text(float(bound['le']))}"
        raise click.BadParameter(
            message, param_hint=f"--{str(first['loc'][0]).replace('_', '-')}"
        ) from None
    _act(
        target,
        actor,
        as_json,
        lambda box, who: policies.set_tenant(box, tenant, request, actor=who),
        lambda done, _: _ages_line(done),
    )


@retention_group.command("clear")
@app_options
@click.argument("tenant")
@_json_option
def retention_clear(target: Target, tenant: str, as_json: bool) -> None:
    """Remove the ages set in the database for a tenant: the configuration file's (or
    the default ones) apply again."""
    from relaybox.ops import retention as policies

    box = load_box(target)
    done = _run(box, lambda: policies.clear_tenant(box, tenant), as_json=as_json)
    _emit(done, as_json, lambda: click.echo(_ages_line(done)))


COMMANDS = [stats, purge, maintenance, erase, erasures, retention_group]
