"""The alerts outbox: each alert row, its delivery, and sending it again."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils.safestring import SafeString

from cron_celery import enums, models
from cron_celery.admin.base import ReadOnly, S
from cron_celery.alerts import delivery
from cron_celery.web import dashboard


@admin.register(models.Alert)
class AlertAdmin(ReadOnly):
    """The outbox: what was sent, where, and why a delivery failed (secrets redacted)."""

    list_display = ("created_at", "job", "execution", "event", "channel", "status_badge", "attempts", "sent_at",
                    "last_error")
    list_filter = ("status", "event", "channel")
    search_fields = ("job__name", "job__code", "channel")
    list_select_related = ("job", "execution")
    actions = ("resend",)

    @admin.display(description="status", ordering="status")
    def status_badge(self, alert: models.Alert) -> SafeString:
        colours: dict[str, str] = {enums.AlertStatus.SENT: S.SUCCEEDED, enums.AlertStatus.FAILED: S.FAILED}
        colour = colours.get(alert.status, S.PENDING)
        return dashboard.badge(colour, alert.status.lower())

    @admin.action(description="Send again", permissions=["operate"])
    def resend(self, request: HttpRequest, queryset: QuerySet[models.Alert]) -> None:
        ids = list(queryset.values_list("id", flat=True))
        # A fresh start: all its attempts again, and not "untouched" for the reconciler yet.
        models.Alert.objects.filter(id__in=ids).update(status=enums.AlertStatus.PENDING, last_error="",
                                                     attempts=0, updated_at=Now())
        delivery.send_soon(ids)
        self.message_user(request, f"{len(ids)} alert(s) queued for delivery.", messages.SUCCESS)
