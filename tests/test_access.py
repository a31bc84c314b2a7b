"""Least privilege at the endpoints: named tokens with scopes (several valid at once, compared
in constant time, never logged or echoed), the deprecated ``API_TOKEN``, sessions that need
the admin's model permissions, and a web process whose cron_celery checks find an error —
through Django's test client against real PostgreSQL, with the run endpoint's messages on the
session's own Redis queue.
"""

from __future__ import annotations

import hmac
import logging
import warnings
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.test import Client, override_settings

from cron_celery import check_errors, checks, conf
from cron_celery.models import CronExecution, CronJob
from cron_celery.web import tokens
from tests.conftest import make_job

pytestmark = pytest.mark.django_db

READER = "reader-token-0123456789-abcdefghijklm"
RUNNER = "runner-token-0123456789-abcdefghijklm"
FORCER = "forcer-token-0123456789-abcdefghijklm"
SCRAPER = "scraper-token-0123456789-abcdefghijkl"
OLD, NEW = "rotated-out-0123456789-abcdefghijklm", "rotated-in-0123456789-abcdefghijklmn"
LEGACY = "legacy-api-token-0123456789"
NAMED = {
    "prometheus": {"token": READER, "scopes": ["read"]},
    "deploy": {"token": RUNNER, "scopes": ["run"]},
    "oncall": {"token": FORCER, "scopes": ["read", "run", "force"]},
    "scraper": {"token": SCRAPER, "scopes": ["metrics"]},
}
READS = ["/cron/status/", "/cron/health/", "/cron/metrics/"]
RUN = "/cron/run/calc-commission/"


def cron_settings(**values: Any) -> override_settings:
    return override_settings(CRON_CELERY={**settings.CRON_CELERY, **values})


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def get(client: Client, url: str, token: str) -> Any:
    return client.get(url, headers=bearer(token))


def post(client: Client, token: str, **data: Any) -> Any:
    return client.post(RUN, data or {"date": "2026-11-29"}, headers=bearer(token))


# --- 1. scoped tokens --------------------------------------------------------------------------

@pytest.mark.parametrize("url", READS)
def test_a_read_token_reads_but_cannot_run(client, queue, url):
    with cron_settings(API_TOKENS=NAMED):
        assert get(client, url, READER).status_code in (200, 503)  # health: 503 is an answer about the jobs
        refused = post(client, READER)
    assert refused.status_code == 403
    assert refused.json() == {"error": "the token lacks the scope 'run'", "missing_scope": "run"}
    assert refused["WWW-Authenticate"] == 'Bearer error="insufficient_scope", scope="run"'
    assert READER not in refused.content.decode() and "prometheus" not in refused.content.decode()
    assert not CronExecution.objects.exists() and queue.headers() == []


@pytest.mark.parametrize("url", READS)
def test_a_run_token_runs_but_cannot_read(client, queue, url):
    with cron_settings(API_TOKENS=NAMED):
        refused = get(client, url, RUNNER)
        sent = post(client, RUNNER, date="2026-11-29", rerun="true")
    needed = "metrics" if url == "/cron/metrics/" else "read"  # the least scope that would do (read gives metrics)
    assert refused.status_code == 403
    assert refused.json() == {"error": f"the token lacks the scope '{needed}'", "missing_scope": needed}
    assert "calc-commission" not in refused.content.decode() and RUNNER not in refused.content.decode()
    assert sent.status_code == 202, sent.content  # rerun needs no more than run
    assert len(queue.headers()) == 1


def test_force_needs_its_own_scope(client, queue):
    with cron_settings(API_TOKENS=NAMED):
        refused = post(client, RUNNER, date="2026-11-29", force="true")
        forced = post(client, FORCER, date="2026-11-29", force="true")
        as_json = client.post(RUN, {"date": "2026-11-30", "force": True}, content_type="application/json",
                              headers=bearer(RUNNER))
    assert refused.status_code == 403 and as_json.status_code == 403
    assert refused.json() == {"error": "the token lacks the scope 'force'", "missing_scope": "force"}
    assert forced.status_code == 202, forced.content
    row = CronExecution.objects.get()  # only the permitted one was written and sent
    assert row.forced and row.id == forced.json()["execution_id"]
    assert [message["cron_execution_id"] for message in queue.headers()] == [row.id]


