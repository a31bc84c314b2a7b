"""Timing alerts with real processes: a beat sends a job to a queue no worker consumes and another
job that runs past its max_runtime; real workers run the reconciler every second and deliver the
alerts to the test's own webhook. Each waiting run alerts LATE once while it still waits, the long
run alerts LONG_RUNNING once while it still runs, however many passes see them."""

from __future__ import annotations

import time

import pytest

from cron_celery.models import Alert, AlertStatus, CronExecution, Status
from tests.conftest import marked, wait_for
from tests.faults.test_beat import start_beat, stop
from tests.redis_servers import RedisServer
from tests.servers import HttpServer
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_an_unconsumed_queue_alerts_late_once_and_an_overrun_alerts_long_running_once_while_running(
        tmp_path, marker):
    hook = HttpServer().start()
    lock = RedisServer(tmp_path).start()
    env = {"CRON_TEST_LOCK_MASTERS": lock.url, "CRON_TEST_LOCK_TTL": "5", "CRON_TEST_LEASE_SECONDS": "15",
           "CRON_TEST_MARKER": str(marker), "CRON_TEST_TIMING": "1", "CRON_TEST_WEBHOOK_URL": hook.url,
           "CRON_TEST_RECONCILE_INTERVAL": "1"}
    workers = [Worker(tmp_path, env, pool="prefork", concurrency=2).start() for _ in range(2)]
    try:
        beat = start_beat(tmp_path, env, 0)
        try:
            wait_for(lambda: CronExecution.objects.filter(task_name="overruns", status=Status.RUNNING).exists()
                     and CronExecution.objects.filter(task_name="unconsumed").exists(), timeout=90,
                     what="the beat to send both jobs and a worker to start the long one")
        finally:
            stop(beat)  # no more slots: the runs already sent are the ones to watch
        long_id = CronExecution.objects.filter(task_name="overruns").order_by("slot").first().id
        wait_for(lambda: any(request.json()["event"] == "LONG_RUNNING" for request in hook.received()), timeout=30,
                 what="the LONG_RUNNING alert to reach the webhook")
        # Delivered while the run was still going (it sleeps six seconds against a bound of two).
        assert CronExecution.objects.get(id=long_id).status == Status.RUNNING
        waiting = list(CronExecution.objects.filter(task_name="unconsumed"))
        wait_for(lambda: {request.json()["execution_id"] for request in hook.received()
                          if request.json()["event"] == "LATE"} >= {row.id for row in waiting}, timeout=30,
                 what="a LATE alert of each run waiting on the unconsumed queue")
        assert set(CronExecution.objects.filter(task_name="unconsumed").values_list("status", flat=True)) == {
            Status.PENDING}
        wait_for(lambda: not CronExecution.objects.filter(task_name="overruns", completed=False).exists(),
                 timeout=60, what="the long runs to finish")
        passes_after = hook.received()
        time.sleep(4)  # four more passes of each worker: nothing is alerted again
    finally:
        for worker in workers:
            worker.stop()
        lock.stop()
        hook.stop()
    bodies = [request.json() for request in hook.received()]
    assert len(bodies) == len(passes_after)
    late = [body for body in bodies if body["event"] == "LATE"]
    assert sorted(body["execution_id"] for body in late) == sorted(row.id for row in waiting)  # once each
    assert {(body["job"], body["status"], body["error_code"]) for body in late} == {("unconsumed", "PENDING", "LATE")}
    assert all("no worker has taken its message" in body["error"] for body in late)
    longs = [body for body in bodies if body["event"] == "LONG_RUNNING"]
    overran = list(CronExecution.objects.filter(task_name="overruns").order_by("slot"))
    ran = [row for row in overran if row.status == Status.SUCCEEDED]  # a slot sent while one ran skips (overlap)
    assert sorted(body["execution_id"] for body in longs) == [row.id for row in ran] == [
        row.id for row in overran if row.long_alerted]
    assert long_id in [body["execution_id"] for body in longs]
    assert all(body["status"] == "RUNNING" and "(found at " in body["error"] and "; max_runtime 2 s)" in body["error"]
               for body in longs)
    assert {row.status for row in overran} <= {Status.SUCCEEDED, Status.SKIPPED}  # not stopped
    assert [line.split()[0] for line in marked(marker)].count("overruns") == len(ran)
    assert set(Alert.objects.filter(job__name__in=["unconsumed", "overruns"]).values_list("status", flat=True)) == {
        AlertStatus.SENT}
    # Their messages stay in a queue nobody reads: it carries the session's name, deleted at its end.
