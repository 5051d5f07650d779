"""The ``relaybox`` command.

Exit codes: 0 success, 1 the operation failed, 2 usage or configuration error,
3 the database is unreachable, 4 relaybox's tables are missing or behind (run
``relaybox migrate``), 5 (``doctor``) endpoint signing secrets are not protected at
rest (no key on PostgreSQL, a key file others can read).
"""

from __future__ import annotations

from relaybox.cli.common import load_box
from relaybox.cli.root import main

__all__ = ["load_box", "main"]
