"""The one grammar of the ``relaybox`` command (docs/operating.md, "CLI"): the options
every command spells the same way, how a command answers with ``--json``, and how an
error reads.

- ``--type`` is an event type, wherever one is taken (a filter, what to publish or
  send, what an endpoint subscribes to).
- ``--reason`` is always *why*: the text recorded with an action, required by every
  action that records one. A dead letter's cause is ``--dead-reason``.
- ``--actor`` is who asks; by default ``cli:LOGIN@HOST``, in every command.
- ``--since`` / ``--until`` take the times of :mod:`relaybox.timespec`.
- ``--json``: one JSON document on stdout, whatever happens. A list is
  ``{"items": [...]}`` (with ``next_cursor`` when it pages); a failure is
  ``{"error": code, "message": sentence}``, with the exit code of
  :mod:`relaybox.cli.exits`. Without ``--json`` a failure is ``Error: sentence`` on
  stderr and nothing on stdout.

Option names a release renamed still parse, hidden from ``--help``, with a warning on
stderr (:class:`GrammarOption`'s ``deprecated``).
"""

from __future__ import annotations

import getpass
import json
import socket
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from relaybox.cli.exits import EXIT_FAILED
from relaybox.timespec import TIME_FORMS

F = TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "CliError",
    "GrammarOption",
    "actor_option",
    "default_actor",
    "emit_list",
    "error_code",
    "reason_option",
    "type_option",
]


class CliError(click.ClickException):
    """A failure with a machine-readable ``code`` (the ``error`` of ``--json``) and its
    exit code."""

    def __init__(self, message: str, *, code: str = "failed", exit_code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code
        self.exit_code = exit_code  # type: ignore[misc]  # click's default is per class


def error_code(exc: click.ClickException) -> str:
    """The ``error`` of ``--json`` for ``exc``."""
    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, click.UsageError):
        return "usage"
    if exc.exit_code == 2:
        return "configuration"
    return "failed"


class GrammarOption(click.Option):
    """A click option that also answers to older names (``deprecated``): they parse as
    the option does, stay out of ``--help``, and warn on stderr when used."""

    def __init__(self, *args: Any, deprecated_names: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deprecated_names = tuple(deprecated_names)

    def _alias_dest(self, alias: str) -> str:
        return f"{self.name}\0{alias}"

    def add_to_parser(self, parser: Any, ctx: click.Context) -> None:
        super().add_to_parser(parser, ctx)
        action = "append" if self.multiple else "store"
        for alias in self.deprecated_names:
            if self.is_flag:
                parser.add_option(
                    obj=self,
                    opts=[alias],
                    dest=self._alias_dest(alias),
                    action="store_const",
                    const=self.flag_activation_value,
                )
            else:
                parser.add_option(
                    obj=self, opts=[alias], dest=self._alias_dest(alias), action=action, nargs=1
                )

    def consume_value(self, ctx: click.Context, opts: Any) -> Any:
        for alias in self.deprecated_names:
            dest = self._alias_dest(alias)
            if dest in opts:
                click.echo(f"Warning: {alias} is deprecated, use {self.opts[0]}", err=True)
                merged = dict(opts)
                value = merged.pop(dest)
                if self.multiple and self.name in merged:
                    value = [*merged[self.name], *value]
                merged[self.name] = value
                opts = merged
        return super().consume_value(ctx, opts)


def type_option(
    help_text: str, *, deprecated: Sequence[str] = (), **kwargs: Any
) -> Callable[[F], F]:
    """``--type``: an event type."""
    return click.option(
        "--type",
        "event_type",
        cls=GrammarOption,
        deprecated_names=deprecated,
        help=help_text,
        **kwargs,
    )


MAX_REASON_CHARS = 2000
"""``--reason``'s bound, the admin API's (``reason`` in its requests)."""
MAX_ACTOR_CHARS = 200
"""``--actor``'s bound, the admin API's (``actor``)."""


def _bounded(name: str, most: int) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A callback refusing (exit 2) an empty value or one over ``most`` characters."""

    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None and not 1 <= len(value) <= most:
            raise click.BadParameter(f"{name} takes 1 to {most:,} characters", ctx, param)
        return value

    return check


def reason_option(what: str, *, required: bool = True, **kwargs: Any) -> Callable[[F], F]:
    """``--reason``: why, recorded ``what`` (e.g. "with each retried event"): 1 to
    :data:`MAX_REASON_CHARS` characters."""
    return click.option(
        "--reason",
        cls=GrammarOption,
        required=required,
        help=f"why: recorded {what}",
        callback=_bounded("--reason", MAX_REASON_CHARS),
        **kwargs,
    )


def actor_option(fn: F) -> F:
    """``--actor``: who asks, recorded with the action (1 to :data:`MAX_ACTOR_CHARS`)."""
    return click.option(
        "--actor",
        help="who asks, recorded with it (default: cli:LOGIN@HOST)",
        callback=_bounded("--actor", MAX_ACTOR_CHARS),
    )(fn)


def since_options(what: str) -> Callable[[F], F]:
    """``--since`` and ``--until`` (optional): ``what`` at or after, before."""

    def add(fn: F) -> F:
        fn = click.option("--until", help=f"{what} before (as --since)")(fn)
        return click.option("--since", help=f"{what} at or after: {TIME_FORMS}")(fn)

    return add


def default_actor(actor: str | None) -> str:
    """``--actor``, else ``cli:LOGIN@HOST``."""
    if actor:
        return actor
    try:
        user = getpass.getuser()
    except Exception:  # no login name in some containers
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"


def emit_list(items: Sequence[Any], next_cursor: str | None = None, *, pages: bool = False) -> None:
    """A list as ``--json`` prints it: ``{"items": [...]}``, with ``next_cursor`` when
    the command ``pages``."""
    document: dict[str, Any] = {"items": list(items)}
    if pages:
        document["next_cursor"] = next_cursor
    click.echo(json.dumps(document, default=str))
