"""Whatever a person types into a periodic task, it stops that job at most, never another
(issue 35 item 2), fuzzed with Hypothesis against the real database.

Each example writes hostile values into one job's periodic task (and its crontab or interval row),
each field as far as PostgreSQL lets it land (a value the database refuses cannot be there), while
the steady job's periodic task gets a plain edit in the same batch. Then what a beat does runs: the
edits are taken in (``apply_edits``), the idle query, every due job planned, a restart's ``sync``.
None may raise; the steady job's edit is taken in; the victim's edit is seen (never read again on
every tick) and is either applied or stored as its ``schedule_problem``. The real beat's side is
tests/faults/test_bad_edits.py.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cron_celery import beat
from cron_celery.alerts import schedule_alerts
from cron_celery.beat import schedule_sync
from cron_celery.decisions import dispatch
from cron_celery.declaring import params
from cron_celery.models import CronJob
from cron_celery.schedules import every
from tests.admin_forms import submit

pytestmark = pytest.mark.django_db

NOW = dt.datetime(2026, 11, 29, 12, 0, 30, tzinfo=dt.UTC)
TASK = PeriodicTask._meta.db_table


def body(run: Any, *, note: str = "", limit: int = 10, day: dt.date | None = None, ratio: float = 0.5) -> None:
    """The jobs' body (declared on the fly: the sync and the beat's rounds need no Celery task)."""


@pytest.fixture
def two_jobs(declare: Any) -> tuple[int, int]:
    parameters = params.from_signature(body, skip=1, job="fuzz")
    declare("fuzz-victim", "FZ01", schedule=every(minutes=7), parameters=parameters, jitter=30)
    declare("fuzz-steady", "FZ02", schedule=every(minutes=5), parameters=parameters)
    schedule_sync.sync(NOW)
    return CronJob.objects.get(code="FZ01").id, CronJob.objects.get(code="FZ02").id


# --- what a person can type -------------------------------------------------------------------------

ANY_TEXT = st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=40)
ODD_TEXT = st.one_of(ANY_TEXT, st.sampled_from(["", "\x00", "a\x00b", "\ud800", "\udcff", "x" * 5000, "\U0001d7d8",
                                                 "\u0663", "*/0", "-1", "99999999999999999999", "1-0", "60", "L", "?"]))
EXTREME_TIMES = st.sampled_from([dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
                                 dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC),
                                 dt.datetime(9999, 12, 31, 23, 55, tzinfo=dt.UTC),
                                 dt.datetime(1, 1, 1, tzinfo=dt.UTC),
                                 dt.datetime(1, 1, 1, 0, 0, 1, tzinfo=dt.UTC), NOW, None])
TIMES = st.one_of(EXTREME_TIMES, st.datetimes(timezones=st.just(dt.UTC)))
HUGE = st.one_of(st.integers(), st.sampled_from([0, -1, 2**31 - 1, -(2**31), 2**63 - 1, 10**30, 10**4000]))
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), HUGE, st.floats(), ODD_TEXT, TIMES.map(lambda t: t.isoformat() if t else t)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ODD_TEXT, inner, max_size=3), max_leaves=6)
KWARGS = st.one_of(
    st.dictionaries(st.sampled_from(["note", "limit", "day", "ratio"]) | ODD_TEXT, JSON_VALUES, max_size=4).map(
        lambda value: json.dumps(value, default=str)),  # ensure_ascii: NULs and surrogates as \u escapes
    ODD_TEXT, st.sampled_from(["[" * 50_000, '{"note": "a\\u0000b"}', '{"note": "\\ud800"}', '{"\\u0000": 1}',
                               '{"limit": 1e999}', '{"ratio": NaN}', '{"limit": ' + "9" * 5000 + "}", "null"]))

EDITS = st.fixed_dictionaries({}, optional={
    "name": ODD_TEXT, "task": ODD_TEXT, "args": ODD_TEXT | KWARGS, "kwargs": KWARGS, "queue": ODD_TEXT,
    "exchange": ODD_TEXT, "routing_key": ODD_TEXT, "headers": ODD_TEXT | KWARGS, "description": ODD_TEXT,
    "priority": HUGE, "expire_seconds": HUGE, "one_off": st.booleans(), "enabled": st.booleans(),
    "start_time": TIMES, "expires": TIMES,
    "crontab": st.tuples(ODD_TEXT, ODD_TEXT, ODD_TEXT, ODD_TEXT, ODD_TEXT, ODD_TEXT | st.sampled_from(
        ["UTC", "Pacific/Kiritimati", "Pacific/Pago_Pago", "Mars/Olympus"])),
    "interval": st.tuples(HUGE, ODD_TEXT | st.sampled_from(["days", "hours", "minutes", "seconds", "microseconds"])),
})


def landed(statement: str, values: list[Any]) -> bool:
    """Write one value as raw SQL would (no form, no model check); False if PostgreSQL refuses it."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement, values)
        return True
    except (DatabaseError, ValueError, OverflowError):  # psycopg refuses a NUL, a surrogate, a number too big
        return False


