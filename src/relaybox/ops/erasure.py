"""Erasing a subject, for operators: the admin API's ``/erasures`` and ``relaybox
erase`` (:mod:`relaybox.erasure` does the work).

The admin API records the erasure and answers 202 with its id at once; the rows are
emptied by a task of this process, batch by batch (``erasure.batch`` rows of each
kind per transaction), and ``GET /erasures/{id}`` shows how far it got. An erasure
whose task ended with the process (or with the database) is resumed by the
maintenance job, as one still waiting for pending rows is.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Literal

import structlog
from pydantic import Field, model_validator

from relaybox.erasure import run_erasure, start_erasure
from relaybox.errors import NotFound
from relaybox.log import short_error
from relaybox.ops.inbound_models import RequestModel, _Model
from relaybox.sources.base import MAX_SUBJECT_CHARS
from relaybox.store.erasure import Erasure

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = [
    "ErasureList",
    "ErasureRecord",
    "ErasureRequest",
    "ErasureRows",
    "erasure_get",
    "erasure_list",
    "erasure_request",
]

log = structlog.get_logger("relaybox.erasure")

_TASKS: dict[tuple[int, int], asyncio.Task[Any]] = {}
"""The erasures this process runs now, by (box, erasure id): one task each."""


class ErasureRequest(RequestModel):
    subject: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_SUBJECT_CHARS,
        description="the subject's id as a source's subject path or a publish named it "
        "(a customer id): not stored, only its SHA-256",
    )
    tenant: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_SUBJECT_CHARS,
        description=(
            "a tenant: the events received for it (their quarantine entries, what their"
            " handlers added to the outbox) and every message published to it, its"
            " deliveries and answers"
        ),
    )
    reason: str = Field(
        min_length=1, max_length=1000, description="why (the request's reference): recorded"
    )
    actor: str | None = Field(
        None, min_length=1, max_length=200, description="who asks (default: admin-api)"
    )

    @model_validator(mode="after")
    def _one_of(self) -> ErasureRequest:
        if (self.subject is None) == (self.tenant is None):
            raise ValueError("name a subject or a tenant (one of them)")
        return self


class ErasureRows(_Model):
    inbox: int = Field(description="inbox events emptied (payload, headers, last error)")
    quarantine: int = Field(description="quarantine entries emptied")
    outbox: int = Field(description="deliveries emptied (payload, last error)")
    attempts: int = Field(
        description="delivery attempts whose response excerpt, headers and error went"
    )
    messages: int = Field(description="message bodies emptied")
    inbox_attempts: int = Field(description="handler attempts whose error text went")
    projections: int = Field(
        description="versioned projections whose state an event of the subject wrote, emptied"
    )


class ErasureRecord(_Model):
    id: int
    actor: str
    reason: str
    scope: Literal["subject", "tenant"]
    subject_digest: str | None = Field(description="SHA-256 of the subject (hex); never it")
    tenant: str | None
    created_at: float
    updated_at: float
    finished_at: float | None
    status: Literal["running", "waiting", "finished"] = Field(
        description="running: this process empties its rows now; waiting: rows of the "
        "subject were pending at its last run, the maintenance job empties them once "
        "they finish; finished: nothing of the subject is left"
    )
    waiting: int = Field(description="rows still pending at its last run")
    rows: ErasureRows


class ErasureList(_Model):
    items: list[ErasureRecord]


def _record(box: Runtime, erasure: Erasure) -> ErasureRecord:
    data = erasure.as_dict()
    task = _TASKS.get((id(box), erasure.id))
    if task is not None and not task.done():
        data["status"] = "running"
    return ErasureRecord.model_validate(data)


async def _run(box: Runtime, erasure_id: int) -> None:
    try:
        await run_erasure(box, erasure_id)
    except Exception as exc:  # the database went away: the maintenance job resumes it
        log.warning("erasure_failed", erasure_id=erasure_id, error=short_error(exc))
    finally:
        _TASKS.pop((id(box), erasure_id), None)


async def erasure_request(box: Runtime, req: ErasureRequest, *, actor: str) -> ErasureRecord:
    """Record the erasure (or find the same one still waiting) and start emptying its
    rows in a task of this process; the record as it is now."""
    erasure, _ = await start_erasure(
        box, subject=req.subject, tenant=req.tenant, actor=actor, reason=req.reason
    )
    key = (id(box), erasure.id)
    if key not in _TASKS:
        _TASKS[key] = asyncio.get_running_loop().create_task(
            _run(box, erasure.id), name=f"relaybox-erasure-{erasure.id}"
        )
    return _record(box, erasure)


async def erasure_get(box: Runtime, erasure_id: int) -> ErasureRecord:
    erasure = await box.store.erasure.get(erasure_id)
    if erasure is None:
        raise NotFound(f"no erasure {erasure_id}")
    return _record(box, erasure)


async def erasure_list(box: Runtime, *, limit: int = 100) -> ErasureList:
    return ErasureList(items=[_record(box, e) for e in await box.store.erasure.latest(limit)])
