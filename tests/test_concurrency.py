"""Exactly once under real concurrency: eight OS processes race for the same slot."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from cron_celery.models import CronExecution, CronJob, Status
from tests.conftest import ROOT, marked, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)

RACE = """
import sys, time
import django
django.setup()
from django.core.management import call_command
from django.core.management.base import CommandError
start = float(sys.argv[1])
# Every process is fully started (Django loaded, connection open) before the start line.
from django.db import connection
connection.ensure_connection()
while time.time() < start:
    time.sleep(0.0005)
try:
    call_command("run_cron_task", "slow-standard", "--at", "2026-11-29T01:00")
    sys.exit(0)
except CommandError as exc:
    sys.exit(exc.returncode)
"""


@pytest.mark.parametrize("sleep", ["0.5", "0"])
def test_eight_processes_running_one_standard_slot_run_the_body_once(marker, sleep):
    env = subprocess_env(CRON_TEST_SLEEP=sleep)
    start = time.time() + 4.0
    procs = [
        subprocess.Popen([sys.executable, "-c", RACE, str(start)], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    codes = [proc.wait(timeout=90) for proc in procs]
    for proc in procs:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
    rows = list(CronExecution.objects.filter(task_name="slow-standard").order_by("run_number"))
    assert len(marked(marker)) == 1, marked(marker)
    assert [row.status for row in rows].count(Status.SUCCEEDED) == 1
    assert len(rows) == 8 and {row.run_number for row in rows} == set(range(1, 9))
    assert all(row.status in (Status.SUCCEEDED, Status.SKIPPED) for row in rows)
    assert all(code in (0, 2) for code in codes), codes
    # Each claim of the job took its own fence: eight attempts, eight numbers at least; a claim the
    # one-round-trip query declined (quick_claims) and that the full claim then decided took two.
    assert 8 <= CronJob.objects.get(name="slow-standard").fence <= 16
