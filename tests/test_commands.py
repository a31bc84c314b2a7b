"""``run_cron_task`` and ``list_cron_tasks`` as a person runs them: real processes, exit codes."""

from __future__ import annotations

import datetime as dt

import pytest

from cron_celery.models import CronExecution, CronJob, SkipReason, Status, Trigger
from tests.conftest import ROOT, manage, marked, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)


def test_run_for_a_date_succeeds_then_skips_as_already_done(marker):
    first = manage("run_cron_task", "calc-commission", "2026-11-29", env=subprocess_env())
    assert first.returncode == 0, first.stderr
    assert "succeeded" in first.stdout and "Processed 120 records" in first.stdout
    row = CronExecution.objects.get(task_name="calc-commission")
    assert (row.status, row.trigger, row.slot) == (Status.SUCCEEDED, Trigger.MANUAL,
                                                   dt.datetime(2026, 11, 29, tzinfo=dt.UTC))
    again = manage("run_cron_task", "calc-commission", "2026-11-29", env=subprocess_env())
    assert again.returncode == 0 and "already ran" in again.stdout
    assert len(marked(marker)) == 1
    assert CronExecution.objects.filter(task_name="calc-commission", status=Status.SKIPPED).count() == 1


def test_at_runs_an_exact_slot_and_rerun_runs_it_again(marker):
    assert manage("run_cron_task", "calc-commission", "--at", "2026-11-29T01:00").returncode == 0
    rerun = manage("run_cron_task", "calc-commission", "--at", "2026-11-29T01:00", "--rerun")
    assert rerun.returncode == 0 and "run #2" in rerun.stdout
    rows = CronExecution.objects.filter(slot=dt.datetime(2026, 11, 29, 1, tzinfo=dt.UTC)).order_by("run_number")
    assert [(r.run_number, r.status, r.forced) for r in rows] == [
        (1, Status.SUCCEEDED, False), (2, Status.SUCCEEDED, True)]
    assert len(marked(marker)) == 2


def test_force_runs_a_paused_job_and_without_it_the_job_is_refused(marker):
    assert manage("run_cron_task", "calc-commission", "2026-11-28").returncode == 0
    CronJob.objects.filter(name="calc-commission").update(paused=True)
    refused = manage("run_cron_task", "calc-commission", "2026-11-27")
    assert refused.returncode == 2 and "paused" in refused.stderr
    forced = manage("run_cron_task", "calc-commission", "2026-11-27", "--force")
    assert forced.returncode == 0, forced.stderr
    assert len(marked(marker)) == 2


def test_a_failure_exits_1_with_one_line_and_no_traceback():
    result = manage("run_cron_task", "sync-external-api", "2026-11-29",
                    env=subprocess_env(CRON_TEST_SYNC_FAILS="1"))
    assert result.returncode == 1
    assert "partner API returned 503" in result.stderr and "Traceback" not in result.stderr
    row = CronExecution.objects.get(task_name="sync-external-api")
    assert (row.status, row.error_code) == (Status.FAILED, "HTTP_503")
    # RERUN_ON_FAILURE: the same slot runs again and can succeed now
    assert manage("run_cron_task", "sync-external-api", "2026-11-29").returncode == 0
    assert CronExecution.objects.filter(task_name="sync-external-api", status=Status.SUCCEEDED).count() == 1


def test_a_failure_is_printed_once_in_a_project_without_logging_settings(tmp_path):
    """A new project names no handler for cron_celery's records. Before, Python's last resort
    printed the run's outcome to stderr and the command's error said it again."""
    (tmp_path / "bare_settings.py").write_text(
        "from tests.settings import *  # noqa: F403\n"
        "LOGGING = {'version': 1, 'disable_existing_loggers': False}\n", encoding="utf-8")
    env = subprocess_env(CRON_TEST_SYNC_FAILS="1", DJANGO_SETTINGS_MODULE="bare_settings",
                         PYTHONPATH=f"{tmp_path}:{ROOT}")
    result = manage("run_cron_task", "sync-external-api", "2026-11-29", env=env)
    assert result.returncode == 1
    said = result.stdout + result.stderr
    assert said.count("partner API returned 503") == 1, said
    assert "sync-external-api 2026-11-29T00:00:00Z failed" in result.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("no-such-job", "2026-11-29"), "Unknown job 'no-such-job'"),
        (("calc-commission", "2026-13-45"), "Cannot read '2026-13-45'"),
        (("calc-commission", "--at", "tomorrow-ish"), "Cannot read 'tomorrow-ish'"),
        (("calc-commission", "2026-11-28", "--at", "2026-11-29T01:00"), "not on 2026-11-28"),
    ],
)
def test_bad_input_exits_1_with_a_clear_message_and_changes_nothing(args, fragment):
    result = manage("run_cron_task", *args)
    assert result.returncode == 1
    assert fragment in result.stderr and "Traceback" not in result.stderr
    assert not CronExecution.objects.exists()


def test_a_job_already_running_is_refused_with_exit_code_2():
    # A live run of another slot holds the job (overlap SKIP is the default).
    assert manage("run_cron_task", "calc-commission", "2026-11-29").returncode == 0
    CronExecution.objects.update(status=Status.RUNNING, lease_until=dt.datetime(2999, 1, 1, tzinfo=dt.UTC))
    result = manage("run_cron_task", "calc-commission", "2026-11-30")
    assert result.returncode == 2 and "another execution of this job is running" in result.stderr
    assert CronExecution.objects.get(slot__date=dt.date(2026, 11, 30)).skip_reason == SkipReason.OVERLAP


