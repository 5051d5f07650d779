"""A readable, stable description of relaybox's tables as a database holds them
(columns, indexes, constraints, sequences on PostgreSQL; the stored ``CREATE``
statements on SQLite), used to compare one database's schema with another's or with
the committed ``src/relaybox/store/schema/<backend>.txt``.

``python -m tests.support.schema --write`` migrates a fresh database on each backend
(PostgreSQL from ``RELAYBOX_TEST_DATABASE_URL``) and rewrites the committed files.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

COMMITTED = Path(__file__).parents[2] / "src" / "relaybox" / "store" / "schema"

_HEADER = (
    "# relaybox's {backend} schema once every migration in "
    "src/relaybox/store/migrations/{backend} has run.\n"
    "# Written by `python -m tests.support.schema --write`; tests/store/test_schema.py fails\n"
    "# when replaying the migrations gives anything else.\n"
)

_PG_COLUMNS = """
SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       pg_get_expr(d.adbin, d.adrelid)
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND c.relname LIKE 'relaybox%'
  AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY c.relname, a.attnum
"""
_PG_INDEXES = """
SELECT tablename, indexdef FROM pg_indexes
WHERE schemaname = current_schema() AND tablename LIKE 'relaybox%'
ORDER BY tablename, indexname
"""
_PG_CONSTRAINTS = """
SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
WHERE connamespace = current_schema()::regnamespace AND conrelid::regclass::text LIKE 'relaybox%'
ORDER BY 1, 2
"""
_PG_SEQUENCES = """
SELECT sequence_name, data_type FROM information_schema.sequences
WHERE sequence_schema = current_schema() AND sequence_name LIKE 'relaybox%'
ORDER BY 1
"""


def describe_postgres(cursor: Any) -> str:
    """The schema of the database ``cursor`` (a DB-API cursor) is connected to."""
    lines: list[str] = []
    table = None
    cursor.execute(_PG_COLUMNS)
    for name, column, type_, not_null, default in cursor.fetchall():
        if name != table:
            lines.append(f"table {name}")
            table = name
        spec = f"  {column} {type_}" + (" NOT NULL" if not_null else "")
        lines.append(spec + (f" DEFAULT {default}" if default is not None else ""))
    cursor.execute(_PG_CONSTRAINTS)
    lines += [f"constraint {t}.{name}: {d}" for t, name, d in cursor.fetchall()]
    cursor.execute(_PG_INDEXES)
    lines += [f"index {d}" for _, d in cursor.fetchall()]
    cursor.execute(_PG_SEQUENCES)
    lines += [f"sequence {name} {type_}" for name, type_ in cursor.fetchall()]
    return "\n".join(lines) + "\n"


def describe_sqlite(cursor: Any) -> str:
    """The schema of the SQLite database ``cursor`` (a DB-API cursor) reads."""
    cursor.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE name LIKE 'relaybox%' "
        "ORDER BY CASE type WHEN 'table' THEN 0 ELSE 1 END, tbl_name, name"
    )
    lines = []
    for type_, name, sql in cursor.fetchall():
        lines.append(f"{type_} {name}: {' '.join((sql or '(automatic)').split())}")
    return "\n".join(lines) + "\n"


def committed(backend: str) -> str:
    text = (COMMITTED / f"{backend}.txt").read_text()
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))


def migrated_sqlite() -> str:
    """The schema a fresh SQLite database has once relaybox migrated it."""
    from relaybox.store import open_store

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "schema.db"
        store = open_store(f"sqlite:///{path}")
        asyncio.run(store.migrate())
        asyncio.run(store.close())
        with sqlite3.connect(path) as db:
            return describe_sqlite(db.cursor())


def migrated_postgres(url: str) -> str:
    """The schema of the PostgreSQL database at ``url`` (already migrated)."""
    import psycopg
    from sqlalchemy.engine import make_url

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as db:
        return describe_postgres(db.cursor())


def _write() -> None:
    from tests.conftest import create_pg_database, drop_pg_database

    url = asyncio.run(create_pg_database())
    try:
        described = {"postgres": migrated_postgres(url), "sqlite": migrated_sqlite()}
    finally:
        asyncio.run(drop_pg_database(url))
    for backend, text in described.items():
        (COMMITTED / f"{backend}.txt").write_text(_HEADER.format(backend=backend) + text)
        print(f"wrote {COMMITTED / f'{backend}.txt'}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.support.schema --write")
    _write()
