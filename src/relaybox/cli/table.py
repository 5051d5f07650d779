"""Rich tables for people at any terminal width: identifiers and times are never cut
(a truncated ``evt_te…`` cannot be pasted into the next command); free text wraps."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["keep_whole"]


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
