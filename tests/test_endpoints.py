"""The HTTP endpoints (``status/``, ``health/``, ``metrics/``, ``run/<job>/``) through Django's
test client, against real PostgreSQL, with the run endpoint's messages on the session's own
Redis queue.
"""

from __future__ import annotations

import datetime as dt
import re
import sys
from typing import Any

import pytest
from celery import Celery
from celery._state import get_current_app
from django.conf import settings
from django.contrib.auth.models import Permission
from django.db import DatabaseError, connection
from django.db.models import Count
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from cron_celery import conf, exceptions, reconciler
from cron_celery.beat import health
from cron_celery.decisions import dispatch, leadership, oneoffs
from cron_celery.declaring import registry
from cron_celery.migrations._initial import counting
from cron_celery.models import Alert, BeatHeartbeat, CronExecution, CronJob, Lease, Status, Trigger
from cron_celery.reconciler import retention
from cron_celery.run import runs, tasks
from cron_celery.web import metrics
from tests.conftest import db_now, make_job

pytestmark = pytest.mark.django_db

TOKEN = "ops-token-0123456789-abcdefghijklmnop"  # a token with every scope
BEARER = {"Authorization": f"Bearer {TOKEN}"}
ALL_SCOPES = {"ops": {"token": TOKEN, "scopes": ["read", "run", "force"]}}
EXE = CronExecution._meta.db_table
JOB = CronJob._meta.db_table
BEAT = BeatHeartbeat._meta.db_table
ALERT = Alert._meta.db_table
LEASE = Lease._meta.db_table
SLOT = dt.datetime(2026, 11, 29, tzinfo=dt.UTC)
ENDPOINTS = [("get", "/cron/status/"), ("get", "/cron/health/"), ("get", "/cron/metrics/"),
             ("post", "/cron/run/calc-commission/")]
#: What a permitted caller gets from each endpoint on an empty database.
PERMITTED = [
    pytest.param("get", "/cron/status/", 200, id="status"),
    pytest.param("get", "/cron/health/", 200, id="health"),
    pytest.param("get", "/cron/metrics/", 200, id="metrics"),
    pytest.param("post", "/cron/run/calc-commission/", 202, id="run"),
]


def cron_settings(**values: Any) -> override_settings:
    """The test settings' ``CRON_CELERY`` with some values changed."""
    return override_settings(CRON_CELERY={**settings.CRON_CELERY, **values})


with_token = cron_settings(API_TOKENS=ALL_SCOPES)


def sql(statement: str, params: list[Any] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params or [])


def execution(job: registry.Job, job_id: int, slot: dt.datetime, status: str = Status.SUCCEEDED,
              seconds: float | None = None, **fields: Any) -> CronExecution:
    """A row as the claims would have left it; ``seconds`` sets started/ended that far apart."""
    started = slot if seconds is not None else None
    ended = slot + dt.timedelta(seconds=seconds) if seconds is not None else None
    return CronExecution.objects.create(
        job_id=job_id, task_code=job.code, task_name=job.name, slot=slot, execution_date=slot.date(),
        status=status, started=started, ended=ended, completed=status in Status.terminal(), **fields,
    )


def bulk_executions(job: registry.Job, job_id: int, count: int, status: str = Status.SUCCEEDED) -> None:
    """``count`` rows in one INSERT ... SELECT generate_series (one slot a minute from 2020)."""
    sql(
        f"""
        INSERT INTO {EXE} (job_id, task_code, task_name, slot, execution_date, run_number, status, trigger,
                           skip_reason, forced, created_at, completed, message, error_code, traceback,
                           retry_count, celery_task_id, worker)
        SELECT %s, %s, %s, s.at, s.at::date, 1, %s, 'BEAT', '', false, now(), true, '', '', '', 0, '', ''
        FROM generate_series(1, %s) AS i,
             LATERAL (SELECT timestamptz '2020-01-01 00:00Z' + i * interval '1 minute') AS s(at)
        """,
        [job_id, job.code, job.name, status, count],
    )




@pytest.fixture
def secret_job() -> tuple[registry.Job, int]:
    """A job with history: what a refused caller must not see."""
    job, job_id = make_job()
    CronJob.objects.filter(id=job_id).update(last_status=Status.FAILED)
    execution(job, job_id, SLOT, Status.FAILED, seconds=3, message="payroll for ACME failed")
    return job, job_id


def call(client: Client, method: str, url: str, **kwargs: Any) -> Any:
    return getattr(client, method)(url, **kwargs)


# --- 1. who may call ------------------------------------------------------------------------

@pytest.mark.parametrize(("method", "url"), ENDPOINTS)
def test_anonymous_callers_get_401_with_a_bearer_challenge_and_no_data(client, secret_job, method, url):
    job, _ = secret_job
    response = call(client, method, url)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"  # no credentials: a bare challenge (RFC 6750)
    assert list(response.json()) == ["error"]
    body = response.content.decode()
    assert job.name not in body and job.code not in body and "ACME" not in body
    assert CronExecution.objects.count() == 1  # the run endpoint created nothing


