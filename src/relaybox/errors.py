"""Exceptions raised by relaybox.

    RelayboxError
    ├── RejectedDelivery            an inbound delivery refused with an HTTP status
    │   ├── BadSignature            401: missing, malformed or non-matching signature
    │   ├── StaleTimestamp          401: timestamp outside the source's tolerance
    │   ├── MalformedHeaders        400: a required header is missing or unparsable
    │   ├── MalformedPayload        400: body is not the JSON the source expects
    │   └── PayloadTooLarge         413: body over the source's limit
    ├── StoreUnavailable            the database could not be reached or a commit's
    │                               outcome is unknown (receiver answers 503)
    ├── ConfigurationError          invalid settings or source definitions
    ├── PermanentError              raised by a handler: the event can never succeed
    │                               (validation, ineligible); goes to dead letters "invalid"
    └── OperationConflict           ctx.once(): the business key exists with another
                                    fingerprint (a different operation reuses the key)

Any other exception raised by a handler is transient and retried within the budget.
"""

from __future__ import annotations

import re

__all__ = [
    "TABLES_MISSING",
    "BadSignature",
    "ConfigurationError",
    "MalformedHeaders",
    "MalformedPayload",
    "OperationConflict",
    "PayloadTooLarge",
    "PermanentError",
    "RejectedDelivery",
    "RelayboxError",
    "StaleTimestamp",
    "StoreUnavailable",
    "tables_missing",
]

TABLES_MISSING = "relaybox tables missing: run `relaybox migrate`"
"""What the receiver answers (503) and logs when the schema was never migrated."""

_MISSING_TABLE = re.compile(r"no such table: relaybox_\w+|relation \"relaybox_\w+\" does not exist")


def tables_missing(exc: BaseException) -> bool:
    """Whether ``exc`` says one of relaybox's tables does not exist (SQLite's and
    PostgreSQL's wording): the database answers, but was never migrated."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _MISSING_TABLE.search(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False


class RelayboxError(Exception):
    """Base class of every relaybox exception."""


class RejectedDelivery(RelayboxError):
    """An inbound delivery that relaybox refuses; carries the HTTP answer.

    ``message`` is shown to the sender: it must never contain a secret or an
    expected signature.
    """

    status: int = 400
    code: str = "rejected"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class BadSignature(RejectedDelivery):
    status = 401
    code = "bad_signature"


class StaleTimestamp(RejectedDelivery):
    status = 401
    code = "stale_timestamp"


class MalformedHeaders(RejectedDelivery):
    status = 400
    code = "malformed_headers"


class MalformedPayload(RejectedDelivery):
    status = 400
    code = "malformed_payload"


class PayloadTooLarge(RejectedDelivery):
    status = 413
    code = "payload_too_large"


class StoreUnavailable(RelayboxError):
    """The database is unreachable, or a commit's outcome is uncertain."""


class ConfigurationError(RelayboxError):
    """Settings or source definitions that cannot work."""


class PermanentError(RelayboxError):
    """Raised by a handler for an event that can never succeed.

    The event goes to dead letters with reason ``invalid`` and this message.
    """


class OperationConflict(RelayboxError):
    """A business key already exists for a different operation (other fingerprint)."""

    def __init__(self, business_key: str, stored: str, given: str) -> None:
        super().__init__(
            f"business key {business_key!r} already recorded with fingerprint {stored!r}, "
            f"not {given!r}: a different operation is reusing this key"
        )
        self.business_key = business_key
        self.stored = stored
        self.given = given
