"""relaybox in the Django admin: the inbox, dead letters (retry and discard, with a
reason), the quarantine (resolve), published messages and their deliveries.

The pages read relaybox's tables through unmanaged models; every action goes through
relaybox's operator use cases (:mod:`relaybox.ops.inbound`), as the dashboard, the API
and the CLI do: a retried dead letter is replayed through the worker and the
handler's business keys, and each action records who did it and why. Acting needs
the model's change permission; reading, its view permission."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from django import forms
from relaybox.contrib.django import get_box
from relaybox.contrib.django.models import DeadLetter, Delivery, InboxEvent, Message, Quarantined
from relaybox.contrib.django.portal import run
from relaybox.errors import OpsError
from relaybox.ops import inbound as ops


class ReasonForm(forms.Form):
    reason = forms.CharField(
        max_length=2000, widget=forms.Textarea(attrs={"rows": 3}), help_text="kept with the record"
    )


class ReadOnly(admin.ModelAdmin):
    """relaybox's rows change only through relaybox: no add, edit or delete here."""

    list_per_page = 50

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_operate_permission(self, request: HttpRequest) -> bool:
        opts = self.model._meta
        return bool(request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}"))


def _with_reason(
    description: str,
    title: str,
    act: Callable[[int, str, str], Coroutine[Any, Any, Any]],
    done: str,
) -> Callable[[Any, HttpRequest, QuerySet[Any]], TemplateResponse | None]:
    """An admin action (``description`` in the actions menu, for those with the
    change permission) asking for a reason first on a page headed ``title``, then
    running ``act(id, actor, reason)`` (a use case of :mod:`relaybox.ops.inbound`) for
    each selected row; ``done`` says how many succeeded."""

    def action(
        modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]
    ) -> TemplateResponse | None:
        form = ReasonForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            actor = f"django:{request.user.get_username()}"
            reason = form.cleaned_data["reason"]
            succeeded = 0
            for pk in queryset.values_list("pk", flat=True):
                try:
                    run(act(int(pk), actor, reason))
                    succeeded += 1
                except OpsError as exc:
                    modeladmin.message_user(request, f"{pk}: {exc}", messages.WARNING)
            if succeeded:
                modeladmin.message_user(request, done.format(n=succeeded), messages.SUCCESS)
            return None
        return TemplateResponse(
            request,
            "admin/relaybox/action_reason.html",
            {
                **modeladmin.admin_site.each_context(request),
                "title": title,
                "opts": modeladmin.model._meta,
                "queryset": queryset,
                "form": form,
                "action": request.POST.get("action", ""),
                "selected": request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME),
            },
        )

    marked: Callable[[Any, HttpRequest, QuerySet[Any]], TemplateResponse | None]
    marked = admin.action(description=description, permissions=("operate",))(action)
    return marked


def _retry(pk: int, actor: str, reason: str) -> Coroutine[Any, Any, Any]:
    return ops.dead_retry(get_box(), pk, actor=actor, reason=reason)


def _discard(pk: int, actor: str, reason: str) -> Coroutine[Any, Any, Any]:
    return ops.dead_discard(get_box(), pk, actor=actor, reason=reason)


def _kept(pk: int, actor: str, reason: str) -> Coroutine[Any, Any, Any]:
    return ops.quarantine_resolve(
        get_box(), pk, resolution="kept_original", actor=actor, reason=reason
    )


def _handled(pk: int, actor: str, reason: str) -> Coroutine[Any, Any, Any]:
    return ops.quarantine_resolve(
        get_box(), pk, resolution="handled_manually", actor=actor, reason=reason
    )


_EVENT = ("source", "event_type", "event_id", "tenant")
"""The columns that say which event a row is: where it came from, what and whose."""

_EVENT_SEARCH = ("event_id", "event_type", "tenant")


@admin.register(InboxEvent)
class InboxEventAdmin(ReadOnly):
    list_display = ("id", *_EVENT, "status", "attempts", "received")
    list_filter = ("status", "source", "dead_reason")
    search_fields = (*_EVENT_SEARCH, "account")


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnly):
    list_display = ("id", *_EVENT, "dead_reason", "last_error", "updated")
    list_filter = ("dead_reason", "source")
    search_fields = _EVENT_SEARCH
    actions = ("retry", "discard")
    retry = _with_reason(
        "Retry the selected dead letters",
        "Retry dead letters",
        _retry,
        "{n} dead letter(s) sent back to the worker",
    )
    discard = _with_reason(
        "Discard the selected dead letters",
        "Discard dead letters",
        _discard,
        "{n} dead letter(s) discarded",
    )


@admin.register(Quarantined)
class QuarantinedAdmin(ReadOnly):
    list_display = ("id", "inbox_id", *_EVENT, "received", "resolution")
    list_filter = ("resolution", "source")
    search_fields = _EVENT_SEARCH
    actions = ("keep_original", "handled_manually")
    keep_original = _with_reason(
        "Resolve: keep the original",
        "Keep the original",
        _kept,
        "{n} quarantined delivery(ies) resolved",
    )
    handled_manually = _with_reason(
        "Resolve: handled manually",
        "Handled manually",
        _handled,
        "{n} quarantined delivery(ies) resolved",
    )


@admin.register(Message)
class MessageAdmin(ReadOnly):
    list_display = ("id", "tenant", "event_type", "idempotency_key", "created")
    list_filter = ("event_type",)
    search_fields = ("id", "tenant", "idempotency_key")


@admin.register(Delivery)
class DeliveryAdmin(ReadOnly):
    list_display = (
        "id",
        "channel",
        "tenant",
        "message_id",
        "endpoint_id",
        "status",
        "attempts",
        "last_status",
        "created",
    )
    list_filter = ("status", "channel")
    search_fields = ("message_id", "endpoint_id", "tenant", "key")
