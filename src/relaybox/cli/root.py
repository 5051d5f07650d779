"""The ``relaybox`` command group: every area's commands registered on first use, and
``--json`` failures as one JSON document."""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import click

from relaybox.errors import InvalidTimeSpec

__all__ = ["main"]


class _AreaGroup(click.Group):
    """Registers the area modules' commands on first use."""

    _areas_loaded = False

    def _load_areas(self) -> None:
        if not self._areas_loaded:
            self._areas_loaded = True
            _register_area_commands(self)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load_areas()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._load_areas()
        return super().get_command(ctx, cmd_name)

    def main(self, args: Any = None, *pos: Any, **kwargs: Any) -> Any:
        """With ``--json``, every failure is one JSON document on stdout too,
        ``{"error": code, "message": sentence}`` (its sentence also on stderr as
        ``Error: …``), whether click, the command or the database raised it."""
        argv = list(sys.argv[1:] if args is None else args)
        wants_json = "--json" in argv[: argv.index("--")] if "--" in argv else "--json" in argv
        if not wants_json or kwargs.get("standalone_mode") is False:
            return super().main(argv, *pos, **kwargs)
        kwargs["standalone_mode"] = False
        try:
            result = super().main(argv, *pos, **kwargs)
        except click.ClickException as exc:
            from relaybox.cli.grammar import error_code

            click.echo(json.dumps({"error": error_code(exc), "message": exc.format_message()}))
            click.echo(f"Error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo(json.dumps({"error": "aborted", "message": "aborted"}))
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        """A time or duration in none of the accepted forms is a usage error (exit 2),
        whichever command parsed it (relaybox.timespec)."""
        try:
            return super().invoke(ctx)
        except InvalidTimeSpec as exc:
            raise click.BadParameter(exc.message) from None


@click.group(cls=_AreaGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="relaybox")
def main() -> None:
    """relaybox: reliable webhooks in both directions, inside your own database."""


# Commands of each area live in their own module (``COMMANDS``: a list of click
# commands), loaded when the command line is parsed, so areas grow without editing
# this file.
_AREA_MODULES = (
    "relaybox.cli.serve",
    "relaybox.cli.outbound",
    "relaybox.cli.messages",
    "relaybox.cli.flow",
    "relaybox.cli.credentials",
    "relaybox.cli.ordered",
    "relaybox.cli.ordering",
    "relaybox.cli.ops",
    "relaybox.cli.maintenance",
    "relaybox.cli.doctor",
    "relaybox.cli.portal",
)


def _register_area_commands(group: click.Group) -> None:
    for module_name in _AREA_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        for command in module.COMMANDS:
            group.add_command(command)
