"""Schedules: builders, canonical cron strings, human sentences, and DST-correct slots."""

from __future__ import annotations

import datetime as dt
import itertools
import zoneinfo

import pytest
from celery.schedules import crontab

from cron_celery import exceptions
from cron_celery.schedules import (
    Cron,
    Interval,
    at,
    at24,
    cron,
    daily,
    every,
    from_celery,
    monthly,
    slots_between,
    weekly,
)

pytestmark = pytest.mark.pure  # needs neither PostgreSQL nor Redis

UTC = dt.UTC


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> dt.datetime:
    return dt.datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def hhmm(slots: list[dt.datetime]) -> list[str]:
    return [s.strftime("%m-%d %H:%M") for s in slots]


# --- builders -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("schedule", "expression", "sentence"),
    [
        (daily(at(3).pm()), "0 15 * * *", "daily at 3:00 PM (UTC)"),
        (daily(at24(15)), "0 15 * * *", "daily at 3:00 PM (UTC)"),
        (daily(at(12).am(), timezone="Europe/Amsterdam"), "0 0 * * *", "daily at 12:00 AM (Europe/Amsterdam)"),
        (daily(at(12, 30).pm()), "30 12 * * *", "daily at 12:30 PM (UTC)"),
        (weekly("mon", at(9).am()), "0 9 * * mon", "weekly on Mon at 9:00 AM (UTC)"),
        (weekly("Mon,thu", at24(18, 5)), "5 18 * * mon,thu", "weekly on Mon, Thu at 6:05 PM (UTC)"),
        (monthly(1, at24(6, 30)), "30 6 1 * *", "monthly on day 1 at 6:30 AM (UTC)"),
    ],
)
def test_builders_normalise_to_cron_and_read_as_a_sentence(schedule, expression, sentence):
    assert schedule.expression == expression and str(schedule) == sentence


def test_intervals_read_as_a_sentence():
    assert [str(every(minutes=15)), str(every(seconds=10)), str(every(hours=1)), str(every(seconds=90))] == [
        "every 15 minutes", "every 10 seconds", "every hour", "every 90 seconds"]


def test_a_twelve_hour_time_without_am_or_pm_is_refused():
    with pytest.raises(TypeError, match=r"at\(3\).am\(\) or at\(3\).pm\(\)"):
        daily(at(3))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="twelve-hour"):
        at(15)
    with pytest.raises(ValueError, match="no such time"):
        at24(24)


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: cron("61 * * * *"), "minute '61'"),
        (lambda: cron("* * *"), "five fields"),
        (lambda: cron("0 0 31 2 *"), "never fires"),
        (lambda: Cron("0", "0", timezone="Mars/Base"), "unknown timezone"),
        (lambda: Interval(0), "seconds >= 1"),
        (lambda: weekly("someday", at24(1)), "day names"),
    ],
)
def test_invalid_schedules_say_what_is_wrong(build, fragment):
    with pytest.raises((exceptions.InvalidSchedule, ValueError), match=fragment):
        schedule = build()
        schedule.next_after(utc(2026, 1, 1))


@pytest.mark.parametrize("on", ["mon-fri", "monkey", "mon,frid", "", "mon,,thu", "thur"])
def test_weekly_refuses_what_is_not_a_day_name_instead_of_reading_its_first_three_letters(on):
    """'mon-fri' once became Monday alone, silently: a part is a day's three letters or its name."""
    with pytest.raises(ValueError, match="day names") as refused:
        weekly(on, at(9).am())
    assert "cron(" in str(refused.value)  # ranges: where to go instead


def test_weekly_takes_full_day_names_in_any_case():
    assert weekly("Monday, THURSDAY", at24(9)).expression == "0 9 * * mon,thu"


def test_celery_crontab_and_timedelta_are_accepted():
    assert from_celery(crontab(minute=0, hour=1), "Europe/Amsterdam") == Cron("0", "1", timezone="Europe/Amsterdam")
    assert from_celery(dt.timedelta(minutes=5)) == Interval(300)
    assert from_celery("*/5 * * * *").expression == "*/5 * * * *"


def test_day_of_week_follows_cron_numbering():
    mondays = slots_between(cron("0 9 * * 1"), utc(2026, 11, 29), utc(2026, 12, 31))
    assert {s.weekday() for s in mondays} == {0} and len(mondays) == 5