def write_edit(task_id: int, edit: dict[str, Any]) -> list[str]:
    """Write what lands of ``edit`` to the periodic task (a crontab or interval as a new row of its
    own); the fields that did."""
    done = []
    for field, given_value in edit.items():
        value = given_value
        if field == "crontab":
            statement = (f"WITH r AS (INSERT INTO {CrontabSchedule._meta.db_table} (minute, hour, day_of_month, "
                         "month_of_year, day_of_week, timezone) VALUES (%s, %s, %s, %s, %s, %s) RETURNING id) "
                         f"UPDATE {TASK} SET crontab_id = (SELECT id FROM r), interval_id = NULL WHERE id = %s")
        elif field == "interval":
            statement = (f"WITH r AS (INSERT INTO {IntervalSchedule._meta.db_table} (every, period) VALUES (%s, %s) "
                         f"RETURNING id) UPDATE {TASK} SET interval_id = (SELECT id FROM r), crontab_id = NULL "
                         "WHERE id = %s")
        else:
            statement, value = f"UPDATE {TASK} SET {field} = %s WHERE id = %s", (value,)
        if landed(statement, [*value, task_id]):
            done.append(field)
    return done


def a_beat_goes_through_its_round(victim: int) -> None:
    """What a beat's tick runs, and what a restarted beat runs first: none of it may raise."""
    dispatch.next_due()
    later = NOW + dt.timedelta(hours=1)
    plans: dict[Any, Any] = {}
    problems: dict[int, str] = {}
    for row in dispatch.due_jobs(later, limit=100):
        beat.plan(row, later, plans, {}, problems)
    schedule_sync.sync(NOW)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(edit=EDITS, note=st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=10))
def test_no_edit_of_one_job_stops_another_or_a_beat(two_jobs, monkeypatch, edit, note):
    monkeypatch.setattr(schedule_alerts, "schedule_problem", lambda job, **kw: 1)
    victim, steady = two_jobs
    example = transaction.savepoint()
    try:
        task_id = CronJob.objects.get(id=victim).periodic_task_id
        assert task_id is not None
        write_edit(task_id, edit)
        PeriodicTask.objects.filter(cron_job__id=steady).update(kwargs=json.dumps({"note": note}))
        schedule_sync.apply_edits(NOW)  # both in one batch: the steady job's edit must be taken in
        rows = {row.id: row for row in CronJob.objects.filter(id__in=[victim, steady])}
        assert rows[steady].params == {"note": note} and rows[steady].schedule_problem == ""
        assert rows[steady].next_run_at is not None and not rows[steady].paused
        assert rows[victim].schedule_seen == rows[victim].schedule_version  # not read again every tick
        a_beat_goes_through_its_round(victim)
        assert CronJob.objects.get(id=steady).schedule_problem == ""
    finally:
        transaction.savepoint_rollback(example)


