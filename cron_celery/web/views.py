"""The HTTP endpoints: ``status/``, ``health/``, ``metrics/``, ``run/<job>/`` and ``audit/``.

Mount them with ``path("cron/", include("cron_celery.urls"))``. Each endpoint asks for one
thing, from a Bearer token or from a staff session:

- ``status/``, ``health/``: the token scope ``read``, or the session's
  ``cron_celery.view_cronexecution`` permission (what the admin asks to show the history);
- ``metrics/``: the scope ``metrics`` (which ``read`` gives too: ``tokens.IMPLIES``), or the same
  permission;
- ``POST run/<job>/``: the scope ``run`` (and ``force`` with ``force=true``), or the
  session's ``cron_celery.change_cronjob`` (``models.OPERATE_PERMISSION``, as the admin's
  run now and re-run actions, which are forced, ask);
- ``audit/`` (the log of schedule changes): the scope ``audit``, or the session's
  ``cron_celery.view_schedulechange`` (what the admin asks to list the changes).

No or an unknown token: 401 with a ``WWW-Authenticate: Bearer`` challenge; a valid token
without the scope: 403 naming the scope. Anonymous requests get 401, non-staff users and staff
users without the permission 403 — never with data. Token values are compared in constant
time (``tokens.match``) and never logged or echoed. A POST from a session must carry Django's
CSRF token; a token request needs none.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Callable
from typing import Any

from celery import current_app
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.utils import dateparse
from django.utils import timezone as django_timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from cron_celery import check_errors, enums, exceptions, models, slots
from cron_celery.beat import health
from cron_celery.decisions import audit, in_effect, oneoffs, pauses
from cron_celery.declaring import params, registry, storable
from cron_celery.run import pausing, tasks
from cron_celery.web import dashboard, tokens

logger = logging.getLogger(__name__)

#: ``status/`` returns at most this many executions (``?limit=``; default 100).
MAX_LIMIT, DEFAULT_LIMIT = 1000, 100
#: What a session needs to read the endpoints (the admin's permission to see the history).
VIEW_PERMISSION = "cron_celery.view_cronexecution"
#: What a session needs to read the audit log (the admin's permission to list schedule changes).
AUDIT_PERMISSION = "cron_celery.view_schedulechange"
View = Callable[..., HttpResponse]


def _challenge(error: str, *, invalid: bool) -> HttpResponse:
    header = 'Bearer error="invalid_token"' if invalid else "Bearer"
    return JsonResponse({"error": error}, status=401, headers={"WWW-Authenticate": header})


def _lacks_scope(scope: str) -> HttpResponse:
    return JsonResponse({"error": f"the token lacks the scope {scope!r}", "missing_scope": scope}, status=403,
                        headers={"WWW-Authenticate": f'Bearer error="insufficient_scope", scope="{scope}"'})


def _lacks_permission(permission: str) -> HttpResponse:
    return JsonResponse({"error": f"the permission {permission} is needed", "missing_permission": permission},
                        status=403)


def caller(request: HttpRequest) -> tokens.Token | None:
    """The token the request was let in with; None for a session."""
    found = getattr(request, "cron_token", None)
    return found if isinstance(found, tokens.Token) else None


def allowed(request: HttpRequest, scope: str, permission: str) -> HttpResponse | None:
    """None when the request (already let in by ``protected``) may do this; otherwise the 403."""
    token = caller(request)
    if token is not None:
        return None if token.allows(scope) else _lacks_scope(scope)
    return None if request.user.has_perm(permission) else _lacks_permission(permission)


def _refusal(request: HttpRequest, scope: str, permission: str) -> HttpResponse | None:
    """None when the request may go on; otherwise the 401/403 answer."""
    header = request.headers.get("Authorization", "")
    if header[:7].lower() == "bearer ":
        presented = header[7:].strip()
        token = tokens.match(presented) if presented else None
        if token is None:
            return _challenge("invalid token", invalid=True)
        request.cron_token = token  # type: ignore[attr-defined]
        return allowed(request, scope, permission)
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return _challenge("authentication required (a staff session or a Bearer token)", invalid=False)
    if not user.is_staff:
        return JsonResponse({"error": "staff only"}, status=403)
    return allowed(request, scope, permission)


def protected(scope: str, permission: str) -> Callable[[View], View]:
    """Authentication and authorisation for an endpoint: the token ``scope`` or the session's
    ``permission``; session POSTs also pass Django's CSRF check."""

    def decorate(view: View) -> View:
        @csrf_exempt
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            refused = _refusal(request, scope, permission)
            if refused is not None:
                return refused
            if request.method == "POST" and caller(request) is None:
                rejected = CsrfViewMiddleware(lambda r: HttpResponse()).process_view(request, view, args, kwargs)
                if rejected is not None:
                    return rejected
            return view(request, *args, **kwargs)

        wrapper.__name__ = view.__name__
        wrapper.__doc__ = view.__doc__
        return wrapper

    return decorate


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def job_summary(job: models.CronJob, next_one_off: dt.datetime | None = None) -> dict[str, Any]:
    return {
        "name": job.name, "code": job.code, "schedule": job.schedule or None,
        "timezone": job.schedule_timezone or job.timezone, "paused": job.paused,
        "pause": dashboard.pause_summary(job),
        "next_slot": _iso(job.next_run_at if job.active_until is None or job.next_run_at is None
                          or job.next_run_at < job.active_until else None),
        "active_from": _iso(job.active_from), "active_until": _iso(job.active_until),
        "next_one_off": _iso(next_one_off), "last_status": job.last_status or None,
        "last_run_at": _iso(job.last_run_at), "last_success_at": _iso(job.last_success_at),
        "consecutive_failures": job.consecutive_failures,
    }


