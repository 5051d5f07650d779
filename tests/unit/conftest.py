"""The unit tier: pure code, no database and no server, so that
``pytest tests/unit`` runs in seconds (and starts no PostgreSQL)."""

from __future__ import annotations

import pytest

_NEEDS_A_DATABASE = {"database_url", "pg_url", "box", "served"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        wanted = _NEEDS_A_DATABASE.intersection(getattr(item, "fixturenames", ()))
        if wanted and "tests/unit/" in item.nodeid:
            raise pytest.UsageError(
                f"{item.nodeid} uses {sorted(wanted)}: a unit test takes no database; "
                "move it to tests/integration or tests/store"
            )