def test_two_tokens_are_valid_at_once_so_one_can_be_rotated_without_downtime(client):
    both = {"old": {"token": OLD, "scopes": ["read"]}, "new": {"token": NEW, "scopes": ["read"]}}
    with cron_settings(API_TOKENS=both):
        assert get(client, "/cron/status/", OLD).status_code == 200
        assert get(client, "/cron/status/", NEW).status_code == 200
    with cron_settings(API_TOKENS={"new": both["new"]}):  # the old one retired
        retired = get(client, "/cron/status/", OLD)
        assert get(client, "/cron/status/", NEW).status_code == 200
    assert retired.status_code == 401 and retired.json() == {"error": "invalid token"}


def test_every_configured_token_is_compared_whichever_matches(client, monkeypatch):
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)  # what cron_celery.web.tokens calls
    with cron_settings(API_TOKENS=NAMED):
        for token in (READER, FORCER, "unknown-token-0123456789-abcdefghijkl"):
            compared.clear()
            get(client, "/cron/status/", token)
            # One comparison per configured token, always, of equal-length digests (not the values).
            assert len(compared) == len(NAMED)
            assert {len(a) for a, _ in compared} == {32} and {len(b) for _, b in compared} == {32}


def test_a_token_is_never_logged_or_echoed(client, queue, caplog):
    wrong = "wrong-token-0123456789-abcdefghijklmn"
    with caplog.at_level(logging.DEBUG), caplog.at_level(logging.DEBUG, logger="cron_celery"), \
            cron_settings(API_TOKENS=NAMED):
        answers = [get(client, "/cron/status/", READER), get(client, "/cron/status/", wrong),
                   post(client, READER), post(client, RUNNER), post(client, RUNNER, force="true"),
                   post(client, FORCER, date="2026-11-30", force="true")]
    assert [answer.status_code for answer in answers] == [200, 401, 403, 202, 403, 202]
    said = caplog.text + "".join(answer.content.decode() + str(answer.headers) for answer in answers)
    for value in (READER, RUNNER, FORCER, wrong):
        assert value not in said
    # The run is logged with the name of the token that sent it.
    sent = [record.getMessage() for record in caplog.records if record.name == "cron_celery.web.views"]
    assert len(sent) == 2 and "by the token 'deploy'" in sent[0] and "by the token 'oncall'" in sent[1]
    with cron_settings(API_TOKENS=NAMED, API_TOKEN=LEGACY), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        shown = repr(conf.get()) + repr(tokens.current())  # what a log line of the settings would show
    assert "prometheus" in shown and READER not in shown and LEGACY not in shown


@pytest.mark.parametrize("entry", [
    {"token": "too-short-0123456789", "scopes": ["read"]},  # 20 characters
    {"token": READER, "scopes": ["read", "admin"]},  # an unknown scope
    {"token": READER, "scopes": ["force"]},  # force without run
    {"token": READER + " x", "scopes": ["read"]},  # cannot travel in a Bearer header
    {"token": READER, "scopes": "read"},  # a string, not a list
], ids=["short", "unknown-scope", "force-alone", "space", "scopes-string"])
def test_a_token_the_checks_refuse_is_not_accepted(client, entry):
    with cron_settings(API_TOKENS={"bad": entry}):
        assert [message.id for message in checks.check_tokens()] == ["cron_celery.E014"]
        response = client.get("/cron/status/", headers=bearer(entry["token"]))
    assert response.status_code == 401


def test_a_duplicated_token_is_refused_for_every_name_that_uses_it(client):
    twice = {"a": {"token": READER, "scopes": ["read"]}, "b": {"token": READER, "scopes": ["read", "run"]},
             "c": {"token": NEW, "scopes": ["read"]}}
    with cron_settings(API_TOKENS=twice):
        (error,) = checks.check_tokens()
        assert get(client, "/cron/status/", READER).status_code == 401
        assert get(client, "/cron/status/", NEW).status_code == 200
    assert error.id == "cron_celery.E014" and "'a', 'b'" in error.msg and READER not in error.msg


