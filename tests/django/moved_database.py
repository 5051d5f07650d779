"""A Django process whose box synchronous code used on one database (``a``) before
the box was pointed at another (``b``), as a test runner's test database replaces the
project's: ``python tests/django/moved_database.py <folder>`` prints the schema version
relaybox reads afterwards (``a`` is migrated, ``b`` is empty: 0 means it followed).
Run alone, so that no coroutine of relaybox's has run in the process before."""

from __future__ import annotations

import asyncio
import sys

from django.conf import settings

import django
from relaybox.store import open_store


async def _migrate(url: str) -> None:
    store = open_store(url)
    await store.migrate()
    await store.close()


def main(folder: str) -> None:
    databases = {
        name: {"ENGINE": "django.db.backends.sqlite3", "NAME": f"{folder}/{name}.db"}
        for name in ("default", "a", "b")
    }
    settings.configure(
        DATABASES=databases,
        INSTALLED_APPS=["relaybox.contrib.django"],
        RELAYBOX={},
        RELAYBOX_DATABASE="a",
        USE_TZ=True,
    )
    django.setup()
    asyncio.run(_migrate(f"sqlite:///{folder}/a.db"))

    from relaybox.contrib.django import get_box
    from relaybox.contrib.django.portal import run

    assert get_box().store.sync is not None  # synchronous code made the store
    settings.RELAYBOX_DATABASE = "b"
    current, _ = run(get_box().store.schema_version())
    print(current)


if __name__ == "__main__":
    main(sys.argv[1])
