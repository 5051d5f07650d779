"""The credits example's tables as Django models: one ledger row per applied
operation, and the balance of each workspace."""

from __future__ import annotations

from django.db import models


class Grant(models.Model):
    """An applied operation: the initial grant of an invoice (+100) or, separately, its
    reversal (-100). The business key is the primary key, so the database refuses a
    second grant for an invoice even outside ``ctx.once()``."""

    business_key = models.TextField(primary_key=True)
    kind = models.TextField(choices=[("grant", "grant"), ("reversal", "reversal")])
    workspace = models.TextField()
    invoice_id = models.TextField()
    credits = models.IntegerField()
    event_id = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.workspace} {self.credits:+d} ({self.invoice_id})"


class Balance(models.Model):
    workspace = models.TextField(primary_key=True)
    credits = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.workspace}: {self.credits}"


class Order(models.Model):
    """An order of the shop: completing one publishes ``order.completed`` to the
    workspace's endpoints, in the same transaction."""

    workspace = models.TextField()
    credits = models.IntegerField()
    completed = models.BooleanField(default=False)