def test_list_cron_tasks_shows_policies_and_the_last_execution():
    manage("run_cron_task", "calc-commission", "2026-11-29")
    result = manage("list_cron_tasks")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "CODE", "SCHEDULE", "PATTERN", "OVERLAP", "TIMEZONE", "NEXT", "SLOT",
                                "LATEST", "SLOT", "ITS", "OUTCOME"]
    row = next(line for line in lines if line.startswith("calc-commission"))
    assert row.split()[1:7] == ["A001", "-", "rerun_on_failure", "skip", "UTC", "-"]
    assert row.split()[-1] == "SUCCEEDED"
    assert next(line for line in lines if line.startswith("boom")).endswith("never run")
    nightly = next(line for line in lines if line.startswith("nightly-report")).split()
    assert nightly[2:7] == ["0", "2", "*", "*", "*"] and nightly[9] == "Europe/Amsterdam"


def listed(name: str) -> str:
    result = manage("list_cron_tasks")
    assert result.returncode == 0, result.stderr
    return next(line for line in result.stdout.splitlines() if line.startswith(name + " "))


def test_list_cron_tasks_shows_the_latest_slots_outcome_not_the_last_row_written():
    """Before: after a backfill of 11-29 the listing said LAST SLOT 11-29 although 12-01 had run,
    and one enqueue of an old date that the broker refused turned LAST STATUS to FAILED."""
    assert manage("run_cron_task", "calc-commission", "2026-12-01").returncode == 0
    assert manage("run_cron_task", "calc-commission", "2026-11-29").returncode == 0  # a backfill, written later
    refused = manage("run_cron_task", "calc-commission", "2026-11-20", "--enqueue",
                     env=subprocess_env(REDIS_URL="redis://127.0.0.1:1/0"))
    assert refused.returncode == 1  # a FAILED row of an older slot, written last
    again = manage("run_cron_task", "calc-commission", "2026-12-01")  # a skip of the latest slot, run_number 2
    assert again.returncode == 0 and "recorded as a skip" in again.stdout and "run #2" not in again.stdout
    resent = manage("run_cron_task", "calc-commission", "2026-12-01", "--enqueue", "--rerun",
                    env=subprocess_env(REDIS_URL="redis://127.0.0.1:1/0"))
    assert resent.returncode == 1  # a re-run of the latest slot the broker refused: it never ran
    assert listed("calc-commission").split()[-3:] == ["2026-12-01", "00:00Z", "SUCCEEDED"]

    CronJob.objects.filter(name="calc-commission").update(paused=True)
    assert manage("run_cron_task", "calc-commission", "2026-12-02").returncode == 2  # refused: a skip only
    assert listed("calc-commission").endswith("2026-12-02 00:00Z  SKIPPED (job paused)")


def test_the_history_shows_a_skip_as_a_skip_not_as_a_second_run(admin_client):
    assert manage("run_cron_task", "calc-commission", "2026-12-01").returncode == 0
    assert manage("run_cron_task", "calc-commission", "2026-12-01").returncode == 0
    skip = CronExecution.objects.get(task_name="calc-commission", status=Status.SKIPPED)
    assert skip.run_number == 2  # the data keeps its number
    page = admin_client.get(f"/admin/cron_celery/cronexecution/?job={skip.job_id}").content.decode()
    cells = [row.split("</tr>")[0] for row in page.split('<tr')[2:]]
    skipped = next(row for row in cells if "skipped" in row)
    ran = next(row for row in cells if "succeeded" in row)
    assert ">skip<" in skipped and ">#2<" not in skipped and ">—<" in skipped
    assert ">#1<" in ran


def test_a_date_runs_the_scheduled_slot_of_that_day_in_the_jobs_timezone():
    result = manage("run_cron_task", "nightly-report", "2026-11-29")
    assert result.returncode == 0, result.stderr
    row = CronExecution.objects.get(task_name="nightly-report")
    # 02:00 in Amsterdam (CET, UTC+1) is 01:00 UTC; the execution date is the local date.
    assert (row.slot, row.execution_date) == (dt.datetime(2026, 11, 29, 1, tzinfo=dt.UTC), dt.date(2026, 11, 29))
    assert row.message == "report for 2026-11-29 at 01:00Z"


def test_an_enqueue_that_cannot_reach_the_broker_fails_cleanly_and_frees_the_slot():
    env = subprocess_env(REDIS_URL="redis://127.0.0.1:1/0")
    result = manage("run_cron_task", "calc-commission", "2026-11-29", "--enqueue", env=env)
    assert result.returncode == 1
    assert "could not be sent to the broker" in result.stderr and "Traceback" not in result.stderr
    row = CronExecution.objects.get(task_name="calc-commission")
    assert (row.status, row.error_code, row.completed) == (Status.FAILED, "PUBLISH_FAILED", True)
    # calc-commission reruns on failure: the slot is not blocked by the abandoned row.
    assert manage("run_cron_task", "calc-commission", "2026-11-29").returncode == 0


def test_list_cron_tasks_shows_the_jobs_a_job_runs_after_as_its_schedule():
    result = manage("list_cron_tasks", env=subprocess_env(CRON_TEST_DEPS="paused"))
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("fan-in ")]
    assert "after fan-a, fan-b" in line, line
