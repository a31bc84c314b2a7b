"""The jobs dashboard (one row per job: its health at a glance), a job's page, and the next hour of
slots (Upcoming)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from cron_celery import models
from cron_celery.admin.base import EstimatedCountPaginator, S
from cron_celery.admin.job_actions import JobActions, local_time
from cron_celery.admin.schedule_changes import changes_table, code_and_admin, who_cell
from cron_celery.decisions import audit, dependencies
from cron_celery.web import dashboard, upcoming


@admin.register(models.CronJob)
class CronJobAdmin(JobActions):
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
        return format_html("{}{}{}", shown, dashboard.schedule_problem(job), code_and_admin(job, long=True))

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
                  who_cell(change), change.source, changes_table(change.changes)) for change in changes]
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
            return format_html("{}{}{}", dashboard.badge(S.SKIPPED, "paused"), dashboard.pause_said(job), timing)
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
                 "local": local_time(slot.at, slot.job),
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
                               job.schedule, zone, problem, code_and_admin(job))
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
