"""The one error → exit-code map of the ``relaybox`` command (relaybox.cli.exits)."""

from __future__ import annotations

import sqlite3

import pytest

from relaybox.cli.exits import exit_code_for
from relaybox.errors import (
    ConfigurationError,
    Conflict,
    InvalidRequest,
    InvalidTimeSpec,
    NotFound,
    StoreUnavailable,
)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (NotFound("no inbox event 9"), 1),
        (Conflict("not a dead letter", code="not_dead"), 1),
        (InvalidRequest("cursor is not one this API returned"), 1),
        (InvalidTimeSpec("'soon' is not a time"), 2),
        (ConfigurationError("unsupported database URL"), 2),
        (StoreUnavailable("gone"), 3),
        (ConnectionRefusedError(111, "refused"), 3),
        (sqlite3.OperationalError("no such table: relaybox_inbox"), 3),
        (RuntimeError("a bug"), None),
        (KeyError("x"), None),
    ],
)
def test_exit_code_for(exc: BaseException, code: int | None) -> None:
    assert exit_code_for(exc) == code
