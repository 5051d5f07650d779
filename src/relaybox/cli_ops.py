"""``relaybox inbox | dead | quarantine | stats | purge | doctor | maintenance``: the
operator's commands. They call the same functions as the admin API and the dashboard
(:mod:`relaybox.admin.ops`), so a dead letter retried here goes through the worker and
its handler's business keys like one retried from a browser.

Every command takes ``--json`` (one JSON document on stdout; logs go to stderr).
Exit codes as in :mod:`relaybox.cli`: 0 success, 1 the operation failed (not found,
wrong state, a failed check), 2 usage or configuration error, 3 the database is
unreachable.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
from pydantic import BaseModel, ValidationError

from relaybox.app import Relaybox
from relaybox.cli import (
    EXIT_DATABASE,
    EXIT_FAILED,
    EXIT_SCHEMA,
    EXIT_SECRETS,
    EXIT_USAGE,
    _run_db,
    _safe_url,
    app_options,
)
from relaybox.cli import load_box as _load_box
from relaybox.cli_tables import keep_whole
from relaybox.errors import TABLES_MISSING, ConfigurationError
from relaybox.timespec import parse_duration, parse_time_or_none

__all__ = ["COMMANDS"]

T = TypeVar("T")


def _iso(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _actor(actor: str | None) -> str:
    if actor:
        return actor
    try:
        user = getpass.getuser()
    except Exception:  # no login name in some containers
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"


def load_box(app: str | None, config: str | None, database_url: str | None) -> Relaybox:
    """:func:`relaybox.cli.load_box` (a configuration error exits 2, usage or
    configuration, not 1: a script can tell "fix your settings" from "it failed"),
    with logging configured from the settings."""
    box = _load_box(app, config, database_url)
    from relaybox.log import configure_logging

    configure_logging(box.settings.log_level, json=box.settings.log_json)
    return box


def _fail(message: str, *, code: str, as_json: bool, exit_code: int = EXIT_FAILED) -> None:
    if as_json:
        click.echo(json.dumps({"error": code, "message": message}))
    else:
        click.echo(f"error: {message}", err=True)
    sys.exit(exit_code)


def _run(box: Relaybox, make: Callable[[], Awaitable[T]], *, as_json: bool) -> T:
    """Run one async operation against the box's database, close it, and map an
    operator error (unknown id, wrong state) to exit 1 with its message."""
    from relaybox.admin import ops

    async def go() -> Any:
        try:
            return await make()
        except ops.OpsError as exc:
            return exc
        finally:
            await box.close()

    result = _run_db(box, go())
    if isinstance(result, ops.OpsError):
        _fail(result.message, code=result.code, as_json=as_json)
    return result


def _emit(model: BaseModel | dict[str, Any], as_json: bool, human: Callable[[], None]) -> None:
    if as_json:
        data = model.model_dump(mode="json") if isinstance(model, BaseModel) else model
        click.echo(json.dumps(data))
    else:
        human()


def _console() -> Any:
    from rich.console import Console

    return Console()


def _events_table(title: str, items: Sequence[Any], next_cursor: str | None) -> None:
    from rich.table import Table

    table = Table(
        "id",
        "source",
        "type",
        "event id",
        "tenant",
        "status",
        "att.",
        "received",
        "last error",
        title=title,
    )
    for e in items:
        status = e.status + (f" ({e.dead_reason})" if e.dead_reason else "")
        status += " purged" if e.purged else ""
        table.add_row(
            str(e.id),
            e.source,
            e.event_type,
            e.event_id,
            e.tenant or "-",
            status,
            str(e.attempts),
            _iso(e.received_at),
            (e.last_error or "")[:60],
        )
    keep_whole(table, ("id", "event id", "received", "att."))
    console = _console()
    console.print(table)
    if next_cursor:
        console.print(f"more: --cursor {next_cursor}")


def _validate(model: type[BaseModel], **fields: Any) -> Any:
    try:
        return model.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise click.UsageError(problems) from None


def _json_option(fn: Any) -> Any:
    return click.option("--json", "as_json", is_flag=True, help="machine-readable output")(fn)


def _filter_options(fn: Any) -> Any:
    for option in reversed(
        [
            click.option("--source", help="only this source"),
            click.option("--type", "event_type", help="only this event type"),
            click.option("--tenant", help="only this tenant"),
            click.option("--since", help="received at or after: 2h, epoch, ISO 8601"),
            click.option("--until", help="received before: 2h, epoch, ISO 8601"),
        ]
    ):
        fn = option(fn)
    return fn


# -- inbox ----------------------------------------------------------------------


@click.group()
def inbox() -> None:
    """Inbox events: list them, show one with its attempts and keys."""


@inbox.command("list")
@app_options
@_filter_options
@click.option("--status", type=click.Choice(["pending", "done", "dead", "ignored"]))
@click.option("--limit", default=50, show_default=True, type=int)
@click.option("--cursor", help="next page (printed after a full page)")
@_json_option
def inbox_list(
    app: str | None,
    config: str | None,
    database_url: str | None,
    source: str | None,
    event_type: str | None,
    tenant: str | None,
    since: str | None,
    until: str | None,
    status: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """Inbox events, newest first."""
    from relaybox.admin import models, ops

    now = time.time()
    f = _validate(
        models.InboxFilter,
        source=source,
        type=event_type,
        tenant=tenant,
        status=status,
        since=parse_time_or_none(since, now),
        until=parse_time_or_none(until, now),
        limit=limit,
        cursor=cursor,
    )
    box = load_box(app, config, database_url)
    page = _run(box, lambda: ops.inbox_list(box, f), as_json=as_json)
    _emit(page, as_json, lambda: _events_table("inbox", page.items, page.next_cursor))


@inbox.command("show")
@app_options
@click.argument("inbox_id", type=int)
@_json_option
def inbox_show(
    app: str | None, config: str | None, database_url: str | None, inbox_id: int, as_json: bool
) -> None:
    """One event: payload, attempts, errors, business keys, outbox rows, replays."""
    from relaybox.admin import ops

    box = load_box(app, config, database_url)
    e = _run(box, lambda: ops.event_get(box, inbox_id), as_json=as_json)

    def human() -> None:
        from rich.table import Table

        console = _console()
        head = Table(show_header=False, title=f"event {e.id}")
        for key, value in (
            ("event key", f"{e.source} / {e.account} / {e.event_id}"),
            ("type", e.event_type),
            ("tenant", e.tenant or "-"),
            ("status", e.status + (f" ({e.dead_reason})" if e.dead_reason else "")),
            ("attempts", str(e.attempts)),
            ("received", _iso(e.received_at)),
            ("done", _iso(e.done_at)),
            ("last error", e.last_error or "-"),
            ("payload", f"purged {_iso(e.purged_at)}" if e.purged else "kept"),
        ):
            head.add_row(key, value)
        console.print(head)
        if not e.purged:
            console.print_json(json.dumps(e.payload))
        if e.attempt_log:
            t = Table("#", "outcome", "error", "worker", "started", title="attempts")
            replay = previous = 0
            for a in e.attempt_log:
                if a.attempt <= previous:  # a replay starts the count again
                    replay += 1
                previous = a.attempt
                number = f"{a.attempt} (replay {replay})" if replay else str(a.attempt)
                t.add_row(number, a.outcome, a.error or "", a.worker or "", _iso(a.started_at))
            keep_whole(t, ("#", "started"))
            console.print(t)
        for title, rows in (
            ("business keys", [(k.business_key, k.fingerprint) for k in e.business_keys]),
            ("outbox", [(f"{o.channel}:{o.key}", o.status) for o in e.outbox]),
            ("replays", [(f"{r.actor}: {r.reason}", _iso(r.replayed_at)) for r in e.replays]),
        ):
            if rows:
                t = Table("", "", title=title, show_header=False)
                for left, right in rows:
                    t.add_row(left, right)
                console.print(t)

    _emit(e, as_json, human)


# -- dead letters ---------------------------------------------------------------


@click.group()
def dead() -> None:
    """Dead letters: list, retry (one, several, or every one matching a filter), discard."""


@dead.command("list")
@app_options
@_filter_options
@click.option(
    "--reason", "dead_reason", type=click.Choice(["invalid", "exhausted", "conflict", "unhandled"])
)
@click.option("--limit", default=50, show_default=True, type=int)
@click.option("--cursor", help="next page (printed after a full page)")
@_json_option
def dead_list(
    app: str | None,
    config: str | None,
    database_url: str | None,
    source: str | None,
    event_type: str | None,
    tenant: str | None,
    since: str | None,
    until: str | None,
    dead_reason: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """Dead letters waiting for an operator, newest first."""
    from relaybox.admin import models, ops

    now = time.time()
    f = _validate(
        models.DeadFilter,
        source=source,
        type=event_type,
        tenant=tenant,
        reason=dead_reason,
        since=parse_time_or_none(since, now),
        until=parse_time_or_none(until, now),
        limit=limit,
        cursor=cursor,
    )
    box = load_box(app, config, database_url)
    page = _run(box, lambda: ops.dead_list(box, f), as_json=as_json)
    _emit(page, as_json, lambda: _events_table("dead letters", page.items, page.next_cursor))


@dead.command("retry")
@app_options
@click.argument("ids", nargs=-1, type=int)
@click.option("--all", "retry_all", is_flag=True, help="every dead letter matching the filters")
@_filter_options
@click.option("--dead-reason", type=click.Choice(["invalid", "exhausted", "conflict", "unhandled"]))
@click.option("--limit", default=1000, show_default=True, type=int, help="with --all")
@click.option("--reason", required=True, help="why: recorded with each retried event")
@click.option("--actor", help="who asks (default: cli:LOGIN@HOST)")
@_json_option
def dead_retry(
    app: str | None,
    config: str | None,
    database_url: str | None,
    ids: tuple[int, ...],
    retry_all: bool,
    source: str | None,
    event_type: str | None,
    tenant: str | None,
    since: str | None,
    until: str | None,
    dead_reason: str | None,
    limit: int,
    reason: str,
    actor: str | None,
    as_json: bool,
) -> None:
    """Send dead letters back through their handler (business keys still hold).

    relaybox dead retry 12 13 --reason "fixed"  ·  relaybox dead retry --all
    --source stripe --dead-reason exhausted --reason "provider outage over"
    """
    from relaybox.admin import models, ops

    if bool(ids) == retry_all:
        raise click.UsageError("give dead letter ids, or --all with filters (not both)")
    who = _actor(actor)
    box = load_box(app, config, database_url)
    if retry_all:
        now = time.time()
        req = _validate(
            models.DeadRetryRequest,
            source=source,
            type=event_type,
            tenant=tenant,
            dead_reason=dead_reason,
            since=parse_time_or_none(since, now),
            until=parse_time_or_none(until, now),
            limit=limit,
            reason=reason,
            actor=who,
        )
        result: Any = _run(box, lambda: ops.dead_retry_many(box, req, actor=who), as_json=as_json)
    else:

        async def each() -> Any:
            replayed: list[int] = []
            purged: list[int] = []
            problems: list[str] = []
            for inbox_id in ids:
                try:
                    r = await ops.dead_retry(box, inbox_id, actor=who, reason=reason)
                    replayed += r.replayed
                except ops.OpsError as exc:
                    problems.append(exc.message)
                    if exc.code == "payload_purged":
                        purged.append(inbox_id)
            return {"replayed": replayed, "purged": purged, "problems": problems}

        result = _run(box, each, as_json=as_json)
    data = result.model_dump(mode="json") if isinstance(result, BaseModel) else result
    if as_json:
        click.echo(json.dumps(data))
    else:
        click.echo(f"retried {len(data['replayed'])} dead letter(s) as {who}")
        for problem in data.get("problems", []):
            click.echo(f"error: {problem}", err=True)
        if data.get("message") and isinstance(result, BaseModel):
            click.echo(data["message"])
    if data.get("problems"):
        sys.exit(EXIT_FAILED)


@dead.command("discard")
@app_options
@click.argument("inbox_id", type=int)
@click.option("--reason", required=True, help="why: kept with the row")
@click.option("--actor", help="who (default: cli:LOGIN@HOST)")
@_json_option
def dead_discard(
    app: str | None,
    config: str | None,
    database_url: str | None,
    inbox_id: int,
    reason: str,
    actor: str | None,
    as_json: bool,
) -> None:
    """Take a dead letter out of the queue for good (the row stays, for the record)."""
    from relaybox.admin import ops

    box = load_box(app, config, database_url)
    who = _actor(actor)
    r = _run(
        box, lambda: ops.dead_discard(box, inbox_id, actor=who, reason=reason), as_json=as_json
    )
    _emit(r, as_json, lambda: click.echo(f"discarded event {inbox_id} as {who}"))


# -- quarantine -----------------------------------------------------------------


@click.group()
def quarantine() -> None:
    """Deliveries that reused an event id with other content: list, compare, resolve."""


@quarantine.command("list")
@app_options
@click.option("--source", help="only this source")
@click.option(
    "--state", type=click.Choice(["open", "resolved", "all"]), default="open", show_default=True
)
@click.option("--limit", default=50, show_default=True, type=int)
@click.option("--cursor", help="next page")
@_json_option
def quarantine_list(
    app: str | None,
    config: str | None,
    database_url: str | None,
    source: str | None,
    state: str,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """Quarantined deliveries, newest first (open ones by default)."""
    from relaybox.admin import models, ops

    f = _validate(models.QuarantineFilter, source=source, limit=limit, cursor=cursor)
    f = f.model_copy(update={"resolved": {"open": False, "resolved": True, "all": None}[state]})
    box = load_box(app, config, database_url)
    page = _run(box, lambda: ops.quarantine_list(box, f), as_json=as_json)

    def human() -> None:
        from rich.table import Table

        t = Table(
            "id",
            "original",
            "source",
            "event id",
            "type",
            "received",
            "resolution",
            title="quarantine",
        )
        for q in page.items:
            t.add_row(
                str(q.id),
                f"{q.inbox_id} ({q.original_status})",
                q.source,
                q.event_id,
                q.event_type,
                _iso(q.received_at),
                q.resolution or "open",
            )
        _console().print(t)

    _emit(page, as_json, human)


@quarantine.command("show")
@app_options
@click.argument("quarantine_id", type=int)
@_json_option
def quarantine_show(
    app: str | None,
    config: str | None,
    database_url: str | None,
    quarantine_id: int,
    as_json: bool,
) -> None:
    """A quarantined delivery compared with the original it collided with."""
    from relaybox.admin import ops

    box = load_box(app, config, database_url)
    q = _run(box, lambda: ops.quarantine_get(box, quarantine_id), as_json=as_json)

    def human() -> None:
        from rich.table import Table

        t = Table(
            "path",
            "change",
            "original",
            "quarantined",
            title=f"quarantine {q.id}: {q.source}/{q.event_id} vs event {q.inbox_id}",
        )
        for d in q.differences:
            t.add_row(d.path, d.change, json.dumps(d.original), json.dumps(d.quarantined))
        _console().print(t)
        if q.resolved_at:
            click.echo(f"resolved {_iso(q.resolved_at)} by {q.resolved_by}: {q.resolution}")

    _emit(q, as_json, human)


@quarantine.command("resolve")
@app_options
@click.argument("quarantine_id", type=int)
@click.option(
    "--resolution", required=True, type=click.Choice(["kept_original", "handled_manually"])
)
@click.option("--reason", required=True, help="why: kept with the entry")
@click.option("--actor", help="who (default: cli:LOGIN@HOST)")
@_json_option
def quarantine_resolve(
    app: str | None,
    config: str | None,
    database_url: str | None,
    quarantine_id: int,
    resolution: str,
    reason: str,
    actor: str | None,
    as_json: bool,
) -> None:
    """Record the decision on a quarantined delivery (the original is not touched)."""
    from relaybox.admin import ops

    box = load_box(app, config, database_url)
    who = _actor(actor)
    r = _run(
        box,
        lambda: ops.quarantine_resolve(
            box, quarantine_id, resolution=resolution, actor=who, reason=reason
        ),
        as_json=as_json,
    )
    _emit(r, as_json, lambda: click.echo(f"resolved quarantine entry {quarantine_id}"))


# -- stats ----------------------------------------------------------------------


@click.command()
@app_options
@_json_option
def stats(app: str | None, config: str | None, database_url: str | None, as_json: bool) -> None:
    """Queue numbers: the same snapshot /metrics exports and the dashboard shows."""
    from relaybox.admin import ops

    box = load_box(app, config, database_url)
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
    help="finished longer ago than this, inbox and outbox alike (default: the settings)",
)
@click.option("--batch", type=int, help="rows per transaction (default: the setting)")
@click.option("--dry-run", is_flag=True, help="count what would be purged, change nothing")
@_json_option
def purge(
    app: str | None,
    config: str | None,
    database_url: str | None,
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
    box = load_box(app, config, database_url)

    async def go() -> retention.PurgeResult:
        if dry_run or as_json:
            return await retention.purge(box, older_than=age, batch=batch, dry_run=dry_run)
        cutoff, outbox_cutoff = retention.cutoffs(box, age)
        inbox_n, quarantine_n = await retention.purge_candidates(box, cutoff)
        outbox_n, messages_n = await retention.outbox_purge_candidates(box, outbox_cutoff)
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        with Progress(
            TextColumn("purging payloads"),
            BarColumn(),
            MofNCompleteColumn(),
            console=_err_console(),
            transient=False,
        ) as bar:
            task = bar.add_task("purge", total=inbox_n + quarantine_n + outbox_n + messages_n)
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
def maintenance(
    app: str | None, config: str | None, database_url: str | None, once: bool, as_json: bool
) -> None:
    """Run the scheduled maintenance (retention purge) until SIGTERM; with several
    processes on one PostgreSQL, one of them runs it at a time (advisory lock)."""
    from relaybox.retention import Maintenance

    box = load_box(app, config, database_url)
    runner = Maintenance(box)
    if once:
        result = _run(box, runner.run_once, as_json=as_json)
        data = {"ran": result is not None, **(result.as_dict() if result else {})}
        _emit(
            data,
            as_json,
            lambda: click.echo(
                "another process holds the maintenance lock: skipped"
                if result is None
                else f"purged {result.inbox} event, {result.quarantine} quarantine, "
                f"{result.outbox} delivery payload(s) and {result.messages} message body(ies)"
            ),
        )
        return

    async def loop() -> None:
        running = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            running.add_signal_handler(sig, runner.stop)
        await runner.run()

    _run(box, loop, as_json=as_json)


# -- doctor ---------------------------------------------------------------------


class _Checks:
    """Check results in order, and the exit code the worst of them means."""

    def __init__(self) -> None:
        self.rows: list[dict[str, str]] = []
        self.exit_code = 0

    def add(self, name: str, status: str, detail: str, *, exit_code: int = EXIT_FAILED) -> None:
        self.rows.append({"check": name, "status": status, "detail": detail})
        if status == "fail" and self.exit_code == 0:
            self.exit_code = exit_code


async def _doctor_database(box: Relaybox, checks: _Checks, max_skew: float) -> None:
    from relaybox.store.base import load_migrations

    url = _safe_url(box)
    try:
        store = box.store
        probe = await store.doctor_probe()
    except ConfigurationError as exc:  # e.g. an unsupported URL scheme
        checks.add("database", "fail", str(exc), exit_code=EXIT_USAGE)
        return
    except Exception as exc:
        text = str(exc).splitlines()[0] if str(exc) else ""
        if "relaybox_migrations" in text:  # reachable, never migrated
            checks.add("database", "ok", f"reachable: {url}")
            checks.add("migrations", "fail", TABLES_MISSING, exit_code=EXIT_SCHEMA)
            return
        checks.add(
            "database",
            "fail",
            f"database unreachable ({url}): {type(exc).__name__}: {text[:300]}",
            exit_code=EXIT_DATABASE,
        )
        return
    checks.add("database", "ok", f"reachable: {url} ({store.backend})")
    known = {v: f"{v:04d}_{n}" for v, n, _ in load_migrations(store.backend)}
    missing = [known[v] for v in sorted(set(known) - probe.applied)]
    unknown = sorted(probe.applied - set(known))
    if missing:
        checks.add(
            "migrations",
            "fail",
            f"not applied: {', '.join(missing)}: run `relaybox migrate`",
            exit_code=EXIT_SCHEMA,
        )
    elif unknown:
        checks.add(
            "migrations",
            "warn",
            f"the database has migrations this relaybox does not know ({unknown}): "
            "is an older version running against a newer schema?",
        )
    else:
        checks.add("migrations", "ok", f"all {len(known)} applied")
    if not missing:
        await _doctor_secrets(box, checks)
        await _doctor_channels(box, checks)
    # Rounded to the millisecond shown, without a negative zero ("-0.000 s").
    skew = round(probe.db_now - (probe.before + probe.after) / 2, 3) + 0.0
    detail = f"database clock {skew:+.3f} s from this machine's"
    if abs(skew) > max_skew:
        checks.add(
            "clock",
            "fail",
            detail + f" (over {max_skew:g} s): backoff, leases and retention read both "
            "clocks; sync NTP on both machines",
        )
    else:
        checks.add("clock", "ok", detail)


async def _doctor_channels(box: Relaybox, checks: _Checks) -> None:
    """Pending outbox rows whose channel this app never registers: no dispatcher
    delivers them."""
    from relaybox.admin import ops

    stuck = {
        name: n
        for name, n in (await ops.unregistered_channels(box)).items()
        if not name.startswith("ep_")
    }
    if stuck:
        named = ", ".join(f"{name} ({n} pending)" for name, n in sorted(stuck.items()))
        checks.add(
            "channels",
            "fail",
            f"outbox rows for channels this app does not register: {named}; register them "
            "with box.outbound.channel(name, ...) or they are never delivered",
        )


def _doctor_secrets_key(box: Relaybox, checks: _Checks) -> None:
    """Where the key that seals endpoint signing secrets comes from, and whether it is
    protected: a key on PostgreSQL, a readable key file only its owner can read."""
    from relaybox.outbound.registry import outbound
    from relaybox.outbound.vault import MISSING_HINT, KeyFileError

    vault = outbound(box).vault
    if vault.configured:
        checks.add("secrets_key", "ok", "outbound.secrets_key is set")
        return
    key_file = vault.key_file
    if key_file is None:
        if vault.sealing:  # an in-memory database: a key as short-lived as its data
            checks.add("secrets_key", "ok", "in-memory database: a key per process")
            return
        checks.add(
            "secrets_key",
            "fail",
            "outbound.secrets_key is not set: relaybox keeps no key of its own for a"
            " database that is not a SQLite file, so endpoints cannot be created, secrets"
            f" cannot be rotated or sealed; {MISSING_HINT}",
            exit_code=EXIT_SECRETS,
        )
        return
    try:
        vault.check()
    except KeyFileError as exc:
        checks.add("secrets_key", "fail", str(exc), exit_code=EXIT_USAGE)
        return
    mode = key_file.mode()
    if mode is None:
        checks.add(
            "secrets_key",
            "ok",
            f"key file {key_file.path}: made when the first endpoint secret is stored",
        )
    elif mode & 0o077:
        checks.add(
            "secrets_key",
            "fail",
            f"key file {key_file.path} is open to other users (mode {mode:04o}): whoever"
            f" reads it and the database can sign webhooks; run `chmod 600 {key_file.path}`",
            exit_code=EXIT_SECRETS,
        )
    else:
        checks.add(
            "secrets_key",
            "ok",
            f"key file {key_file.path} (mode {mode:04o}): back it up, every sealed secret needs it",
        )


async def _doctor_secrets(box: Relaybox, checks: _Checks) -> None:
    """Endpoint signing secrets against the keys relaybox has."""
    from relaybox.outbound.endpoints import secrets_at_rest
    from relaybox.outbound.registry import outbound
    from relaybox.outbound.vault import KeyFileError

    try:
        n = await secrets_at_rest(box)
    except KeyFileError:
        return  # reported by the secrets_key check
    if not any(n.values()):
        return
    vault = outbound(box).vault
    if n["locked"]:
        lost = vault.key_file is not None and vault.key_file.mode() is None
        checks.add(
            "secrets",
            "fail",
            f"{n['locked']} endpoint secret(s) sealed with a key {vault.source} does"
            " not hold: deliveries to their endpoints are held until it does"
            + (": the key file is missing, restore it from your backup" if lost else ""),
        )
    elif n["plaintext"] and not vault.sealing:
        checks.add(
            "secrets",
            "warn",
            f"{n['plaintext']} endpoint secret(s) stored in plaintext: whoever reads the"
            " database can sign webhooks; set outbound.secrets_key, then run"
            " `relaybox migrate`",
        )
    elif n["plaintext"] or n["older"]:
        checks.add(
            "secrets",
            "warn",
            f"{n['plaintext']} in plaintext and {n['older']} under an older key:"
            " run `relaybox migrate` (seals the plaintext ones) or"
            " `relaybox endpoints seal-secrets` (seals both)",
        )
    else:
        checks.add("secrets", "ok", f"{n['current']} endpoint secret(s) sealed")


@click.command()
@app_options
@click.option("--max-skew", default=2.0, show_default=True, help="seconds of clock skew allowed")
@_json_option
def doctor(
    app: str | None, config: str | None, database_url: str | None, max_skew: float, as_json: bool
) -> None:
    """Check configuration, the key of endpoint secrets, database reachability,
    migrations and clock skew; name each problem and exit non-zero (2 configuration,
    3 database unreachable, 4 tables missing or migrations pending, 5 endpoint secrets
    not protected at rest: no outbound.secrets_key on PostgreSQL or a key file open to
    other users; 1 other)."""
    checks = _Checks()
    box: Relaybox | None = None
    try:
        box = _load_box(app, config, database_url)
    except click.ClickException as exc:
        checks.add("configuration", "fail", exc.format_message(), exit_code=EXIT_USAGE)
    if box is not None:
        s = box.settings
        checks.add(
            "configuration",
            "ok",
            f"{len(box.sources)} source(s), retention {s.retention.payload_max_age / 86400:g} d"
            + ("" if s.retention.enabled else " (scheduled purge disabled)"),
        )
        if s.admin_token is None:
            checks.add("admin", "warn", "admin_token is not set: /admin refuses every request")
        else:
            checks.add("admin", "ok", "admin_token is set")

        async def run() -> None:
            assert box is not None
            try:
                await asyncio.wait_for(_doctor_database(box, checks, max_skew), 30)
            except TimeoutError:
                checks.add(
                    "database",
                    "fail",
                    f"no answer within 30 s ({_safe_url(box)})",
                    exit_code=EXIT_DATABASE,
                )
            finally:
                try:
                    await box.close()
                except Exception:  # closing a store that never connected
                    pass

        try:
            asyncio.run(run())
        except (OSError, ConfigurationError) as exc:  # the store could not even be opened
            checks.add(
                "database",
                "fail",
                f"database unreachable ({_safe_url(box)}): {type(exc).__name__}: {exc}",
                exit_code=EXIT_DATABASE,
            )
        # After the database: with both wrong, the exit code names the database.
        _doctor_secrets_key(box, checks)
    if as_json:
        click.echo(json.dumps({"ok": checks.exit_code == 0, "checks": checks.rows}))
    else:
        from rich.table import Table

        t = Table("check", "status", "detail", title="relaybox doctor")
        colors = {"ok": "green", "warn": "yellow", "fail": "red"}
        for row in checks.rows:
            t.add_row(row["check"], f"[{colors[row['status']]}]{row['status']}[/]", row["detail"])
        _console().print(t)
        for row in checks.rows:
            if row["status"] == "fail":
                click.echo(f"problem: {row['check']}: {row['detail']}", err=True)
    sys.exit(checks.exit_code)


COMMANDS = [inbox, dead, quarantine, stats, purge, doctor, maintenance]
