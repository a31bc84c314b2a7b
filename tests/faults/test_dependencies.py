"""``after=`` on real workers: a downstream slot runs once when its upstream jobs succeeded in it,
even when the worker that wrote the last upstream's success dies before sending it; and the alert
of a downstream job declared with ``alert_on_upstream=True`` is not lost when the worker that wrote
its upstream's failure dies right after the commit."""

from __future__ import annotations

import datetime as dt

import pytest

from cron_celery.models import Alert, AlertStatus, CronExecution, SkipReason, Status, Trigger
from tests.conftest import marked, wait_for
from tests.faults.test_retries import broker, enqueue, settled, started  # noqa: F401 (fixtures)
from tests.jobsapp import jobs_chain as jobs
from tests.servers import HttpServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SLOT = dt.datetime(2026, 11, 30, 6, 0, tzinfo=dt.UTC)


def test_a_worker_killed_between_the_last_upstreams_success_and_the_send_still_runs_the_downstream_once(
        started, broker, marker):  # noqa: F811
    """extract succeeds; transform's worker dies (its whole process group) right after transform's
    success was committed — the downstream execution was recorded in that same transaction, and
    never sent. A second worker's reconciler sends it after PENDING_GRACE: load runs once."""
    from cron_celery.decisions import dependencies

    dependencies.sync([jobs.chain_extract.job, jobs.chain_transform.job, jobs.chain_load.job])
    first = started(pool="solo")
    extract = settled(enqueue(jobs.chain_extract, broker, SLOT))[0]
    assert extract.status == Status.SUCCEEDED
    assert not CronExecution.objects.filter(task_code="C103").exists()  # transform has not run yet
    first.stop()  # the next message must reach the worker that dies
    dying = started(pool="solo", CRON_TEST_DIE_AFTER_UPSTREAM="1", CRON_TEST_VISIBILITY_TIMEOUT="3")
    transform_id = enqueue(jobs.chain_transform, broker, SLOT)
    assert dying.proc is not None
    dying.proc.wait(timeout=60)  # gone: the success is committed, the downstream never sent
    transform = CronExecution.objects.get(id=transform_id)
    assert transform.status == Status.SUCCEEDED
    (load,) = CronExecution.objects.filter(task_code="C103")
    assert (load.status, load.trigger, load.upstream_execution_id, load.started) == (
        Status.PENDING, Trigger.UPSTREAM, transform_id, None)
    # Another worker, with the reconciler on.
    started(pool="solo", CRON_TEST_RECONCILE_INTERVAL="1", CRON_TEST_PENDING_GRACE="3",
            CRON_TEST_VISIBILITY_TIMEOUT="3")
    ran = settled(load.id, timeout=90)[0]
    assert (ran.status, ran.trigger, ran.run_number, ran.republished) == (Status.SUCCEEDED, Trigger.UPSTREAM, 1, 1)
    wait_for(lambda: not CronExecution.objects.filter(completed=False).exists(), timeout=30,
             what="every execution to end")
    assert CronExecution.objects.filter(task_code="C103").count() == 1
    bodies = [line.split()[0] for line in marked(marker)]
    assert (bodies.count("chain-extract"), bodies.count("chain-transform"), bodies.count("chain-load")) == (1, 1, 1)


def test_a_worker_killed_right_after_an_upstreams_failure_commits_loses_no_downstream_alert(
        started, broker, marker):  # noqa: F811
    """chain-fails fails; its worker dies (its whole process group) right after the failure was
    committed and announced — chain-after-fails' skip and its UPSTREAM alert were written in that
    same transaction. Another worker delivers the alert: once, naming the skipped execution."""
    from cron_celery.decisions import dependencies

    dependencies.sync([jobs.chain_fails.job, jobs.chain_after_fails.job])
    hook = HttpServer().start()
    dying = started(pool="solo", CRON_TEST_DIE_AFTER_UPSTREAM_FAILURE="1", CRON_TEST_WEBHOOK_URL=hook.url,
                    CRON_TEST_VISIBILITY_TIMEOUT="3")
    failed_id = enqueue(jobs.chain_fails, broker, SLOT)
    assert dying.proc is not None
    dying.proc.wait(timeout=60)
    assert CronExecution.objects.get(id=failed_id).status == Status.FAILED
    (skipped,) = CronExecution.objects.filter(task_code="C105")
    assert (skipped.status, skipped.skip_reason, skipped.upstream_execution_id) == (
        Status.SKIPPED, SkipReason.UPSTREAM, failed_id)
    assert list(Alert.objects.filter(execution_id=skipped.id).values_list("event", "channel")) == [
        ("UPSTREAM", "webhook")]
    started(pool="solo", CRON_TEST_RECONCILE_INTERVAL="1", CRON_TEST_PENDING_GRACE="3",
            CRON_TEST_VISIBILITY_TIMEOUT="3", CRON_TEST_WEBHOOK_URL=hook.url)
    wait_for(lambda: Alert.objects.filter(execution_id=skipped.id, status=AlertStatus.SENT).exists(), timeout=90,
             what="the downstream's UPSTREAM alert to be delivered")
    wait_for(lambda: Alert.objects.filter(execution_id=failed_id, status=AlertStatus.SENT).exists(), timeout=60,
             what="the upstream's own alert to be delivered")
    hook.stop()
    bodies = [request.json() for request in hook.received()]
    upstream = [body for body in bodies if body["event"] == "UPSTREAM"]
    assert [(body["job"], body["execution_id"], body["status"], body["error_code"]) for body in upstream] == [
        ("chain-after-fails", skipped.id, "SKIPPED", "UPSTREAM")]
    assert f"execution {failed_id}, ended FAILED: RuntimeError: the source is down" in upstream[0]["error"]
    assert [body["execution_id"] for body in bodies if body["event"] == "FAILED"] == [failed_id]
    assert [line.split()[0] for line in marked(marker)].count("chain-fails") == 1  # run once, never again