@pytest.mark.parametrize(("method", "url"), ENDPOINTS)
@pytest.mark.parametrize("header", ["Bearer wrong", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer "])
def test_a_wrong_bearer_token_gets_401(client, secret_job, method, url, header):
    with with_token:
        response = call(client, method, url, headers={"Authorization": header})
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer error="invalid_token"'
    assert response.json() == {"error": "invalid token"}
    assert secret_job[0].name not in response.content.decode()
    assert CronExecution.objects.count() == 1


@pytest.mark.parametrize(("method", "url"), ENDPOINTS)
@pytest.mark.parametrize("header", [f"Bearer {TOKEN}", "Bearer ", "Bearer  "])
def test_no_bearer_token_is_accepted_when_no_token_is_configured(client, secret_job, method, url, header):
    with cron_settings(API_TOKEN="", API_TOKENS={}):
        response = call(client, method, url, headers={"Authorization": header})
    assert response.status_code == 401
    assert secret_job[0].name not in response.content.decode()
    assert CronExecution.objects.count() == 1


@pytest.mark.parametrize(("method", "url"), ENDPOINTS)
def test_a_logged_in_user_who_is_not_staff_gets_403_and_no_data(client, django_user_model, secret_job, method, url):
    client.force_login(django_user_model.objects.create_user("ops-reader", password="pw-not-used"))
    response = call(client, method, url)
    assert response.status_code == 403
    assert response.json() == {"error": "staff only"}
    assert secret_job[0].name not in response.content.decode()
    assert CronExecution.objects.count() == 1


def test_a_staff_session_with_only_the_view_permission_may_read_but_not_run(client, django_user_model, queue):
    job, _job_id = make_job()
    staff = django_user_model.objects.create_user("ops-staff", password="pw-not-used", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(content_type__app_label="cron_celery",
                                                      codename="view_cronexecution"))
    client.force_login(staff)
    assert client.get("/cron/status/").status_code == 200
    refused = client.post(f"/cron/run/{job.name}/")
    assert refused.status_code == 403
    assert refused.json() == {"error": "the permission cron_celery.change_cronjob is needed",
                              "missing_permission": "cron_celery.change_cronjob"}
    assert not CronExecution.objects.filter(task_name=job.name).exists()


@pytest.mark.parametrize(("method", "url", "expected"), PERMITTED)
def test_a_staff_session_is_let_in(admin_client, queue, method, url, expected):
    response = call(admin_client, method, url)
    assert response.status_code == expected, response.content
    assert response["Content-Type"].startswith("text/plain" if "metrics" in url else "application/json")


@pytest.mark.parametrize(("method", "url", "expected"), PERMITTED)
def test_the_right_token_is_let_in_without_a_session(client, queue, method, url, expected):
    with with_token:
        response = call(client, method, url, headers=BEARER)
        # Surrounding spaces are forgiven; the token itself is not.
        spaced = call(client, method, url, headers={"Authorization": f"Bearer  {TOKEN} "})
    assert (response.status_code, spaced.status_code) == (expected, expected), response.content
    assert "_auth_user_id" not in client.session  # a token call logs nobody in


@pytest.mark.parametrize(("method", "url"), [("post", "/cron/status/"), ("post", "/cron/health/"),
                                             ("delete", "/cron/metrics/"), ("get", "/cron/run/calc-commission/"),
                                             ("put", "/cron/run/calc-commission/")])
def test_a_wrong_method_gets_405(client, method, url):
    with with_token:
        response = call(client, method, url, headers=BEARER)
    assert response.status_code == 405
    assert not CronExecution.objects.exists()


# --- 2. status/ -------------------------------------------------------------------------------

def test_status_summarises_every_job_and_lists_executions_most_recent_first(client):
    first, first_id = make_job()
    second, second_id = make_job()
    CronJob.objects.filter(id=first_id).update(
        schedule="0 2 * * *", schedule_timezone="Europe/Amsterdam", next_run_at=SLOT + dt.timedelta(days=1),
        last_status=Status.FAILED, last_run_at=SLOT, last_success_at=SLOT - dt.timedelta(days=1),
        consecutive_failures=2, paused=True)
    old = execution(first, first_id, SLOT - dt.timedelta(days=1), Status.SUCCEEDED, seconds=1.5, message="ok")
    newer = execution(second, second_id, SLOT, Status.SKIPPED, skip_reason="ALREADY_RAN", message="x" * 800)
    newest = execution(first, first_id, SLOT, Status.FAILED, seconds=90, error_code="E42", retry_count=2)
    with with_token:
        body = client.get("/cron/status/", headers=BEARER).json()
    assert [job["name"] for job in body["jobs"]] == sorted([first.name, second.name])
    summary = next(job for job in body["jobs"] if job["name"] == first.name)
    since = CronJob.objects.get(id=first_id).paused_at  # dated by the database when the pause began
    assert since is not None and summary.pop("pause") == {"note": None, "by": None, "since": since.isoformat(),
                                                          "until": None}
    assert summary == {
        "name": first.name, "code": first.code, "schedule": "0 2 * * *", "timezone": "Europe/Amsterdam",
        "paused": True, "next_slot": "2026-11-30T00:00:00+00:00", "last_status": "FAILED",
        "last_run_at": "2026-11-29T00:00:00+00:00", "last_success_at": "2026-11-28T00:00:00+00:00",
        "consecutive_failures": 2, "active_from": None, "active_until": None, "next_one_off": None,
    }
    bare = next(job for job in body["jobs"] if job["name"] == second.name)
    assert (bare["schedule"], bare["next_slot"], bare["last_status"], bare["timezone"]) == (None, None, None, "UTC")
    assert [row["id"] for row in body["executions"]] == [newest.id, newer.id, old.id]
    top = body["executions"][0]
    assert (top["job"], top["code"], top["status"], top["error_code"], top["attempt"], top["duration_seconds"]) == (
        first.name, first.code, "FAILED", "E42", 3, 90.0)
    assert (top["slot"], top["execution_date"], top["trigger"]) == ("2026-11-29T00:00:00+00:00", "2026-11-29", "BEAT")
    assert body["executions"][1]["skip_reason"] == "ALREADY_RAN"
    assert body["executions"][1]["message"] == "x" * 500  # long messages are cut
    assert body["executions"][1]["duration_seconds"] is None


def test_status_limit_defaults_to_100_and_never_exceeds_1000(client):
    job, job_id = make_job()
    bulk_executions(job, job_id, 1200)
    newest = CronExecution.objects.order_by("-id").values_list("id", flat=True)[:1000]
    with with_token:
        default = client.get("/cron/status/", headers=BEARER).json()["executions"]
        five = client.get("/cron/status/?limit=5", headers=BEARER).json()["executions"]
        most = client.get("/cron/status/?limit=1000", headers=BEARER).json()["executions"]
    assert [row["id"] for row in default] == list(newest[:100])
    assert [row["id"] for row in five] == list(newest[:5])
    assert len(most) == 1000 and [row["id"] for row in most] == list(newest)


@pytest.mark.parametrize("limit", ["0", "1001", "abc", "-5", "1.5", "", "10%20"])
def test_status_refuses_a_limit_out_of_range_with_400(client, limit):
    with with_token:
        response = client.get(f"/cron/status/?limit={limit}", headers=BEARER)
    assert response.status_code == 400
    assert response.json() == {"error": "limit must be a whole number from 1 to 1000"}


def test_status_refuses_a_superscript_digit_limit_with_400_not_500():
    client = Client(raise_request_exception=False)
    with with_token:
        response = client.get("/cron/status/?limit=%C2%B2", headers=BEARER)  # limit=²
    assert response.status_code == 400


def test_status_job_filter_by_name_or_code_and_404_for_an_unknown_job(client):
    wanted, wanted_id = make_job()
    other, other_id = make_job()
    mine = [execution(wanted, wanted_id, SLOT + dt.timedelta(hours=n)).id for n in range(3)]
    execution(other, other_id, SLOT)
    with with_token:
        for key in (wanted.name, wanted.code):
            body = client.get("/cron/status/", {"job": key}, headers=BEARER).json()
            assert [job["name"] for job in body["jobs"]] == [wanted.name]
            assert [row["id"] for row in body["executions"]] == mine[::-1]
        missing = client.get("/cron/status/", {"job": "no-such-job"}, headers=BEARER)
    assert missing.status_code == 404
    assert missing.json() == {"error": "unknown job 'no-such-job'"}


def test_status_job_filter_prefers_the_name_like_the_registry_does(client):
    # Job "b-job" and another job whose *code* is "b-job": ?job=b-job means the job named
    # b-job (registry.get() looks names up first), not both, nor the other one's history.
    named, named_id = make_job()
    coded, coded_id = make_job()
    CronJob.objects.filter(id=named_id).update(name="b-job")
    CronJob.objects.filter(id=coded_id).update(name="a-job", code="b-job")
    execution(named, named_id, SLOT)
    execution(coded, coded_id, SLOT)
    with with_token:
        body = client.get("/cron/status/", {"job": "b-job"}, headers=BEARER).json()
    assert [job["name"] for job in body["jobs"]] == ["b-job"]
    assert {row["id"] for row in body["executions"]} == set(
        CronExecution.objects.filter(job_id=named_id).values_list("id", flat=True))


# --- 3. health/ -------------------------------------------------------------------------------

HEALTH = {"BEAT_STALE_SECONDS": 30, "OVERDUE_SECONDS": 60}


def health_of(client: Client) -> tuple[int, dict[str, Any]]:
    with cron_settings(API_TOKENS=ALL_SCOPES, HEALTH=HEALTH):
        response = client.get("/cron/health/", headers=BEARER)
    return response.status_code, response.json()


def test_health_is_200_when_nothing_is_scheduled_even_without_a_beat(client):
    make_job()  # a job with no schedule and no next slot needs no beat
    code, body = health_of(client)
    assert code == 200
    assert (body["status"], body["reasons"], body["beat"], body["overdue"], body["checks"]) == ("ok", [], None, [], [])


def test_health_follows_the_leading_beat(client):
    _, job_id = make_job()
    sql(f"UPDATE {JOB} SET next_run_at = now() + interval '1 hour' WHERE id = %s", [job_id])
    code, body = health_of(client)
    assert code == 503 and body["status"] == "unhealthy"
    assert len(body["reasons"]) == 1 and body["reasons"][0].startswith("no beat is leading")

    health.beat_seen("host-a:1", True)
    code, body = health_of(client)
    assert (code, body["reasons"]) == (200, [])
    assert (body["beat"]["identity"], body["beat"]["age_seconds"]) == ("host-a:1", 0.0)

    sql(f"UPDATE {BEAT} SET seen_at = now() - interval '25 seconds'")  # within the limit
    assert health_of(client)[0] == 200
    sql(f"UPDATE {BEAT} SET seen_at = now() - interval '45 seconds'")
    code, body = health_of(client)
    assert code == 503
    assert body["reasons"] == ["the leading beat host-a:1 was last seen 45 s ago (limit 30 s)"]

    health.beat_seen("host-a:1", True)  # seen again
    assert health_of(client)[0] == 200

    health.beat_seen("host-b:2", False)  # a standby does not count
    health.beat_gone("host-a:1")
    code, body = health_of(client)
    assert code == 503 and body["reasons"][0].startswith("no beat is leading") and body["beat"] is None


def test_health_names_an_overdue_job_until_it_is_advanced_or_paused(client):
    job, job_id = make_job()
    health.beat_seen("host-a:1", True)
    sql(f"UPDATE {JOB} SET next_run_at = now() - interval '50 seconds' WHERE id = %s", [job_id])
    assert health_of(client)[0] == 200  # late, but within OVERDUE_SECONDS
    sql(f"UPDATE {JOB} SET next_run_at = now() - interval '10 minutes' WHERE id = %s", [job_id])
    code, body = health_of(client)
    assert code == 503
    assert body["overdue"] == [{"job": job.name, "code": job.code, "next_slot": body["overdue"][0]["next_slot"],
                                "late_seconds": 600.0}]
    assert body["reasons"] == [f"job {job.name} ({job.code}) is 600 s late for its slot "
                               f"{body['overdue'][0]['next_slot']} (limit 60 s)"]
    sql(f"UPDATE {JOB} SET next_run_at = now() + interval '1 minute' WHERE id = %s", [job_id])
    assert health_of(client)[0] == 200
    sql(f"UPDATE {JOB} SET next_run_at = now() - interval '10 minutes', paused = true WHERE id = %s", [job_id])
    assert health_of(client)[0] == 200


def test_health_through_a_staff_session(admin_client):
    _, job_id = make_job()
    sql(f"UPDATE {JOB} SET next_run_at = now() + interval '1 hour' WHERE id = %s", [job_id])
    assert admin_client.get("/cron/health/").status_code == 503
    health.beat_seen("host-a:1", True)
    assert admin_client.get("/cron/health/").status_code == 200


# --- 4. metrics/ ------------------------------------------------------------------------------

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(client: Client) -> tuple[Samples, set[str], str]:
    """(every sample by name and labels, the family names, the content type)."""
    with with_token:
        response = client.get("/cron/metrics/", headers=BEARER)
    assert response.status_code == 200
    samples: Samples = {}
    families = set()
    for family in text_string_to_metric_families(response.content.decode()):
        families.add(family.name)
        for sample in family.samples:
            labels = tuple(sorted((key, value) for key, value in sample.labels.items() if key != "le"))
            if "le" in sample.labels:
                labels += (("le", str(float(sample.labels["le"]))),)
            samples[sample.name, labels] = sample.value
    return samples, families, response["Content-Type"]


def test_metrics_counts_durations_and_gauges_match_the_rows(client):
    busy, busy_id = make_job()
    idle, idle_id = make_job()
    durations = [0.05, 0.3, 2.5, 45.0, 7200.0]
    for n, seconds in enumerate(durations):
        execution(busy, busy_id, SLOT + dt.timedelta(hours=n), Status.SUCCEEDED, seconds=seconds)
    execution(busy, busy_id, SLOT - dt.timedelta(hours=1), Status.FAILED, seconds=0.2)
    execution(busy, busy_id, SLOT - dt.timedelta(hours=2), Status.LOST)  # no end: not in the histogram
    execution(busy, busy_id, SLOT - dt.timedelta(hours=3), Status.LOST)
    execution(idle, idle_id, SLOT, Status.PENDING)
    success = dt.datetime(2026, 11, 29, 6, 30, tzinfo=dt.UTC)
    CronJob.objects.filter(id=busy_id).update(fenced_count=4, last_success_at=success, consecutive_failures=3)
    sql(f"UPDATE {JOB} SET next_run_at = now() - interval '10 minutes' WHERE id = %s", [idle_id])
    sql(f"UPDATE {JOB} SET next_run_at = now() + interval '10 minutes' WHERE id = %s", [busy_id])
    health.beat_seen("host-a:1", True)
    sql(f"UPDATE {BEAT} SET seen_at = now() - interval '12 seconds'")
    health.beat_seen("host-b:2", False)  # a standby seen just now is not the leader's age

    samples, families, content_type = scrape(client)
    assert content_type.startswith("text/plain")
    b, i = (("cron_job", busy.name),), (("cron_job", idle.name),)
    executions = {labels: value for (name, labels), value in samples.items() if name == "cron_executions_total"}
    # Success and each failure start at 0 for every job, so that a job's first failure is an
    # increase (a series that appears at 1 has none, and the dashboard's failures would miss it).
    assert executions == {
        (("cron_job", busy.name), ("status", "SUCCEEDED")): 5, (("cron_job", busy.name), ("status", "FAILED")): 1,
        (("cron_job", busy.name), ("status", "LOST")): 2, (("cron_job", busy.name), ("status", "TIMED_OUT")): 0,
        **{(("cron_job", idle.name), ("status", status)): 0 for status in ("SUCCEEDED", "FAILED", "TIMED_OUT", "LOST")},
    }
    assert samples["cron_executions_open", (("cron_job", idle.name), ("status", "PENDING"))] == 1
    assert (samples["cron_lost_total", b], samples["cron_lost_total", i]) == (2, 0)
    assert (samples["cron_fenced_total", b], samples["cron_fenced_total", i]) == (4, 0)
    assert samples["cron_last_success_timestamp_seconds", b] == success.timestamp()
    assert ("cron_last_success_timestamp_seconds", i) not in samples
    assert (samples["cron_overdue", b], samples["cron_overdue", i]) == (0, 1)
    assert (samples["cron_consecutive_failures", b], samples["cron_consecutive_failures", i]) == (3, 0)
    assert samples["cron_beat_heartbeat_age_seconds", ()] == 12.0

    finished = [*durations, 0.2]
    buckets = {float(le): sum(1 for d in finished if d <= float(le))
               for le in ("0.1", "0.5", "1.0", "5.0", "10.0", "30.0", "60.0", "300.0", "900.0", "3600.0")}
    buckets[float("inf")] = len(finished)
    got = {float(labels[-1][1]): value for (name, labels), value in samples.items()
           if name == "cron_execution_duration_seconds_bucket" and labels[0] == ("cron_job", busy.name)}
    assert got == buckets
    assert samples["cron_execution_duration_seconds_count", b] == len(finished)
    assert samples["cron_execution_duration_seconds_sum", b] == pytest.approx(sum(finished))
    assert ("cron_execution_duration_seconds_count", i) not in samples  # nothing finished
    assert {"cron_executions", "cron_lost", "cron_fenced", "cron_execution_duration_seconds"} <= families


def test_metrics_without_a_leading_beat_or_rows(client):
    health.beat_seen("host-b:2", False)
    samples, families, _ = scrape(client)
    assert "cron_beat_heartbeat_age_seconds" in families
    assert not [key for key in samples if key[0] == "cron_beat_heartbeat_age_seconds"]
    assert not [key for key in samples if key[0] == "cron_executions_total"]


def test_metrics_give_the_undelivered_alerts_by_channel_and_when_each_last_gave_one_up(client):
    job, job_id = make_job()
    failed = execution(job, job_id, SLOT, Status.FAILED, seconds=1.0)
    other = execution(job, job_id, SLOT + dt.timedelta(hours=1), Status.FAILED, seconds=1.0)
    rows = [("slack", "PENDING", "40 minutes", failed), ("slack", "PENDING", "5 minutes", other),
            ("email", "FAILED", "2 hours", failed), ("email", "FAILED", "1 hour", other),
            ("webhook", "SENT", "1 minute", failed)]
    for channel, status, age, row in rows:
        Alert.objects.create(execution=row, job_id=job_id, event="FAILED", channel=channel, status=status)
        sql(f"UPDATE {ALERT} SET updated_at = now() - interval '{age}' WHERE execution_id = %s AND channel = %s",
            [row.id, channel])
    samples, _, _ = scrape(client)
    undelivered = {labels: value for (name, labels), value in samples.items() if name == "cron_alerts_undelivered"}
    assert undelivered == {(("channel", "slack"), ("status", "PENDING")): 2,
                           (("channel", "email"), ("status", "FAILED")): 2}  # SENT is not counted
    gave_up = {labels: value for (name, labels), value in samples.items()
               if name == "cron_alerts_last_failed_timestamp_seconds"}
    assert list(gave_up) == [(("channel", "email"),)]  # only a channel that gave one up has one
    assert gave_up[(("channel", "email"),)] == pytest.approx((db_now() - dt.timedelta(hours=1)).timestamp(), abs=2)


def test_metrics_give_the_last_reconciler_pass_that_finished_and_not_one_that_failed(client, monkeypatch):
    samples, families, _ = scrape(client)
    assert "cron_reconciler_last_pass_age_seconds" in families
    assert not [key for key in samples if key[0] == "cron_reconciler_last_pass_age_seconds"]  # none ever finished
    assert samples["cron_reconciler_interval_seconds", ()] == conf.settings.RECONCILE["INTERVAL"]
    assert reconciler.run_pass().ran
    samples, _, _ = scrape(client)
    assert samples["cron_reconciler_last_pass_age_seconds", ()] == pytest.approx(0, abs=1)
    sql(f"UPDATE {LEASE} SET lease_until = now() - interval '7 minutes' WHERE name = %s", [leadership.RECONCILED])

    def broken(report: object, batch: int) -> None:
        raise DatabaseError("a step failed")

    monkeypatch.setattr(reconciler, "_tidy", broken)
    with pytest.raises(DatabaseError):
        reconciler.run_pass()
    samples, _, _ = scrape(client)
    assert samples["cron_reconciler_last_pass_age_seconds", ()] == pytest.approx(7 * 60, abs=1)  # not moved


def test_metrics_say_which_jobs_are_paused(client):
    running, _ = make_job()
    stopped, stopped_id = make_job()
    CronJob.objects.filter(id=stopped_id).update(paused=True)
    samples, _, _ = scrape(client)
    assert samples["cron_paused", (("cron_job", running.name),)] == 0
    assert samples["cron_paused", (("cron_job", stopped.name),)] == 1


def unimport(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Make module ``name`` import afresh for this test (restored after it)."""
    parent, _, leaf = name.rpartition(".")
    monkeypatch.delattr(sys.modules[parent], leaf)
    monkeypatch.delitem(sys.modules, name)


def test_metrics_without_prometheus_client_answer_501_and_name_the_extra(client, monkeypatch):
    unimport(monkeypatch, "cron_celery.web.metrics")
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if it were not installed
    with with_token:
        response = client.get("/cron/metrics/", headers=BEARER)
    assert response.status_code == 501
    assert response.content.decode() == "prometheus-client is not installed: pip install 'cron_celery[prometheus]'\n"


def test_a_module_of_ours_that_fails_to_import_is_not_reported_as_a_missing_extra(client, monkeypatch):
    unimport(monkeypatch, "cron_celery.web.metrics")
    unimport(monkeypatch, "cron_celery.decisions.oneoffs")
    monkeypatch.setitem(sys.modules, "cron_celery.decisions.oneoffs", None)  # a broken module metrics imports
    with with_token, pytest.raises(ModuleNotFoundError, match=r"cron_celery\.decisions\.oneoffs"):
        client.get("/cron/metrics/", headers=BEARER)


def test_metrics_say_when_a_beat_is_needed_and_a_late_one_off_makes_its_job_overdue_as_health_does(client):
    """cron_beat_needed gates the rules' beat alerts: 0 while every job is paused or has no next
    slot (a maintenance stop of the beats pages nobody), 1 once an unpaused job has a slot, a
    one-off run waits to be sent or a pause has an end. A late one-off makes its job overdue, as on /cron/health/."""
    _, scheduled_id = make_job()
    once, once_id = make_job()
    sql(f"UPDATE {JOB} SET next_run_at = now() + interval '1 hour', paused = true WHERE id = %s", [scheduled_id])
    samples, _, _ = scrape(client)
    assert samples["cron_beat_needed", ()] == 0
    assert health.check().ok  # no beat has ever led, and nothing needs one

    recorded = oneoffs.record(once, once_id, db_now() + dt.timedelta(minutes=5))
    samples, _, _ = scrape(client)
    assert samples["cron_beat_needed", ()] == 1  # a one-off waits for a beat to send it
    assert samples["cron_overdue", (("cron_job", once.name),)] == 0  # not late yet

    sql(f"UPDATE {EXE} SET due_at = now() - interval '10 minutes' WHERE id = %s", [recorded.execution_id])
    samples, _, _ = scrape(client)
    overdue = {dict(labels)["cron_job"] for (name, labels), value in samples.items()
               if name == "cron_overdue" and value == 1}
    assert overdue == {once.name}
    assert {item["job"] for item in health.check().overdue} == overdue

    sql(f"DELETE FROM {EXE} WHERE id = %s", [recorded.execution_id])  # sent and gone, for this test
    samples, _, _ = scrape(client)
    assert samples["cron_beat_needed", ()] == 0
    sql(f"UPDATE {JOB} SET paused_until = now() + interval '1 hour' WHERE id = %s", [scheduled_id])
    samples, _, _ = scrape(client)
    assert samples["cron_beat_needed", ()] == 1  # a pause that ends: the job has slots again then
    sql(f"UPDATE {JOB} SET paused = false WHERE id = %s", [scheduled_id])
    samples, _, _ = scrape(client)
    assert samples["cron_beat_needed", ()] == 1  # an unpaused job with a next slot
    assert samples["cron_overdue", (("cron_job", once.name),)] == 0


def test_a_scrape_reads_undelivered_alerts_through_their_partial_indexes(client):
    """The scrape's own statements on the outbox, with 5,000 delivered alerts in it: no sequential scan."""
    job, job_id = make_job()
    row = execution(job, job_id, SLOT, Status.FAILED, seconds=1.0)
    sql(f"INSERT INTO {ALERT} (execution_id, job_id, event, channel, status, attempts, last_error, created_at, "
        "updated_at, facts) SELECT %s, %s, 'FAILED', 'ch-' || n, 'SENT', 1, '', now(), now(), '{}' "
        "FROM generate_series(1, 5000) AS n", [row.id, job_id])
    sql(f"ANALYZE {ALERT}")
    with CaptureQueriesContext(connection) as captured:
        scrape(client)
    statements = [query["sql"] for query in captured.captured_queries if ALERT in query["sql"]]
    assert statements
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {statement}")
            nodes = [node for node in plan_nodes(cursor.fetchone()[0][0]["Plan"])
                     if node.get("Relation Name") == ALERT]
            assert nodes and all(node["Node Type"] != "Seq Scan" for node in nodes), nodes
            assert {node.get("Index Name") for node in nodes} <= {"cron_alert_pending", "cron_alert_failed"}, nodes


def test_a_duration_equal_to_a_bucket_bound_counts_in_that_le_bucket(client):
    job, job_id = make_job()
    execution(job, job_id, SLOT, Status.SUCCEEDED, seconds=1.0)  # exactly le="1.0"
    samples, _, _ = scrape(client)
    assert samples["cron_execution_duration_seconds_bucket", (("cron_job", job.name), ("le", "1.0"))] == 1


# --- 5. run/<job>/ ----------------------------------------------------------------------------

def run(client: Client, job: str = "calc-commission", **kwargs: Any) -> Any:
    with with_token:
        return client.post(f"/cron/run/{job}/", headers=BEARER, **kwargs)


def test_run_sends_one_run_to_the_workers_and_answers_202(client, queue):
    response = run(client, data={"date": "2026-11-29"})
    assert response.status_code == 202, response.content
    body = response.json()
    row = CronExecution.objects.get()
    assert body == {"job": "calc-commission", "slot": "2026-11-29T00:00:00+00:00", "execution_id": row.id,
                    "run_number": 1, "celery_task_id": row.celery_task_id}
    assert (row.status, row.trigger, row.forced, row.task_code, row.slot) == (
        Status.PENDING, Trigger.ENQUEUE, False, "A001", SLOT)
    assert row.celery_task_id
    [message] = queue.headers()
    assert (message["id"], message["task"]) == (row.celery_task_id, "tests.jobsapp.tasks.calc_commission")
    assert (message["cron_execution_id"], message["cron_slot"], message["cron_trigger"]) == (
        row.id, "2026-11-29T00:00:00Z", "ENQUEUE")
    assert "cron_force" not in message and "cron_rerun" not in message


def test_run_takes_json_at_and_date_and_the_force_and_rerun_flags(client, queue):
    at = run(client, data={"at": "2026-11-29T05:30Z", "force": True}, content_type="application/json")
    assert at.status_code == 202, at.content
    assert at.json()["slot"] == "2026-11-29T05:30:00+00:00"
    # the job's own timezone picks the day's slot: 02:00 in Amsterdam is 01:00 UTC in winter
    dated = run(client, "nightly-report", data={"date": "2026-11-29", "rerun": "yes"},
                content_type="application/json")
    assert dated.json()["slot"] == "2026-11-29T01:00:00+00:00"
    again = run(client, "nightly-report", data={"date": "2026-11-29", "at": "2026-11-29T02:00"})
    assert (again.status_code, again.json()["run_number"]) == (202, 2)
    plain = run(client, data={"date": "2026-11-30", "force": "false", "rerun": "0"},
                content_type="application/json")
    rows = {row.id: row for row in CronExecution.objects.all()}
    assert rows[at.json()["execution_id"]].forced is True
    assert rows[dated.json()["execution_id"]].forced is True
    assert rows[again.json()["execution_id"]].forced is False
    assert rows[plain.json()["execution_id"]].forced is False
    headers = {message["cron_execution_id"]: message for message in queue.headers()}
    assert headers[at.json()["execution_id"]]["cron_force"] is True
    assert headers[dated.json()["execution_id"]]["cron_rerun"] is True
    assert all(row.trigger == Trigger.ENQUEUE and row.status == Status.PENDING for row in rows.values())


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"data": {"date": "2026-13-45"}}, "Cannot read '2026-13-45' as a slot: expected a date such as 2026-11-29."),
        ({"data": {"at": "tomorrow-ish"}}, "Cannot read 'tomorrow-ish' as a slot"),
        ({"data": {"date": "2026-11-28", "at": "2026-11-29T01:00"}}, "not on 2026-11-28"),
        ({"data": "{not json", "content_type": "application/json"}, "the body is not JSON"),
        ({"data": "[1, 2]", "content_type": "application/json"}, "the body must be a JSON object"),
    ],
)
def test_run_refuses_bad_input_with_400_and_creates_no_row(client, queue, kwargs, fragment):
    response = run(client, **kwargs)
    assert response.status_code == 400
    assert fragment in response.json()["error"]
    assert not CronExecution.objects.exists()
    assert queue.headers() == []


