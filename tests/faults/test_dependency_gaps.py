"""``after=`` when an upstream never runs a slot, and a job removed from the code, on a real beat and
real workers (jobs: tests/jobsapp/jobs_deps.py, picked by CRON_TEST_DEPS).

- A fan-in whose second upstream is paused, or outside its active window: every slot its first
  upstream ran ends in a recorded decision below — SKIPPED (``UPSTREAM``) naming the upstream that
  does not run it, down the chain — and no ``UPSTREAM`` alert (somebody paused it, or gave it its
  window: neither is a failure). Before, the slot had no row at all, before and after the reconciler.
- A downstream job removed by a deploy: its edges, its waiting executions and its one-off run are
  retired at the beat's start (SKIPPED, ``REMOVED``), its upstream's successes add nothing, nothing
  is sent again and nobody is alerted; the removal is logged and audited once, with two beats
  starting at once. Declared again by the next deploy, it runs again.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django_celery_beat.models import PeriodicTask

from cron_celery.models import (
    Alert,
    CronDependency,
    CronExecution,
    CronJob,
    ScheduleChange,
    SkipReason,
    Status,
    Trigger,
)
from tests.conftest import manage, subprocess_env, wait_for
from tests.faults.test_beat import start_beat, stop
from tests.servers import HttpServer
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@contextmanager
def running(tmp: Path, env: dict[str, str], *, beats: tuple[int, ...] = (0,), worker: bool = True,
            synced: Callable[[], bool] | None = None) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Beats (their log index) and a worker with the reconciler on, stopped after: the beats first,
    then every execution is waited for, then the worker. ``synced``: the worker starts once it is
    true (the beats' schedule sync has run), as a deploy's workers come up after its sync."""
    procs: list[subprocess.Popen[bytes]] = []
    if synced is not None:
        procs = [start_beat(tmp, env, index) for index in beats]
        wait_for(synced, timeout=60, what="the beats' schedule sync")
    started = Worker(tmp, env, pool="prefork", concurrency=2).start() if worker else None
    procs = procs or [start_beat(tmp, env, index) for index in beats]
    try:
        yield procs
        for proc in procs:
            stop(proc)
        if started is not None:
            sent = CronExecution.objects.filter(completed=False).exclude(trigger=Trigger.ONE_OFF)
            wait_for(lambda: not sent.exists(), timeout=60, what="every execution sent to end")
    finally:
        for proc in procs:
            stop(proc)
        if started is not None:
            started.stop()


def _env(marker: Path, hook: HttpServer, deps: str, **extra: str) -> dict[str, str]:
    return {"CRON_TEST_DEPS": deps, "CRON_TEST_MARKER": str(marker), "CRON_TEST_RECONCILE_INTERVAL": "1",
            "CRON_TEST_PENDING_GRACE": "3", "CRON_TEST_WEBHOOK_URL": hook.url, **extra}


def _succeeded_slots(name: str) -> list[dt.datetime]:
    return list(CronExecution.objects.filter(task_name=name, status=Status.SUCCEEDED).order_by("slot")
                .values_list("slot", flat=True))


def _assert_skipped_below(slots: list[dt.datetime], *words: str) -> None:
    """Each of these slots of fan-in is SKIPPED (UPSTREAM) with a message that says these words,
    and fan-end's slot below it is skipped for it; nothing ran, and no UPSTREAM alert was written."""
    for slot in slots:
        rows = list(CronExecution.objects.filter(task_name="fan-in", slot=slot))
        assert [(row.status, row.skip_reason) for row in rows] == [(Status.SKIPPED, SkipReason.UPSTREAM)], (slot, rows)
        assert all(word in rows[0].message for word in words), rows[0].message
        below = list(CronExecution.objects.filter(task_name="fan-end", slot=slot))
        assert [(row.status, row.skip_reason, row.upstream_execution_id) for row in below] == [
            (Status.SKIPPED, SkipReason.UPSTREAM, rows[0].id)], (slot, below)
    assert not Alert.objects.filter(event="UPSTREAM").exists()


def test_a_paused_upstream_of_a_fan_in_skips_each_downstream_slot_naming_it(tmp_path, marker):
    hook = HttpServer().start()
    with running(tmp_path, _env(marker, hook, "paused")):
        wait_for(lambda: CronExecution.objects.filter(task_name="fan-end", status=Status.SUCCEEDED).exists(),
                 timeout=60, what="a slot to run down the chain while both upstream jobs run")
        task = PeriodicTask.objects.get(name="fan-b (D502)")
        task.enabled = False  # paused, the admin's way
        task.save()
        paused_at = time.time()
        wait_for(lambda: len([slot for slot in _succeeded_slots("fan-a") if slot.timestamp() > paused_at + 2]) >= 3,
                 timeout=60, what="three slots of fan-a after fan-b was paused")
        time.sleep(5)  # reconciler passes (PENDING_GRACE 3 s) have had their say
    hook.stop()
    fan_b = set(CronExecution.objects.filter(task_name="fan-b").values_list("slot", flat=True))
    gaps = [slot for slot in _succeeded_slots("fan-a") if slot not in fan_b]  # slots fan-b never ran
    assert len(gaps) >= 3, gaps
    _assert_skipped_below(gaps, "fan-b (D502)", "paused")
    assert CronExecution.objects.filter(task_name="fan-in", status=Status.SUCCEEDED).exists()


