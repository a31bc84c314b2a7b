"""The schema: migrations in step with the models, and the original design's queries."""

from __future__ import annotations

import datetime as dt
from io import StringIO

import pytest
from django.core.management import call_command
from django.db.models import Count, Q

from cron_celery.models import CronExecution, Status
from tests.conftest import make_job
from tests.test_claims import begin, finish


@pytest.mark.django_db
def test_models_match_migrations():
    out = StringIO()
    try:
        call_command("makemigrations", "cron_celery", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exc:  # --check exits 1 when a migration is missing
        pytest.fail(f"cron_celery models changed without a migration:\n{out.getvalue()} ({exc})")


@pytest.mark.django_db
def test_the_original_designs_queries_work_unchanged():
    job, job_id = make_job("always", overlap="allow")
    today = dt.date(2026, 11, 29)
    slot = dt.datetime(2026, 11, 29, 1, tzinfo=dt.UTC)
    finish(job_id, begin(job, job_id, slot=slot), Status.SUCCEEDED)
    finish(job_id, begin(job, job_id, slot=slot), Status.FAILED)
    stuck = begin(job, job_id, slot=slot)
    CronExecution.objects.filter(id=stuck.execution_id).update(
        started=dt.datetime(2026, 11, 29, 0, 0, tzinfo=dt.UTC))

    failures = CronExecution.objects.filter(success=False, execution_date__gte=today - dt.timedelta(days=7))
    assert [row.status for row in failures] == [Status.FAILED]

    stuck_rows = CronExecution.objects.filter(
        completed=False, started__lt=dt.datetime(2026, 11, 29, 0, 30, tzinfo=dt.UTC))
    assert [row.id for row in stuck_rows] == [stuck.execution_id]

    stats = list(
        CronExecution.objects.filter(execution_date__gte=today - dt.timedelta(days=30))
        .values("task_name")
        .annotate(total=Count("id"), successful=Count("id", filter=Q(success=True)),
                  failed=Count("id", filter=Q(success=False)))
    )
    assert stats == [{"task_name": job.name, "total": 3, "successful": 1, "failed": 1}]


@pytest.mark.django_db
def test_the_admin_shows_the_history_read_only(admin_client):
    job, job_id = make_job()
    claim = begin(job, job_id)
    finish(job_id, claim, Status.FAILED, message="Überweisung failed\nsecond line")
    listing = admin_client.get("/admin/cron_celery/cronexecution/")
    assert listing.status_code == 200
    assert "Überweisung failed" in listing.content.decode() and "second line" not in listing.content.decode()
    detail = admin_client.get(f"/admin/cron_celery/cronexecution/{claim.execution_id}/change/")
    assert detail.status_code == 200 and "second line" in detail.content.decode()
    assert admin_client.post(f"/admin/cron_celery/cronexecution/{claim.execution_id}/change/", {}).status_code == 403
    assert admin_client.get("/admin/cron_celery/cronjob/").status_code == 200
    assert admin_client.get("/admin/cron_celery/alert/").status_code == 200
