"""What each exit code of ``relaybox`` means, and which errors map to which: the one
place every command's runner asks.

===  ==================================================================================
0    success
1    the operation failed: not found, wrong state, a failed check
2    usage or configuration: a bad option or time, invalid settings, an unsupported URL
3    the database is unreachable (or answered with an error of its own)
4    relaybox's tables are missing or migrations are pending (``doctor``)
5    endpoint signing secrets are not protected at rest (``doctor``)
6    this host's clock is more than ``clock_max_skew`` from the database's (``doctor``)
===  ==================================================================================
"""

from __future__ import annotations

from relaybox.errors import ConfigurationError, InvalidTimeSpec, OpsError, StoreUnavailable

__all__ = [
    "EXIT_CLOCK",
    "EXIT_DATABASE",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_SCHEMA",
    "EXIT_SECRETS",
    "EXIT_USAGE",
    "exit_code_for",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DATABASE = 3
EXIT_SCHEMA = 4
EXIT_SECRETS = 5
EXIT_CLOCK = 6

_DRIVERS = ("sqlalchemy", "asyncpg", "sqlite3", "aiosqlite")


def exit_code_for(exc: BaseException) -> int | None:
    """The exit code ``exc`` means when a command's operation raised it; ``None`` for
    an error no code describes (a bug: it propagates with its traceback)."""
    if isinstance(exc, InvalidTimeSpec | ConfigurationError):
        return EXIT_USAGE
    if isinstance(exc, OpsError):
        return EXIT_FAILED
    if isinstance(exc, StoreUnavailable | OSError | ConnectionError):
        return EXIT_DATABASE
    if type(exc).__module__.startswith(_DRIVERS):
        return EXIT_DATABASE
    return None
