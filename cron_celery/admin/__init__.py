"""The admin: a jobs dashboard, the execution history and the alerts outbox.

History is an audit trail: no form edits an execution. Actions go through the same code
paths as the commands (``tasks.send_run``, ``backfill``, ``outcomes``), so an action in
the admin is recorded like any other run.
"""

from __future__ import annotations

import csv
import datetime as dt
import functools
import json
import zoneinfo
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from celery import current_app
from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.exceptions import NotRegistered
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connection, transaction
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django_celery_beat import admin as beat_admin  # noqa: F401  (its admins registered first: ours wrap them)
from django_celery_beat import models as beat_models
from django_celery_beat.models import PeriodicTask

from cron_celery import alerts, enums, exceptions, models, schedules
from cron_celery.admin import access
from cron_celery.beat import overrides
from cron_celery.decisions import audit, dependencies, in_effect
from cron_celery.declaring import params, registry
from cron_celery.run import backfill, outcomes, resumes, tasks
from cron_celery.web import dashboard, upcoming

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


def _param_field(param: params.Param, initial: params.Json, scheduled: bool) -> forms.Field:
    """The form field of one parameter, by its kind; empty means None (optional), the default, or ''."""
    said = f"{param.type_text}; " + ("required" if param.required else f"default {json.dumps(param.default_json)}")
    said += f"; its scheduled value (the periodic task's kwargs) is {json.dumps(initial)}" if scheduled else ""
    if param.kind == params.DATETIME:
        said += " (e.g. 2026-12-01 18:00, in the job's timezone unless you add an offset or Z)"
    # A form's help text is not escaped by Django: the values in it (kwargs typed in the admin) are, here.
    options: dict[str, Any] = {"label": param.name, "help_text": format_html("{}", said), "initial": initial,
                               "required": param.required and not param.optional and param.kind != params.BOOL}
    if param.kind == params.BOOL:
        return forms.NullBooleanField(**{**options, "required": False}) if param.optional else \
            forms.BooleanField(**{**options, "required": False})
    if param.kind == params.INT:
        return forms.IntegerField(**options)
    if param.kind == params.FLOAT:
        return forms.FloatField(**options)
    if param.kind == params.DATE:
        return forms.DateField(widget=forms.DateInput(attrs={"type": "date"}), **options)
    if param.kind == params.CHOICE:
        choices = [(_spelled(choice), _spelled(choice)) for choice in param.choices]
        return forms.ChoiceField(choices=([("", "— (None)")] if param.optional else []) + choices,
                                 **{**options, "initial": _spelled(initial) if initial is not None else ""})
    return forms.CharField(strip=False, **options)


def _spelled(value: object) -> str:
    """A parameter's value as a person types it: ``us``, ``true``, ``2026-12-01``; None as ``null``."""
    return value if isinstance(value, str) else json.dumps(value)