def test_intervals_are_aligned_to_the_epoch_whatever_the_starting_point():
    schedule = every(minutes=15)
    assert schedule.next_after(utc(2026, 11, 29, 10, 7, 31)) == utc(2026, 11, 29, 10, 15)
    assert schedule.next_after(utc(2026, 11, 29, 10, 15)) == utc(2026, 11, 29, 10, 30)
    assert every(seconds=7).next_after(dt.datetime.fromtimestamp(700, UTC)) == dt.datetime.fromtimestamp(707, UTC)


# --- DST: three zones, both transitions, daily / hourly / every 15 minutes ------------------

AMS, NYC, LHI = "Europe/Amsterdam", "America/New_York", "Australia/Lord_Howe"


@pytest.mark.parametrize(
    ("zone", "expression", "after", "until", "expected"),
    [
        # Amsterdam, spring forward 2026-03-29 02:00 CET -> 03:00 CEST (01:00 UTC)
        (AMS, "30 2 * * *", utc(2026, 3, 27, 12), utc(2026, 3, 31),
         ["03-28 01:30", "03-29 01:00", "03-30 00:30"]),  # 02:30 does not exist: fires at 03:00
        (AMS, "0 * * * *", utc(2026, 3, 28, 23, 30), utc(2026, 3, 29, 2, 30),
         ["03-29 00:00", "03-29 01:00", "03-29 02:00"]),
        (AMS, "*/15 * * * *", utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1, 30),
         ["03-29 00:45", "03-29 01:00", "03-29 01:15", "03-29 01:30"]),
        # Amsterdam, fall back 2026-10-25 03:00 CEST -> 02:00 CET (01:00 UTC)
        (AMS, "30 2 * * *", utc(2026, 10, 23, 12), utc(2026, 10, 27),
         ["10-24 00:30", "10-25 00:30", "10-26 01:30"]),  # 02:30 twice: only the first
        (AMS, "0 * * * *", utc(2026, 10, 24, 22, 30), utc(2026, 10, 25, 2, 30),
         ["10-24 23:00", "10-25 00:00", "10-25 02:00"]),  # the repeated 02:00 does not fire again
        (AMS, "*/15 * * * *", utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 2, 0),
         ["10-25 00:45", "10-25 02:00"]),  # 02:00-02:45 CET already fired as CEST
        # New York, spring forward 2026-03-08 02:00 EST -> 03:00 EDT (07:00 UTC)
        (NYC, "30 2 * * *", utc(2026, 3, 7), utc(2026, 3, 10),
         ["03-07 07:30", "03-08 07:00", "03-09 06:30"]),
        (NYC, "0 * * * *", utc(2026, 3, 8, 5, 30), utc(2026, 3, 8, 8, 30),
         ["03-08 06:00", "03-08 07:00", "03-08 08:00"]),
        (NYC, "*/15 * * * *", utc(2026, 3, 8, 6, 30), utc(2026, 3, 8, 7, 30),
         ["03-08 06:45", "03-08 07:00", "03-08 07:15", "03-08 07:30"]),
        # New York, fall back 2026-11-01 02:00 EDT -> 01:00 EST (06:00 UTC)
        (NYC, "30 1 * * *", utc(2026, 10, 31), utc(2026, 11, 3),
         ["10-31 05:30", "11-01 05:30", "11-02 06:30"]),
        (NYC, "0 * * * *", utc(2026, 11, 1, 4, 30), utc(2026, 11, 1, 7, 30),
         ["11-01 05:00", "11-01 07:00"]),
        (NYC, "*/15 * * * *", utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 7, 0),
         ["11-01 05:45", "11-01 07:00"]),  # 01:00-01:45 EST already fired as EDT
        # Lord Howe (half-hour shift), spring forward 2026-10-04 02:00 -> 02:30 (15:30 UTC, 10-03)
        (LHI, "15 2 * * *", utc(2026, 10, 1), utc(2026, 10, 5, 12),
         ["10-01 15:45", "10-02 15:45", "10-03 15:30", "10-04 15:15"]),
        (LHI, "0 * * * *", utc(2026, 10, 3, 13), utc(2026, 10, 3, 17),
         ["10-03 13:30", "10-03 14:30", "10-03 15:30", "10-03 16:00", "10-03 17:00"]),
        (LHI, "*/15 * * * *", utc(2026, 10, 3, 15), utc(2026, 10, 3, 16),
         ["10-03 15:15", "10-03 15:30", "10-03 15:45", "10-03 16:00"]),
        # Lord Howe, fall back 2026-04-05 02:00 LHDT -> 01:30 LHST (15:00 UTC, 04-04)
        (LHI, "45 1 * * *", utc(2026, 4, 3), utc(2026, 4, 6, 12),
         ["04-03 14:45", "04-04 14:45", "04-05 15:15"]),
        (LHI, "0 * * * *", utc(2026, 4, 4, 12), utc(2026, 4, 4, 17),
         ["04-04 13:00", "04-04 14:00", "04-04 15:30", "04-04 16:30"]),
        (LHI, "*/15 * * * *", utc(2026, 4, 4, 14), utc(2026, 4, 4, 15, 45),
         ["04-04 14:15", "04-04 14:30", "04-04 14:45", "04-04 15:30", "04-04 15:45"]),
    ],
)
def test_dst_transitions_fire_each_wall_clock_time_once(zone, expression, after, until, expected):
    slots = slots_between(cron(expression, timezone=zone), after, until)
    assert hhmm(slots) == expected
    assert slots == sorted(set(slots))
    tz = zoneinfo.ZoneInfo(zone)
    walls = [s.astimezone(tz).replace(tzinfo=None) for s in slots]
    assert len(walls) == len(set(walls))