def test_a_row_postgresql_refuses_stops_its_own_job_only_and_becomes_its_problem(two_jobs, monkeypatch,
                                                                                 django_capture_on_commit_callbacks):
    """Each edit is written on its own: here a trigger of the database's own refuses the victim's new row
    (as PostgreSQL refuses a value it cannot store); the batch falls back to one row at a time."""
    said: list[tuple[str, str]] = []
    monkeypatch.setattr(schedule_alerts, "schedule_problem",
                        lambda job, **kw: said.append((kw["code"], kw["problem"])) or 1)
    victim, steady = two_jobs
    with connection.cursor() as cursor:
        cursor.execute(f"""
            CREATE FUNCTION fuzz_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'this row cannot be stored'; END $$;
            CREATE TRIGGER fuzz_refuse BEFORE UPDATE ON cron_celery_cronjob FOR EACH ROW
              WHEN (NEW.id = {victim} AND NEW.one_off) EXECUTE FUNCTION fuzz_refuse();
        """)
    PeriodicTask.objects.filter(cron_job__id=victim).update(one_off=True, kwargs='{"note": "v"}')
    PeriodicTask.objects.filter(cron_job__id=steady).update(kwargs='{"note": "s"}')
    before = CronJob.objects.get(id=victim)
    with django_capture_on_commit_callbacks(execute=True):
        assert schedule_sync.apply_edits(NOW) == 2
    after, other = CronJob.objects.get(id=victim), CronJob.objects.get(id=steady)
    assert (other.params, other.schedule_problem) == ({"note": "s"}, "")
    assert after.schedule_seen == after.schedule_version and not after.one_off and after.params is None
    assert (after.schedule, after.next_run_at, after.paused) == (before.schedule, before.next_run_at, before.paused)
    assert "the edit could not be stored: " in after.schedule_problem
    assert "this row cannot be stored" in after.schedule_problem
    assert said == [("FZ01", after.schedule_problem)]
    assert schedule_sync.apply_edits(NOW) == 0  # seen: not read again


@pytest.mark.parametrize(("start_time", "fragment"), [
    (dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC), "no slot after that before the calendar ends"),
    (dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC), "no slot after that before the calendar ends"),
])
def test_a_window_that_opens_past_the_calendars_last_slot_is_the_jobs_problem(two_jobs, start_time, fragment):
    victim, steady = two_jobs
    before = CronJob.objects.get(id=victim)
    PeriodicTask.objects.filter(cron_job__id=victim).update(start_time=start_time)
    PeriodicTask.objects.filter(cron_job__id=steady).update(kwargs='{"limit": 3}')
    schedule_sync.apply_edits(NOW)
    after = CronJob.objects.get(id=victim)
    assert fragment in after.schedule_problem and after.next_run_at == before.next_run_at
    assert CronJob.objects.get(id=steady).params == {"limit": 3}
    a_beat_goes_through_its_round(victim)


@pytest.mark.parametrize("kwargs", ['{"note": "a\\u0000b"}', '{"note": "\\udcff"}', '{"\\u0000": 1}',
                                    "[" * 50_000, '{"limit": ' + "9" * 4400 + "}"])
def test_kwargs_jsonb_cannot_hold_are_refused_in_the_admin_and_at_sync(two_jobs, admin_client, kwargs):
    victim, _steady = two_jobs
    task = PeriodicTask.objects.get(cron_job__id=victim)
    page = submit(admin_client, f"/admin/django_celery_beat/periodictask/{task.id}/change/", {"kwargs": kwargs})
    assert page.status_code == 200
    assert "cannot take these parameters" in page.content.decode() or "Unable to parse JSON" in page.content.decode()
    assert PeriodicTask.objects.get(id=task.id).kwargs == "{}"  # nothing saved
    PeriodicTask.objects.filter(id=task.id).update(kwargs=kwargs)  # past the form: the sync refuses it
    schedule_sync.apply_edits(NOW)
    row = CronJob.objects.get(id=victim)
    assert row.schedule_problem.startswith("kwargs: ") and row.params is None and not row.paused
    assert schedule_sync.recheck_params() == 0  # the same refusal is not read again and again