def test_run_of_an_unknown_job_is_404(client, queue):
    response = run(client, "no-such-job")
    assert response.status_code == 404
    assert response.json()["error"].startswith("Unknown job 'no-such-job'")
    assert not CronExecution.objects.exists() and queue.headers() == []


def test_a_session_post_needs_the_csrf_token_and_a_token_post_does_not(admin_user, queue):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(admin_user)
    refused = browser.post("/cron/run/calc-commission/", {"date": "2026-11-29"})
    assert refused.status_code == 403
    assert not CronExecution.objects.exists()
    assert browser.get("/admin/").status_code == 200  # the admin hands out the CSRF cookie
    csrf = browser.cookies["csrftoken"].value
    wrong = browser.post("/cron/run/calc-commission/", {"date": "2026-11-29"}, headers={"X-CSRFToken": "x" * 32})
    assert wrong.status_code == 403
    accepted = browser.post("/cron/run/calc-commission/", {"date": "2026-11-29"}, headers={"X-CSRFToken": csrf})
    assert accepted.status_code == 202, accepted.content
    as_field = browser.post("/cron/run/calc-commission/", {"date": "2026-11-29", "csrfmiddlewaretoken": csrf})
    assert as_field.status_code == 202
    machine = Client(enforce_csrf_checks=True)
    with with_token:
        assert machine.post("/cron/run/calc-commission/", {"date": "2026-11-29"}, headers=BEARER).status_code == 202
    assert CronExecution.objects.count() == 3 and len(queue.headers()) == 3


