"""Click parameter types shared by the CLI's commands."""

from __future__ import annotations

from typing import Any

import click

from relaybox.wire import parse_json

__all__ = ["FILTER"]


class _JsonObject(click.ParamType[dict[str, Any]]):
    """A JSON object given as text (``'{"data.country": "PT"}'``)."""

    name = "json"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, dict):
            return value
        try:
            parsed = parse_json(value)
        except (ValueError, RecursionError):  # NaN, Infinity and 1e999 too: not JSON
            self.fail(f"{value[:80]!r} is not JSON text", param, ctx)
        if not isinstance(parsed, dict):
            self.fail("a payload filter is a JSON object ({} removes it)", param, ctx)
        return parsed


FILTER = _JsonObject()
"""The type of ``--filter``."""