def test_an_upstream_outside_its_window_skips_the_fan_in_and_the_chain_below_it(tmp_path, marker):
    hook = HttpServer().start()
    with running(tmp_path, _env(marker, hook, "window")):
        wait_for(lambda: len(_succeeded_slots("fan-a")) >= 3, timeout=60, what="three slots of fan-a")
        time.sleep(5)
    hook.stop()
    assert not CronExecution.objects.filter(task_name="fan-b").exists()
    slots = _succeeded_slots("fan-a")
    assert len(slots) >= 3
    _assert_skipped_below(slots, "fan-b (D502)", "window")
    assert not CronExecution.objects.filter(task_name__in=["fan-in", "fan-end"]).exclude(status=Status.SKIPPED).exists()


def test_cancelling_an_upstreams_runs_not_started_skips_the_fan_in_slots_that_waited_for_them(
        tmp_path, marker, admin_client):
    """fan-b's messages go to a queue nobody consumes, so its slots stay PENDING while fan-a runs
    its own. Somebody cancels fan-b's runs in the history ("Cancel runs not started yet"): each
    fan-in slot that waited for them is decided in the cancel's own transaction, SKIPPED (UPSTREAM)
    naming the cancelled run, and fan-end below it. Before (aac597e), the cancel decided nothing: the
    slots had no row when the action answered, and a reconciler pass decided them later only while
    fan-a's success was under an hour old, naming a wrong cause ("went past this slot")."""
    hook = HttpServer().start()
    with running(tmp_path, _env(marker, hook, "cancel")) as beats:
        held = CronExecution.objects.filter(task_name="fan-b", status=Status.PENDING)
        wait_for(lambda: len([slot for slot in _succeeded_slots("fan-a")
                              if held.filter(slot=slot).exists()]) >= 3, timeout=60,
                 what="three slots fan-a ran while fan-b's wait untaken")
        for beat in beats:  # no new slots: every run of fan-b is cancelled at once
            stop(beat)
        done = admin_client.post("/admin/cron_celery/cronexecution/", {
            "action": "cancel_not_started", "_selected_action": list(held.values_list("id", flat=True))},
            follow=True)
        assert "run(s) cancelled" in done.content.decode()
        # Read at once: the decision is the cancel's, not a later reconciler pass's.
        cancelled = {row.slot: row for row in CronExecution.objects.filter(
            task_name="fan-b", skip_reason=SkipReason.CANCELLED)}
        below = {(row.task_name, row.slot): row for row in CronExecution.objects.filter(
            task_name__in=["fan-in", "fan-end"])}
    hook.stop()
    waited = [slot for slot in _succeeded_slots("fan-a") if slot in cancelled]
    assert len(waited) >= 3, (waited, cancelled)
    for slot in waited:
        fan_in = below.get(("fan-in", slot))
        assert fan_in is not None, f"the fan-in slot {slot} had no row when the cancel answered"
        assert (fan_in.status, fan_in.skip_reason) == (Status.SKIPPED, SkipReason.UPSTREAM), (slot, fan_in)
        assert fan_in.message == (f"Skipped: upstream job fan-b (D502) ended SKIPPED, CANCELLED in this slot "
                                  f"(execution {cancelled[slot].id}).")
        fan_end = below[("fan-end", slot)]
        assert (fan_end.status, fan_end.skip_reason, fan_end.upstream_execution_id) == (
            Status.SKIPPED, SkipReason.UPSTREAM, fan_in.id)
    assert not CronExecution.objects.filter(task_name__in=["fan-b", "fan-in", "fan-end"]).exclude(
        status=Status.SKIPPED).exists()
    assert not Alert.objects.filter(event="UPSTREAM").exists()  # a person cancelled them: nobody is paged


def _down_edges() -> int:
    return CronDependency.objects.filter(downstream__name="rm-down").count()