class ParamsForm(forms.Form):
    """"Run with parameters…": a field per parameter of the job, from its signature (initial: its
    scheduled value, else its default), the slot's date, and whether to run while paused. ``values``
    (once valid) are the checked values, as stored."""

    PREFIX = "param_"

    def __init__(self, job: registry.Job, scheduled: Mapping[str, Any] | None, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.job = job
        self.values: dict[str, params.Json] = {}
        for param in job.parameters:
            given = scheduled is not None and param.name in scheduled
            initial = scheduled[param.name] if scheduled is not None and given else param.default_json
            self.fields[self.PREFIX + param.name] = _param_field(param, initial, given)
        self.fields["date"] = forms.DateField(
            required=False, label="Execution date", widget=forms.DateInput(attrs={"type": "date"}),
            help_text="The slot it runs for: the job's first slot that day; empty: the current minute")
        self.fields["force"] = forms.BooleanField(required=False, label="Run even if the job is paused")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for param in self.job.parameters:
            key = self.PREFIX + param.name
            if key not in data:  # its field already has its error
                continue
            value = data[key]
            if value in (None, "") and param.kind != params.BOOL:
                value = None if param.optional else "" if param.kind == params.STR else \
                    None if param.required else param.default
            elif param.kind == params.CHOICE:
                value = params.parse_text(param, str(value), self.job.tzinfo)
            try:
                self.values[param.name] = params.to_json(param, value, self.job.tzinfo)
            except ValueError as error:
                self.add_error(key, f"{error}.")
        return data


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Counts an unfiltered list (the history, or the dashboard's jobs) of more than 10,000 rows from
    PostgreSQL's statistics instead of ``count(*)`` (a full scan at a million rows, or on every
    dashboard page at a hundred thousand jobs); a filtered list is counted exactly."""

    @cached_property
    def count(self) -> int:
        query = getattr(self.object_list, "query", None)
        if query is not None and not query.where:
            with connection.cursor() as cursor:
                cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                               [query.model._meta.db_table])
                row = cursor.fetchone()
            if row and row[0] and row[0] > 10_000:
                return int(row[0])
        return int(super().count)

    def page(self, number: Any) -> Any:
        """The page asked for; at the estimated last page or past it the list is counted exactly, so
        that rows added since PostgreSQL's statistics were taken are on a page the links reach."""
        try:
            asked = int(number)
        except (TypeError, ValueError):
            asked = 0
        query = getattr(self.object_list, "query", None)
        if query is not None and not query.where and asked >= self.num_pages:
            exact = int(self.object_list.count())  # type: ignore[attr-defined]  # a QuerySet: it has a query
            if exact != self.count:
                self.__dict__["count"] = exact
                self.__dict__.pop("num_pages", None)  # the page links then reach the real last page
        return super().page(number)


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
    readonly_fields = ("runs_after", "schedule_in_code", "latest_runs", "schedule_changes")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The job's page: its schedule (in effect, and in code), then its latest runs and its schedule
        changes side by side (the changes for those who may see the audit log), then every field."""
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None:
            return fieldsets
        ours = {"schedule_in_code", "latest_runs", "schedule_changes"}
        rest = [name for _title, options in fieldsets for name in options.get("fields", ()) if name not in ours]
        audited = request.user.has_perm(f"cron_celery.view_{models.ScheduleChange._meta.model_name}")
        history = ("latest_runs", "schedule_changes") if audited else ("latest_runs",)
        return [("Schedule: in effect and in code", {"fields": ("schedule_in_code",)}),
                ("Latest runs and schedule changes" if audited else "Latest runs", {"fields": (history,)}),
                ("Job", {"fields": rest})]

    @admin.display(description="schedule")
    def schedule_in_code(self, job: models.CronJob) -> SafeString:
        """The schedule in effect, and — when the admin's edit differs from the code — what the code
        declares, with the warning of when a deploy replaces the edit."""
        zone = job.schedule_timezone or job.timezone
        shown = format_html("{} <code>{}</code> ({})", dashboard.schedule_words(job), job.schedule or "—", zone)
        if job.periodic_task_id:
            url = reverse("admin:django_celery_beat_periodictask_change", args=[job.periodic_task_id])
            shown = format_html('{} — <a href="{}">edit it in its periodic task</a>', shown, url)
        return format_html("{}{}{}", shown, dashboard.schedule_problem(job), _code_and_admin(job, long=True))

    @admin.display(description="latest runs")
    def latest_runs(self, job: models.CronJob) -> SafeString:
        """The job's ten newest executions (its (job, slot) index), linked to its whole history."""
        rows = list(models.CronExecution.objects.filter(job_id=job.id).order_by("-slot", "-run_number")[:10])
        history = reverse("admin:cron_celery_cronexecution_changelist") + f"?job={job.id}"
        if not rows:
            return format_html('No runs yet. <a href="{}">Its history</a>', history)
        link = reverse("admin:cron_celery_cronexecution_change", args=[0]).replace("/0/", "/{}/")
        cells = [(format_html('<a href="{}">{}</a>', link.format(row.id), dashboard.when(row.slot)),
                  dashboard.badge(row.status), row.trigger, f"#{row.run_number}",
                  str(row.duration).split(".")[0] if row.duration is not None else "—",
                  (row.message.splitlines()[0] if row.message else "")[:80]) for row in rows]
        body = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                                cells)
        return format_html('<table class="cron-job-runs"><thead><tr><th>slot</th><th>status</th><th>trigger</th>'
                           '<th>run</th><th>duration</th><th>message</th></tr></thead><tbody>{}</tbody></table>'
                           '<p><a href="{}">All its runs →</a></p>', body, history)

    @admin.display(description="schedule changes")
    def schedule_changes(self, job: models.CronJob) -> SafeString:
        """The job's twenty newest schedule changes (``audit``), linked to all of them."""
        listing = reverse("admin:cron_celery_schedulechange_changelist") + f"?job={job.id}"
        changes = audit.latest(job.id, 20)
        if not changes:
            return format_html('No schedule change recorded. <a href="{}">The audit log</a>', listing)
        link = reverse("admin:cron_celery_schedulechange_change", args=[0]).replace("/0/", "/{}/")
        cells = [(format_html('<a href="{}">{}</a>', link.format(change.id), dashboard.when(change.changed_at)),
                  _who_cell(change), change.source, _changes_table(change.changes)) for change in changes]
        body = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", cells)
        return format_html('<table class="cron-job-changes"><thead><tr><th>when</th><th>who</th><th>from</th>'
                           '<th>what changed (before → after)</th></tr></thead><tbody>{}</tbody></table>'
                           '<p><a href="{}">All its schedule changes →</a></p>', body, listing)

    @admin.display(description="dependencies (after=)")
    def runs_after(self, job: models.CronJob) -> str:
        after, before = dependencies.neighbours(job.id)
        if not after and not before:
            return "-"
        said = [f"runs after {', '.join(after)}"] if after else []
        said += [f"runs before {', '.join(before)}"] if before else []
        return "; ".join(said)
    list_per_page = 50
    # One count per page, and an estimate for a long unfiltered list (see EstimatedCountPaginator).
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    actions = ("run_now", "run_with_params", "schedule_one_off", "pause", "resume", "backfill_range")

    def get_queryset(self, request: HttpRequest) -> QuerySet[models.CronJob]:
        queryset = super().get_queryset(request).select_related("periodic_task").prefetch_related(
            "upstream_edges__upstream")
        return dashboard.with_figures(queryset) if request.resolver_match and \
            request.resolver_match.url_name == "cron_celery_cronjob_changelist" else queryset

    @admin.display(description="status", ordering="last_status")
    def status_badge(self, job: models.CronJob) -> SafeString:
        timing = dashboard.timing_badges(getattr(job, "timing", None))
        if job.paused:
            return format_html("{}{}", dashboard.badge(S.SKIPPED, "paused"), timing)
        return format_html("{}{}", dashboard.badge(job.last_status), timing)

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
        words = dashboard.schedule_words(job)
        problem = dashboard.schedule_problem(job)  # an edit that could not be applied, and why
        zone = format_html('<br><small class="cron-quiet">{}</small>', job.schedule_timezone or job.timezone)
        if job.periodic_task_id:
            url = reverse("admin:django_celery_beat_periodictask_change", args=[job.periodic_task_id])
            return format_html('<a href="{}" title="Edit the schedule">{}</a><br><code>{}</code>{}{}{}', url, words,
                               job.schedule, zone, problem, _code_and_admin(job))
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

    @admin.action(description="Run with parameters…", permissions=["operate"])
    def run_with_params(self, request: HttpRequest, queryset: QuerySet[models.CronJob]) -> HttpResponse | None:
        """Send one run of one job with parameter values typed into a form made from its signature: its
        own execution of the slot (``params_given``), whatever the slot's regular run did or will do."""
        chosen = list(queryset[:2])
        if len(chosen) != 1:
            self.message_user(request, "Run with parameters takes one job at a time (its form comes from that "
                                       "job's parameters): select one.", messages.ERROR)
            return None
        job = chosen[0]
        declared = _declared_or_say(self, request, job)
        if declared is None:
            return None
        if not declared.parameters:
            self.message_user(request, f"{job.name} declares no parameters: use “Run now”.", messages.WARNING)
            return None
        form = ParamsForm(declared, job.params if isinstance(job.params, dict) else None,
                          request.POST if "apply" in request.POST else None)
        if "apply" in request.POST and form.is_valid():
            day = form.cleaned_data.get("date")
            try:
                slot = in_effect.slot_for(declared, day.isoformat()) if day else \
                    dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
                sent = tasks.send_run(declared, slot, enums.Trigger.ADMIN, force=form.cleaned_data["force"],
                                      given=form.values)
            except exceptions.InvalidParams as error:
                key = ParamsForm.PREFIX + error.field
                form.add_error(key if key in form.fields else None, str(error))
            except exceptions.CronCeleryError as error:
                self.message_user(request, f"{job.name}: {error}", messages.ERROR)
                return None
            else:
                link = reverse("admin:cron_celery_cronexecution_change", args=[sent.execution_id])
                self.message_user(request, format_html(
                    '{}: sent for {} with {} (<a href="{}">execution {}</a>, run #{}).', job.name,
                    dashboard.when(slot), params.shown(form.values), link, sent.execution_id, sent.run_number),
                    messages.SUCCESS)
                return None
        return self._action_form(
            request, queryset, form, "run_with_params", title=f"Run {job.name} with parameters",
            submit="Send the run",
            intro="Send one run of this job to the workers with the values below (trigger ADMIN). It is a run "
                  "of its own: it does not use up the slot's regular run, and is not skipped because the slot "
                  "already ran; a pause (unless you tick the box), the overlap and the concurrency limits "
                  "still apply. The values are stored on the execution and shown in the history.")

    @admin.action(description="Pause", permissions=["operate"])
    def pause(self, request: HttpRequest, queryset: QuerySet[models.CronJob]) -> None:
        self._set_paused(request, queryset, True)

    @admin.action(description="Resume", permissions=["operate"])
    def resume(self, request: HttpRequest, queryset: QuerySet[models.CronJob]) -> None:
        self._set_paused(request, queryset, False)

    def _set_paused(self, request: HttpRequest, queryset: QuerySet[models.CronJob], paused: bool) -> None:
        source = audit.admin_action("pause" if paused else "resume")
        for job in queryset.select_related("periodic_task"):
            # A transaction per job (one job's rows locked at a time, as before), naming the user to
            # the audit log's triggers.
            with transaction.atomic():
                audit.set_author(actor=_username(request), source=source)
                task = job.periodic_task
                if task is not None:  # the periodic task is the switch; the beat follows it
                    task.enabled = not paused
                    task.save(update_fields=["enabled"])
                else:
                    models.CronJob.objects.filter(id=job.id).update(paused=paused)
            if not paused and (declared := _declared(job)) is not None:
                resumes.release(current_app, declared)  # the runs the pause held (else the reconciler's)
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