def test_a_whole_year_of_every_fifteen_minutes_has_no_duplicates_or_holes_outside_dst():
    schedule = cron("*/15 * * * *", timezone=AMS)
    slots = slots_between(schedule, utc(2026, 1, 1), utc(2027, 1, 1))
    gaps = {b - a for a, b in itertools.pairwise(slots)}
    # 15 minutes, except over the spring gap (exactly 15 min too: 01:45 CET -> 03:00 CEST)
    # and the fall-back hour (one hour and a quarter of silence).
    assert gaps == {dt.timedelta(minutes=15), dt.timedelta(minutes=75)}
    assert len(slots) == 365 * 96 - 4


# --- catch-up ---------------------------------------------------------------------------

from cron_celery.catch_up import plan_catch_up  # noqa: E402

HOURLY = cron("0 * * * *")


def test_an_on_time_slot_runs_under_every_policy():
    for policy in ("none", "latest", "all"):
        plan = plan_catch_up(HOURLY, utc(2026, 11, 29, 10), utc(2026, 11, 29, 10, 0, 2), policy)
        assert plan.run == [utc(2026, 11, 29, 10)] and plan.missed == []
        assert plan.next_run_at == utc(2026, 11, 29, 11)


def test_nothing_due_changes_nothing():
    plan = plan_catch_up(HOURLY, utc(2026, 11, 29, 11), utc(2026, 11, 29, 10, 30), "latest")
    assert (plan.run, plan.missed, plan.next_run_at) == ([], [], utc(2026, 11, 29, 11))


@pytest.mark.parametrize(
    ("policy", "run", "missed"),
    [
        ("none", [], ["06:00", "07:00", "08:00", "09:00", "10:00"]),
        ("latest", ["10:00"], ["06:00", "07:00", "08:00", "09:00"]),
        ("all", ["06:00", "07:00", "08:00", "09:00", "10:00"], []),
    ],
)
def test_after_five_hours_down_each_policy_runs_and_misses_what_it_should(policy, run, missed):
    plan = plan_catch_up(HOURLY, utc(2026, 11, 29, 6), utc(2026, 11, 29, 10, 20), policy)
    assert [s.strftime("%H:%M") for s in plan.run] == run
    assert [s.strftime("%H:%M") for s in plan.missed] == missed
    assert plan.next_run_at == utc(2026, 11, 29, 11) and not plan.truncated


def test_none_still_runs_the_current_slot_after_downtime_if_it_is_on_time():
    plan = plan_catch_up(HOURLY, utc(2026, 11, 29, 6), utc(2026, 11, 29, 10, 0, 30), "none")
    assert plan.run == [utc(2026, 11, 29, 10)] and len(plan.missed) == 4


def test_all_is_bounded_per_cycle_and_continues_next_cycle():
    minutely = every(minutes=1)
    start, now = utc(2026, 11, 29, 0), utc(2026, 11, 29, 1, 0, 30)  # 61 slots due
    first = plan_catch_up(minutely, start, now, "all", limit=25)
    assert len(first.run) == 25 and first.truncated and first.next_run_at == utc(2026, 11, 29, 0, 25)
    second = plan_catch_up(minutely, first.next_run_at, now, "all", limit=25)
    third = plan_catch_up(minutely, second.next_run_at, now, "all", limit=25)
    assert len(second.run) == 25 and len(third.run) == 11 and not third.truncated
    assert first.run + second.run + third.run == slots_between(minutely, start - dt.timedelta(seconds=1), now)


