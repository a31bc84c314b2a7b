"""What every page of ours shares: read-only model admins (history is an audit trail: no form
edits it), the permission to operate cron jobs, and a job's declaration found or said missing."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.functional import cached_property

from cron_celery import enums, exceptions, models
from cron_celery.declaring import registry

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


def declared_or_say(admin_page: admin.ModelAdmin, request: HttpRequest,  # type: ignore[type-arg]
                     job: models.CronJob) -> registry.Job | None:
    """The job's declaration, or None after telling the person it is not in this code base."""
    declared = declaration_of(job)
    if declared is None:
        admin_page.message_user(request, f"{job.name}: not declared in this code base.", messages.ERROR)
    return declared


def declaration_of(job: models.CronJob) -> registry.Job | None:
    try:
        return registry.get(job.code)
    except exceptions.UnknownJob:
        return None


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
