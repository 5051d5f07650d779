"""``relaybox replay | reconcile | recover``: the ordering area's commands.

All three put work back on the one idempotent path (inbox → worker → handler with
its business keys and projections), so running any of them twice changes nothing
the second time. Exit codes as in :mod:`relaybox.cli`: 0 success, 1 some of the
work failed, 2 usage or configuration error, 3 the database is unreachable.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import click

from relaybox.cli.common import Target, app_options, json_option, run_db
from relaybox.cli.exits import EXIT_FAILED
from relaybox.cli.grammar import CliError, actor_option, default_actor, since_options
from relaybox.cli.table import print_pairs
from relaybox.errors import ConfigurationError
from relaybox.timespec import TIME_FORMS, parse_time

__all__ = ["COMMANDS"]


def _print_table(title: str, rows: list[tuple[str, Any]]) -> None:
    print_pairs(title, rows)


# -- replay -------------------------------------------------------------------------


@click.command()
@app_options
@click.argument("ids", nargs=-1, type=int)
@click.option("--source", default=None, help="only this source")
@since_options("received")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(["done", "dead", "ignored"]),
    help="repeatable; default for a range: done and dead (ids: any finished status)",
)
@actor_option
@click.option(
    "--reason",
    default=None,
    help="why: recorded with each replayed row (required, except with --dry-run)",
)
@click.option("--limit", default=10_000, show_default=True, help="at most this many rows")
@click.option("--batch", default=500, show_default=True, help="rows per transaction")
@click.option(
    "--include-discarded",
    is_flag=True,
    help="replay discarded dead letters too (a range leaves them out; ids name them)",
)
@click.option("--dry-run", is_flag=True, help="show what would be replayed, change nothing")
@json_option
def replay(
    target: Target,
    ids: tuple[int, ...],
    source: str | None,
    since: str | None,
    until: str | None,
    statuses: tuple[str, ...],
    actor: str | None,
    reason: str | None,
    limit: int,
    batch: int,
    include_discarded: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Send finished inbox rows through their handler again.

    By id (relaybox replay 12 13), by source and time range (--source stripe
    --since 6h), by status (--status dead). The handler's business keys make a
    replay safe: an operation that already happened is not applied again. Each
    replayed row is recorded with --actor and --reason (required).

    Dead letters discarded with `relaybox dead discard` are out of the queue for
    good: a range or a status leaves them out unless --include-discarded; giving
    their ids replays them.
    """
    from relaybox.inbound.replay import ReplayResult, Selection, select
    from relaybox.inbound.replay import replay as do_replay

    if not (ids or source or since or until or statuses):
        raise click.UsageError("select rows: ids, --source, --since/--until or --status")
    if batch < 1 or limit < 1:
        raise click.UsageError("--batch and --limit must be positive")
    if not dry_run and not (reason and reason.strip()):
        raise click.UsageError("--reason is required: it is recorded with each replayed row")
    box = target.load_logging()
    now = time.time()
    chosen: tuple[str, ...] | None = statuses or (None if ids else ("done", "dead"))
    try:
        selection = Selection(
            ids=list(ids) or None,
            source=source,
            since=None if since is None else parse_time(since, now),
            until=None if until is None else parse_time(until, now),
            statuses=chosen,
            limit=limit,
            include_discarded=include_discarded or None,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    who = default_actor(actor)

    async def run() -> dict[str, Any]:
        try:
            candidates = await select(box, selection)
            kept = selection.takes_discarded
            replayable = [
                c.inbox_id for c in candidates if not c.purged and (kept or not c.discarded)
            ]
            out: dict[str, Any] = {
                "dry_run": dry_run,
                "actor": who,
                "reason": reason,
                "selected": len(candidates),
                "purged": [c.inbox_id for c in candidates if c.purged],
                "discarded": [
                    c.inbox_id for c in candidates if c.discarded and not c.purged and not kept
                ],
            }
            if ids:
                found = {c.inbox_id for c in candidates}
                out["not_found_or_pending"] = [i for i in ids if i not in found]
            if dry_run:
                out["would_replay"] = replayable
                return out
            total = ReplayResult()
            with _Progress(len(replayable), show=not ids and not as_json) as advance:
                for start in range(0, len(replayable), batch):
                    chunk = replayable[start : start + batch]
                    # The same statuses guard each chunk: a row that changed since
                    # the selection (completed by a worker, replayed by someone
                    # else) is skipped, not replayed twice.
                    part = await do_replay(
                        box,
                        Selection(
                            ids=chunk, statuses=chosen, limit=len(chunk), include_discarded=kept
                        ),
                        actor=who,
                        reason=reason or "",
                    )
                    total.replayed += part.replayed
                    total.purged += part.purged
                    total.skipped += part.skipped + [
                        i for i in chunk if i not in {*part.replayed, *part.purged, *part.skipped}
                    ]
                    advance(len(chunk))
            out.update(
                total.as_dict(),
                purged=sorted({*out["purged"], *total.purged}),
                discarded=out["discarded"],
            )
            return out
        finally:
            await box.close()

    out = run_db(box, run())
    if as_json:
        click.echo(json.dumps(out))
    elif dry_run:
        click.echo(f"would replay {len(out['would_replay'])} row(s): {_ids(out['would_replay'])}")
    else:
        click.echo(f"replayed {len(out['replayed'])} row(s) as {who}: {_ids(out['replayed'])}")
    if not as_json:
        if out["purged"]:
            click.echo(f"payload purged, cannot replay: {_ids(out['purged'])}", err=True)
        if out.get("skipped"):
            click.echo(f"changed meanwhile, skipped: {_ids(out['skipped'])}", err=True)
        if out.get("discarded"):
            click.echo(
                f"discarded dead letters left out (--include-discarded): {_ids(out['discarded'])}",
                err=True,
            )
        if out.get("not_found_or_pending"):
            click.echo(f"not found or still pending: {_ids(out['not_found_or_pending'])}", err=True)
    incomplete = out["purged"] or out.get("not_found_or_pending")
    if ids and incomplete and not dry_run:
        sys.exit(EXIT_FAILED)


def _ids(values: list[int]) -> str:
    shown = ", ".join(str(v) for v in values[:20])
    return shown + (f", … ({len(values)} in all)" if len(values) > 20 else "") or "none"


class _Progress:
    """A rich progress bar on stderr for long ranges; a no-op otherwise."""

    def __init__(self, total: int, *, show: bool) -> None:
        self.total = total
        self.show = show and total > 0
        self._bar: Any = None

    def __enter__(self) -> Any:
        if not self.show:
            return lambda n: None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._bar = Progress(
            TextColumn("replaying"),
            BarColumn(),
            MofNCompleteColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._bar.start()
        task = self._bar.add_task("replay", total=self.total)
        return lambda n: self._bar.advance(task, n)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


# -- reconcile ----------------------------------------------------------------------


@click.command()
@app_options
@click.option("--source", required=True, help="a source with a registered reconciler")
@click.option("--resource", "resources", multiple=True, help="resource id (repeatable)")
@click.option(
    "--all", "every", is_flag=True, help="every resource (the reconciler's list, or known ones)"
)
@click.option("--requested", is_flag=True, help="resources handlers asked to reconcile")
@click.option("--concurrency", type=int, default=None, help="fetches at once")
@json_option
def reconcile(
    target: Target,
    source: str,
    resources: tuple[str, ...],
    every: bool,
    requested: bool,
    concurrency: int | None,
    as_json: bool,
) -> None:
    """Compare stored state with the provider's and repair divergences.

    Needs --app naming a Relaybox on which relaybox.inbound.reconcile.register(box, SOURCE,
    fetch) declared how to read the provider's current state.
    """
    from relaybox.inbound.reconcile import reconciler_for

    if not (resources or every or requested):
        raise click.UsageError("choose --resource ID (repeatable), --all or --requested")
    box = target.load_logging()
    reconciler = reconciler_for(box, source)
    if reconciler is None:
        raise click.UsageError(
            f"no reconciler for source {source!r}: call relaybox.inbound.reconcile.register(box, "
            f"{source!r}, fetch) in the module named by --app"
        )
    if concurrency is not None:
        if concurrency < 1:
            raise click.UsageError("--concurrency must be at least 1")
        reconciler.concurrency = concurrency

    async def run() -> dict[str, Any]:
        try:
            report = await reconciler.run(resources, every=every, requested=requested)
            return report.as_dict()
        finally:
            await box.close()

    out = run_db(box, run())
    if as_json:
        click.echo(json.dumps(out))
    else:
        _print_table(
            f"reconcile {source}",
            [(k, out[k]) for k in ("checked", "in_sync", "repaired", "superseded", "failed")],
        )
        for key in out["divergences"]:
            click.echo(f"repaired: {key}")
        for key, error in out["failures"].items():
            click.echo(f"failed: {key}: {error}", err=True)
    if out["failed"]:
        sys.exit(EXIT_FAILED)


# -- recover ------------------------------------------------------------------------


@click.command()
@app_options
@click.option("--source", required=True, help="the source whose deliveries to recover")
@click.option("--since", required=True, help=f"delivered at or after: {TIME_FORMS}")
@click.option("--repo", default=None, help="GitHub: owner/name of the repository hook")
@click.option("--org", default=None, help="GitHub: organization of the org hook")
@click.option("--hook-id", default=None, help="GitHub: the hook's id")
@click.option("--app-hook", is_flag=True, help="GitHub: the App's hook (token: an App JWT)")
@click.option("--api-url", default="https://api.github.com", show_default=True, help="GitHub's API")
@click.option(
    "--token-env",
    default="GITHUB_TOKEN",
    show_default=True,
    help="environment variable holding the API token (never pass it as an argument)",
)
@click.option(
    "--mode",
    type=click.Choice(["ingest", "redeliver"]),
    default="ingest",
    show_default=True,
    help="ingest: fetch missing deliveries from the API; redeliver: ask the provider to resend",
)
@click.option("--account", default=None, help="account of recovered deliveries (override)")
@click.option("--tenant", default=None, help="tenant of recovered deliveries (override)")
@click.option("--dry-run", is_flag=True, help="list missing deliveries, change nothing")
@json_option
def recover(
    target: Target,
    source: str,
    since: str,
    repo: str | None,
    org: str | None,
    hook_id: str | None,
    app_hook: bool,
    api_url: str,
    token_env: str,
    mode: str,
    account: str | None,
    tenant: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Find deliveries the provider made that never reached the inbox, and bring them in.

    For providers that do not retry (GitHub). Running it twice changes nothing.
    """
    from relaybox.inbound.recovery import DeliveryLog, GitHubDeliveries, log_for, recover

    box = target.load_logging()
    if source not in box.sources:
        raise click.UsageError(f"no source named {source!r} (configured: {', '.join(box.sources)})")
    start = parse_time(since, time.time())
    factory = log_for(box, source)
    if repo or org or app_hook:
        token = os.environ.get(token_env, "")
        if not token:
            raise click.UsageError(f"set {token_env} to an API token that can read the hook")
        try:
            GitHubDeliveries(
                token=token, repo=repo, org=org, hook_id=hook_id, app=app_hook, api_url=api_url
            )
        except ConfigurationError as exc:
            raise click.UsageError(str(exc)) from None

        def factory() -> DeliveryLog:
            return GitHubDeliveries(
                token=token, repo=repo, org=org, hook_id=hook_id, app=app_hook, api_url=api_url
            )

    elif factory is None:
        raise click.UsageError(
            "say where the deliveries are listed: --repo OWNER/NAME --hook-id N, --org ORG "
            "--hook-id N or --app-hook (or relaybox.inbound.recovery.register in --app)"
        )
    assert factory is not None

    async def run() -> dict[str, Any]:
        deliveries = factory()
        try:
            report = await recover(
                box,
                source,
                deliveries,
                since=start,
                mode=mode,  # type: ignore[arg-type]
                dry_run=dry_run,
                account=account,
                tenant=tenant,
            )
            return report.as_dict()
        finally:
            await deliveries.close()
            await box.close()

    try:
        out = run_db(box, run())
    except Exception as exc:
        from relaybox.inbound.recovery import RecoveryError

        if isinstance(exc, RecoveryError):
            raise CliError(f"recovery failed: {exc}", code="recovery_failed") from None
        raise
    if as_json:
        click.echo(json.dumps(out))
    else:
        _print_table(
            f"recover {source} ({mode}{', dry run' if dry_run else ''})",
            [
                ("listed", out["listed"]),
                ("already in the inbox", out["present"]),
                ("missing", len(out["missing"])),
                ("ingested", len(out["ingested"])),
                ("redelivery requested", len(out["redelivery_requested"])),
                ("failed", len(out["failed"])),
            ],
        )
        for event_id, error in out["failed"].items():
            click.echo(f"failed: {event_id}: {error}", err=True)
    if out["failed"]:
        sys.exit(EXIT_FAILED)


COMMANDS = [replay, reconcile, recover]
