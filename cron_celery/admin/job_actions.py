"""The jobs dashboard's actions, mixed into its admin: they send runs through the same paths as the
commands (``tasks.send_run``, ``backfill``, ``resumes``), so an action is recorded like any run."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Callable

from celery import current_app
from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from cron_celery import enums, exceptions, models, slots
from cron_celery.admin.base import ReadOnly, declared_or_say
from cron_celery.admin.forms import BackfillForm, OneOffForm, ParamsForm, PauseForm
from cron_celery.admin.schedule_changes import username
from cron_celery.decisions import audit, in_effect
from cron_celery.declaring import params, registry
from cron_celery.run import backfill, pausing, tasks
from cron_celery.web import dashboard


class JobActions(ReadOnly):
    """The jobs dashboard's actions: run now, with parameters, a one-off run, pause, resume, backfill.
    Each goes through the same code as the commands, so it is recorded like any other run."""

    @admin.action(description="Run now (send to the workers)", permissions=["operate"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[models.CronJob]) -> None:
        for job in queryset:
            declared = declared_or_say(self, request, job)
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
        declared = declared_or_say(self, request, job)
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

    @admin.action(description="Pause…", permissions=["operate"])
    def pause(self, request: HttpRequest, queryset: QuerySet[models.CronJob]) -> HttpResponse | None:
        """Pause with a note and, optionally, an end: the job resumes itself then, by the database's
        clock (``pauses``), whoever is around."""
        form = PauseForm(request.POST if "apply" in request.POST else None)
        if "apply" in request.POST and form.is_valid():
            self._set_paused(request, queryset, True, note=form.cleaned_data["note"].strip(),
                             until=form.cleaned_data["until"].strip())
            return None
        return self._action_form(request, queryset, form, "pause", title="Pause", submit="Pause",
                                 intro="Pause these jobs: no slot of theirs is sent while they are paused (each is "
                                       "recorded SKIPPED PAUSED if its message was on its way), and the runs "
                                       "somebody asks for wait for the resume. With an end, each resumes itself "
                                       "then; without one, until somebody resumes it.")

    @admin.action(description="Resume", permissions=["operate"])
    def resume(self, request: HttpRequest, queryset: QuerySet[models.CronJob]) -> None:
        self._set_paused(request, queryset, False)

    def _set_paused(self, request: HttpRequest, queryset: QuerySet[models.CronJob], paused: bool, *,
                    note: str = "", until: str = "") -> None:
        source = audit.admin_action("pause" if paused else "resume")
        done = 0
        for job in queryset.select_related("periodic_task"):
            try:  # a transaction per job: one job's rows locked at a time
                end = slots.parse_slot(until, job_zone(job)) if paused and until else None
                pausing.switch(current_app, job, paused, actor=username(request), source=source, note=note,
                               until=end)
            except exceptions.CronCeleryError as error:
                self.message_user(request, f"{job.name}: {error}", messages.ERROR)
                continue
            done += 1
        verb = "paused" if paused else "resumed"
        if done:
            self.message_user(request, f"{done} job(s) {verb}.", messages.SUCCESS)

    @admin.action(description="Backfill a date range…", permissions=["operate"])
    def backfill_range(self, request: HttpRequest, queryset: QuerySet[models.CronJob]) -> HttpResponse | None:
        form = BackfillForm(request.POST if "apply" in request.POST else None)
        if "apply" in request.POST and form.is_valid():
            data = form.cleaned_data

            def send(job: models.CronJob, declared: registry.Job) -> SafeString:
                planned = backfill.plan(declared, data["start"], data["end"], force=data["force"],
                                        cascade=data["cascade"])
                return backfill_said(job, backfill.start(declared, planned), len(planned.done), planned.outside)

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
                at = slots.parse_slot(data["at"], declared.tzinfo)
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
            declared = declared_or_say(self, request, job)
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


def job_zone(job: models.CronJob) -> zoneinfo.ZoneInfo:
    """The timezone a time typed for this job is read in: its schedule's, else its own, else UTC."""
    return pausing.zone_of(job)


def local_time(slot: dt.datetime, job: models.CronJob) -> str:
    """A slot in the job's schedule timezone ("09:30:00 CET Europe/Amsterdam"); UTC jobs get a dash."""
    zone = job.schedule_timezone or job.timezone
    if zone in ("", "UTC"):
        return "—"
    try:
        return f"{slot.astimezone(zoneinfo.ZoneInfo(zone)):%H:%M:%S %Z} {zone}"  # the abbreviation: CET or CEST
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return zone


def backfill_said(job: models.CronJob, started: backfill.Started, done: int, outside: int = 0) -> SafeString:
    """How far a backfill got, with a link to its executions in the history."""
    history = (reverse("admin:cron_celery_cronexecution_changelist")
               + f"?job={job.id}&trigger__exact={enums.Trigger.BACKFILL.value}")
    later = f", {started.handed_over} being sent by a worker" if started.handed_over else ""
    skipped = f"; {done} already ran" if done else ""
    skipped += f"; {outside} outside its active window left out" if outside else ""
    return format_html('{}: {} slots recorded, {} sent now{}{}. <a href="{}">Follow them in the history</a>.',
                       job.name, started.recorded, started.sent, later, skipped, history)
