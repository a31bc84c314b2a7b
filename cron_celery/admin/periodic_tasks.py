"""django-celery-beat's admins, told who edits: a periodic task's kwargs checked against the job's
parameters on save, and every save and delete of a cron job's schedule recorded in the audit log."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.exceptions import NotRegistered
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django_celery_beat import admin as beat_admin  # noqa: F401  (its admins registered first: ours wrap them)
from django_celery_beat import models as beat_models
from django_celery_beat.models import PeriodicTask

from cron_celery import exceptions, models
from cron_celery.admin import access
from cron_celery.admin.schedule_changes import code_and_admin, username
from cron_celery.decisions import audit, tracked
from cron_celery.declaring import params, registry


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


class TrackingChoice(forms.NullBooleanSelect):
    """Yes, no, or (empty) as the setting says, in those words."""

    def __init__(self, attrs: Any = None) -> None:
        super().__init__(attrs)
        self.choices = [("unknown", "As TRACK_PERIODIC_TASKS says"), ("true", "Yes"), ("false", "No")]


class TrackingForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = models.TrackedPeriodicTask
        fields = ("track", "catch_up")
        widgets = {"track": TrackingChoice}


class TrackingInline(admin.TabularInline):  # type: ignore[type-arg]
    """On a periodic task's page: whether cron_celery tracks it as a job (over ``TRACK_PERIODIC_TASKS``),
    its catch-up policy, and what holds now. Not shown for a cron job's own periodic task, which is
    always its job's."""

    model = models.TrackedPeriodicTask
    form = TrackingForm
    extra = 1
    max_num = 1
    can_delete = False
    fields = ("track", "catch_up", "now")
    readonly_fields = ("now",)

    @admin.display(description="now")
    def now(self, choice: models.TrackedPeriodicTask) -> SafeString | str:
        """The job that tracks the periodic task, linked; or that none does (the beat links or unlinks
        one at its next tick after a save)."""
        job = models.CronJob.objects.filter(periodic_task_id=choice.periodic_task_id,
                                            task__startswith=tracked.ALIAS).first()
        if job is None:
            return "not tracked: sent by django-celery-beat's own logic, with no record"
        return format_html('tracked as the job <a href="{}">{}</a> ({})',
                           reverse("admin:cron_celery_cronjob_change", args=[job.pk]), job.name, job.code)


class OffersTracking:
    """Mixed into the periodic task's admin: ``TrackingInline``, except on a cron job's own task."""

    def get_inline_instances(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        found: list[Any] = super().get_inline_instances(request, obj)  # type: ignore[misc]
        if obj is not None and models.CronJob.objects.filter(periodic_task_id=obj.pk).exclude(
                task__startswith=tracked.ALIAS).exists():
            return [inline for inline in found if not isinstance(inline, TrackingInline)]
        return found


def _check_kwargs_on_save() -> None:
    """Re-register the periodic task's admin (django-celery-beat's, or the subclass registered in its
    place) with its form extended by ``KwargsChecked`` and the tracking choice (``TrackingInline``)."""
    try:
        current: type[admin.ModelAdmin] = type(admin.site.get_model_admin(PeriodicTask))  # type: ignore[type-arg]
    except NotRegistered:
        return  # a project that took django-celery-beat's admin out: no form to check
    base_form = current.form
    if issubclass(base_form, KwargsChecked):
        return
    form = type(base_form.__name__, (KwargsChecked, base_form), {"__module__": __name__})
    checked = type(current.__name__, (OffersTracking, current),
                   {"form": form, "__module__": __name__, "inlines": [*current.inlines, TrackingInline]})
    admin.site.unregister(PeriodicTask)
    admin.site.register(PeriodicTask, checked)


_check_kwargs_on_save()


class Audited(access.OperateGated):
    """Mixed into django-celery-beat's admins (the periodic task and its schedules): their forms, deletes
    and actions name the admin user and where from to the audit log's triggers, in the transaction of
    the change (``audit.set_author``). A task's page also says what its cron job's code declares. A row
    that drives a cron job is changed only with the permission to operate cron jobs (``cron_celery.admin.access``)."""

    #: Actions that change no schedule (and send messages): left outside a transaction of their own.
    UNAUDITED_ACTIONS = frozenset({"run_tasks"})

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        with transaction.atomic():  # inside the change view's transaction: the same one
            audit.set_author(actor=username(request), source=audit.ADMIN_FORM if change else audit.ADMIN_ADD_FORM)
            super().save_model(request, obj, form, change)  # type: ignore[misc]

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        with transaction.atomic():
            audit.set_author(actor=username(request), source=audit.ADMIN_DELETE)
            super().delete_model(request, obj)  # type: ignore[misc]

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        with transaction.atomic():
            audit.set_author(actor=username(request), source=audit.ADMIN_DELETE)
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
                           job.schedule or "—", job.schedule_timezone or job.timezone, code_and_admin(job, long=True))


def _audited(action: Callable[..., Any], name: str) -> Callable[..., Any]:
    """An admin action run in a transaction that names the user and the action to the audit log."""

    @functools.wraps(action)
    def run(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        with transaction.atomic():
            audit.set_author(actor=username(request), source=audit.admin_action(name))
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
