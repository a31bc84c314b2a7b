"""Real ``celery beat`` processes with the cron_celery scheduler and real workers: every slot
is dispatched and run exactly once, with or without the leader lease, across a killed leader
and a beat that was down, and admin edits reach a running beat."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from django.utils import timezone
from django_celery_beat.models import ClockedSchedule, CrontabSchedule, IntervalSchedule, PeriodicTask

from cron_celery.models import CronExecution, CronJob, SkipReason, Status, Trigger
from tests.admin_forms import submit
from tests.conftest import ROOT, marked, subprocess_env, wait_for
from tests.redis_servers import RedisServer
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TICKS = {"tick-1s": 1, "tick-2s": 2}
FLEET = {f"fleet-{i:02d}": 1 + i % 2 for i in range(20)}
LEAD_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+: WARNING/\w+\] beat \S+ is now the leader",
                       re.MULTILINE)


def start_beat(tmp: Path, env: dict[str, str], index: int) -> subprocess.Popen[bytes]:
    log = open(tmp / f"beat-{index}.log", "ab")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.celery_app", "beat", "-S", "cron_celery.beat.Scheduler",
         "--loglevel", "INFO", "--max-interval", "1", "--pidfile", str(tmp / f"beat-{index}-{time.time()}.pid")],
        cwd=ROOT, env=subprocess_env(CRON_TEST_LOG_LEVEL="INFO", **env), stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def beat_log(tmp: Path, index: int) -> str:
    return (tmp / f"beat-{index}.log").read_text(errors="replace")


@contextmanager
def cluster(tmp: Path, marker: Path, *, workers: int = 1, **extra: str) -> Iterator[dict[str, str]]:
    """A lock Redis of our own and ``workers`` real workers; yields the env for beats."""
    lock = RedisServer(tmp).start()
    env = {"CRON_TEST_LOCK_MASTERS": lock.url, "CRON_TEST_LOCK_TTL": "5", "CRON_TEST_LEASE_SECONDS": "15",
           "CRON_TEST_MARKER": str(marker), **extra}
    started: list[Worker] = []
    try:
        for _ in range(workers):
            started.append(Worker(tmp, env, pool="prefork", concurrency=2).start())
        yield env
        wait_for(lambda: not CronExecution.objects.filter(completed=False).exists(),
                 timeout=90, what="the workers to finish every dispatched slot")
    finally:
        for worker in started:
            worker.stop()
        lock.stop()


def run_two_beats(tmp: Path, marker: Path, seconds: float, *, workers: int = 1,
                  kill_leader_after: float | None = None, at_lead: Callable[[], None] | None = None,
                  **extra: str) -> tuple[list[str], int, float]:
    """Two beats for ``seconds``; returns their logs, how many led, and when they stopped. With
    ``kill_leader_after``, ``at_lead`` is called once a beat leads, and the leader is SIGKILLed
    that many seconds later."""
    with cluster(tmp, marker, workers=workers, **extra) as env:
        beats = [start_beat(tmp, env, i) for i in range(2)]
        try:
            # The seconds count from the first dispatch: a loaded machine may take a while to start a beat.
            wait_for(CronExecution.objects.exists, timeout=90, what="the beats' first dispatch")
            if kill_leader_after is not None:
                # The leader is the first beat to log its lead; on a loaded machine that may take a while.
                wait_for(lambda: any(took_lead_before(beat_log(tmp, i), time.time() + 2) for i in range(2)),
                         timeout=60, what="one beat to take the lead")
                if at_lead is not None:
                    at_lead()
                time.sleep(kill_leader_after)
                leader = next(i for i in range(2) if took_lead_before(beat_log(tmp, i), time.time() + 2))
                os.killpg(beats[leader].pid, signal.SIGKILL)  # no goodbye: the lease must expire
                beats[leader].wait(timeout=10)
            time.sleep(seconds)
        finally:
            stopped = time.time()
            for proc in beats:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in beats:
                stop(proc)
    logs = [beat_log(tmp, i) for i in range(2)]
    return logs, sum(1 for log in logs if took_lead_before(log, stopped)), stopped


def timestamp(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def took_lead_before(log: str, moment: float) -> bool:
    """Whether the beat became the leader before ``moment`` (not while the beats were stopping)."""
    for found in LEAD_LINE.finditer(log):
        if dt.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").timestamp() < moment - 1:
            return True
    return False


def assert_every_slot_once(marker: Path, jobs: dict[str, int], stopped: float | None = None) -> None:
    lines = Counter(line.split()[0] for line in marked(marker))
    for name, step in jobs.items():
        rows = list(CronExecution.objects.filter(task_name=name).order_by("slot"))
        assert len(rows) >= 4, f"{name}: only {len(rows)} slots dispatched"
        slots = [row.slot for row in rows]
        assert Counter(slots).most_common(1)[0][1] == 1, f"{name}: a slot was dispatched twice"
        gaps = {(b - a).total_seconds() for a, b in itertools.pairwise(slots)}
        assert gaps == {float(step)}, f"{name}: slots missing between {slots[0]} and {slots[-1]}: {gaps}"
        assert {row.run_number for row in rows} == {1}
        if stopped is not None:
            assert slots[-1].timestamp() >= stopped - step - 2, f"{name}: dispatch stopped early at {slots[-1]}"
        ran = [row for row in rows if row.status == Status.SUCCEEDED]
        job = CronJob.objects.get(name=name)
        if job.overlap == "allow":  # every slot runs
            assert len(ran) == len(rows), f"{name}: {Counter(row.status for row in rows)}"
        else:  # overlap "skip": catch-up slots sent together may meet a running one
            assert all(row.status == Status.SUCCEEDED or row.skip_reason in (
                SkipReason.OVERLAP, SkipReason.LOCK_UNAVAILABLE) for row in rows)
        assert lines[name] == len(ran), f"{name}: {lines[name]} bodies ran for {len(ran)} successful slots"


def test_two_beats_with_the_leader_lease_dispatch_every_slot_of_twenty_jobs_once(tmp_path, marker):
    """Issue test 1, with a plain periodic task next to the cron jobs."""
    every_second, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.create(name="plain ping", task="tests.jobsapp.tasks.plain_ping", interval=every_second)
    seconds = 30.0  # 15 to 30 slots of each of the twenty jobs, and 30 pings
    logs, leaders, stopped = run_two_beats(tmp_path, marker, seconds, workers=2, CRON_TEST_FLEET="1")
    assert leaders == 1, logs
    assert_every_slot_once(marker, {**FLEET, **TICKS}, stopped)
    # The plain task is sent by django-celery-beat's scheduler, by the leader only, untracked.
    pings = [line for line in marked(marker) if line.startswith("plain-ping ")]
    assert 10 <= len(pings) <= seconds + 5, f"{len(pings)} pings in {seconds} s: sent twice?"
    assert not CronExecution.objects.filter(task_name__contains="ping").exists()


def test_two_beats_that_both_think_they_lead_still_dispatch_every_slot_once(tmp_path, marker):
    """Issue test 2: leadership forced on in both beats (a stale leader)."""
    _logs, _, stopped = run_two_beats(tmp_path, marker, 20, workers=2, CRON_TEST_FLEET="1",
                                      CRON_CELERY_BEAT_ALWAYS_LEAD="1")
    assert_every_slot_once(marker, {**FLEET, **TICKS}, stopped)


def test_the_standby_takes_over_when_the_leader_is_killed_and_no_slot_is_lost(tmp_path, marker):
    """Issue test 3."""
    logs, leaders, stopped = run_two_beats(tmp_path, marker, seconds=9, kill_leader_after=4,
                                           CRON_TEST_BEAT_LEASE_SECONDS="3")
    assert leaders == 2, logs  # the first leader, then the standby after the lease expired
    assert_every_slot_once(marker, TICKS, stopped)  # catch-up "all": the slots of the gap ran too
    assert CronExecution.objects.filter(task_name="tick-1s", trigger=Trigger.CATCH_UP).exists()


@pytest.mark.parametrize("track", [[], ["plain clocked"]], ids=["untracked", "clocked-tracked"])
def test_a_killed_leader_leaves_no_plain_periodic_task_for_the_standby_to_send_again(tmp_path, marker, track):
    """Untracked periodic tasks are sent once per due time across a takeover. Made before the beats
    start: a primer, due at once (Celery writes the last runs after a beat's first send, and not again
    for three minutes), then an interval, a crontab and a clocked one-off, due together at a minute at
    least 20 s away and not again before the test ends. The leader sends each one and is SIGKILLed; the
    standby holds the copy it read at its start and must not send them again. Tracked, the clocked
    one-off is recorded as it fires (``tracking.fires``): one execution, its slot the clocked time."""
    now = timezone.now()
    due = (now + dt.timedelta(seconds=80)).replace(second=0, microsecond=0)  # a minute 20 to 80 s away
    every_30s, _ = IntervalSchedule.objects.get_or_create(every=30, period=IntervalSchedule.SECONDS)
    hourly = CrontabSchedule.objects.create(minute=str(due.minute), hour="*", timezone="UTC")
    plain = {"interval": {"interval": every_30s, "last_run_at": due - dt.timedelta(seconds=30)},
             "crontab": {"crontab": hourly, "last_run_at": due - dt.timedelta(seconds=30)},
             "clocked": {"clocked": ClockedSchedule.objects.create(clocked_time=due), "one_off": True}}
    every_hour, _ = IntervalSchedule.objects.get_or_create(every=3600, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.create(name="plain primer", task="tests.jobsapp.tasks.plain_mark", args='["primer"]',
                                interval=every_hour, last_run_at=now - dt.timedelta(hours=2))
    for label, schedule in plain.items():
        PeriodicTask.objects.create(name=f"plain {label}", task="tests.jobsapp.tasks.plain_mark",
                                    args=json.dumps([label]), **schedule)

    def sent_all() -> None:  # the leader sent all three before it is killed
        wait_for(lambda: len([line for line in marked(marker) if line.startswith("plain-mark ")]) >= 4,
                 timeout=150, what="the primer and the three plain periodic tasks")

    logs, leaders, _stopped = run_two_beats(tmp_path, marker, seconds=10, kill_leader_after=2, at_lead=sent_all,
                                            CRON_TEST_BEAT_LEASE_SECONDS="3", CRON_TEST_TRACK=json.dumps(track))
    assert leaders == 2, logs  # the first leader sent each one, then the standby took over
    sent = Counter(line.split()[1] for line in marked(marker) if line.startswith("plain-mark "))
    assert sent == {"primer": 1, "interval": 1, "crontab": 1, "clocked": 1}, logs
    senders = [{label for label in plain if f"Sending due task plain {label} " in log} for log in logs]
    assert sorted(senders, key=len) == [set(), set(plain)], senders  # the killed leader sent them all
    fired = list(CronExecution.objects.filter(task_name="plain-clocked"))
    if track:
        assert [(row.slot, row.status, row.params) for row in fired] == [
            (due, Status.SUCCEEDED, {"args": ["clocked"], "kwargs": {}})], logs
    else:
        assert not fired


def test_a_beat_down_for_several_slots_catches_up_by_each_jobs_policy(tmp_path, marker):
    """Issue test 4: one beat, stopped for 8 s (four slots of the two-second jobs), started again."""
    with cluster(tmp_path, marker, CRON_CELERY_BEAT_ALWAYS_LEAD="1") as env:
        beat = start_beat(tmp_path, env, 0)
        wait_for(lambda: CronExecution.objects.filter(task_name="catch-up-all").count() >= 2, timeout=60,
                 what="the first slots")
        stop(beat)
        down_at = time.time()
        time.sleep(8)
        beat = start_beat(tmp_path, env, 0)
        up_at = time.time()
        jobs = {"catch-up-none": "none", "catch-up-latest": "latest", "catch-up-all": "all"}
        # Until each job has a slot on time after the restart (a loaded machine starts a beat slowly).
        wait_for(lambda: all(CronExecution.objects.filter(task_name=name, slot__gt=timestamp(up_at + 2),
                                                          trigger=Trigger.BEAT, status=Status.SUCCEEDED).exists()
                             for name in jobs), timeout=90, what="slots on time after the restart")
        stop(beat)
    for name, policy in jobs.items():
        rows = list(CronExecution.objects.filter(task_name=name).order_by("slot"))
        slots = [row.slot.timestamp() for row in rows]
        assert {b - a for a, b in itertools.pairwise(slots)} == {2.0}, f"{name}: holes or duplicates"
        gap = [row for row in rows if down_at + 1 < row.slot.timestamp() < up_at - 1]
        assert len(gap) >= 3, f"{name}: {len(gap)} slots in the downtime"
        missed = [row for row in gap if row.status == Status.MISSED]
        late = [row for row in rows if row.trigger == Trigger.CATCH_UP]
        if policy == "all":
            assert not missed and {row.status for row in gap} == {Status.SUCCEEDED} and len(late) >= 3
        else:
            assert len(missed) == len(gap) and not late, f"{name}: {[(r.slot, r.status) for r in gap]}"
            assert all(row.message.startswith("Missed") and row.completed for row in missed)
        # After the restart, slots on time run again under every policy.
        assert any(row.status == Status.SUCCEEDED and row.slot.timestamp() > up_at + 2 for row in rows), name
    ran = Counter(line.split()[0] for line in marked(marker))
    for name in jobs:
        assert ran[name] == CronExecution.objects.filter(task_name=name, status=Status.SUCCEEDED).count()
    # django-celery-beat's Periodic tasks page tells the truth: when the beat last sent each job's
    # slot, and how many it sent (before: "Last Run Datetime: -" and 0, however often it ran).
    for name in jobs:
        task = CronJob.objects.get(name=name).periodic_task
        sent = CronExecution.objects.filter(task_name=name).exclude(status=Status.MISSED)
        assert task is not None and task.total_run_count == sent.count() > 0, (name, task and task.total_run_count)
        assert task.last_run_at is not None and task.last_run_at >= max(row.created_at for row in sent)
    # What the operator reads at INFO: a line per dispatch round, and the MISSED slots with why;
    # none of pottery's "Registering Redlock._acquired_script" in the beat's or the worker's log.
    log = beat_log(tmp_path, 0)
    assert re.search(r"INFO/\w+\] cron_celery beat: dispatched \d+ slot\(s\) of \d+ job\(s\) in \d+ ms", log), log
    for name, policy in (("catch-up-none", "none"), ("catch-up-latest", "latest")):
        assert re.search(rf"INFO/\w+\] cron job {name}: \d+ slot\(s\) recorded MISSED, \S+ to \S+: not dispatched "
                         rf"in time .* catch_up={policy} does not run them late", log), log
    logs = {path.name: path.read_text(errors="replace") for path in tmp_path.glob("*.log")}
    assert any(name.startswith("fault-") for name in logs) and "beat-0.log" in logs
    assert not [name for name, text in logs.items() if "Registering Redlock" in text]


def test_admin_edits_reach_a_running_beat_without_a_restart(tmp_path, marker, admin_client):
    """Issue test 6: the interval changed through the admin form, then the job disabled."""
    with cluster(tmp_path, marker, CRON_CELERY_BEAT_ALWAYS_LEAD="1") as env:
        beat = start_beat(tmp_path, env, 0)
        try:
            wait_for(lambda: CronExecution.objects.filter(task_name="tick-2s").count() >= 2, timeout=60,
                     what="the first slots of tick-2s")
            task = CronJob.objects.get(name="tick-2s").periodic_task
            assert task is not None
            five, _ = IntervalSchedule.objects.get_or_create(every=5, period=IntervalSchedule.SECONDS)
            url = f"/admin/django_celery_beat/periodictask/{task.id}/change/"
            assert submit(admin_client, url, {"interval": str(five.id)}).status_code == 302
            edited = time.time()
            later = dt.datetime.fromtimestamp(edited + 8, tz=dt.UTC)
            wait_for(lambda: CronExecution.objects.filter(task_name="tick-2s", slot__gte=later).exists(),
                     timeout=30, what="slots of the new schedule")
            action = admin_client.post("/admin/django_celery_beat/periodictask/",
                                       {"action": "disable_tasks", "_selected_action": [task.id]})
            assert action.status_code == 302
            disabled = time.time()
            time.sleep(6)
        finally:
            stop(beat)
    after_edit = [row.slot.timestamp() for row in CronExecution.objects.filter(task_name="tick-2s").order_by("slot")
                  if row.slot.timestamp() > edited + 2]
    assert after_edit and all(slot % 5 == 0 for slot in after_edit), after_edit  # every 5 s, epoch-aligned
    assert all(slot < disabled + 1 for slot in after_edit), "dispatched after it was disabled"
    job = CronJob.objects.get(name="tick-2s")
    assert job.paused and job.next_run_at is None and job.schedule == "every 5s"
    assert "schedule every 5 seconds" in beat_log(tmp_path, 0)


def test_a_leader_stopped_with_sigterm_hands_over_at_once_not_after_its_lease(tmp_path, marker):
    """Graceful shutdown: the leader releases its lease (30 s here) on SIGTERM. The standby is
    paused meanwhile, so the lease key is seen gone (released, not expired) before anyone
    could take it again; then the standby takes over."""
    with cluster(tmp_path, marker, CRON_TEST_BEAT_LEASE_SECONDS="30") as env:
        lock = redis.Redis.from_url(env["CRON_TEST_LOCK_MASTERS"])
        beats = [start_beat(tmp_path, env, i) for i in range(2)]
        try:
            wait_for(lambda: sum("is now the leader" in beat_log(tmp_path, i) for i in range(2)) == 1,
                     timeout=60, what="a leader")
            leader = next(i for i in range(2) if "is now the leader" in beat_log(tmp_path, i))
            standby = 1 - leader
            assert list(lock.scan_iter(match="*beat-leader*")), "the leader holds no lease key"
            os.killpg(beats[standby].pid, signal.SIGSTOP)
            stop(beats[leader])  # SIGTERM, and waits for the process to exit
            held = list(lock.scan_iter(match="*beat-leader*"))
            os.killpg(beats[standby].pid, signal.SIGCONT)
            assert not held, f"the stopped leader left its lease behind: {held}"
            wait_for(lambda: "is now the leader" in beat_log(tmp_path, standby), timeout=40,
                     what="the standby to take over")
        finally:
            for proc in beats:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGCONT)
                stop(proc)


def test_two_beats_send_each_slot_of_jobs_with_jitter_once_at_its_offset_never_before(tmp_path, marker):
    """Jitter with two beats that both dispatch (a stale leader): four five-second jobs with
    ``jitter=4.5`` each get a fixed offset from their code; every slot is recorded once at its
    nominal time, with ``due_at`` = slot + the job's offset, and its message is sent at that
    moment — never before it, and before the next slot of the job is due."""
    _logs, _, stopped = run_two_beats(tmp_path, marker, 30, workers=1, CRON_TEST_JITTER="1",
                                      CRON_CELERY_BEAT_ALWAYS_LEAD="1")
    jittered = {f"jittered-{i}": 5 for i in range(4)}
    assert_every_slot_once(marker, jittered, stopped - 4.5)  # the last slots are sent up to 4.5 s late
    offsets = {}
    for name in jittered:
        job = CronJob.objects.get(name=name)
        assert 0 <= job.jitter_ms < 4500
        offsets[name] = job.jitter_ms
        for row in CronExecution.objects.filter(task_name=name):
            assert row.slot.timestamp() % 5 == 0, row.slot  # the slot stays the nominal time
            offset = dt.timedelta(milliseconds=job.jitter_ms)
            assert row.due_at == row.slot + offset, (row.slot, row.due_at, job.jitter_ms)
            assert row.due_at <= row.created_at < row.due_at + dt.timedelta(seconds=5), (
                name, row.slot, row.due_at, row.created_at)
            assert row.started is not None and row.started >= row.due_at
    assert len(set(offsets.values())) == 4, offsets  # spread, not all at one instant
