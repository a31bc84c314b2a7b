"""Read-only admin pages for jobs and their execution history.

History is an audit trail: nothing here edits an execution. (A fuller dashboard with
actions is planned; these pages already let a person find any run and read its error.)
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from cron_celery import models


class ReadOnly(admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(models.CronJob)
class CronJobAdmin(ReadOnly):
    list_display = ("name", "code", "pattern", "overlap", "timezone", "paused", "last_status",
                    "last_run_at", "last_success_at", "consecutive_failures")
    list_filter = ("pattern", "overlap", "paused", "last_status")
    search_fields = ("name", "code", "task")


@admin.register(models.CronExecution)
class CronExecutionAdmin(ReadOnly):
    list_display = ("task_name", "slot", "run_number", "status", "trigger", "skip_reason",
                    "duration", "short_message")
    list_filter = ("status", "trigger", "skip_reason", "task_name")
    search_fields = ("task_code", "task_name", "celery_task_id", "message")
    date_hierarchy = "slot"
    list_select_related = ("job",)

    @admin.display(description="message")
    def short_message(self, obj: models.CronExecution) -> str:
        first = obj.message.splitlines()[0] if obj.message else ""
        return first[:100]


@admin.register(models.Alert)
class AlertAdmin(ReadOnly):
    """The outbox: what was sent, where, and why a delivery failed (secrets redacted)."""

    list_display = ("created_at", "job", "execution", "event", "channel", "status", "attempts", "sent_at",
                    "last_error")
    list_filter = ("status", "event", "channel")
    search_fields = ("job__name", "job__code", "channel")
    list_select_related = ("job", "execution")
