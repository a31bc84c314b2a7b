"""A catch-up window on real processes: two beats (the leader lease) and a worker find an hourly
catch-up ``all`` job whose next slot was due three days ago, as after a beat down that long. The
job's six-hour window lets six hours of slots run, late, once each; every older slot is recorded
``MISSED``, none is sent."""

from __future__ import annotations

import datetime as dt
import itertools
from collections import Counter
from pathlib import Path

import pytest

from cron_celery.decisions import leadership
from cron_celery.models import CronExecution, CronJob, Status
from tests.conftest import manage, marked, subprocess_env, wait_for
from tests.faults.test_beat import beat_log, start_beat, stop
from tests.redis_servers import RedisServer
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WINDOW = dt.timedelta(hours=6)


def test_a_beat_down_three_days_sends_six_hours_of_an_all_job_with_a_six_hour_window(tmp_path: Path, marker: Path):
    lock = RedisServer(tmp_path).start()
    env = {"CRON_TEST_LOCK_MASTERS": lock.url, "CRON_TEST_MARKER": str(marker)}
    worker: Worker | None = None
    beats = []
    try:
        synced = manage("sync_cron_schedules", env=subprocess_env(**env))
        assert synced.returncode == 0, synced.stderr
        down_since = (leadership.database_now() - dt.timedelta(days=3)).replace(minute=0, second=0, microsecond=0)
        assert CronJob.objects.filter(code="W012").update(next_run_at=down_since) == 1
        worker = Worker(tmp_path, env, pool="prefork", concurrency=2).start()
        beats = [start_beat(tmp_path, env, index) for index in (0, 1)]
        wait_for(lambda: CronJob.objects.get(code="W012").next_run_at > leadership.database_now(), timeout=90,
                 what="the beats to decide the three days of slots")
        wait_for(lambda: not CronExecution.objects.filter(task_code="W012", completed=False).exists(), timeout=90,
                 what="the worker to run the slots sent")
    finally:
        for beat in beats:
            stop(beat)
        if worker is not None:
            worker.stop()
        lock.stop()
    rows = list(CronExecution.objects.filter(task_code="W012").order_by("slot"))
    missed = [row for row in rows if row.status == Status.MISSED]
    ran = [row for row in rows if row.status == Status.SUCCEEDED]
    assert len(missed) + len(ran) == len(rows), Counter(row.status for row in rows)
    # Every hourly slot from three days ago to the round that decided them, each once.
    assert rows[0].slot == down_since and len({row.slot for row in rows}) == len(rows)
    assert {b.slot - a.slot for a, b in itertools.pairwise(rows)} == {dt.timedelta(hours=1)}
    assert 6 <= len(ran) <= 7 and len(missed) >= 3 * 24 - 7, f"{len(ran)} slots ran, {len(missed)} MISSED"
    decided = min(row.created_at for row in rows)  # the round's transaction (one round decides them all)
    assert max(row.created_at for row in missed) - decided < dt.timedelta(seconds=5)
    horizon = decided - WINDOW
    assert all(row.slot < horizon + dt.timedelta(seconds=5) for row in missed), [r.slot for r in missed[-3:]]
    assert all(row.slot >= horizon - dt.timedelta(seconds=5) for row in ran), [r.slot for r in ran[:3]]
    assert all(row.message == "Missed: the scheduler did not dispatch this slot in time." for row in missed)
    # The bodies ran once each, for the slots inside the window only.
    assert Counter(line.split()[1] for line in marked(marker) if line.startswith("hourly-window ")) == {
        row.slot.isoformat(): 1 for row in ran}
    logs = beat_log(tmp_path, 0) + beat_log(tmp_path, 1)
    assert f"cron job hourly-window: {len(missed)} slot(s) recorded MISSED" in logs, logs[-3000:]
    assert "older than its catch_up_window, 21600 s" in logs
