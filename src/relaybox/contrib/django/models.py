"""Read-only views of relaybox's tables for the Django admin. Unmanaged: relaybox's
own migrations (run by this app's Django migrations) create and change the tables;
these models map the columns an operator reads. Times are epoch seconds."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db import models

__all__ = ["DeadLetter", "Delivery", "InboxEvent", "Message", "Quarantined"]


def _when(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC)


class InboxEvent(models.Model):
    id = models.BigAutoField(primary_key=True)
    source = models.TextField()
    account = models.TextField()
    event_id = models.TextField()
    event_type = models.TextField()
    tenant = models.TextField(null=True)
    status = models.TextField()
    dead_reason = models.TextField(null=True)
    attempts = models.IntegerField()
    next_attempt_at = models.FloatField()
    last_error = models.TextField(null=True)
    received_at = models.FloatField()
    updated_at = models.FloatField()
    done_at = models.FloatField(null=True)
    discarded_at = models.FloatField(null=True)
    discarded_by = models.TextField(null=True)
    discard_reason = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = "relaybox_inbox"
        ordering = ("-id",)
        verbose_name = "inbox event"

    def __str__(self) -> str:
        return f"{self.source} {self.event_type} {self.event_id}"

    def received(self) -> datetime | None:
        return _when(self.received_at)

    def updated(self) -> datetime | None:
        return _when(self.updated_at)


class DeadLetterManager(models.Manager["DeadLetter"]):
    def get_queryset(self) -> models.QuerySet[DeadLetter]:
        return super().get_queryset().filter(status="dead", discarded_at__isnull=True)


class DeadLetter(InboxEvent):
    """Inbox events in dead letters that nobody discarded."""

    objects: Any = DeadLetterManager()

    class Meta:
        proxy = True
        verbose_name = "dead letter"


class Quarantined(models.Model):
    id = models.BigAutoField(primary_key=True)
    inbox_id = models.BigIntegerField()
    source = models.TextField()
    account = models.TextField()
    event_id = models.TextField()
    event_type = models.TextField()
    tenant = models.TextField(null=True)
    received_at = models.FloatField()
    resolved_at = models.FloatField(null=True)
    resolution = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = "relaybox_quarantine"
        ordering = ("-id",)
        verbose_name = "quarantined delivery"
        verbose_name_plural = "quarantine"

    def __str__(self) -> str:
        return f"{self.source} {self.event_id} (quarantined)"

    def received(self) -> datetime | None:
        return _when(self.received_at)


class Message(models.Model):
    id = models.TextField(primary_key=True)
    tenant = models.TextField()
    event_type = models.TextField()
    idempotency_key = models.TextField(null=True)
    body = models.TextField()
    created_at = models.FloatField()

    class Meta:
        managed = False
        db_table = "relaybox_messages"
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return f"{self.event_type} {self.id}"

    def created(self) -> datetime | None:
        return _when(self.created_at)


class Delivery(models.Model):
    """A row of the outbox: one message for one endpoint (or an action a handler
    recorded with ``ctx.outbox.add()``)."""

    id = models.BigAutoField(primary_key=True)
    channel = models.TextField()
    key = models.TextField()
    tenant = models.TextField(null=True)
    status = models.TextField()
    attempts = models.IntegerField()
    next_attempt_at = models.FloatField()
    last_error = models.TextField(null=True)
    last_status = models.IntegerField(null=True)
    dead_reason = models.TextField(null=True)
    endpoint_id = models.TextField(null=True)
    message_id = models.TextField(null=True)
    created_at = models.FloatField()
    updated_at = models.FloatField()
    sent_at = models.FloatField(null=True)

    class Meta:
        managed = False
        db_table = "relaybox_outbox"
        ordering = ("-id",)
        verbose_name_plural = "deliveries"

    def __str__(self) -> str:
        return f"{self.channel} {self.key}"

    def created(self) -> datetime | None:
        return _when(self.created_at)
