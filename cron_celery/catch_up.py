"""The catch-up after scheduler downtime: which of the slots that fell due since a job was last
dispatched run, which are recorded MISSED, by the job's policy (``none``, ``latest``, ``all``)."""

from __future__ import annotations

import dataclasses
import datetime as dt

from cron_celery.schedules import Interval, Schedule, slots_between

_DAWN = dt.datetime.min.replace(tzinfo=dt.UTC)

@dataclasses.dataclass(frozen=True, kw_only=True)
class CatchUpPlan:
    """What to do with the slots that fell due since a job was last dispatched."""

    run: list[dt.datetime]  # slots to dispatch now (oldest first)
    missed: list[dt.datetime]  # slots to record MISSED, never to run
    next_run_at: dt.datetime  # the first slot still in the future
    truncated: bool = False  # more slots were due than ``limit``: the rest wait for the next cycle
    unrecorded_before: dt.datetime | None = None  # older overdue slots were not recorded (long outage)
    late: bool = False  # ``all`` runs overdue slots: every one of ``run`` is a catch-up, the newest too


def plan_catch_up(schedule: Schedule, due_since: dt.datetime, now: dt.datetime, policy: str,
                  limit: int = 1000, end: dt.datetime | None = None,
                  window: dt.timedelta | None = None) -> CatchUpPlan:
    """Split the slots in ``[due_since, now]`` by the catch-up policy.

    ``due_since`` is the job's ``next_run_at``: the first slot not dispatched yet. A slot
    dispatched within its grace (a minute, or half an interval) is on time and runs under
    every policy. Overdue slots (the scheduler was down): ``none`` records them all MISSED,
    ``latest`` runs the most recent and records the rest MISSED, ``all`` runs them all —
    at most ``limit`` per cycle, the rest in later cycles (``truncated``). After an outage
    longer than ``limit`` slots, ``none`` and ``latest`` record only the newest ``limit``
    slots (``unrecorded_before`` says where the record starts), so a week down never
    writes, or walks, a week of slots.

    ``end`` (a job's ``active_until``): slots at or after it are outside the job's window, neither
    run nor recorded; ``next_run_at`` is then the first slot past it (the job is due no more).

    ``window`` (a job's ``catch_up_window``): the policy decides the slots inside it; those older than
    ``now - window`` are recorded MISSED whatever the policy, the newest of them in the room ``limit``
    leaves (``_with_window``).
    """
    if window is not None and policy != "none" and due_since < now - window:
        return _with_window(schedule, due_since, now, policy, limit, end, now - window)
    # The last moment inside the window (none comes before the calendar's first).
    last = now if end is None or end > now else end - dt.timedelta(microseconds=1) if end > _DAWN else end
    due: list[dt.datetime] = []
    slot = due_since
    while slot <= last and len(due) < limit:
        due.append(slot)
        slot = schedule.next_after(slot)
    truncated = slot <= last
    if not due:
        return CatchUpPlan(run=[], missed=[], next_run_at=due_since)
    if policy == "all":
        late = len(due) > 1 or truncated or due[0] < now - _grace(schedule)
        return CatchUpPlan(run=due, missed=[], next_run_at=slot, truncated=truncated, late=late)
    unrecorded_before = None
    if truncated:  # more is overdue: keep only the newest ``limit`` slots, found from ``now``
        due = (due + _newest_slots(schedule, slot, last, limit))[-limit:]
        unrecorded_before = due[0]
        slot = schedule.next_after(due[-1])
    latest = due[-1]
    on_time = latest >= now - _grace(schedule)
    if policy == "none" and not on_time:
        return CatchUpPlan(run=[], missed=due, next_run_at=slot, unrecorded_before=unrecorded_before)
    return CatchUpPlan(run=[latest], missed=due[:-1], next_run_at=slot, unrecorded_before=unrecorded_before)


def _with_window(schedule: Schedule, due_since: dt.datetime, now: dt.datetime, policy: str, limit: int,
                 end: dt.datetime | None, horizon: dt.datetime) -> CatchUpPlan:
    """``plan_catch_up`` for a job whose slots before ``horizon`` fell out of its catch-up window: the
    slots inside it are planned by the policy; the newest of those that fell out are recorded MISSED
    in the room ``limit`` leaves (``unrecorded_before``: where the record starts, when it does not
    reach back to ``due_since``)."""
    before = horizon if end is None else min(horizon, end)
    inside = plan_catch_up(schedule, schedule.next_after(before - dt.timedelta(microseconds=1)), now, policy,
                           limit, end)
    room = limit - len(inside.run) - len(inside.missed)
    old = _newest_slots(schedule, due_since, before - dt.timedelta(microseconds=1), room) if room > 0 else []
    recorded = old + inside.missed + inside.run
    unrecorded_before = inside.unrecorded_before
    if old and old[0] > due_since:
        unrecorded_before = old[0]
    elif room <= 0 and due_since < before and unrecorded_before is None:  # no room for a slot that fell out
        unrecorded_before = min(recorded, default=inside.next_run_at)
    return dataclasses.replace(inside, missed=old + inside.missed, unrecorded_before=unrecorded_before)


def shortest_window(schedule: Schedule) -> dt.timedelta:
    """The shortest ``catch_up_window`` a job on this schedule may have: the lateness within which its
    slots count as on time (a shorter one would record slots MISSED that the beat sends on time)."""
    return _grace(schedule)


def _newest_slots(schedule: Schedule, first: dt.datetime, now: dt.datetime, limit: int) -> list[dt.datetime]:
    """The newest ``limit`` slots in ``[first, now]`` (``first`` is a slot), oldest first,
    found without walking the whole range: look back from ``now`` over a doubling window."""
    if isinstance(schedule, Interval):
        step = dt.timedelta(seconds=schedule.seconds)
        last = schedule.next_after(now) - step
        start = max(first, last - step * (limit - 1))
        return [start + step * i for i in range(int((last - start) / step) + 1)] if last >= start else []
    window = dt.timedelta(hours=1)
    while True:
        start = max(first, now - window)
        slots = slots_between(schedule, start - dt.timedelta(microseconds=1), now)
        if len(slots) >= limit or start == first:
            return slots[-limit:]
        window *= 2


def _grace(schedule: Schedule) -> dt.timedelta:
    """How late a slot may be dispatched and still count as on time (policy ``none``)."""
    if isinstance(schedule, Interval):
        return dt.timedelta(seconds=min(60, max(1, schedule.seconds // 2)))
    return dt.timedelta(seconds=60)