def test_every_slot_all_runs_late_is_a_catch_up_the_last_of_a_long_drain_and_the_newest_too():
    """``late`` marks the plan's slots CATCH_UP (buffered behind the live run): several overdue slots,
    a single overdue slot, but not a slot dispatched on time."""
    minutely = every(minutes=1)
    start, now = utc(2026, 11, 29, 0), utc(2026, 11, 29, 0, 25, 30)  # 26 slots due
    first = plan_catch_up(minutely, start, now, "all", limit=25)
    last = plan_catch_up(minutely, first.next_run_at, now, "all", limit=25)
    assert first.late and len(last.run) == 1 and not last.late  # the newest, on time
    overdue = plan_catch_up(HOURLY, utc(2026, 11, 29, 6), utc(2026, 11, 29, 6, 30), "all")
    assert overdue.run == [utc(2026, 11, 29, 6)] and overdue.late
    on_time = plan_catch_up(minutely, utc(2026, 11, 29, 0, 25), now, "all")
    assert on_time.run == [utc(2026, 11, 29, 0, 25)] and not on_time.late
    assert not plan_catch_up(HOURLY, utc(2026, 11, 29, 6), utc(2026, 11, 29, 10, 20), "latest").late


@pytest.mark.parametrize("schedule", [every(minutes=1), cron("* * * * *")], ids=["interval", "cron"])
def test_latest_after_a_long_outage_runs_the_newest_slot_and_records_only_the_newest_misses(schedule):
    plan = plan_catch_up(schedule, utc(2026, 11, 29, 0), utc(2026, 11, 29, 2, 0, 10), "latest", limit=10)
    assert plan.run == [utc(2026, 11, 29, 2)]
    assert plan.missed == [utc(2026, 11, 29, 1, 51) + dt.timedelta(minutes=i) for i in range(9)]
    assert plan.unrecorded_before == utc(2026, 11, 29, 1, 51)
    assert plan.next_run_at == utc(2026, 11, 29, 2, 1)


@pytest.mark.parametrize("policy", ["none", "latest"])
@pytest.mark.parametrize("schedule", [every(seconds=1), cron("* * * * *")], ids=["1s", "cron"])
def test_a_week_down_writes_at_most_limit_rows(schedule, policy):
    down_since = utc(2026, 11, 22, 0)
    now = utc(2026, 11, 29, 0) + dt.timedelta(milliseconds=500)
    plan = plan_catch_up(schedule, down_since, now, policy, limit=1000)
    assert len(plan.run) + len(plan.missed) == 1000
    assert plan.unrecorded_before is not None and plan.unrecorded_before > down_since
    recorded = plan.missed + plan.run
    assert recorded == sorted(recorded) and recorded[-1] == utc(2026, 11, 29, 0)
    assert plan.next_run_at == schedule.next_after(utc(2026, 11, 29, 0))


def test_an_outage_just_over_the_limit_keeps_the_record_contiguous():
    plan = plan_catch_up(every(minutes=1), utc(2026, 11, 29, 0), utc(2026, 11, 29, 0, 12), "latest", limit=10)
    assert plan.missed + plan.run == [utc(2026, 11, 29, 0, 3) + dt.timedelta(minutes=i) for i in range(10)]
    assert plan.unrecorded_before == utc(2026, 11, 29, 0, 3)


# --- catch-up within a window ---------------------------------------------------------------

SIX_HOURS = dt.timedelta(hours=6)


@pytest.mark.parametrize(
    ("policy", "run", "missed"),
    [
        ("latest", ["10:00"], ["06:00", "07:00", "08:00", "09:00"]),
        ("all", ["08:00", "09:00", "10:00"], ["06:00", "07:00"]),
    ],
)
def test_slots_older_than_the_catch_up_window_are_missed_whatever_the_policy(policy, run, missed):
    window = dt.timedelta(hours=2, minutes=30)  # 10:20 - 2:30 = 07:50: 06:00 and 07:00 fell out
    plan = plan_catch_up(HOURLY, utc(2026, 11, 29, 6), utc(2026, 11, 29, 10, 20), policy, window=window)
    assert [s.strftime("%H:%M") for s in plan.run] == run
    assert [s.strftime("%H:%M") for s in plan.missed] == missed
    assert plan.next_run_at == utc(2026, 11, 29, 11) and not plan.truncated and plan.unrecorded_before is None


