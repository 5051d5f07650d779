"""``relaybox inbox | dead | quarantine``: the
operator's commands. They call the same functions as the admin API and the dashboard
(:mod:`relaybox.ops.inbound`), so a dead letter retried here goes through the worker and
its handler's business keys like one retried from a browser.

Every command takes ``--json`` (one JSON document on stdout; logs go to stderr).
Exit codes as in :mod:`relaybox.cli`: 0 success, 1 the operation failed (not found,
wrong state, a failed check), 2 usage or configuration error, 3 the database is
unreachable.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import click
from pydantic import BaseModel, ValidationError

from relaybox.app import Relaybox
from relaybox.cli.common import Target, action_options, app_options, json_option, run_db
from relaybox.cli.exits import EXIT_FAILED, exit_code_for
from relaybox.cli.grammar import (
    CliError,
    GrammarOption,
    default_actor,
    since_options,
    type_option,
)
from relaybox.cli.table import format_time, keep_whole, print_table
from relaybox.config.loading import validation_problems
from relaybox.errors import OpsError
from relaybox.timespec import parse_time_or_none
from relaybox.wire import text_problem

__all__ = ["COMMANDS"]

T = TypeVar("T")


_iso = format_time
_actor = default_actor


def load_box(target: Target) -> Relaybox:
    """The box ``target`` names, logging configured (:meth:`Target.load_logging`)."""
    return target.load_logging()


def _run(box: Relaybox, make: Callable[[], Awaitable[T]], *, as_json: bool) -> T:
    """Run one async operation against the box's database, close it, and map an
    operator error to its exit code (unknown id, wrong state: 1) with its message
    (``--json``: ``{"error": code, "message": ...}`` on stdout, :mod:`.grammar`)."""

    async def go() -> T | OpsError:
        try:
            return await make()
        except OpsError as exc:
            return exc
        finally:
            await box.close()

    result = run_db(box, go())
    if isinstance(result, OpsError):
        exit_code = exit_code_for(result) or EXIT_FAILED
        raise CliError(result.message, code=result.code, exit_code=exit_code)
    return result


M = TypeVar("M", bound=BaseModel)


def _act(
    target: Target,
    actor: str | None,
    as_json: bool,
    act: Callable[[Relaybox, str], Awaitable[M]],
    said: Callable[[M, str], str],
) -> None:
    """An operator's action: ``act`` on the box ``target`` names, as ``actor`` (else
    :func:`default_actor`); its result as JSON, or the line ``said`` makes of it and
    the actor."""
    box = load_box(target)
    who = _actor(actor)
    result = _run(box, lambda: act(box, who), as_json=as_json)
    _emit(result, as_json, lambda: click.echo(said(result, who)))


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
    rows = []
    for e in items:
        status = e.status + (f" ({e.dead_reason})" if e.dead_reason else "")
        status += " purged" if e.purged else ""
        rows.append(
            (e.id, e.source, e.event_type, e.event_id, e.tenant or "-", status, e.attempts,
             _iso(e.received_at), (e.last_error or "")[:60])
        )  # fmt: skip
    print_table(
        ("id", "source", "type", "event id", "tenant", "status", "att.", "received",
         "last error"),
        rows,
        title=title,
        whole=("id", "event id", "received", "att."),
        drop=("tenant", "type", "source", "att."),
    )  # fmt: skip
    console = _console()
    if next_cursor:
        console.print(f"more: --cursor {next_cursor}")


def _validate(model: type[BaseModel], **fields: Any) -> Any:
    try:
        return model.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise click.UsageError(validation_problems(exc)) from None


_json_option = json_option


def _filter_options(fn: Any) -> Any:
    for option in reversed(
        [
            click.option("--source", help="only this source"),
            type_option("only this event type", deprecated=("--event-type",)),
            click.option("--tenant", help="only this tenant"),
            since_options("received"),
        ]
    ):
        fn = option(fn)
    return fn


_DEAD_REASONS = click.Choice(["invalid", "exhausted", "conflict", "unhandled"])


def _filter_fields(
    source: str | None,
    event_type: str | None,
    tenant: str | None,
    since: str | None,
    until: str | None,
) -> dict[str, Any]:
    """The fields of :func:`_filter_options` as an inbox filter of
    :mod:`relaybox.ops.inbound_models` names them, times read now."""
    now = time.time()
    return {
        "source": source,
        "type": event_type,
        "tenant": tenant,
        "since": parse_time_or_none(since, now),
        "until": parse_time_or_none(until, now),
    }


def _list_command(
    group: click.Group,
    option: Callable[[Callable[..., None]], Callable[..., None]],
    *,
    field: str,
    model: str,
    use_case: str,
    title: str,
    doc: str,
) -> None:
    """``<group> list``: inbox events through the filters, ``option`` (one more filter,
    its value the model's ``field``), a page at a time, newest first. ``model`` is the
    filter of :mod:`relaybox.ops.inbound_models`, ``use_case`` the function of
    :mod:`relaybox.ops.inbound` that lists (both imported when the command runs)."""

    @group.command("list", help=doc)
    @app_options
    @_filter_options
    @option
    @click.option("--limit", default=50, show_default=True, type=int, help="a page's size")
    @click.option("--cursor", help="next page (printed after a full page)")
    @_json_option
    def command(
        target: Target,
        source: str | None,
        event_type: str | None,
        tenant: str | None,
        since: str | None,
        until: str | None,
        limit: int,
        cursor: str | None,
        as_json: bool,
        **chosen: str | None,
    ) -> None:
        from relaybox.ops import inbound as ops
        from relaybox.ops import inbound_models as models

        (value,) = chosen.values()
        f = _validate(
            getattr(models, model),
            **_filter_fields(source, event_type, tenant, since, until),
            **{field: value},
            limit=limit,
            cursor=cursor,
        )
        box = load_box(target)
        page = _run(box, lambda: getattr(ops, use_case)(box, f), as_json=as_json)
        _emit(page, as_json, lambda: _events_table(title, page.items, page.next_cursor))


# -- inbox ----------------------------------------------------------------------


@click.group()
def inbox() -> None:
    """Inbox events: list them, show one with its attempts and keys."""


_list_command(
    inbox,
    click.option(
        "--status",
        type=click.Choice(["pending", "done", "dead", "ignored"]),
        help="only this status",
    ),
    field="status",
    model="InboxFilter",
    use_case="inbox_list",
    title="inbox",
    doc="Inbox events, newest first.",
)


@inbox.command("show")
@app_options
@click.argument("inbox_id", type=int)
@_json_option
def inbox_show(target: Target, inbox_id: int, as_json: bool) -> None:
    """One event: payload, attempts, errors, business keys, outbox rows, replays."""
    from relaybox.ops import inbound as ops

    box = load_box(target)
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
            (
                "payload",
                f"erased {_iso(e.erased_at)} (its subject's erasure)"
                if e.erased_at is not None
                else f"purged {_iso(e.purged_at)}"
                if e.purged
                else "kept",
            ),
        ):
            head.add_row(key, value)
        console.print(head)
        if not e.purged:
            # A lone surrogate (a provider's JSON may escape one) cannot be printed:
            # then the payload is shown with every non-ASCII character escaped.
            escape = text_problem(e.payload, nul=False) is not None
            console.print_json(json.dumps(e.payload), ensure_ascii=escape)
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


_list_command(
    dead,
    click.option(
        "--dead-reason",
        cls=GrammarOption,
        deprecated_names=("--reason",),
        type=_DEAD_REASONS,
        help="only dead letters of this cause",
    ),
    field="reason",
    model="DeadFilter",
    use_case="dead_list",
    title="dead letters",
    doc="Dead letters waiting for an operator, newest first.",
)


@dead.command("retry")
@app_options
@click.argument("ids", nargs=-1, type=int)
@click.option("--all", "retry_all", is_flag=True, help="every dead letter matching the filters")
@_filter_options
@click.option("--dead-reason", type=_DEAD_REASONS, help="only dead letters of this cause")
@click.option("--limit", default=1000, show_default=True, type=int, help="with --all")
@action_options("with each retried event")
def dead_retry(
    target: Target,
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
    from relaybox.ops import inbound as ops
    from relaybox.ops import inbound_models as models

    if bool(ids) == retry_all:
        raise click.UsageError("give dead letter ids, or --all with filters (not both)")
    who = _actor(actor)
    box = load_box(target)
    if retry_all:
        req = _validate(
            models.DeadRetryRequest,
            **_filter_fields(source, event_type, tenant, since, until),
            dead_reason=dead_reason,
            limit=limit,
            reason=reason,
            actor=who,
        )
        result: Any = _run(box, lambda: ops.dead_retry_many(box, req, actor=who), as_json=as_json)
    else:

        async def each() -> Any:
            replayed: list[int] = []
            purged: list[int] = []
            problems: list[OpsError] = []
            for inbox_id in ids:
                try:
                    r = await ops.dead_retry(box, inbox_id, actor=who, reason=reason)
                    replayed += r.replayed
                except OpsError as exc:
                    problems.append(exc)
                    if exc.code == "payload_purged":
                        purged.append(inbox_id)
            if problems and not replayed:  # nothing done: the failure is the answer
                raise CliError(
                    "; ".join(p.message for p in problems),
                    code=problems[0].code if len(problems) == 1 else "failed",
                    exit_code=exit_code_for(problems[0]) or EXIT_FAILED,
                )
            return {
                "replayed": replayed,
                "purged": purged,
                "problems": [p.message for p in problems],
            }

        result = _run(box, each, as_json=as_json)
    data = result.model_dump(mode="json") if isinstance(result, BaseModel) else result
    if as_json:
        click.echo(json.dumps(data))
    else:
        click.echo(f"retried {len(data['replayed'])} dead letter(s) as {who}")
        for problem in data.get("problems", []):
            click.echo(f"Error: {problem}", err=True)
        if data.get("message") and isinstance(result, BaseModel):
            click.echo(data["message"])
    if data.get("problems"):
        sys.exit(EXIT_FAILED)


@dead.command("discard")
@app_options
@click.argument("inbox_id", type=int)
@action_options("with the row")
def dead_discard(
    target: Target,
    inbox_id: int,
    reason: str,
    actor: str | None,
    as_json: bool,
) -> None:
    """Take a dead letter out of the queue for good (the row stays, for the record)."""
    from relaybox.ops import inbound as ops

    _act(
        target,
        actor,
        as_json,
        lambda box, who: ops.dead_discard(box, inbox_id, actor=who, reason=reason),
        lambda _, who: f"discarded event {inbox_id} as {who}",
    )


# -- quarantine -----------------------------------------------------------------


@click.group()
def quarantine() -> None:
    """Deliveries that reused an event id with other content: list, compare, resolve."""


@quarantine.command("list")
@app_options
@click.option("--source", help="only this source")
@click.option(
    "--state",
    type=click.Choice(["open", "resolved", "all"]),
    default="open",
    show_default=True,
    help="which entries",
)
@click.option("--limit", default=50, show_default=True, type=int, help="a page's size")
@click.option("--cursor", help="next page")
@_json_option
def quarantine_list(
    target: Target,
    source: str | None,
    state: str,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """Quarantined deliveries, newest first (open ones by default)."""
    from relaybox.ops import inbound as ops
    from relaybox.ops import inbound_models as models

    f = _validate(models.QuarantineFilter, source=source, limit=limit, cursor=cursor)
    f = f.model_copy(update={"resolved": {"open": False, "resolved": True, "all": None}[state]})
    box = load_box(target)
    page = _run(box, lambda: ops.quarantine_list(box, f), as_json=as_json)

    def human() -> None:
        print_table(
            ("id", "original", "source", "event id", "type", "received", "resolution"),
            [
                (q.id,
                 f"{q.inbox_id} ({q.original_status or 'gone'})",
                 q.source, q.event_id,
                 q.event_type, _iso(q.received_at), q.resolution or "open")
                for q in page.items
            ],
            title="quarantine",
            whole=("id", "event id", "received"),
            drop=("type", "source"),
        )  # fmt: skip

    _emit(page, as_json, human)


@quarantine.command("show")
@app_options
@click.argument("quarantine_id", type=int)
@_json_option
def quarantine_show(
    target: Target,
    quarantine_id: int,
    as_json: bool,
) -> None:
    """A quarantined delivery compared with the original it collided with."""
    from relaybox.ops import inbound as ops

    box = load_box(target)
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
    "--resolution",
    required=True,
    type=click.Choice(["kept_original", "handled_manually"]),
    help="the decision",
)
@action_options("with the entry")
def quarantine_resolve(
    target: Target,
    quarantine_id: int,
    resolution: str,
    reason: str,
    actor: str | None,
    as_json: bool,
) -> None:
    """Record the decision on a quarantined delivery (the original is not touched)."""
    from relaybox.ops import inbound as ops

    _act(
        target,
        actor,
        as_json,
        lambda box, who: ops.quarantine_resolve(
            box, quarantine_id, resolution=resolution, actor=who, reason=reason
        ),
        lambda _, __: f"resolved quarantine entry {quarantine_id}",
    )


COMMANDS = [inbox, dead, quarantine]