def test_a_broker_that_is_down_fails_the_run_cleanly(client, queue):
    job = registry.get("calc-commission")
    working = get_current_app()
    broken = Celery("broker-down", broker="redis://127.0.0.1:1/0", set_as_current=False)
    broken.set_current()
    try:
        with pytest.raises(exceptions.PublishFailed) as caught:
            tasks.send_run(job, SLOT, Trigger.ENQUEUE)
        response = run(client, data={"date": "2026-11-30"})
    finally:
        working.set_current()
        broken.close()
    assert get_current_app() is working
    assert "could not be sent to the broker" in str(caught.value)
    assert response.status_code == 503
    assert response.json()["error"].startswith("calc-commission: could not be sent to the broker")
    rows = list(CronExecution.objects.order_by("slot"))
    assert [(row.status, row.error_code, row.completed, row.success, row.celery_task_id) for row in rows] == [
        (Status.FAILED, "PUBLISH_FAILED", True, False, "")] * 2
    assert all(row.ended is not None and "Could not send the run to the broker" in row.message for row in rows)
    assert queue.headers() == []
    # the working broker is back: the same slot can be sent again
    assert run(client, data={"date": "2026-11-29"}).status_code == 202
    assert len(queue.headers()) == 1


def test_metrics_counters_are_the_history_as_it_was_written_and_survive_a_purge(client):
    """Every path that ends an execution counts once (the trigger), so the counters equal a
    count of the rows; purging the rows afterwards leaves them as they were."""
    job, job_id = make_job("standard", "skip")
    runs.execute(job, SLOT, lambda run: "ok", trigger=Trigger.MANUAL)  # claim, then the final write
    runs.execute(job, SLOT + dt.timedelta(hours=1), lambda run: {"error": True}, trigger=Trigger.MANUAL)
    runs.execute(job, SLOT, lambda run: "again", trigger=Trigger.MANUAL)  # the slot already ran: SKIPPED
    decision = dispatch.Decision(job_id=job_id, expected_next_run_at=None, next_run_at=SLOT + dt.timedelta(days=1),
                                 run=[], missed=[SLOT + dt.timedelta(hours=2)], tz=dt.UTC)
    dispatch.dispatch_many([decision])  # MISSED, inserted in bulk
    execution(job, job_id, SLOT + dt.timedelta(hours=3), Status.PENDING)
    truth = dict(CronExecution.objects.filter(job_id=job_id).exclude(status__in=metrics.OPEN)
                 .values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    assert truth == {"SUCCEEDED": 1, "FAILED": 1, "SKIPPED": 1, "MISSED": 1}
    samples, _, _ = scrape(client)
    counted = {dict(labels)["status"]: value for (name, labels), value in samples.items()
               if name == "cron_executions_total" and dict(labels)["cron_job"] == job.name}
    assert counted == {"TIMED_OUT": 0, "LOST": 0, **truth}  # served at 0 until one happens
    assert samples["cron_executions_open", (("cron_job", job.name), ("status", "PENDING"))] == 1
    assert samples["cron_execution_duration_seconds_count", (("cron_job", job.name),)] == 2  # the two that ran
    purged = retention.purge(SLOT + dt.timedelta(days=30), ("SUCCEEDED", "FAILED", "SKIPPED", "MISSED"))
    assert purged.executions == 4
    again, _, _ = scrape(client)
    assert {key: value for key, value in again.items() if key[0].startswith("cron_execution")} == {
        key: value for key, value in samples.items() if key[0].startswith("cron_execution")}


def test_a_scrape_reads_no_execution_history(client):
    """Each statement of a scrape reaches the execution table only through an index condition on
    the job (the open executions, job by job) or through the partial index of the one-off runs
    not sent yet (which holds those alone): PostgreSQL's plans, with sequential scans priced out
    so that a statement that could only scan shows it."""
    job, job_id = make_job()
    bulk_executions(job, job_id, 2000)
    with CaptureQueriesContext(connection) as captured:
        scrape(client)
    statements = [query["sql"] for query in captured.captured_queries if query["sql"].lstrip().startswith("SELECT")]
    assert len(statements) >= 3
    reached = []
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for statement in statements:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {statement}")
            reached += [node for node in plan_nodes(cursor.fetchone()[0][0]["Plan"])
                        if node.get("Relation Name") == EXE]
    assert reached  # the open executions are read
    through = {"one-offs": 0, "job": 0}
    for node in reached:
        condition = node.get("Index Cond", "") + node.get("Recheck Cond", "")
        assert node["Node Type"] != "Seq Scan", node
        if node.get("Index Name") == ONE_OFF_INDEX:
            through["one-offs"] += 1
        else:
            assert "job_id" in condition, node
            through["job"] += 1
    assert through["one-offs"] and through["job"], through


#: The partial index of the one-off runs not sent yet (models.CronExecution's indexes).
ONE_OFF_INDEX = "cron_exec_one_off_due"


def plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(found for child in node.get("Plans", []) for found in plan_nodes(child))]


def test_the_histogram_bounds_of_the_trigger_are_the_metrics_bounds():
    migration = counting
    bounds = tuple(float(bound) for bound in re.findall(r"[\d.]+", migration.BOUNDS.split("]")[0]))
    assert bounds == metrics.BUCKETS