def execution_summary(row: models.CronExecution) -> dict[str, Any]:
    duration = row.duration
    return {
        "id": row.id, "job": row.task_name, "code": row.task_code, "slot": _iso(row.slot),
        "execution_date": row.execution_date.isoformat(), "run_number": row.run_number, "status": row.status,
        "trigger": row.trigger, "skip_reason": row.skip_reason or None, "attempt": row.retry_count + 1,
        "started": _iso(row.started), "ended": _iso(row.ended),
        "duration_seconds": duration.total_seconds() if duration is not None else None,
        "error_code": row.error_code or None, "message": row.message[:500],
        "params": row.params, "params_given": row.params_given,
    }


@require_GET
@protected(tokens.READ, VIEW_PERMISSION)
def status(request: HttpRequest) -> HttpResponse:
    """Every job's summary and the most recent executions (``?limit=`` ≤ 1000, ``?job=``)."""
    raw = request.GET.get("limit", str(DEFAULT_LIMIT))
    if not re.fullmatch(r"[0-9]{1,5}", raw) or not 1 <= int(raw) <= MAX_LIMIT:
        return JsonResponse({"error": f"limit must be a whole number from 1 to {MAX_LIMIT}"}, status=400)
    jobs = models.CronJob.objects.all()
    executions = models.CronExecution.objects.all()
    wanted = request.GET.get("job")
    if wanted:  # a name first, then a code, as the commands look jobs up
        found = models.CronJob.objects.filter(name=wanted).first() or models.CronJob.objects.filter(code=wanted).first()
        if found is None:
            return JsonResponse({"error": f"unknown job {wanted!r}"}, status=404)
        jobs = jobs.filter(id=found.id)
        executions = executions.filter(job=found)
    listed = list(jobs.order_by("name"))
    one_offs = oneoffs.next_by_job([job.id for job in listed])
    return JsonResponse({
        "jobs": [job_summary(job, one_offs.get(job.id)) for job in listed],
        "executions": [execution_summary(row) for row in executions.order_by("-id")[: int(raw)]],
    })


