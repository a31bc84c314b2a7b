"""The execution history: one row per call, filtered by job, with its attempts, parameters and
chain; its alerts inline."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from cron_celery import models
from cron_celery.admin.base import EstimatedCountPaginator, JobFilter, S, declaration_of
from cron_celery.admin.execution_actions import ExecutionActions
from cron_celery.admin.forms import spelled
from cron_celery.decisions import dependencies
from cron_celery.declaring import params
from cron_celery.web import dashboard


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
class CronExecutionAdmin(ExecutionActions):
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
        declared = declaration_of(row.job)
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
        declared = declaration_of(row.job)
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
                cells.append((name, param.type_text if param else "not declared now", spelled(stored[name]), source))
            elif param is not None:
                cells.append((name, param.type_text, "—" if param.required else spelled(param.default_json),
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
