"""The one table printer of the ``relaybox`` command: readable at any terminal width,
80 columns included. Identifiers and times are never cut (a truncated ``evt_te…``
cannot be pasted into the next command): their columns keep their cells whole, free
text folds onto more lines, and when the whole columns alone do not fit, the columns
named as least useful are left out, in the order given."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["keep_whole", "print_pairs", "print_table"]

_FOLDED_MIN = 5
"""The narrowest a folding column gets before columns are dropped instead."""


def keep_whole(table: Any, names: Iterable[str]) -> Any:
    """Columns headed by one of ``names`` keep their cells on one line, as wide as the
    longest; every other column folds its text onto more lines instead of cutting it."""
    wanted = set(names)
    for column in table.columns:
        if str(column.header) in wanted:
            widths = [len(str(column.header)), *(len(str(c)) for c in column.cells)]
            column.no_wrap = True
            column.min_width = max(widths)
        else:
            column.overflow = "fold"
    return table


def _needed(columns: Sequence[str], rows: Sequence[Sequence[str]], whole: set[str]) -> int:
    """The narrowest the table can be drawn with ``whole`` columns uncut: their longest
    cell, the others folded to a few characters, plus borders and padding."""
    width = 1
    for i, name in enumerate(columns):
        if name in whole:
            width += max([len(name), *(len(r[i]) for r in rows)]) + 3
        else:
            width += _FOLDED_MIN + 3
    return width


def print_table(
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    title: str | None = None,
    whole: Iterable[str] = (),
    drop: Sequence[str] = (),
    width: int | None = None,
) -> None:
    """Print ``rows`` under ``columns`` (``None`` shows as ``-``). ``whole``: columns
    never cut or wrapped (ids, times); ``drop``: columns left out, first to last, while
    the table does not fit the terminal (``width`` overrides its width)."""
    from rich.console import Console
    from rich.table import Table

    console = Console() if width is None else Console(width=width)
    keep = set(whole)
    shown = list(columns)
    cells = [["-" if v is None else str(v) for v in row] for row in rows]
    for name in drop:
        if _needed(shown, _project(columns, shown, cells), keep) <= console.width:
            break
        if name in shown:
            shown.remove(name)
    table = Table(*shown, title=title)
    for row in _project(columns, shown, cells):
        table.add_row(*row)
    keep_whole(table, keep)
    console.print(table)


def _project(
    columns: Sequence[str], shown: Sequence[str], cells: Sequence[Sequence[str]]
) -> list[list[str]]:
    index = [list(columns).index(c) for c in shown]
    return [[row[i] for i in index] for row in cells]


def print_pairs(title: str, pairs: Iterable[tuple[str, Any]], *, width: int | None = None) -> None:
    """Print ``name: value`` lines as a two-column table without header; values fold."""
    from rich.console import Console
    from rich.table import Table

    console = Console() if width is None else Console(width=width)
    table = Table("", "", title=title, show_header=False)
    for key, value in pairs:
        table.add_row(key, "-" if value is None else str(value))
    table.columns[0].no_wrap = True
    table.columns[1].overflow = "fold"
    console.print(table)