#: The job filter lists every job up to this many; beyond, only the job chosen (a page of
#: thousands of links is no filter, and reading them would make every history page grow with N).
JOB_FILTER_LISTS_UP_TO = 100


class JobFilter(admin.SimpleListFilter):
    """By job, listed from the jobs table (not a DISTINCT over the whole history). With more than
    ``JOB_FILTER_LISTS_UP_TO`` jobs it lists only the job chosen: one job's history is reached from
    its page on the dashboard ("All its runs"), or by searching the history for its name or code."""

    title = "job"
    parameter_name = "job"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        jobs = list(models.CronJob.objects.order_by("name").values_list("id", "name")[:JOB_FILTER_LISTS_UP_TO + 1])
        if len(jobs) <= JOB_FILTER_LISTS_UP_TO:
            return [(str(job_id), name) for job_id, name in jobs]
        chosen = self.value()
        if not (chosen and chosen.isascii() and chosen.isdigit()):
            return []
        name = models.CronJob.objects.filter(id=int(chosen)).values_list("name", flat=True).first()
        return [(chosen, name or f"job #{chosen}")]  # a job since deleted still filters (to nothing)

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
    list_display = ("status_badge", "task_name", "slot_shown", "run_shown", "trigger", "params_shown", "skip_reason",
                    "attempt", "duration", "short_message")
    list_filter = ("status", "trigger", "skip_reason", JobFilter)
    search_fields = ("task_code", "task_name", "celery_task_id")
    date_hierarchy = "slot"
    list_select_related = ("job",)
    show_full_result_count = False  # no count(*) over the whole history on every page
    paginator = EstimatedCountPaginator
    actions = ("rerun", "rerun_cascade", "cancel_one_off", "cancel_not_started", "mark_lost", "export_csv")
    inlines = (AlertInline,)
    readonly_fields = ("attempt_history", "duration", "chain", "parameters")
    fieldsets = (
        (None, {"fields": ("job", "task_name", "task_code", "slot", "due_at", "execution_date", "run_number", "status",
                           "trigger", "skip_reason", "forced")}),
        ("Parameters", {"fields": ("parameters", "params_given")}),
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
            shown = dashboard.badge(row.status, f"{row.status.lower()}, waiting")  # for the job's live run
        else:
            shown = dashboard.badge(row.status)
        # Its timing alerts: it started late (or still waits), it ran past its max_runtime.
        marks = [label for label, marked in (("late", row.late_alerted), ("ran long", row.long_alerted)) if marked]
        return format_html("{}{}", shown, format_html_join("", "<br>{}", ((dashboard.badge(S.RETRYING, label),)
                                                                         for label in marks)))

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

    @admin.display(description="parameters")
    def params_shown(self, row: models.CronExecution) -> SafeString | str:
        """The values it runs with, in a line (the full list on its page); "given" marks a run with
        parameters a person gave (its own execution)."""
        declared = _declared(row.job)
        stored = row.params if isinstance(row.params, dict) else None
        text = params.shown(params.ordered(declared.parameters if declared else (), stored))
        if not text:
            return "—"
        short = text if len(text) <= 48 else text[:47] + "…"
        given = format_html(' <small class="cron-quiet" title="{}">given</small>',
                            "A run with parameters a person gave: its own execution of the slot") \
            if row.params_given else ""
        return format_html('<code title="{}">{}</code>{}', text, short, given)

    @admin.display(description="parameters")
    def parameters(self, row: models.CronExecution) -> SafeString | str:
        """Each parameter of the job: the value the run was given (on its row), else the default it ran with."""
        stored = row.params if isinstance(row.params, dict) else {}
        declared = _declared(row.job)
        names = [param.name for param in declared.parameters] if declared is not None else []
        names += [name for name in stored if name not in names]
        if not names:
            return "-"
        by_name = {param.name: param for param in declared.parameters} if declared is not None else {}
        cells = []
        for name in names:
            param = by_name.get(name)
            if name in stored:
                source = "given by hand" if row.params_given else "on the row (its schedule's kwargs)"
                cells.append((name, param.type_text if param else "not declared now", _spelled(stored[name]), source))
            elif param is not None:
                cells.append((name, param.type_text, "—" if param.required else _spelled(param.default_json),
                              "required, none given" if param.required else "its default"))
        rows = format_html_join("", "<tr><td><code>{}</code></td><td>{}</td><td><code>{}</code></td><td>{}</td></tr>",
                                cells)
        return format_html("<table><thead><tr><th>parameter</th><th>type</th><th>value</th><th>from</th></tr></thead>"
                           "<tbody>{}</tbody></table>", rows)

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
                # A run with parameters a person gave is re-run with the same values (checked again:
                # the code may have changed since); any other with the job's scheduled ones.
                given = params.from_json(declared.parameters, row.params, job=declared.name, tz=declared.tzinfo) \
                    if row.params_given and isinstance(row.params, dict) else None
                sent = tasks.send_run(declared, row.slot, enums.Trigger.ADMIN, force=True, cascade=cascade,
                                      given=given)
            except exceptions.CronCeleryError as error:
                self.message_user(request, f"{row}: {error}", messages.ERROR)
                continue
            with_values = f" with {params.shown(params.ordered(declared.parameters, given))}" if given else ""
            self.message_user(request, f"{row.task_name} {row.slot:%Y-%m-%d %H:%M}: sent again{with_values} "
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

    @admin.action(description="Cancel runs not started yet (pending, waiting, held by a pause)",
                  permissions=["operate"])
    def cancel_not_started(self, request: HttpRequest, queryset: QuerySet[models.CronExecution]) -> None:
        user = getattr(request.user, "get_username", lambda: "someone")()
        chosen = list(queryset.values_list("id", flat=True))
        cancelled = outcomes.cancelled(chosen, f"{user} in the admin", any_pending=True)
        left = len(chosen) - len(cancelled)
        said = f"{len(cancelled)} run(s) cancelled"
        if left:
            said += f"; {left} left as they are (started already: revoke a running one to stop it)"
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
              "celery_task_id", "params", "params_given")


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
    if isinstance(value, dict | list):  # a JSON column (params): as JSON, not as Python's repr
        value = json.dumps(value, ensure_ascii=False)
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


class KwargsChecked:
    """A periodic task form that refuses, on save, kwargs its cron job cannot run with: they are
    checked against the job's parameters (``params.from_kwargs``), the error on the kwargs field,
    naming the parameter. Tasks that belong to no cron job are left as django-celery-beat has them."""

    instance: PeriodicTask

    def _clean_json(self, field: str) -> Any:
        """django-celery-beat's check that args and kwargs are JSON, with JSON nested deeper than Python
        reads (``[[[[...``) refused like any other text that is not JSON, instead of a server error."""
        try:
            return super()._clean_json(field)  # type: ignore[misc]
        except RecursionError:
            raise forms.ValidationError("Unable to parse JSON: it nests deeper than Python reads.",
                                        code="invalid") from None

    def clean_kwargs(self) -> Any:
        value = super().clean_kwargs()  # type: ignore[misc]  # django-celery-beat's: it is JSON
        code = models.CronJob.objects.filter(periodic_task_id=self.instance.pk).values_list("code", flat=True) \
            .first() if self.instance.pk else None
        declared = _declared_code(code) if code is not None else None
        if declared is not None:
            try:
                params.from_kwargs(declared.parameters, value, job=declared.name, tz=declared.tzinfo)
            except exceptions.InvalidParams as error:
                raise forms.ValidationError(str(error), code="cron_params") from None
        return value


def _declared_code(code: str) -> registry.Job | None:
    try:
        return registry.get(code)
    except exceptions.UnknownJob:  # not declared in this code base: nothing to check them against
        return None


def _check_kwargs_on_save() -> None:
    """Re-register the periodic task's admin (django-celery-beat's, or the subclass registered in its
    place) with its form extended by ``KwargsChecked``."""
    try:
        current: type[admin.ModelAdmin] = type(admin.site.get_model_admin(PeriodicTask))  # type: ignore[type-arg]
    except NotRegistered:
        return  # a project that took django-celery-beat's admin out: no form to check
    base_form = current.form
    if issubclass(base_form, KwargsChecked):
        return
    form = type(base_form.__name__, (KwargsChecked, base_form), {"__module__": __name__})
    checked = type(current.__name__, (current,), {"form": form, "__module__": __name__})
    admin.site.unregister(PeriodicTask)
    admin.site.register(PeriodicTask, checked)


_check_kwargs_on_save()


# --- the audit log of schedule changes -------------------------------------------------------

def _username(request: HttpRequest) -> str:
    return str(getattr(request.user, "get_username", lambda: "")() or "")


def _code_and_admin(job: models.CronJob, *, long: bool = False) -> SafeString:
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


def _changes_table(changes: object) -> SafeString:
    """Each changed attribute with its value before and after."""
    cells = [(key, before, after) for key, before, after in audit.described(changes)]
    body = format_html_join("", "<tr><td>{}</td><td><code>{}</code></td><td>→</td><td><code>{}</code></td></tr>",
                            cells)
    return format_html('<table class="cron-changes">{}</table>', body)


def _who_cell(change: models.ScheduleChange) -> SafeString:
    """The person the change's transaction named — a claim any database session can make — over the
    database role that made it (and its application_name), which the session cannot set."""
    if not change.actor:
        return format_html("{}", audit.role(change))
    return format_html('{}<br><small class="cron-quiet" title="The name is what the change\'s transaction said '
                       '(any database session can say any name); the role is what the database recorded">'
                       'database role: {}</small>', change.actor, audit.role(change))


SCHEDULE_CHANGE_CSV = ("id", "changed_at", "job_name", "job_code", "actor", "db_role", "application_name", "source",
                       "changes")


def _schedule_change_rows(queryset: QuerySet[models.ScheduleChange]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(SCHEDULE_CHANGE_CSV)
    for values in queryset.order_by("id").values_list(*SCHEDULE_CHANGE_CSV).iterator(chunk_size=2000):
        yield writer.writerow([csv_cell(value) for value in values])


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
        return _who_cell(change)

    @admin.display(description="what changed (before → after)")
    def changes_shown(self, change: models.ScheduleChange) -> SafeString:
        return _changes_table(change.changes)

    @admin.action(description="Export the selection as CSV")
    def export_csv(self, request: HttpRequest, queryset: QuerySet[models.ScheduleChange]) -> StreamingHttpResponse:
        response = StreamingHttpResponse(_schedule_change_rows(queryset), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = 'attachment; filename="cron-schedule-changes.csv"'
        return response


class Audited(access.OperateGated):
    """Mixed into django-celery-beat's admins (the periodic task and its schedules): their forms, deletes
    and actions name the admin user and where from to the audit log's triggers, in the transaction of
    the change (``audit.set_author``). A task's page also says what its cron job's code declares. A row
    that drives a cron job is changed only with the permission to operate cron jobs (``cron_celery.admin.access``)."""

    #: Actions that change no schedule (and send messages): left outside a transaction of their own.
    UNAUDITED_ACTIONS = frozenset({"run_tasks"})

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        with transaction.atomic():  # inside the change view's transaction: the same one
            audit.set_author(actor=_username(request), source=audit.ADMIN_FORM if change else audit.ADMIN_ADD_FORM)
            super().save_model(request, obj, form, change)  # type: ignore[misc]

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        with transaction.atomic():
            audit.set_author(actor=_username(request), source=audit.ADMIN_DELETE)
            super().delete_model(request, obj)  # type: ignore[misc]

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        with transaction.atomic():
            audit.set_author(actor=_username(request), source=audit.ADMIN_DELETE)
            super().delete_queryset(request, queryset)  # type: ignore[misc]

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions: dict[str, Any] = super().get_actions(request)  # type: ignore[misc]
        return {name: (func if name in self.UNAUDITED_ACTIONS else _audited(func, name), name, description)
                for name, (func, _name, description) in actions.items()}

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        found = tuple(super().get_readonly_fields(request, obj))  # type: ignore[misc]
        return (*found, "cron_celery_job") if isinstance(obj, PeriodicTask) else found

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = list(super().get_fieldsets(request, obj))  # type: ignore[misc]
        if isinstance(obj, PeriodicTask) and models.CronJob.objects.filter(periodic_task_id=obj.pk).exists():
            fieldsets = [("cron_celery", {"fields": ("cron_celery_job",)}),
                         *[(title, {**options, "fields": [name for name in options.get("fields", ())
                                                          if name != "cron_celery_job"]})
                           for title, options in fieldsets]]
        return fieldsets

    @admin.display(description="cron job")
    def cron_celery_job(self, task: PeriodicTask) -> SafeString | str:
        """The cron job this task schedules, its schedule in effect and what its code declares."""
        job = models.CronJob.objects.filter(periodic_task_id=task.pk).first()
        if job is None:
            return "-"
        url = reverse("admin:cron_celery_cronjob_change", args=[job.id])
        return format_html('<a href="{}">{}</a> — in effect: <code>{}</code> ({}){}', url, job,
                           job.schedule or "—", job.schedule_timezone or job.timezone, _code_and_admin(job, long=True))


def _audited(action: Callable[..., Any], name: str) -> Callable[..., Any]:
    """An admin action run in a transaction that names the user and the action to the audit log."""

    @functools.wraps(action)
    def run(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        with transaction.atomic():
            audit.set_author(actor=_username(request), source=audit.admin_action(name))
            return action(modeladmin, request, queryset)

    return run


def _audit_beat_admins() -> None:
    """Re-register django-celery-beat's admins (or whatever subclass is registered in their place)
    with ``Audited`` mixed in, once."""
    for model in (PeriodicTask, beat_models.CrontabSchedule, beat_models.IntervalSchedule,
                  beat_models.SolarSchedule, beat_models.ClockedSchedule):
        try:
            current: type[admin.ModelAdmin] = type(admin.site.get_model_admin(model))  # type: ignore[type-arg]
        except NotRegistered:
            continue  # a project that took django-celery-beat's admin out: nothing to audit there
        if issubclass(current, Audited):
            continue
        audited = type(current.__name__, (Audited, current), {"__module__": __name__})
        admin.site.unregister(model)
        admin.site.register(model, audited)


_audit_beat_admins()
