"""The history's actions, mixed into its admin."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, StreamingHttpResponse

from cron_celery import enums, exceptions, models
from cron_celery.admin.base import ReadOnly, S, declaration_of, declared_or_say
from cron_celery.admin.csv_export import execution_rows
from cron_celery.declaring import params
from cron_celery.run import outcomes, tasks


class ExecutionActions(ReadOnly):
    """The history's actions: re-run (with its downstream jobs too), cancel what has not started, mark
    stuck runs LOST, export as CSV."""

    @admin.action(description="Re-run the selected slots (forced)", permissions=["operate"])
    def rerun(self, request: HttpRequest, queryset: QuerySet[models.CronExecution]) -> None:
        self._rerun(request, queryset, cascade=False)

    @admin.action(description="Re-run the selected slots and, when they succeed, their downstream jobs (cascade)",
                  permissions=["operate"])
    def rerun_cascade(self, request: HttpRequest, queryset: QuerySet[models.CronExecution]) -> None:
        self._rerun(request, queryset, cascade=True)

    def _rerun(self, request: HttpRequest, queryset: QuerySet[models.CronExecution], *, cascade: bool) -> None:
        for row in queryset.select_related("job"):
            declared = declared_or_say(self, request, row.job)
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
                declaration_of(row.job), job_id=row.job_id, execution_id=row.id, slot=row.slot, status=S.LOST,
                error_code="MARKED_LOST", message=f"Marked LOST in the admin by {user}.", running_too=True)
        self.message_user(request, f"{done} execution(s) marked LOST; finished ones are left as they are.",
                          messages.SUCCESS if done else messages.WARNING)

    @admin.action(description="Export the selection as CSV")
    def export_csv(self, request: HttpRequest, queryset: QuerySet[models.CronExecution]) -> StreamingHttpResponse:
        response = StreamingHttpResponse(execution_rows(queryset), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = 'attachment; filename="cron-executions.csv"'
        return response
