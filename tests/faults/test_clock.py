"""One clock: the reconciler decides what is late by the database's clock, never by the clock
of the machine it runs on. The pass runs in a real child process (``manage.py reconcile_cron``)
whose clock Debian's ``faketime`` moves minutes away from the database's.

``faketime`` comes from Debian's package of that name; the session fixture installs it when it
is missing, and fails — never skips — when it cannot.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from django.db import connection

from cron_celery.decisions import jobs as job_rows
from cron_celery.models import CronExecution, CronJob, Status
from tests.conftest import ROOT, db_now, debian_tool, subprocess_env, wait_for
from tests.jobsapp.jobs_leader import clock_probe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
FAKETIME = "/usr/bin/faketime"
GRACE = 300  # RECONCILE["MISSED_GRACE"] of the child process


@pytest.fixture(scope="session")
def faketime() -> str:
    return debian_tool(FAKETIME, "faketime", "the clock tests")


def under_clock(faketime: str, offset: str, *command: str) -> str:
    """Run ``python command`` in a child process whose clock is ``offset`` away (``+10m``)."""
    result = subprocess.run([faketime, "-f", offset, sys.executable, *command], cwd=ROOT,
                            env=subprocess_env(CRON_TEST_MISSED_GRACE=str(GRACE)),
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the whole process group (faketime runs the command as its child), then
    SIGKILL to whatever is left after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def scheduled_from(job_id: int, minutes_ago: int) -> dt.datetime:
    """Give the job an every-minute schedule whose first undispatched slot is the minute
    ``minutes_ago`` minutes before the database's clock."""
    CronJob.objects.filter(id=job_id).update(schedule="every 60s", timezone="UTC", catch_up="none", paused=False)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {CronJob._meta.db_table} SET next_run_at = date_trunc('minute', now())"
            " - make_interval(mins => %s) WHERE id = %s RETURNING next_run_at",
            [minutes_ago, job_id],
        )
        row = cursor.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def test_the_reconciler_judges_missed_slots_by_the_database_clock_not_the_workers(faketime):
    job_id = job_rows.job_id(clock_probe.job)
    ahead = float(under_clock(faketime, "+10m", "-c", "import time; print(time.time())"))
    assert ahead - db_now().timestamp() > 590, "faketime did not move the child's clock"

    # Due one to two minutes ago by the database: within the 300 s grace, nothing is missed yet,
    # although the child's clock, ten minutes fast, sees it twelve minutes late.
    due = scheduled_from(job_id, 1)
    out = under_clock(faketime, "+10m", "-m", "django", "reconcile_cron")
    assert "Reconciled" in out, out
    recorded = list(CronExecution.objects.filter(job_id=job_id).values_list("slot", "status"))
    assert recorded == [], f"recorded early by a fast worker clock: {recorded}"
    assert CronJob.objects.get(id=job_id).next_run_at == due

    # Ten minutes late by the database: a child whose clock is ten minutes slow (to which the
    # slot is not even due yet) records the slots that are more than the grace late, and none after.
    scheduled_from(job_id, 10)
    under_clock(faketime, "-10m", "-m", "django", "reconcile_cron")
    cutoff = db_now() - dt.timedelta(seconds=GRACE)
    missed = list(CronExecution.objects.filter(job_id=job_id).order_by("slot"))
    assert missed, "a slow worker clock hid slots the database clock says are missed"
    assert {row.status for row in missed} == {Status.MISSED}
    assert all(row.slot <= cutoff for row in missed), [row.slot for row in missed]


def test_a_beat_whose_clock_is_off_says_so(faketime, tmp_path):
    """A beat dispatches by the database's clock (tests/faults/test_skew.py), but a machine whose
    clock is off the database's still needs fixing (retry countdowns read it): the beat says so
    in its log."""
    log_path = tmp_path / "beat.log"
    with open(log_path, "ab") as log:
        beat = subprocess.Popen(
            [faketime, "-f", "+10m", sys.executable, "-m", "celery", "-A", "tests.celery_app", "beat",
             "-S", "cron_celery.beat.Scheduler", "--loglevel", "INFO", "--max-interval", "1",
             "--pidfile", str(tmp_path / "beat.pid")],
            cwd=ROOT, env=subprocess_env(CRON_TEST_LOG_LEVEL="INFO"), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: "off the database's" in log_path.read_text(errors="replace") or beat.poll() is not None,
                 timeout=60, what="the beat's clock warning")
    finally:
        stop_group(beat)
    text = log_path.read_text(errors="replace")
    found = re.search(r"this machine's clock is ([+-][\d.]+) s off the database's", text)
    assert found, text[-3000:]
    assert 590 < float(found.group(1)) < 610
