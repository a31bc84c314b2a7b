"""Clocks minutes off the database's change nothing: a real beat under Debian's ``faketime``
dispatches each slot when the database's clock reaches it, not when its own clock does.

``faketime`` comes from Debian's package of that name (``tests.conftest.debian_tool``
installs it when it is missing; never a skip).
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from cron_celery.decisions import jobs as job_rows
from cron_celery.models import CronExecution, CronJob, Status, Trigger
from tests.conftest import ROOT, debian_tool, subprocess_env, wait_for
from tests.faults.test_clock import FAKETIME, stop_group
from tests.jobsapp.jobs_database import db_clock_tick

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
STEP = 4  # seconds between the probe job's slots


@pytest.fixture(scope="session")
def faketime() -> str:
    return debian_tool(FAKETIME, "faketime", "the clock skew tests")


def schedule_soon(job_id: int, ahead: int) -> dt.datetime:
    """Give the job an every-STEP-seconds schedule whose next slot is the first one at least
    ``ahead`` seconds after the database's clock (slots are aligned on the epoch)."""
    CronJob.objects.filter(id=job_id).update(schedule=f"every {STEP}s", timezone="UTC", catch_up="all",
                                             paused=False)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {CronJob._meta.db_table} SET next_run_at = to_timestamp("
            " ceil((extract(epoch FROM now()) + %s) / %s) * %s) WHERE id = %s RETURNING next_run_at",
            [ahead, STEP, STEP, job_id],
        )
        row = cursor.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def start_beat(faketime: str, offset: str, tmp: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = open(tmp / "beat.log", "ab")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [faketime, "-f", offset, sys.executable, "-m", "celery", "-A", "tests.celery_app", "beat",
         "-S", "cron_celery.beat.Scheduler", "--loglevel", "INFO", "--max-interval", "1",
         "--pidfile", str(tmp / "beat.pid")],
        cwd=ROOT, env=subprocess_env(CRON_TEST_LOG_LEVEL="INFO", CRON_CELERY_BEAT_ALWAYS_LEAD="1", **env),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )


def dispatched(job_id: int) -> list[tuple[dt.datetime, dt.datetime, str, str]]:
    """(slot, created_at on the database's clock, trigger, status) of the job's rows, by slot."""
    return list(CronExecution.objects.filter(job_id=job_id).order_by("slot")
                .values_list("slot", "created_at", "trigger", "status"))


@pytest.mark.parametrize("offset", ["+300s", "-300s"])
def test_a_beat_whose_clock_is_off_dispatches_each_slot_when_the_database_says_it_is_due(
        faketime, tmp_path, queue, offset):
    """A beat five minutes fast would send the next five minutes of slots at once, early (as
    catch-up); five minutes slow it would send nothing for five minutes, then the slots late.
    Both must dispatch each slot when the database's clock reaches it."""
    job_id = job_rows.job_id(db_clock_tick.job)
    beat = start_beat(faketime, offset, tmp_path, {})
    try:
        # The beat's start-up sync clears the next slot of a job with no schedule in code: give
        # it its schedule once the beat has synced.
        wait_for(lambda: "schedules synced" in (tmp_path / "beat.log").read_text(errors="replace")
                 or beat.poll() is not None, timeout=60, what="the beat's start-up sync")
        first = schedule_soon(job_id, ahead=8)
        wait_for(lambda: len(dispatched(job_id)) >= 3 or beat.poll() is not None, timeout=90,
                 what=f"three slots dispatched by a beat whose clock is {offset} off")
    finally:
        stop_group(beat)
    rows = dispatched(job_id)
    assert len(rows) >= 3, (tmp_path / "beat.log").read_text(errors="replace")[-3000:]
    early = [(slot.isoformat(), created.isoformat()) for slot, created, _, _ in rows if created < slot]
    assert not early, f"dispatched before the database's clock reached the slot: {early[:5]} ({len(early)} rows)"
    assert rows[0][0] == first, f"the first slot dispatched is {rows[0][0]}, not {first}"
    assert {trigger for _, _, trigger, _ in rows} == {Trigger.BEAT}, rows
    assert {status for _, _, _, status in rows} == {Status.PENDING}, rows  # no worker: nothing MISSED either
    late = [(slot.isoformat(), created.isoformat()) for slot, created, _, _ in rows
            if created - slot > dt.timedelta(seconds=60)]
    assert not late, f"dispatched minutes after the slot: {late}"
