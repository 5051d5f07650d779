"""The dispatcher's retry policy, :class:`Schedule` (an explicit list of delays, jitter,
``Retry-After``), and :func:`parse_retry_after`: both live in :mod:`relaybox.retry`, the
one retry engine of the inbox and the outbox, and are importable from here too."""

from __future__ import annotations

from relaybox.retry import Schedule, parse_retry_after

__all__ = ["Schedule", "parse_retry_after"]