def every_endpoint_but(name: str) -> list[str]:
    """Each endpoint's path (from the package's own URL list, so a new endpoint is in it), but ``name``."""
    from django.urls import reverse

    from cron_celery import urls

    return [reverse(f"cron_celery:{pattern.name}", kwargs={"job": "calc-commission"} if "<" in str(pattern.pattern)
                    else None) for pattern in urls.urlpatterns if pattern.name != name]


def answer_of(client: Client, url: str, token: str) -> Any:
    """The endpoint's answer to the method it takes (GET, else POST)."""
    got = get(client, url, token)
    return client.post(url, {"date": "2026-11-29"}, headers=bearer(token)) if got.status_code == 405 else got


def test_a_metrics_token_scrapes_and_is_refused_everything_else(client, queue):
    job, job_id = make_job()
    CronJob.objects.filter(id=job_id).update(last_status="FAILED")
    with cron_settings(API_TOKENS=NAMED):
        scraped = get(client, "/cron/metrics/", SCRAPER)
        refused = {url: answer_of(client, url, SCRAPER) for url in every_endpoint_but("metrics")}
    assert scraped.status_code == 200 and job.name in scraped.content.decode()
    assert {url for url in refused if "/run/" in url} and {"/cron/status/", "/cron/health/"} <= set(refused)
    for url, answer in refused.items():
        assert answer.status_code == 403, (url, answer.status_code)
        assert answer.json()["missing_scope"] in ("read", "run", "audit", "pause"), url
        assert job.name not in answer.content.decode()
    assert not CronExecution.objects.exists() and queue.headers() == []


def test_a_read_token_scrapes_too_but_a_metrics_token_does_not_read(client):
    with cron_settings(API_TOKENS=NAMED):
        reader = [get(client, url, READER).status_code for url in ("/cron/status/", "/cron/metrics/")]
        scraper = [get(client, url, SCRAPER).status_code for url in ("/cron/status/", "/cron/metrics/")]
    assert reader == [200, 200]  # read implies metrics: a read token that scraped keeps scraping
    assert scraper == [403, 200]


def test_an_unknown_scope_is_a_check_error_that_lists_the_scopes(client):
    with cron_settings(API_TOKENS={"prometheus": {"token": SCRAPER, "scopes": ["metric"]}}):
        (error,) = checks.check_tokens()
        refused = get(client, "/cron/metrics/", SCRAPER)
    assert error.id == "cron_celery.E014" and "['metric']" in error.msg and "metrics" in error.msg
    assert refused.status_code == 401


# --- the deprecated API_TOKEN ----------------------------------------------------------------

def test_the_old_api_token_still_reads_runs_and_forces_with_a_deprecation_warning(client, queue):
    with cron_settings(API_TOKEN=LEGACY):
        with pytest.warns(DeprecationWarning, match="API_TOKENS"):
            assert get(client, "/cron/status/", LEGACY).status_code == 200
        forced = post(client, LEGACY, date="2026-11-29", force="true")
        scraped = get(client, "/cron/metrics/", LEGACY)
        audited = get(client, "/cron/audit/", LEGACY)
        messages = checks.check_tokens()
    assert forced.status_code == 202 and CronExecution.objects.get().forced
    assert scraped.status_code == 200  # the scopes it had: read (status, health, metrics), run, force
    assert audited.status_code == 403 and audited.json()["missing_scope"] == "audit"
    (warning,) = messages
    assert warning.id == "cron_celery.W002" and not warning.is_serious()
    assert "CRON_CELERY['API_TOKENS'] = {'legacy': {'token': os.environ['CRON_API_TOKEN']" in warning.msg
    assert LEGACY not in warning.msg


def test_the_old_and_the_new_setting_work_side_by_side_while_callers_move(client):
    with cron_settings(API_TOKEN=LEGACY, API_TOKENS=NAMED), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert get(client, "/cron/status/", LEGACY).status_code == 200
        assert get(client, "/cron/status/", READER).status_code == 200
        assert post(client, READER).status_code == 403
    with cron_settings(API_TOKEN=READER, API_TOKENS=NAMED):  # the same value twice: refused, by both names
        assert "'prometheus', 'API_TOKEN'" in checks.check_tokens()[0].msg
        assert get(client, "/cron/status/", READER).status_code == 401


