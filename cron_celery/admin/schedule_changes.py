"""The audit log of schedule changes: who changed what, from where, and what changed."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, StreamingHttpResponse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from cron_celery import models
from cron_celery.admin.base import JobFilter, ReadOnly
from cron_celery.admin.csv_export import schedule_change_rows
from cron_celery.beat import overrides
from cron_celery.decisions import audit
from cron_celery.web import dashboard


def username(request: HttpRequest) -> str:
    return str(getattr(request.user, "get_username", lambda: "")() or "")


def code_and_admin(job: models.CronJob, *, long: bool = False) -> SafeString:
    """"declared in code: X" under a schedule the admin edited away from the code's, with the warning
    of when a deploy replaces the edit (``overrides``); nothing while the code's schedule is in effect."""
    found = overrides.compare(job)
    if found is None:
        return mark_safe("")
    if long:
        return format_html('<div class="cron-declared" style="max-width:40em"><small>declared in code: <code>{}</code>'
                           ' ({})</small><div class="cron-declared-warning" role="note" style="color:#9a6700">'
                           '<strong>Edited in the admin.</strong> {}</div></div>', found.declared_text(),
                           dashboard.describe(found.declared), found.warning)
    # The dashboard's narrow schedule column: a short line, the whole warning on hover.
    # Its timezone only when the edit changed that too (on a line of its own, as the column's own).
    zone = format_html("<br>{}", found.declared_timezone) \
        if found.declared_timezone and found.declared_timezone != found.in_effect_timezone else ""
    return format_html('<div class="cron-declared" style="max-width:12em"><small>declared in code: '
                       '<code style="white-space:nowrap">{}</code>{}'
                       '<br><span class="cron-declared-warning" title="{}" style="color:#9a6700">edited in the admin: '
                       'a deploy that changes the code\'s schedule replaces the edit</span></small></div>',
                       found.declared, zone, found.warning)


def changes_table(changes: object) -> SafeString:
    """Each changed attribute with its value before and after."""
    cells = [(key, before, after) for key, before, after in audit.described(changes)]
    body = format_html_join("", "<tr><td>{}</td><td><code>{}</code></td><td>→</td><td><code>{}</code></td></tr>",
                            cells)
    return format_html('<table class="cron-changes">{}</table>', body)


def who_cell(change: models.ScheduleChange) -> SafeString:
    """The person the change's transaction named — a claim any database session can make — over the
    database role that made it (and its application_name), which the session cannot set."""
    if not change.actor:
        return format_html("{}", audit.role(change))
    return format_html('{}<br><small class="cron-quiet" title="The name is what the change\'s transaction said '
                       '(any database session can say any name); the role is what the database recorded">'
                       'database role: {}</small>', change.actor, audit.role(change))


@admin.register(models.ScheduleChange)
class ScheduleChangeAdmin(ReadOnly):
    """The audit log: every change of a job's schedule, timezone, enabled/paused state, parameters,
    window or concurrency — when, who, where from, before → after. Written by database triggers;
    nobody edits or deletes a row here (retention: ``AUDIT_RETENTION_DAYS``)."""

    list_display = ("changed_shown", "job_shown", "who", "source", "changes_shown")
    list_filter = (JobFilter, "source")
    search_fields = ("job_name", "job_code", "actor", "db_role", "application_name", "source")
    date_hierarchy = "changed_at"
    actions = ("export_csv",)
    fields = ("changed_at", "job", "job_name", "job_code", "who", "actor", "db_role", "application_name", "source",
              "changes_shown")
    readonly_fields = ("who", "changes_shown")

    @admin.display(description="when", ordering="id")
    def changed_shown(self, change: models.ScheduleChange) -> SafeString:
        return dashboard.when(change.changed_at)

    @admin.display(description="job", ordering="job_name")
    def job_shown(self, change: models.ScheduleChange) -> SafeString:
        return format_html('{}<br><small class="cron-quiet">{}</small>', change.job_name, change.job_code)

    @admin.display(description="who")
    def who(self, change: models.ScheduleChange) -> SafeString:
        return who_cell(change)

    @admin.display(description="what changed (before → after)")
    def changes_shown(self, change: models.ScheduleChange) -> SafeString:
        return changes_table(change.changes)

    @admin.action(description="Export the selection as CSV")
    def export_csv(self, request: HttpRequest, queryset: QuerySet[models.ScheduleChange]) -> StreamingHttpResponse:
        response = StreamingHttpResponse(schedule_change_rows(queryset), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = 'attachment; filename="cron-schedule-changes.csv"'
        return response
