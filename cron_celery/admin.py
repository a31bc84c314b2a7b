"""The admin: a jobs dashboard, the execution history and the alerts outbox.

History is an audit trail: no form edits an execution. Actions go through the same code
paths as the commands (``tasks.send_run``, ``backfill``, ``outcomes``), so an action in
the admin is recorded like any other run.
"""

from __future__ import annotations

import csv
import datetime as dt
import zoneinfo
from collections.abc import Callable, Iterator
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from cron_celery import (
    alerts,
    backfill,
    dashboard,
    dependencies,
    enums,
    exceptions,
    models,
    outcomes,
    registry,
    schedules,
    tasks,
    upcoming,
)

S = enums.Status


class Operated:
    """Admin actions marked ``permissions=["operate"]`` need ``models.OPERATE_PERMISSION``."""

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(models.OPERATE_PERMISSION))


class ReadOnly(Operated, admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _declared_or_say(admin_page: admin.ModelAdmin, request: HttpRequest,  # type: ignore[type-arg]
                     job: models.CronJob) -> registry.Job | None:
    """The job's declaration, or None after telling the person it is not in this code base."""
    declared = _declared(job)
    if declared is None:
        admin_page.message_user(request, f"{job.name}: not declared in this code base.", messages.ERROR)
    return declared


def _declared(job: models.CronJob) -> registry.Job | None:
    try:
        return registry.get(job.code)
    except exceptions.UnknownJob:
        return None


class BackfillForm(forms.Form):
    start = forms.DateField(label="From", help_text="First date, in the job's timezone")
    end = forms.DateField(label="To", help_text="Last date (inclusive)")
    force = forms.BooleanField(required=False, label="Also slots that already ran")
    cascade = forms.BooleanField(required=False, label="Cascade: also run the jobs that run after it",
                                 help_text="Each slot that succeeds runs that slot of its downstream jobs "
                                           "(declared with after=) again")


class OneOffForm(forms.Form):
    at = forms.CharField(label="At", help_text="e.g. 2026-12-01 18:00, in each job's timezone unless you add an "
                                               "offset or Z; must be in the future")
    force = forms.BooleanField(required=False, label="Run even if the job is paused then")


@admin.register(models.CronJob)
class CronJobAdmin(ReadOnly):
    """The dashboard: one row per job, its health at a glance."""

    # Narrow enough for a 1280 px window with the admin's sidebar open: the timezone rides in the
    # schedule's cell, times stack their date over their hour, the week's figures share a cell.
    list_display = ("status_badge", "job_name", "schedule_text", "next_slot", "last_success", "failures",
                    "week_figures", "last_runs")
    list_display_links = ("job_name",)
    # No filter panel: the dashboard needs the width; sort by status or search instead.
    search_fields = ("name", "code", "task")
    readonly_fields = ("runs_after",)

    @admin.display(description="dependencies (after=)")
    def runs_after(self, job: models.CronJob) -> str:
        after, before = dependencies.neighbours(job.id)
        if not after and not before:
            return "-"
        said = [f"runs after {', '.join(after)}"] if after else []
        said += [f"runs before {', '.join(before)}"] if before else []
        return "; ".join(said)
    list_per_page = 50
    actions = ("run_now", "schedule_one_off", "pause", "resume", "backfill_range")

    def get_queryset(self, request: HttpRequest) -> QuerySet[models.CronJob]:
        queryset = super().get_queryset(request).select_related("periodic_task")
        return dashboard.with_figures(queryset) if request.resolver_match and \
            request.resolver_match.url_name == "cron_celery_cronjob_changelist" else queryset

    @admin.display(description="status", ordering="last_status")
    def status_badge(self, job: models.CronJob) -> SafeString:
        if job.paused:
            return dashboard.badge(S.SKIPPED, "paused")
        return dashboard.badge(job.last_status)

    #: The admin's list, with a banner while this process's system checks find an error.
    change_list_template = "admin/cron_celery/cronjob_change_list.html"

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return super().changelist_view(request, {"title": "Cron jobs", "check_errors": dashboard.check_errors(),
                                                 **(extra_context or {})})

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view(self.upcoming_view)
        return [path("upcoming/", view, name="cron_celery_cronjob_upcoming"), *super().get_urls()]

    def upcoming_view(self, request: HttpRequest) -> HttpResponse:
        """The next hour of slots across all jobs: what is about to run."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        plan = upcoming.upcoming(timezone.now())
        history = reverse("admin:cron_celery_cronexecution_changelist")
        rows = [{"at": dashboard.when(slot.at), "due": slot.due, "name": slot.job.name, "code": slot.job.code,
                 "local": _local(slot.at, slot.job),
                 "words": f"one-off run (execution {slot.one_off})" if slot.one_off else
                 dashboard.describe(slot.job.schedule),
                 "expression": "" if slot.one_off else slot.job.schedule, "history": f"{history}?job={slot.job.id}"}
                for slot in plan.slots]
        return TemplateResponse(request, "admin/cron_celery/upcoming.html", {
            **self.admin_site.each_context(request), "title": "Upcoming: the next hour of slots", "plan": plan,
            "rows": rows, "per_job": upcoming.PER_JOB, "max_jobs": upcoming.MAX_JOBS, "opts": self.model._meta,
            "window": (dashboard.when(plan.now), dashboard.when(plan.until)),
            "more": [(item.job.name, item.count, dashboard.when(item.until)) for item in plan.more],
            "behind": [(item.job.name, dashboard.when(item.since), int((plan.now - item.since).total_seconds()),
                        item.job.catch_up) for item in plan.behind],
        })

    @admin.display(description="job", ordering="name")
    def job_name(self, job: models.CronJob) -> SafeString:
        return format_html('{}<br><small class="cron-quiet">{}</small>', job.name, job.code)

    @admin.display(description="last success", ordering="last_success_at")
    def last_success(self, job: models.CronJob) -> SafeString:
        return dashboard.when_stacked(job.last_success_at)

    @admin.display(description="failures in a row", ordering="consecutive_failures")
    def failures(self, job: models.CronJob) -> int:
        return job.consecutive_failures

    @admin.display(description="schedule")
    def schedule_text(self, job: models.CronJob) -> SafeString:
        words = dashboard.describe(job.schedule)
        problem = dashboard.schedule_problem(job)  # an edit that could not be applied, and why
        zone = format_html('<br><small class="cron-quiet">{}</small>', job.schedule_timezone or job.timezone)
        if job.periodic_task_id:
            url = reverse("admin:django_celery_beat_periodictask_change", args=[job.periodic_task_id])
            return format_html('<a href="{}" title="Edit the schedule">{}</a><br><code>{}</code>{}{}', url, words,
                               job.schedule, zone, problem)
        return format_html("{}<br><code>{}</code>{}{}", words, job.schedule or "—", zone, problem)

    @admin.display(description="next slot", ordering="next_run_at")
    def next_slot(self, job: models.CronJob) -> SafeString:
        return dashboard.next_run(job, getattr(job, "next_one_off", None), timezone.now())

    @admin.display(description="7 days")
    def week_figures(self, job: Any) -> SafeString:
        """The share of the week's ended slots that succeeded, and the successes' median duration."""
        figures = dashboard.week(getattr(job, "week", None))
        if not figures.finished:
            return mark_safe('<span class="cron-muted">—</span>')
        rate = f"{100 * figures.succeeded / figures.finished:.0f} % of {figures.finished}"
        if figures.median is None:
            return format_html('<span style="white-space:nowrap">{}</span>', rate)
        seconds = figures.median
        shown = f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"
        return format_html('<span style="white-space:nowrap">{}</span><br>'
                           '<small class="cron-quiet" style="white-space:nowrap">median {}{}</small>', rate,
                           "≈ " if figures.estimated else "", shown)

    @admin.display(description="last 30 runs")
    def last_runs(self, job: Any) -> SafeString:
        return dashboard.chart(getattr(job, "recent", None))

    @admin.action(description="Run now (send to the workers)", permissions=["operate"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[models.CronJob]) -> None:
        for job in queryset:
            declared = _declared_or_say(self, request, job)
            if declared is None:
                continue
            try:
                sent = tasks.send_run(declared, dt.datetime.now(dt.UTC).replace(second=0, microsecond=0),
                                      enums.Trigger.ADMIN, force=True)
            except exceptions.CronCeleryError as error:
                self.message_user(request, f"{job.name}: {error}", messages.ERROR)
                continue
            self.message_user(request, f"{job.name}: sent (execution {sent.execution_id}).", messages.SUCCESS)

    @admin.action(description="Pause", permissions=["operate"])
    def pause(self, request: HttpRequest, queryset: QuerySet[models.CronJob]) -> None:
        self._set_paused(request, queryset, True)

    @admin.action(description="Resume", permissions=["operate"])
    def resume(self, request: HttpRequest, queryset: QuerySet[models.CronJob]) -> None:
        self._set_paused(request, queryset, False)

    def _set_paused(self, request: HttpRequest, queryset: QuerySet[models.CronJob], paused: bool) -> None:
        for job in queryset.select_related("periodic_task"):
            task = job.periodic_task
            if task is not None:  # the periodic task is the switch; the beat follows it
                task.enabled = not paused
                task.save(update_fields=["enabled"])
            else:
                models.CronJob.objects.filter(id=job.id).update(paused=paused)
        verb = "paused" if paused else "resumed"
        self.message_user(request, f"{queryset.count()} job(s) {verb}.", messages.SUCCESS)

    @admin.action(description="Backfill a date range…", permissions=["operate"])
    def backfill_range(self, request: HttpRequest, queryset: QuerySet[models.CronJob]) -> HttpResponse | None:
        form = BackfillForm(request.POST if "apply" in request.POST else None)
        if "apply" in request.POST and form.is_valid():
            data = form.cleaned_data

            def send(job: models.CronJob, declared: registry.Job) -> SafeString:
                planned = backfill.plan(declared, data["start"], data["end"], force=data["force"],
                                        cascade=data["cascade"])
                return _backfill_said(job, backfill.start(declared, planned), len(planned.done), planned.outside)

            self._each_declared(request, queryset, send)
            return None
        return self._action_form(request, queryset, form, "backfill_range", title="Backfill", submit="Send the slots",
                                 intro="Send the past slots of these jobs to the workers (trigger BACKFILL), oldest "
                                       "first. Slots that already succeeded, or are queued or running, are left out "
                                       "unless you tick the last box.")

    @admin.action(description="Schedule a one-off run…", permissions=["operate"])
    def schedule_one_off(self, request: HttpRequest, queryset: QuerySet[models.CronJob]) -> HttpResponse | None:
        form = OneOffForm(request.POST if "apply" in request.POST else None)
        if "apply" in request.POST and form.is_valid():
            data = form.cleaned_data

            def record(job: models.CronJob, declared: registry.Job) -> SafeString:
                at = schedules.parse_slot(data["at"], declared.tzinfo)
                recorded = tasks.schedule_one_off(declared, at, force=data["force"])
                return format_html(
                    '{}: one-off run at {} recorded (execution {}); the beat sends it then. '
                    '<a href="{}">Cancel it from the history</a>.', job.name, dashboard.when(at),
                    recorded.execution_id, reverse("admin:cron_celery_cronexecution_changelist")
                    + f"?job={job.id}&trigger__exact={enums.Trigger.ONE_OFF.value}")

            self._each_declared(request, queryset, record)
            return None
        return self._action_form(request, queryset, form, "schedule_one_off", title="Schedule a one-off run",
                                 submit="Record the one-off run",
                                 intro="Record one run of each of these jobs at a time of your choosing (trigger "
                                       "ONE_OFF): the beat sends it to the workers then, once. It shows as the "
                                       "job's next run on the dashboard, and can be cancelled from the history "
                                       "until it is sent.")

    def _each_declared(self, request: HttpRequest, queryset: QuerySet[models.CronJob],
                       act: Callable[[models.CronJob, registry.Job], SafeString]) -> None:
        """``act`` on each selected job declared in this code base; says what it did, or why not."""
        for job in queryset:
            declared = _declared_or_say(self, request, job)
            if declared is None:
                continue
            try:
                said = act(job, declared)
            except exceptions.CronCeleryError as error:
                self.message_user(request, f"{job.name}: {error}", messages.ERROR)
                continue
            self.message_user(request, said, messages.SUCCESS)

    def _action_form(self, request: HttpRequest, queryset: QuerySet[models.CronJob], form: forms.Form, action: str,
                     *, title: str, submit: str, intro: str) -> HttpResponse:
        return TemplateResponse(request, "admin/cron_celery/action_form.html", {
            **self.admin_site.each_context(request), "title": title, "form": form, "jobs": queryset,
            "action": action, "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "opts": self.model._meta, "intro": intro, "submit": submit,
        })


def _local(slot: dt.datetime, job: models.CronJob) -> str:
    """A slot in the job's schedule timezone ("09:30:00 CET Europe/Amsterdam"); UTC jobs get a dash."""
    zone = job.schedule_timezone or job.timezone
    if zone in ("", "UTC"):
        return "—"
    try:
        return f"{slot.astimezone(zoneinfo.ZoneInfo(zone)):%H:%M:%S %Z} {zone}"  # the abbreviation: CET or CEST
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return zone


def _backfill_said(job: models.CronJob, started: backfill.Started, done: int, outside: int = 0) -> SafeString:
    """How far a backfill got, with a link to its executions in the history."""
    history = (reverse("admin:cron_celery_cronexecution_changelist")
               + f"?job={job.id}&trigger__exact={enums.Trigger.BACKFILL.value}")
    later = f", {started.handed_over} being sent by a worker" if started.handed_over else ""
    skipped = f"; {done} already ran" if done else ""
    skipped += f"; {outside} outside its active window left out" if outside else ""
    return format_html('{}: {} slots recorded, {} sent now{}{}. <a href="{}">Follow them in the history</a>.',
                       job.name, started.recorded, started.sent, later, skipped, history)


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Counts an unfiltered history from PostgreSQL's statistics instead of ``count(*)``
    (a full scan at a million rows); a filtered list is counted exactly."""

    @cached_property
    def count(self) -> int:
        query = getattr(self.object_list, "query", None)
        if query is not None and not query.where:
            with connection.cursor() as cursor:
                cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                               [models.CronExecution._meta.db_table])
                row = cursor.fetchone()
            if row and row[0] and row[0] > 10_000:
                return int(row[0])
        return int(super().count)


class JobFilter(admin.SimpleListFilter):
    """By job, listed from the jobs table (not a DISTINCT over the whole history)."""

    title = "job"
    parameter_name = "job"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        jobs = models.CronJob.objects.order_by("name").values_list("id", "name")
        return [(str(job_id), name) for job_id, name in jobs]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(job_id=int(value)) if value and value.isascii() and value.isdigit() else queryset


class AlertInline(admin.TabularInline):  # type: ignore[type-arg]
    model = models.Alert
    extra = 0
    can_delete = False
    fields = ("event", "channel", "status", "attempts", "sent_at", "last_error")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class HistoryChangeList(ChangeList):  # type: ignore[misc]
    """Marks the column the rows are sorted by from the admin's ``get_ordering(request)``;
    Django's list only looks at the static ``ordering``, so it would claim the whole history
    is sorted by slot when it is sorted by id (newest first)."""

    def __init__(self, request: HttpRequest, *args: Any, **kwargs: Any) -> None:
        self.request_for_ordering = request
        super().__init__(request, *args, **kwargs)

    def _get_default_ordering(self) -> list[Any] | tuple[Any, ...]:
        return self.model_admin.get_ordering(self.request_for_ordering)


@admin.register(models.CronExecution)
class CronExecutionAdmin(ReadOnly):
    list_display = ("status_badge", "task_name", "slot_shown", "run_shown", "trigger", "skip_reason", "attempt",
                    "duration", "short_message")
    list_filter = ("status", "trigger", "skip_reason", JobFilter)
    search_fields = ("task_code", "task_name", "celery_task_id")
    date_hierarchy = "slot"
    list_select_related = ("job",)
    show_full_result_count = False  # no count(*) over the whole history on every page
    paginator = EstimatedCountPaginator
    actions = ("rerun", "rerun_cascade", "cancel_one_off", "mark_lost", "export_csv")
    inlines = (AlertInline,)
    readonly_fields = ("attempt_history", "duration", "chain")
    fieldsets = (
        (None, {"fields": ("job", "task_name", "task_code", "slot", "due_at", "execution_date", "run_number", "status",
                           "trigger", "skip_reason", "forced")}),
        ("Outcome", {"fields": ("started", "ended", "duration", "success", "message", "error_code", "traceback",
                                "result")}),
        ("Chain (after=)", {"fields": ("chain", "upstream_execution_id", "cascade")}),
        ("Attempts", {"fields": ("retry_count", "attempt_history", "fence", "worker", "pid", "lease_until",
                                 "celery_task_id", "republished")}),
    )

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        # One job's history reads its (job, slot) index; the whole history reads the newest ids.
        return ("-slot", "-run_number") if request.GET.get("job") else ("-id",)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return HistoryChangeList

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        changelist = super().get_changelist_instance(request)
        if not request.GET.get("job"):
            # Django's date hierarchy reads the min, max and distinct dates of every row it
            # lists: over the whole history that is a full scan. It is offered per job.
            changelist.date_hierarchy = None
        return changelist

    @admin.display(description="status", ordering="status")
    def status_badge(self, row: models.CronExecution) -> SafeString:
        if row.waiting_since is not None and row.status in (S.PENDING, S.RETRYING):
            return dashboard.badge(row.status, f"{row.status.lower()}, waiting")  # for the job's live run
        return dashboard.badge(row.status)

    @admin.display(description="slot", ordering="slot")
    def slot_shown(self, row: models.CronExecution) -> SafeString:
        return dashboard.when(row.slot)

    @admin.display(description="run", ordering="run_number")
    def run_shown(self, row: models.CronExecution) -> str:
        """A skip is no run of its slot: it shows as one, not as "run 2"."""
        return "skip" if row.status == S.SKIPPED else f"#{row.run_number}"

    @admin.display(description="attempt")
    def attempt(self, row: models.CronExecution) -> int | str:
        return "—" if row.status == S.SKIPPED else row.retry_count + 1

    @admin.display(description="message")
    def short_message(self, row: models.CronExecution) -> str:
        first = row.message.splitlines()[0] if row.message else ""
        return first[:100]

    @admin.display(description="this slot across its chain")
    def chain(self, row: models.CronExecution) -> SafeString | str:
        """Each job this one runs after and before, with its latest execution of the slot; the
        first that did not succeed is where the chain stopped."""
        steps = dependencies.chain(row.job_id, row.slot)
        if len(steps) < 2:
            return "-"
        stopped = next((step.job for step in steps if step.status not in (S.SUCCEEDED, "")), None)
        link = reverse("admin:cron_celery_cronexecution_change", args=[0]).replace("/0/", "/{}/")
        cells = [(
            "upstream" if step.depth < 0 else "this job" if step.depth == 0 else "downstream", step.job,
            format_html('<a href="{}">{}</a>', link.format(step.execution_id), step.execution_id)
            if step.execution_id else "not yet",
            dashboard.badge(step.status) if step.status else "",
            "the chain stopped here" if step.job == stopped else "",
        ) for step in steps]
        rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", cells)
        return format_html("<table><thead><tr><th></th><th>job</th><th>execution</th><th>status</th><th></th></tr>"
                           "</thead><tbody>{}</tbody></table>", rows)

    @admin.display(description="every attempt")
    def attempt_history(self, row: models.CronExecution) -> SafeString:
        entries = row.attempts or [{"attempt": 1, "started": row.started, "ended": row.ended, "worker": row.worker,
                                    "pid": row.pid, "fence": row.fence, "status": row.status,
                                    "error_code": row.error_code, "message": row.message[:500]}]
        cells = [(entry.get("attempt"), dashboard.badge(str(entry.get("status") or S.RUNNING)),
                  entry.get("started") or "—", entry.get("ended") or "—",
                  f"{entry.get('worker') or '—'} / {entry.get('pid') or '—'}", entry.get("fence") or "—",
                  entry.get("error_code") or "", entry.get("message") or "")
                 for entry in entries]
        rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                                    "<td>{}</td><td>{}</td></tr>", cells)
        return format_html("<table><thead><tr><th>#</th><th>status</th><th>started</th><th>ended</th>"
                           "<th>worker / pid</th><th>fence</th><th>error code</th><th>message</th></tr></thead>"
                           "<tbody>{}</tbody></table>", rows)

    @admin.action(description="Re-run the selected slots (forced)", permissions=["operate"])
    def rerun(self, request: HttpRequest, queryset: QuerySet[models.CronExecution]) -> None:
        self._rerun(request, queryset, cascade=False)

    @admin.action(description="Re-run the selected slots and, when they succeed, their downstream jobs (cascade)",
                  permissions=["operate"])
    def rerun_cascade(self, request: HttpRequest, queryset: QuerySet[models.CronExecution]) -> None:
        self._rerun(request, queryset, cascade=True)

    def _rerun(self, request: HttpRequest, queryset: QuerySet[models.CronExecution], *, cascade: bool) -> None:
        for row in queryset.select_related("job"):
            declared = _declared_or_say(self, request, row.job)
            if declared is None:
                continue
            try:
                sent = tasks.send_run(declared, row.slot, enums.Trigger.ADMIN, force=True, cascade=cascade)
            except exceptions.CronCeleryError as error:
                self.message_user(request, f"{row}: {error}", messages.ERROR)
                continue
            self.message_user(request, f"{row.task_name} {row.slot:%Y-%m-%d %H:%M}: sent again "
                                       f"(execution {sent.execution_id}).", messages.SUCCESS)

    @admin.action(description="Cancel one-off runs not sent yet", permissions=["operate"])
    def cancel_one_off(self, request: HttpRequest, queryset: QuerySet[models.CronExecution]) -> None:
        user = getattr(request.user, "get_username", lambda: "someone")()
        chosen = list(queryset.values_list("id", flat=True))
        cancelled = outcomes.cancelled(chosen, f"{user} in the admin")
        left = len(chosen) - len(cancelled)
        said = f"{len(cancelled)} one-off run(s) cancelled"
        if left:
            said += f"; {left} left as they are (not one-off runs, or sent already: revoke a sent one to stop it)"
        self.message_user(request, said + ".", messages.SUCCESS if cancelled else messages.WARNING)

    @admin.action(description="Mark stuck executions LOST", permissions=["operate"])
    def mark_lost(self, request: HttpRequest, queryset: QuerySet[models.CronExecution]) -> None:
        user = getattr(request.user, "get_username", lambda: "someone")()
        done = 0
        for row in queryset.filter(status__in=[S.PENDING, S.RUNNING, S.RETRYING]).select_related("job"):
            done += outcomes.unstarted(
                _declared(row.job), job_id=row.job_id, execution_id=row.id, slot=row.slot, status=S.LOST,
                error_code="MARKED_LOST", message=f"Marked LOST in the admin by {user}.", running_too=True)
        self.message_user(request, f"{done} execution(s) marked LOST; finished ones are left as they are.",
                          messages.SUCCESS if done else messages.WARNING)

    @admin.action(description="Export the selection as CSV")
    def export_csv(self, request: HttpRequest, queryset: QuerySet[models.CronExecution]) -> StreamingHttpResponse:
        response = StreamingHttpResponse(_csv_rows(queryset), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = 'attachment; filename="cron-executions.csv"'
        return response


CSV_FIELDS = ("id", "task_name", "task_code", "slot", "execution_date", "run_number", "status", "trigger",
              "skip_reason", "retry_count", "started", "ended", "error_code", "message", "worker", "fence",
              "celery_task_id")


class _Echo:
    def write(self, value: str) -> str:
        return value


#: A cell starting with one of these is a formula to a spreadsheet (OWASP, "CSV Injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """A value as a CSV cell that a spreadsheet shows as text: a string that would start a
    formula gets a leading ``'`` (job messages are whatever the job wrote)."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def _csv_rows(queryset: QuerySet[models.CronExecution]) -> Iterator[str]:
    """The rows as CSV lines, read in chunks: constant memory whatever the selection."""
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_FIELDS)
    for values in queryset.order_by("id").values_list(*CSV_FIELDS).iterator(chunk_size=2000):
        yield writer.writerow([csv_cell(value) for value in values])


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
        alerts.send_soon(ids)
        self.message_user(request, f"{len(ids)} alert(s) queued for delivery.", messages.SUCCESS)