@require_GET
@protected(tokens.READ, VIEW_PERMISSION)
def health_view(request: HttpRequest) -> HttpResponse:
    """200 when a beat leads, no job is overdue and this process's cron_celery system checks
    found no error; 503 with the reasons (and the checks' ids under ``checks``) otherwise."""
    report = health.check()
    found = check_errors.process_errors()
    body = report.as_dict()
    body["checks"] = [{"id": message.id, "message": message.msg, "hint": message.hint} for message in found]
    if found:
        body["status"] = "unhealthy"
        body["reasons"] = [f"system check {message.id}: {message.msg}" for message in found] + body["reasons"]
    return JsonResponse(body, status=200 if report.ok and not found else 503)


@require_GET
@protected(tokens.METRICS, VIEW_PERMISSION)
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus text format (needs the ``prometheus`` extra: prometheus-client)."""
    try:
        from cron_celery.web import metrics
    except ModuleNotFoundError as missing:
        if (missing.name or "").partition(".")[0] != "prometheus_client":
            raise  # a module of ours that fails to import is a bug to see, not a missing extra
        return HttpResponse("prometheus-client is not installed: pip install 'cron_celery[prometheus]'\n",
                            status=501, content_type="text/plain")
    body, content_type = metrics.render()
    return HttpResponse(body, content_type=content_type)


@require_POST
@protected(tokens.RUN, models.OPERATE_PERMISSION)
def run(request: HttpRequest, job: str) -> HttpResponse:
    """Send one run of a job to the workers (trigger ENQUEUE). Form or JSON fields, all
    optional: ``date`` (its first slot that day), ``at`` (an exact slot), ``force``, ``rerun``,
    ``cascade`` (its success runs the slot of the jobs declared ``after=`` it again), ``params``
    (an object of parameter values; a form field holds it as JSON text): a run with parameters,
    its own execution, its values over the scheduled ones; a bad one is a 400 whose ``field``
    names it. With ``schedule`` true, nothing is sent now: a one-off run at ``at`` is recorded for
    the beat to send then (201, trigger ONE_OFF).
    A token needs the scope ``run``, and ``force`` too for ``force``; a session needs
    ``models.OPERATE_PERMISSION`` for both, as the admin's forced actions do."""
    try:
        declared = registry.get(job)
    except exceptions.UnknownJob as error:
        return JsonResponse({"error": str(error)}, status=404)
    fields: dict[str, str] = {key: str(value) for key, value in request.POST.items()}
    raw_params: object = None
    if "params" in fields:  # a form field: JSON text
        try:
            raw_params = storable.loads(fields.pop("params") or "null")
        except ValueError as error:
            return JsonResponse({"error": f"params is not JSON ({error})", "field": "params"}, status=400)
    if request.content_type == "application/json":
        body = _json_object(request)
        if isinstance(body, JsonResponse):
            return body
        raw_params = body.pop("params", None)
        fields = {key: str(value).lower() if isinstance(value, bool) else str(value)
                  for key, value in body.items() if value is not None}  # null: as if absent
    given: dict[str, params.Json] | None = None
    if raw_params is not None:
        try:
            given = params.from_json(declared.parameters, raw_params, job=declared.name, tz=declared.tzinfo)
        except exceptions.InvalidParams as error:
            return JsonResponse({"error": str(error), "field": error.field}, status=400)
    flag = {"1", "true", "yes", "on"}
    force = fields.get("force", "").lower() in flag
    if force:
        refused = allowed(request, tokens.FORCE, models.OPERATE_PERMISSION)
        if refused is not None:
            return refused
    if fields.get("schedule", "").lower() in flag:
        return _schedule_one_off(request, declared, fields, force=force, given=given)
    try:
        slot = in_effect.slot_for(declared, fields.get("date") or None, fields.get("at") or None)
        sent = tasks.send_run(declared, slot, enums.Trigger.ENQUEUE, force=force,
                              rerun=fields.get("rerun", "").lower() in flag,
                              cascade=fields.get("cascade", "").lower() in flag, given=given)
    except exceptions.PublishFailed as error:
        return JsonResponse({"error": f"{declared.name}: {error}"}, status=503)
    except exceptions.InvalidParams as error:
        return JsonResponse({"error": str(error), "field": error.field}, status=400)
    except exceptions.CronCeleryError as error:
        return JsonResponse({"error": str(error)}, status=400)
    _log_done(request, "run of cron job %s for slot %s sent", declared, slot, sent.execution_id)
    answer = {"job": declared.name, "slot": slot.isoformat(), "execution_id": sent.execution_id,
              "run_number": sent.run_number, "celery_task_id": sent.celery_task_id}
    return JsonResponse({**answer, "params": given} if given else answer, status=202)


