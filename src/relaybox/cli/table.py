"""The one table printer of the ``relaybox`` command: readable at any terminal width,
80 columns included. Identifiers and times are never cut (a truncated ``evt_te…``
cannot be pasted into the next command): their columns keep their cells whole, free
text folds onto more lines (never a header, nor a word as short as
:data:`_WORD`), and when the whole columns alone do not fit, the columns named as least
useful are left out, in the order given. Every time is printed by :func:`format_time`
(``2026-03-13 10:30:00Z``), the one format of the CLI's tables."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

__all__ = ["format_time", "keep_whole", "print_pairs", "print_table"]

_FOLDED_MIN = 5
"""The narrowest a folding column gets before columns are dropped instead."""

_WORD = 10
"""A folding column is at least as wide as its longest word up to this length: a
status such as ``disabled`` is never cut in two."""


def format_time(ts: float | None) -> str:
    """Epoch seconds as the tables print them: ``2026-03-13 10:30:00Z``; ``-`` for none."""
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _fold_min(header: str, cells: Iterable[str]) -> int:
    """The narrowest a folding column is drawn: its header whole, its words up to
    :data:`_WORD` characters whole."""
    words = [len(w) for c in cells for w in c.split() if len(w) <= _WORD]
    return max(len(header), _FOLDED_MIN, *words, 0)


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
            column.min_width = _fold_min(str(column.header), (str(c) for c in column.cells))
    return table


def _needed(columns: Sequence[str], rows: Sequence[Sequence[str]], whole: set[str]) -> int:
    """The narrowest the table can be drawn with ``whole`` columns uncut: their longest
    cell, the others folded to a few characters, plus borders and padding."""
    width = 1
    for i, name in enumerate(columns):
        if name in whole:
            width += max([len(name), *(len(r[i]) for r in rows)]) + 3
        else:
            width += _fold_min(name, (r[i] for r in rows)) + 3
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
    projected = _project(columns, shown, cells)
    for row in projected:
        table.add_row(*row)
    keep_whole(table, keep)
    widths = _widths(shown, projected, keep, console.width)
    if widths is not None:  # rich's own shrinking can push columns past the edge
        for column, width in zip(table.columns, widths, strict=True):
            column.width = width
    console.print(table)


def _widths(
    columns: Sequence[str], rows: Sequence[Sequence[str]], whole: set[str], total: int
) -> list[int] | None:
    """Each column's width (without padding) for a table ``total`` wide: whole columns
    their longest cell, folding ones at least :func:`_fold_min`, then the room left up
    to their longest cell; ``None`` when even that does not fit."""
    natural = [max([len(name), *(len(r[i]) for r in rows)]) for i, name in enumerate(columns)]
    widths = [
        natural[i] if name in whole else min(natural[i], _fold_min(name, (r[i] for r in rows)))
        for i, name in enumerate(columns)
    ]
    room = total - (1 + 3 * len(columns)) - sum(widths)
    if room < 0:
        return None
    # The room goes to the folding columns that need the least of it first: short
    # values (a type, a status) end whole, the long free text folds.
    folding = sorted(
        (i for i, name in enumerate(columns) if name not in whole),
        key=lambda i: natural[i] - widths[i],
    )
    for i in folding:
        given = min(room, natural[i] - widths[i])
        widths[i] += given
        room -= given
    return widths


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
