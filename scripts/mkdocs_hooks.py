"""MkDocs hooks (``hooks:`` in mkdocs.yml): the CLI reference page's command list is
``relaybox COMMAND --help`` of every command, read from the click commands when the
site is built, so it cannot fall behind the code; and the Sphinx roles of docstrings
(``:meth:`publish```) read as plain code on the API page."""

from __future__ import annotations

import re
from typing import Any

import click

MARKER = "<!-- relaybox --help of every command -->"
ROLE = re.compile(r":(?:attr|class|data|exc|func|meth|mod|obj):(?=<code>)")


def _context(command: click.Command, parent: click.Context | None, name: str) -> click.Context:
    """The context ``relaybox … name --help`` would print from (its settings too)."""
    return command.make_context(
        name, [], parent=parent, resilient_parsing=True, max_content_width=88
    )


def _sections(
    command: click.Command, parent: click.Context | None, name: str, path: str, level: int
) -> list[str]:
    ctx = _context(command, parent, name)
    out = [f"{'#' * level} `{path}`", "", "```text", ctx.get_help(), "```", ""]
    if isinstance(command, click.Group):
        for sub in command.list_commands(ctx):
            child = command.get_command(ctx, sub)
            if child is not None and not child.hidden:
                out += _sections(child, ctx, sub, f"{path} {sub}", min(level + 1, 4))
    return out


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from relaybox.cli import main

    root = _context(main, None, "relaybox")
    blocks: list[str] = []
    for name in main.list_commands(root):
        command = main.get_command(root, name)
        if command is not None and not command.hidden:
            blocks += _sections(command, root, name, f"relaybox {name}", 2)
    return markdown.replace(MARKER, "\n".join(blocks))


def on_page_content(html: str, page: Any, **_: Any) -> str:
    return ROLE.sub("", html)