@require_POST
@protected(tokens.PAUSE, models.OPERATE_PERMISSION)
def pause(request: HttpRequest, job: str) -> HttpResponse:
    """Pause a job (its name or code). Form or JSON fields, both optional: ``note`` (why, shown on the
    dashboard, the job's page, ``status/`` and in the audit log) and ``until`` (an ISO-8601 time, naive
    ones read in the job's timezone: it resumes itself then; one not ahead is a 400 and nothing is
    paused). The author is the token's name (``token:<name>``) or the user. A token needs the scope
    ``pause``; a session ``models.OPERATE_PERMISSION``, as the admin's *Pause…* does."""
    return _switch(request, job, paused=True)


@require_POST
@protected(tokens.PAUSE, models.OPERATE_PERMISSION)
def resume(request: HttpRequest, job: str) -> HttpResponse:
    """Resume a job (its name or code): the note and the end are cleared, and the runs the pause held
    are sent. The same scope and permission as ``pause``."""
    return _switch(request, job, paused=False)


def _json_object(request: HttpRequest) -> dict[str, Any] | JsonResponse:
    """A JSON request's body, an object; else the 400 that says what is wrong with it."""
    try:
        body = storable.loads(request.body or b"{}")
    except ValueError:
        return JsonResponse({"error": "the body is not JSON"}, status=400)
    if not isinstance(body, dict):
        return JsonResponse({"error": "the body must be a JSON object"}, status=400)
    return body


def _switch(request: HttpRequest, name: str, *, paused: bool) -> HttpResponse:
    row = models.CronJob.objects.select_related("periodic_task").filter(
        Q(name=name) | Q(code=name), removed_at__isnull=True).first()
    if row is None:
        return JsonResponse({"error": f"no cron job is named {name!r}"}, status=404)
    fields: dict[str, str] = {key: str(value) for key, value in request.POST.items()}
    if request.content_type == "application/json":
        body = _json_object(request)
        if isinstance(body, JsonResponse):
            return body
        fields = {key: str(value) for key, value in body.items() if value is not None}
    note = fields.get("note", "").strip()
    if len(note) > pauses.NOTE_MAX or "\x00" in note:
        return JsonResponse({"error": f"note must be at most {pauses.NOTE_MAX} characters, without NUL",
                             "field": "note"}, status=400)
    token = caller(request)
    actor = f"token:{token.name}" if token else request.user.get_username()
    try:
        until = slots.parse_slot(fields["until"], pausing.zone_of(row)) if paused and fields.get("until") else None
        pausing.switch(current_app, row, paused, actor=actor, source=audit.endpoint_action(
            "pause" if paused else "resume"), note=note, until=until)
    except exceptions.InvalidSlot as error:
        return JsonResponse({"error": f"until: {error}", "field": "until"}, status=400)
    except exceptions.CronCeleryError as error:
        return JsonResponse({"error": str(error), "field": "until"}, status=400)
    logger.info("cron job %s %s through the endpoint by %s", row.name, "paused" if paused else "resumed",
                f"the token {token.name!r}" if token else f"user {actor!r}", extra={"job": row.code})
    fresh = models.CronJob.objects.get(id=row.id)
    return JsonResponse({"job": fresh.name, "code": fresh.code, "paused": fresh.paused,
                         "pause": dashboard.pause_summary(fresh)})


def _log_done(request: HttpRequest, what: str, declared: registry.Job, slot: dt.datetime, execution_id: int) -> None:
    """Log who did ``what`` (a format with the job's name and the slot) through the endpoint."""
    token = caller(request)
    logger.info(what + " through the endpoint by %s (execution %s)", declared.name, slot.isoformat(),
                f"the token {token.name!r}" if token else f"user {request.user.get_username()!r}", execution_id,
                extra={"job": declared.code, "slot": slot.isoformat(), "execution": execution_id})


