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
    ├── OperationConflict           ctx.once(): the business key exists with another
    │                               fingerprint (a different operation reuses the key)
    ├── OpsError                    an operator request (admin API, dashboard, CLI) that
    │   │                           cannot be carried out; carries its HTTP answer
    │   ├── InvalidRequest          400 invalid_request: a parameter out of its bounds
    │   │   └── InvalidTimeSpec     400: a time or duration in none of the accepted forms
    │   │                           (relaybox.timespec); the CLI exits 2 on it
    │   ├── NotFound                404 not_found: no such event, entry or endpoint
    │   └── Conflict                409: the row is not in the state the action needs
    │                               (its code says which: not_dead, resolved, ...)
    ├── PublishLimited              a tenant over its publish rate, however it sends
    │                               (relaybox.outbound.registry; the API and portal: 429)
    └── ApiError                    the tenant API's answer to a request it refuses
                                    (relaybox.outbound.api; status and code it carries)

Any other exception raised by a handler is transient and retried within the budget.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "TABLES_MISSING",
    "BadSignature",
    "ConfigurationError",
    "Conflict",
    "InvalidRequest",
    "InvalidTimeSpec",
    "MalformedHeaders",
    "MalformedPayload",
    "NotFound",
    "NotInTransaction",
    "OperationConflict",
    "OpsError",
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


class Answered:
    """An error that carries its HTTP answer: ``status`` and ``code``. A subclass
    names its own as class keywords (``class NotFound(OpsError, status=404,
    code="not_found")``)."""

    status: int
    code: str

    def __init_subclass__(
        cls, *, status: int | None = None, code: str | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if code is not None:
            cls.code = code


class RejectedDelivery(Answered, RelayboxError):
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


class BadSignature(RejectedDelivery, status=401, code="bad_signature"):
    """No signature of the delivery verifies with the source's secrets (401)."""


class StaleTimestamp(RejectedDelivery, status=401, code="stale_timestamp"):
    """The delivery's signed timestamp is outside the source's tolerance (401)."""


class MalformedHeaders(RejectedDelivery, status=400, code="malformed_headers"):
    """Headers the source needs are missing or unreadable (400)."""


class MalformedPayload(RejectedDelivery, status=400, code="malformed_payload"):
    """A body the source cannot read, or one without the fields it needs (400)."""


class PayloadTooLarge(RejectedDelivery, status=413, code="payload_too_large"):
    """A body over the receiver's size limit (413)."""


class StoreUnavailable(RelayboxError):
    """The database is unreachable, or a commit's outcome is uncertain."""


class ConfigurationError(RelayboxError):
    """Settings or source definitions that cannot work."""


class NotInTransaction(RelayboxError):
    """A write that relaybox makes in the application's own transaction (publishing
    with Django's connection) was called outside one: it would commit apart from the
    change it belongs to. Call it inside the transaction (``transaction.atomic()``)."""


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


class OpsError(Answered, RelayboxError):
    """An operator request that cannot be carried out; ``code`` and ``status`` are
    what the admin API answers."""

    status = 400
    code = "invalid_request"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        # The dashboard's message code for this error when it is more specific than
        # ``code``; the API answers ``code`` and ``message``.
        self.hint = hint


class InvalidRequest(OpsError):
    """A parameter the operation cannot take (400)."""


class InvalidTimeSpec(InvalidRequest, ValueError):
    """A time or duration in none of the forms :mod:`relaybox.timespec` accepts."""

    def __init__(self, message: str) -> None:
        super().__init__(message, hint="bad_time")


class NotFound(OpsError, status=404, code="not_found"):
    """The event, entry or endpoint does not exist (404)."""


class Conflict(OpsError, status=409, code="conflict"):
    """The row is not in the state the action needs (409); ``code`` says which."""

    def __init__(self, message: str, *, code: str = "conflict") -> None:
        super().__init__(message)
        self.code = code