def test_three_days_down_with_all_and_a_six_hour_window_sends_six_hours_of_slots():
    down_since, now = utc(2026, 11, 26, 9), utc(2026, 11, 29, 9, 0, 20)  # 72 hourly slots and the current one
    plan = plan_catch_up(HOURLY, down_since, now, "all", window=SIX_HOURS)
    # 03:00 is six hours and 20 s old: out. 04:00 to 09:00 run.
    assert plan.run == [utc(2026, 11, 29, 4) + dt.timedelta(hours=i) for i in range(6)]
    assert plan.missed == [down_since + dt.timedelta(hours=i) for i in range(67)]  # 26th 09:00 to 29th 03:00
    assert plan.late and plan.next_run_at == utc(2026, 11, 29, 10)
    without = plan_catch_up(HOURLY, down_since, now, "all")
    assert len(without.run) == 73 and without.missed == []


def test_a_window_that_holds_no_slot_records_them_all_missed_and_waits_for_the_next():
    daily = cron("0 8 * * *")
    plan = plan_catch_up(daily, utc(2026, 11, 26, 8), utc(2026, 11, 29, 15), "all", window=SIX_HOURS)
    assert plan.run == [] and plan.missed == [utc(2026, 11, d, 8) for d in (26, 27, 28, 29)]
    assert plan.next_run_at == utc(2026, 11, 30, 8)


def test_an_outage_within_the_window_is_caught_up_as_without_one():
    for policy in ("latest", "all"):
        args = (HOURLY, utc(2026, 11, 29, 6), utc(2026, 11, 29, 10, 20), policy)
        assert plan_catch_up(*args, window=SIX_HOURS) == plan_catch_up(*args)


def test_a_window_does_not_change_catch_up_none():
    args = (HOURLY, utc(2026, 11, 29, 6), utc(2026, 11, 29, 10, 0, 30), "none")
    assert plan_catch_up(*args, window=dt.timedelta(hours=1)) == plan_catch_up(*args)


def test_a_week_fallen_out_of_the_window_records_at_most_limit_rows_then_runs_the_window():
    """The window's 30 slots run; the newest 70 of those that fell out fill the rest of the 100 rows."""
    minutely = every(minutes=1)
    now = utc(2026, 11, 29, 0, 0, 10)
    plan = plan_catch_up(minutely, utc(2026, 11, 22, 0), now, "all", limit=100, window=dt.timedelta(minutes=30))
    horizon_first = utc(2026, 11, 28, 23, 31)  # the first slot inside the window (23:30 is 30 min 10 s old)
    assert plan.missed == [horizon_first - dt.timedelta(minutes=70 - i) for i in range(70)]
    assert plan.unrecorded_before == plan.missed[0]
    assert plan.run == [horizon_first + dt.timedelta(minutes=i) for i in range(30)]
    assert plan.next_run_at == utc(2026, 11, 29, 0, 1)


def test_a_window_stops_at_the_active_until_of_the_job():
    end = utc(2026, 11, 29, 8, 30)
    plan = plan_catch_up(HOURLY, utc(2026, 11, 29, 1), utc(2026, 11, 29, 10, 20), "all", end=end, window=SIX_HOURS)
    assert [s.strftime("%H:%M") for s in plan.missed] == ["01:00", "02:00", "03:00", "04:00"]
    assert [s.strftime("%H:%M") for s in plan.run] == ["05:00", "06:00", "07:00", "08:00"]


def test_a_window_wider_than_the_limit_records_limit_rows_and_says_where_the_record_starts():
    """Three hours down, a minutely latest job, a 30-minute window, a limit of 5: the newest five
    slots are recorded (four MISSED, the newest run), nothing of the rest, and the record is said to
    start at the first of the five — no gap left unsaid, no more rows than the limit."""
    minutely = every(minutes=1)
    plan = plan_catch_up(minutely, utc(2026, 11, 29, 9), utc(2026, 11, 29, 12, 0, 10), "latest", limit=5,
                         window=dt.timedelta(minutes=30))
    assert plan.run == [utc(2026, 11, 29, 12)]
    assert plan.missed == [utc(2026, 11, 29, 11, 56) + dt.timedelta(minutes=i) for i in range(4)]
    assert plan.unrecorded_before == utc(2026, 11, 29, 11, 56)
    assert plan.next_run_at == utc(2026, 11, 29, 12, 1)
    all_ = plan_catch_up(minutely, utc(2026, 11, 29, 9), utc(2026, 11, 29, 12, 0, 10), "all", limit=5,
                         window=dt.timedelta(minutes=30))
    assert all_.run == [utc(2026, 11, 29, 11, 31) + dt.timedelta(minutes=i) for i in range(5)] and all_.truncated
    assert all_.missed == [] and all_.unrecorded_before == utc(2026, 11, 29, 11, 31)
    assert all_.next_run_at == utc(2026, 11, 29, 11, 36)
