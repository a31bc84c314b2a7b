"""django-celery-beat's own periodic tasks (those that are no cron job's): sent by the leading beat
alone, and once per due time across a change of leader.

``DatabaseScheduler`` keeps what it sent in memory, each entry's last run and run count, and writes
it to the database every few minutes; a beat that stands by reads the entries when it starts and then
not again until the schedule changes. A leader killed before that write left the database behind
what it had sent, and the beat that led next, reading the database or holding the copy it read at its
start, sent it again: an interval's or a crontab's due time a second time, a clocked one-off twice.
So:

- the leader writes an entry's last run and run count to its row *before* it sends the entry, and
  only if the row still holds the run count it read (``record_reserved``, from ``Scheduler.reserve``):
  a beat holding an older copy (a standby that just took over, a leader that stalled past its lease
  while another led) sends nothing and reads the entries again (``SentElsewhere``);
- a beat that becomes the leader reads every entry again before it sends any (``read_again``), and so
  does a leader whose round failed.

What it gives up: a due time whose row was written but whose message never left (the beat killed in
between, or the broker refusing the message: Celery logs and drops it) is not sent again. A periodic
task with no record of its own has no row to send it again from; a cron job's slots are recorded
before they are sent, and the reconciler sends what was not.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import close_old_connections
from django_celery_beat.models import PeriodicTask


class SentElsewhere(Exception):
    """The row of the entry about to be sent no longer holds the run count this beat read."""

    def __init__(self, name: str) -> None:
        super().__init__(f"periodic task {name!r} was sent by another beat since this beat read it: not sent")


def record_reserved(held: dict[str, Any], entry: Any, new_entry: Any) -> None:
    """Write what the send of ``entry`` about to happen changes on its row, the last run and run count
    of ``new_entry`` (a one-off with a run counted is disabled by the next look at it, on whichever
    beat), if the row still holds the run count ``entry`` was read with; else raise ``SentElsewhere``.
    Only those two columns: an admin's concurrent edit of the others stands.

    The count compared is the entry's own, not its model's: ``DatabaseScheduler``'s entries share one
    model object, which the send advances, while the entry read with it keeps its old last run; a
    schedule rebuilt from the entries held (``held``) would find that entry due again and pass the
    comparison. So the entries held are given the new one, and an old one is refused all the same."""
    written = PeriodicTask.objects.filter(pk=new_entry.model.pk, total_run_count=entry.total_run_count).update(
        last_run_at=new_entry.last_run_at, total_run_count=new_entry.total_run_count)
    if not written:
        raise SentElsewhere(new_entry.name)
    if held.get(new_entry.name) is entry:
        held[new_entry.name] = new_entry


def read_again(scheduler: Any) -> None:
    """Forget the entries ``scheduler`` (a ``DatabaseScheduler``) holds and read them from the
    database: the last leader's sends are there. Nothing it holds is written back first: what it
    holds is older than the rows. The change marker is read before the entries, so that an edit
    committed in between is seen as a change at the next tick."""
    close_old_connections()  # a connection the database dropped is not used again
    scheduler._dirty.clear()
    scheduler._initial_read = False
    scheduler._last_timestamp = scheduler.Changes.last_change()
    scheduler._schedule = scheduler.all_as_schedule()
    scheduler._last_full_sync = dt.datetime.now()  # naive local time, as DatabaseScheduler keeps it
    scheduler._heap = None  # Scheduler.tick builds it again from the entries just read
