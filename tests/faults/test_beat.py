"""Two real ``celery beat`` processes with the cron_celery scheduler and a real worker:
every slot is dispatched and run exactly once, with or without the leader lease."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from cron_celery.models import CronExecution, SkipReason, Status, Trigger
from tests.conftest import ROOT, marked, subprocess_env, wait_for
from tests.redis_servers import RedisServer
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

JOBS = ("tick-1s", "tick-2s")


def start_beat(tmp: Path, env: dict[str, str], index: int) -> subprocess.Popen[bytes]:
    log = open(tmp / f"beat-{index}.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.celery_app", "beat", "-S", "cron_celery.beat.Scheduler",
         "--loglevel", "INFO", "--max-interval", "1", "--pidfile", str(tmp / f"beat-{index}.pid")],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )


def run_two_beats(tmp: Path, marker: Path, seconds: float, kill_leader_after: float | None = None,
                  **extra: str) -> tuple[list[str], int]:
    lock = RedisServer(tmp).start()
    env = {"CRON_TEST_LOCK_MASTERS": lock.url, "CRON_TEST_LOCK_TTL": "5", "CRON_TEST_LEASE_SECONDS": "15",
           "CRON_TEST_MARKER": str(marker), **extra}
    worker = Worker(tmp, env, pool="prefork", concurrency=2).start()
    beats = [start_beat(tmp, subprocess_env(**env), i) for i in range(2)]
    try:
        if kill_leader_after is not None:
            time.sleep(kill_leader_after)
            leader = next(i for i in range(2) if "is now the leader" in (tmp / f"beat-{i}.log").read_text())
            import os

            os.killpg(beats[leader].pid, signal.SIGKILL)  # no goodbye: the lease must expire
            beats[leader].wait(timeout=10)
        time.sleep(seconds)
        for proc in beats:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in beats:
            proc.wait(timeout=30)
        wait_for(lambda: not CronExecution.objects.filter(task_name__in=JOBS, completed=False).exists(),
                 timeout=60, what="the worker to finish every dispatched slot")
    finally:
        for proc in beats:
            if proc.poll() is None:
                proc.kill()
        worker.stop()
        lock.stop()
    logs = [(tmp / f"beat-{i}.log").read_text(errors="replace") for i in range(2)]
    return logs, sum(1 for log in logs if "is now the leader" in log)


def assert_every_slot_once(marker: Path) -> None:
    for name, step in (("tick-1s", 1), ("tick-2s", 2)):
        rows = list(CronExecution.objects.filter(task_name=name).order_by("slot"))
        assert len(rows) >= 4, f"{name}: only {len(rows)} slots dispatched"
        slots = [row.slot for row in rows]
        assert Counter(slots).most_common(1)[0][1] == 1, f"{name}: a slot was dispatched twice"
        gaps = {(b - a).total_seconds() for a, b in itertools.pairwise(slots)}
        assert gaps == {float(step)}, f"{name}: slots missing between {slots[0]} and {slots[-1]}: {gaps}"
        assert {row.run_number for row in rows} == {1}
        ran = [row for row in rows if row.status == Status.SUCCEEDED]
        if name == "tick-1s":  # overlap "allow": every slot runs
            assert len(ran) == len(rows)
        else:  # overlap "skip": catch-up slots sent together may meet a running one
            assert all(row.status == Status.SUCCEEDED or row.skip_reason in (
                SkipReason.OVERLAP, SkipReason.LOCK_UNAVAILABLE) for row in rows)
        lines = [line for line in marked(marker) if line.startswith(f"{name} ")]
        assert len(lines) == len(ran), f"{name}: {len(lines)} bodies ran for {len(ran)} successful slots"


def test_two_beats_with_the_leader_lease_dispatch_every_slot_once(tmp_path, marker):
    logs, leaders = run_two_beats(tmp_path, marker, seconds=10)
    assert leaders == 1, logs
    assert_every_slot_once(marker)


def test_two_beats_that_both_think_they_lead_still_dispatch_every_slot_once(tmp_path, marker):
    _logs, _ = run_two_beats(tmp_path, marker, seconds=10, CRON_CELERY_BEAT_ALWAYS_LEAD="1")
    assert_every_slot_once(marker)


def test_the_standby_takes_over_when_the_leader_is_killed_and_no_slot_is_lost(tmp_path, marker):
    logs, leaders = run_two_beats(tmp_path, marker, seconds=9, kill_leader_after=4,
                                  CRON_TEST_BEAT_LEASE_SECONDS="3")
    assert leaders == 2, logs  # the first leader, then the standby after the lease expired
    assert_every_slot_once(marker)  # catch-up "all": the slots of the gap ran too
    assert CronExecution.objects.filter(task_name="tick-1s", trigger=Trigger.CATCH_UP).exists()
