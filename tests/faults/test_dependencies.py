"""``after=`` on real workers: a downstream slot runs once when its upstream jobs succeeded in it,
even when the worker that wrote the last upstream's success dies before sending it."""

from __future__ import annotations

import datetime as dt

import pytest

from cron_celery.models import CronExecution, Status, Trigger
from tests.conftest import marked, wait_for
from tests.faults.test_retries import broker, enqueue, settled, started  # noqa: F401 (fixtures)
from tests.jobsapp import jobs_chain as jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SLOT = dt.datetime(2026, 11, 30, 6, 0, tzinfo=dt.UTC)


def test_a_worker_killed_between_the_last_upstreams_success_and_the_send_still_runs_the_downstream_once(
        started, broker, marker):  # noqa: F811
    """extract succeeds; transform's worker dies (its whole process group) right after transform's
    success was committed — the downstream execution was recorded in that same transaction, and
    never sent. A second worker's reconciler sends it after PENDING_GRACE: load runs once."""
    from cron_celery import dependencies

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
