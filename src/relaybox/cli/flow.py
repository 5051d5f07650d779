"""``relaybox endpoints`` commands of an endpoint's flow: ``disable``, ``enable`` and
``recover`` (an operator's actions, with ``--reason`` and ``--actor``, through
:mod:`relaybox.ops.outbound` as the admin API's and the dashboard's), ``pause``,
``resume``, ``replay-missing``, and the ``--filter`` option of ``create`` and ``update`` (a
payload filter as JSON text, :mod:`relaybox.outbound.filters`).

They join the ``endpoints`` group of :mod:`relaybox.cli.outbound` (this module is one
of the CLI's area modules, loaded after it), and act on any tenant's endpoint by id (the
CLI is the operator's).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import click

from relaybox.app import Relaybox
from relaybox.cli.common import Target, action_options, app_options, json_option
from relaybox.cli.grammar import CliError
from relaybox.cli.ops import _act
from relaybox.cli.outbound import _endpoint, _run, endpoint_action, endpoints_group
from relaybox.errors import Conflict
from relaybox.ops import outbound as ops
from relaybox.ops.outbound_models import EndpointActionResult
from relaybox.outbound import flow, replays
from relaybox.store.outbox_flow import ReplayJob
from relaybox.timespec import TIME_FORMS, parse_time, parse_time_or_none

__all__ = ["COMMANDS"]


def register_switches(group: click.Group) -> None:
    """Add ``disable``, ``enable`` and ``recover`` to the ``endpoints`` group."""

    def switch(
        name: str,
        help_text: str,
        recorded: str,
        action: Callable[..., Awaitable[EndpointActionResult]],
    ) -> None:
        @group.command(name, help=help_text)
        @app_options
        @click.argument("endpoint_id")
        @action_options(recorded)
        def command(
            target: Target, endpoint_id: str, reason: str, actor: str | None, as_json: bool
        ) -> None:
            _act(
                target,
                actor,
                as_json,
                lambda box, who: action(box, endpoint_id, actor=who, reason=reason),
                lambda done, _: done.message,
            )

    switch(
        "disable",
        "Disable an endpoint; its waiting deliveries become dead letters.",
        "as the endpoint's disabled reason",
        ops.endpoint_disable,
    )
    switch(
        "enable",
        "Enable an endpoint (dead letters stay dead: see recover).",
        "in the log and the relaybox.endpoint.enabled event",
        ops.endpoint_enable,
    )

    @group.command("recover")
    @app_options
    @click.argument("endpoint_id")
    @click.option("--since", required=True, help=f"dead deliveries created since: {TIME_FORMS}")
    @click.option("--until", default=None, help="created before (as --since)")
    @action_options("in the log")
    def recover(
        target: Target,
        endpoint_id: str,
        since: str,
        until: str | None,
        reason: str,
        actor: str | None,
        as_json: bool,
    ) -> None:
        """Retry every dead delivery of an enabled endpoint created since a time."""
        now = time.time()
        start, end = parse_time(since, now), parse_time_or_none(until, now)
        _act(
            target,
            actor,
            as_json,
            lambda box, who: ops.endpoint_recover(
                box, endpoint_id, since=start, until=end, actor=who, reason=reason
            ),
            lambda done, _: done.message,
        )


def register(group: click.Group) -> None:
    """Add ``pause``, ``resume`` and ``replay-missing`` to the ``endpoints`` group."""

    def switch(name: str, help_text: str, paused: bool) -> None:
        async def act(box: Relaybox, endpoint_id: str) -> dict[str, Any]:
            before = await _endpoint(box, endpoint_id)
            action = flow.pause_endpoint if paused else flow.resume_endpoint
            await action(box, endpoint_id, tenant=None)
            backlog = (await box.store.outbox.endpoint_backlog()).get(endpoint_id)
            return {
                "endpoint": endpoint_id,
                "action": name,
                "changed": (before.paused_at is None) == paused,
                "waiting": backlog.pending if backlog else 0,
            }

        def say(endpoint_id: str, done: dict[str, Any]) -> str:
            if not done["changed"]:
                return f"{endpoint_id}: unchanged (already {'paused' if paused else 'running'})"
            return f"{endpoint_id}: {name}d, {done['waiting']} deliveries waiting"

        endpoint_action(group, name, help_text, act, say)

    switch(
        "pause",
        "Pause an endpoint: its deliveries (and new ones) wait, never dead-lettered.",
        True,
    )
    switch("resume", "Resume a paused endpoint: its deliveries go out in publish order.", False)

    @group.command("replay-missing")
    @app_options
    @click.argument("endpoint_id")
    @click.option("--since", required=True, help=f"messages published since: {TIME_FORMS}")
    @click.option("--limit", type=click.IntRange(min=1), default=None, help="queue at most")
    @click.option(
        "--wait/--no-wait",
        default=True,
        show_default=True,
        help="run the job here until it ends (or wait for the dispatcher running it); "
        "--no-wait: queue it for a dispatcher and print its id",
    )
    @json_option
    def replay_missing(
        target: Target,
        endpoint_id: str,
        since: str,
        limit: int | None,
        wait: bool,
        as_json: bool,
    ) -> None:
        """Deliver the messages since a time that an endpoint's subscription matches
        but that it never got (published while it was disabled, or before it existed).
        Each once, however often this runs. A job: one per endpoint at a time."""
        box = target.load()
        start = parse_time(since, time.time())

        async def act() -> ReplayJob:
            await _endpoint(box, endpoint_id)
            try:
                job = await replays.start_replay(
                    box, endpoint_id, since=start, tenant=None, limit=limit
                )
            except Conflict as exc:
                raise CliError(exc.message, code=exc.code) from None
            assert job is not None  # _endpoint found it
            return await replays.run_replay(box, job.id) if wait else job

        done = _run(box, act)
        if as_json:
            click.echo(json.dumps(replays.job_json(done)))
        elif done.status == "queued":
            click.echo(f"replay job {done.id} queued: a dispatcher runs it")
        elif done.status == "done":
            click.echo(
                f"{done.queued} missing deliveries queued ({done.scanned} messages read; "
                f"job {done.id})"
            )
            if done.resume_since is not None:
                click.echo(f"more may remain: run again with --since {done.resume_since}")
        if done.status == "failed":
            raise CliError(f"replay job {done.id} failed: {done.error}", code="replay_failed")


register_switches(endpoints_group)
register(endpoints_group)

COMMANDS: list[click.Command] = []  # the commands join ``endpoints`` above