def test_a_downstream_job_removed_from_the_code_leaves_nothing_running_and_comes_back_when_declared(
        tmp_path, marker):
    hook = HttpServer().start()
    # 1. rm-up -> rm-down, both declared: rm-down runs after rm-up.
    with running(tmp_path, _env(marker, hook, "chain")):
        wait_for(lambda: CronExecution.objects.filter(task_name="rm-down", status=Status.SUCCEEDED).exists(),
                 timeout=60, what="rm-down to run after rm-up")
    assert _down_edges() == 1
    # A deploy under way: a worker dies right after rm-up's success recorded rm-down's execution (never sent),
    # and a one-off run of rm-down waits for tomorrow.
    dying = Worker(tmp_path, _env(marker, hook, "chain", CRON_TEST_DIE_AFTER_RM_UP="1"), pool="solo").start()
    with running(tmp_path, _env(marker, hook, "chain"), beats=(1,), worker=False):
        assert dying.proc is not None
        dying.proc.wait(timeout=60)
    dying.stop()
    at = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).replace(microsecond=0)
    at += dt.timedelta(seconds=1 - int(at.timestamp()) % 2)  # an odd second: not a slot of rm-up's schedule
    scheduled = manage("run_cron_task", "rm-down", "--at", at.isoformat(), "--schedule",
                       env=subprocess_env(CRON_TEST_DEPS="chain"))
    assert scheduled.returncode == 0, scheduled.stderr
    waiting = list(CronExecution.objects.filter(task_name="rm-down", completed=False).order_by("id"))
    assert {row.trigger for row in waiting} == {Trigger.UPSTREAM, Trigger.ONE_OFF}, waiting
    # 2. The deploy that removed rm-down: two beats start at once, a worker with the reconciler.
    removed_at = time.time()
    with running(tmp_path, _env(marker, hook, "chain-removed"), beats=(2, 3),
                 synced=lambda: CronJob.objects.filter(name="rm-down", removed_at__isnull=False).exists()):
        wait_for(lambda: len([slot for slot in _succeeded_slots("rm-up") if slot.timestamp() > removed_at + 2]) >= 3,
                 timeout=60, what="three slots of rm-up after the deploy")
        time.sleep(5)  # reconciler passes (PENDING_GRACE 3 s) have had their say
    hook.stop()
    rows = list(CronExecution.objects.filter(task_name="rm-down").order_by("id"))
    assert not [row for row in rows if not row.completed], rows
    assert [row.id for row in rows if row.created_at.timestamp() > removed_at] == []  # nothing new for it
    retired = [row for row in rows if row.id in {w.id for w in waiting}]
    assert [(row.status, row.skip_reason, row.republished) for row in retired] == [
        (Status.SKIPPED, "REMOVED", 0)] * len(waiting), retired
    assert all("removed from the code" in row.message for row in retired), [row.message for row in retired]
    assert _down_edges() == 0
    assert not Alert.objects.filter(job__name="rm-down").exists()
    assert not Alert.objects.filter(event__in=["FAILED", "LOST", "UPSTREAM", "LATE"]).exists(), list(
        Alert.objects.values_list("event", "job__name"))  # (the beat's downtime between the phases: MISSED slots)
    changes = [change.changes for change in ScheduleChange.objects.filter(job__name="rm-down").order_by("id")]
    assert [change.get("declared") for change in changes] == [[True, False]], changes
    logs = "".join(path.read_text(errors="replace") for path in tmp_path.glob("*.log"))  # every worker's and beat's
    assert logs.count("] cron_celery: job rm-down (D512) was removed from the code") == 1, logs[-3000:]
    # 3. Declared again by the next deploy: it runs again, after a success of rm-up.
    again_at = time.time()
    with running(tmp_path, _env(marker, hook, "chain"), beats=(4,)):
        wait_for(lambda: any(slot.timestamp() > again_at for slot in _succeeded_slots("rm-down")),
                 timeout=60, what="rm-down to run again once declared again")
    assert _down_edges() == 1
    assert CronJob.objects.get(name="rm-down").removed_at is None
    changes = [change.changes for change in ScheduleChange.objects.filter(job__name="rm-down").order_by("id")]
    assert [change.get("declared") for change in changes] == [[True, False], [False, True]], changes


def test_a_worker_of_older_code_starting_mid_rollout_retires_nothing(
        tmp_path, marker):
    """A rollout: the beat and the new workers declare rm-down; a worker still on the old image (whose
    code lacks it) restarts. Retiring a job is the deploy's schedule sync's (a beat's start,
    ``sync_cron_schedules``), never a worker's: the old worker does not retire rm-down (its edges stay,
    its waiting execution is not closed, nothing is audited)."""
    hook = HttpServer().start()
    with running(tmp_path, _env(marker, hook, "chain")):
        wait_for(lambda: CronExecution.objects.filter(task_name="rm-down", status=Status.SUCCEEDED).exists(),
                 timeout=60, what="rm-down to run after rm-up")
    job = CronJob.objects.get(name="rm-down")
    stranded = CronExecution.objects.create(
        job=job, task_name="rm-down", task_code=job.code, slot=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        execution_date=dt.date(2026, 1, 1), status=Status.PENDING, trigger=Trigger.ENQUEUE,
        celery_task_id="rm-down-stranded")
    CronExecution.objects.filter(id=stranded.id).update(created_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    old = Worker(tmp_path, _env(marker, hook, "chain-removed"), pool="solo").start()
    try:
        time.sleep(6)  # its start, and reconciler passes (PENDING_GRACE 3 s), have had their say
    finally:
        old.stop()
    hook.stop()
    job.refresh_from_db()
    assert job.removed_at is None  # (a downstream job has no periodic task of its own to unlink)
    assert not ScheduleChange.objects.filter(job=job, changes__has_key="declared").exists()
    stranded.refresh_from_db()
    assert (stranded.status, stranded.skip_reason) == (Status.PENDING, ""), (stranded.status, stranded.message)
    assert _down_edges() == 1
