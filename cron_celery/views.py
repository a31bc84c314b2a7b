"""The HTTP endpoints: ``status/``, ``health/``, ``metrics/`` and ``run/<job>/``.

Mount them with ``path("cron/", include("cron_celery.urls"))``. Every endpoint needs a
staff session or ``Authorization: Bearer <CRON_CELERY["API_TOKEN"]>`` (compared in
constant time); anonymous requests get 401 and non-staff users 403, with no data. A POST
from a session must carry Django's CSRF token; a token request needs none.
"""

from __future__ import annotations

import datetime as dt
import hmac
import json
import re
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from cron_celery import conf, exceptions, health, models, registry, schedule_sync, tasks

#: ``status/`` returns at most this many executions (``?limit=``; default 100).
MAX_LIMIT, DEFAULT_LIMIT = 1000, 100
View = Callable[..., HttpResponse]


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """None when the request may see the data; otherwise the 401/403 answer."""
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        token = str(conf.settings.API_TOKEN or "")
        if token and hmac.compare_digest(header[7:].strip().encode(), token.encode()):
            request.cron_token = True  # type: ignore[attr-defined]
            return None
        return JsonResponse({"error": "invalid token"}, status=401, headers={"WWW-Authenticate": "Bearer"})
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return JsonResponse({"error": "authentication required (a staff session or a Bearer token)"}, status=401,
                            headers={"WWW-Authenticate": "Bearer"})
    if not user.is_staff:
        return JsonResponse({"error": "staff only"}, status=403)
    return None


def protected(view: View) -> View:
    """Authentication for an endpoint; session POSTs also pass Django's CSRF check."""

    @csrf_exempt
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        refused = _refusal(request)
        if refused is not None:
            return refused
        if request.method == "POST" and not getattr(request, "cron_token", False):
            rejected = CsrfViewMiddleware(lambda r: HttpResponse()).process_view(request, view, args, kwargs)
            if rejected is not None:
                return rejected
        return view(request, *args, **kwargs)

    wrapper.__name__ = view.__name__
    wrapper.__doc__ = view.__doc__
    return wrapper


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def job_summary(job: models.CronJob) -> dict[str, Any]:
    return {
        "name": job.name, "code": job.code, "schedule": job.schedule or None,
        "timezone": job.schedule_timezone or job.timezone, "paused": job.paused,
        "next_slot": _iso(job.next_run_at), "last_status": job.last_status or None,
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
    }


@require_GET
@protected
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
    return JsonResponse({
        "jobs": [job_summary(job) for job in jobs.order_by("name")],
        "executions": [execution_summary(row) for row in executions.order_by("-id")[: int(raw)]],
    })


@require_GET
@protected
def health_view(request: HttpRequest) -> HttpResponse:
    """200 when a beat leads and no job is overdue; 503 with the reasons otherwise."""
    report = health.check()
    return JsonResponse(report.as_dict(), status=200 if report.ok else 503)


@require_GET
@protected
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus text format (needs the ``metrics`` extra: prometheus-client)."""
    try:
        from cron_celery import metrics
    except ImportError:
        return HttpResponse("prometheus-client is not installed: pip install 'cron_celery[metrics]'\n",
                            status=501, content_type="text/plain")
    body, content_type = metrics.render()
    return HttpResponse(body, content_type=content_type)


@require_POST
@protected
def run(request: HttpRequest, job: str) -> HttpResponse:
    """Send one run of a job to the workers (trigger ENQUEUE). Form or JSON fields, all
    optional: ``date`` (its first slot that day), ``at`` (an exact slot), ``force``, ``rerun``.
    A session needs ``models.OPERATE_PERMISSION``; the Bearer token may always."""
    if not getattr(request, "cron_token", False) and not request.user.has_perm(models.OPERATE_PERMISSION):
        return JsonResponse({"error": f"the permission {models.OPERATE_PERMISSION} is needed"}, status=403)
    try:
        declared = registry.get(job)
    except exceptions.UnknownJob as error:
        return JsonResponse({"error": str(error)}, status=404)
    fields: dict[str, str] = {key: str(value) for key, value in request.POST.items()}
    if request.content_type == "application/json":
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            return JsonResponse({"error": "the body is not JSON"}, status=400)
        if not isinstance(body, dict):
            return JsonResponse({"error": "the body must be a JSON object"}, status=400)
        fields = {key: str(value).lower() if isinstance(value, bool) else str(value)
                  for key, value in body.items() if value is not None}  # null: as if absent
    flag = {"1", "true", "yes", "on"}
    try:
        slot = schedule_sync.slot_for(declared, fields.get("date") or None, fields.get("at") or None)
        sent = tasks.send_run(declared, slot, models.Trigger.ENQUEUE, force=fields.get("force", "").lower() in flag,
                              rerun=fields.get("rerun", "").lower() in flag)
    except exceptions.PublishFailed as error:
        return JsonResponse({"error": f"{declared.name}: {error}"}, status=503)
    except exceptions.CronCeleryError as error:
        return JsonResponse({"error": str(error)}, status=400)
    return JsonResponse({"job": declared.name, "slot": slot.isoformat(), "execution_id": sent.execution_id,
                         "run_number": sent.run_number, "celery_task_id": sent.celery_task_id}, status=202)