# --- 2. sessions follow the admin's permissions ------------------------------------------------

def staff_with(django_user_model: Any, *codenames: str) -> Any:
    user = django_user_model.objects.create_user("staff-" + "-".join(codenames), password="pw-not-used",
                                                 is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="cron_celery",
                                                         codename__in=codenames))
    return django_user_model.objects.get(id=user.id)  # permissions are cached per user object


@pytest.mark.parametrize("url", READS)
def test_a_staff_session_needs_the_view_permission_to_read(client, django_user_model, url):
    job, job_id = make_job()
    CronJob.objects.filter(id=job_id).update(last_status="FAILED")
    client.force_login(staff_with(django_user_model, "view_cronjob"))  # not the history's
    refused = client.get(url)
    assert refused.status_code == 403
    assert refused.json() == {"error": "the permission cron_celery.view_cronexecution is needed",
                              "missing_permission": "cron_celery.view_cronexecution"}
    assert job.name not in refused.content.decode()
    client.force_login(staff_with(django_user_model, "view_cronexecution"))
    assert client.get(url).status_code == 200


def test_a_staff_session_needs_the_change_permission_to_run_and_to_force(client, django_user_model, queue):
    client.force_login(staff_with(django_user_model, "view_cronexecution"))
    assert client.post(RUN, {"date": "2026-11-29", "force": "true"}).status_code == 403
    assert client.post(RUN, {"date": "2026-11-29"}).status_code == 403
    assert not CronExecution.objects.exists()
    # As the admin's Run now and Re-run (both forced): cron_celery.change_cronjob is enough.
    client.force_login(staff_with(django_user_model, "view_cronexecution", "change_cronjob"))
    plain = client.post(RUN, {"date": "2026-11-29"})
    forced = client.post(RUN, {"date": "2026-11-29", "force": "true"})
    assert (plain.status_code, forced.status_code) == (202, 202)
    assert sorted(CronExecution.objects.values_list("forced", flat=True)) == [False, True]


# --- 5. a web process whose checks find an error ----------------------------------------------

def test_health_answers_503_with_the_check_id_while_a_check_finds_an_error(client):
    token = {"monitor": {"token": READER, "scopes": ["read"]}}
    with cron_settings(API_TOKENS=token, LOCK={"TTL": 120}, LEASE_SECONDS=60):  # a lock outliving its lease
        broken = get(client, "/cron/health/", READER)
    assert broken.status_code == 503
    body = broken.json()
    assert body["status"] == "unhealthy"
    assert [check["id"] for check in body["checks"]] == ["cron_celery.E007"]
    assert body["checks"][0]["hint"].startswith("Keep the lock TTL at or below the lease")
    assert body["reasons"][0].startswith("system check cron_celery.E007: CRON_CELERY['LOCK']['TTL'] (120 s)")
    with cron_settings(API_TOKENS=token):
        fixed = get(client, "/cron/health/", READER)
    assert fixed.status_code == 200 and fixed.json()["checks"] == []
    silenced = override_settings(SILENCED_SYSTEM_CHECKS=["cron_celery.E007"])
    with cron_settings(API_TOKENS=token, LOCK={"TTL": 120}, LEASE_SECONDS=60), silenced:
        assert get(client, "/cron/health/", READER).status_code == 200  # the operator chose to run with it


def test_the_checks_run_once_per_process_not_per_request(client, monkeypatch):
    runs: list[int] = []
    real = check_errors.errors

    def counted() -> list[Any]:
        runs.append(1)
        return real()

    monkeypatch.setattr(check_errors, "errors", counted)
    with cron_settings(API_TOKENS={"monitor": {"token": READER, "scopes": ["read"]}}):
        for _ in range(3):
            assert get(client, "/cron/health/", READER).status_code == 200
        assert len(runs) == 1
        with cron_settings(MESSAGE_MAX_CHARS=5):  # a settings change runs them again: E002 now
            first = get(client, "/cron/health/", READER)
            second = get(client, "/cron/health/", READER)
        assert len(runs) == 2
    assert first.status_code == second.status_code == 503
    assert [check["id"] for check in second.json()["checks"]] == ["cron_celery.E002"]