def _schedule_one_off(request: HttpRequest, declared: registry.Job, fields: dict[str, str], *,
                      force: bool, given: dict[str, params.Json] | None = None) -> HttpResponse:
    """``"schedule": true``: record a one-off run at ``at`` for the beat to send then (``oneoffs``)."""
    if not fields.get("at"):
        return JsonResponse({"error": "schedule needs at, the time of the one-off run (e.g. 2026-12-01T18:00)"},
                            status=400)
    together = [name for name in ("rerun", "cascade") if fields.get(name, "").lower() in {"1", "true", "yes", "on"}]
    if together:
        return JsonResponse({"error": f"schedule cannot be combined with {', '.join(together)}: a one-off run is "
                                      "a new run at a time of its own"}, status=400)
    try:
        at = in_effect.slot_for(declared, fields.get("date") or None, fields["at"])
        recorded = tasks.schedule_one_off(declared, at, force=force, given=given)
    except exceptions.InvalidParams as error:
        return JsonResponse({"error": str(error), "field": error.field}, status=400)
    except exceptions.CronCeleryError as error:
        return JsonResponse({"error": str(error)}, status=400)
    _log_done(request, "one-off run of cron job %s at %s recorded", declared, at, recorded.execution_id)
    return JsonResponse({"job": declared.name, "slot": at.isoformat(), "execution_id": recorded.execution_id,
                         "run_number": recorded.run_number, "scheduled": True, "status": "PENDING"}, status=201)


def _since(raw: str) -> dt.datetime | None:
    """``since=``: an ISO 8601 date or time (UTC unless it carries an offset); None if unreadable."""
    try:
        moment = dateparse.parse_datetime(raw)
        if moment is None:
            day = dateparse.parse_date(raw)
            moment = dt.datetime.combine(day, dt.time()) if day is not None else None
    except ValueError:
        return None
    if moment is not None and django_timezone.is_naive(moment):
        moment = moment.replace(tzinfo=dt.UTC)
    return moment


@require_GET
@protected(tokens.AUDIT, AUDIT_PERMISSION)
def audit_view(request: HttpRequest) -> HttpResponse:
    """The audit log of schedule changes, newest first (``audit.page``): ``?job=`` (a job's name or
    code; a deleted job's by the name or code it had), ``?since=`` (an ISO 8601 date or time, UTC unless it
    has an offset), ``?limit=`` (1-1000, default 100), ``?before=`` (the id to continue below: the
    answer's ``next`` link carries it). A token needs the scope ``audit``; a session the
    permission to view schedule changes."""
    raw = request.GET.get("limit", str(DEFAULT_LIMIT))
    if not re.fullmatch(r"[0-9]{1,5}", raw) or not 1 <= int(raw) <= MAX_LIMIT:
        return JsonResponse({"error": f"limit must be a whole number from 1 to {MAX_LIMIT}"}, status=400)
    before_raw = request.GET.get("before", "")
    if before_raw and not re.fullmatch(r"[1-9][0-9]{0,17}", before_raw):
        return JsonResponse({"error": "before must be the id of a change (a whole number above 0)"}, status=400)
    since_raw = request.GET.get("since", "")
    since = _since(since_raw) if since_raw else None
    if since_raw and since is None:
        return JsonResponse({"error": f"since must be an ISO 8601 date or time such as 2026-11-29 or "
                                      f"2026-11-29T08:00:00Z, not {since_raw[:40]!r}"}, status=400)
    try:
        found = audit.page(job=request.GET.get("job") or None, since=since,
                           before=int(before_raw) if before_raw else None, limit=int(raw))
    except exceptions.UnknownAuditedJob as error:
        return JsonResponse({"error": str(error)}, status=404)
    following = None
    if found.more and found.changes:
        query = request.GET.copy()
        query["before"] = str(found.changes[-1].id)
        following = f"{request.path}?{query.urlencode()}"
    return JsonResponse({"changes": [audit.as_dict(change) for change in found.changes], "next": following})

