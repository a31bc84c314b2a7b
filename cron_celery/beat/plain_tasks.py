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


def record_reserved(model: PeriodicTask, counted: int) -> None:
    """Write what the send about to happen changes on the entry's row, its last run and run count (a
    one-off with a run counted is disabled by the next look at it, on whichever beat), if the row
    still holds ``counted``, the run count this beat read; else raise ``SentElsewhere``. Only those two
    columns: an admin's concurrent edit of the others stands."""
    written = PeriodicTask.objects.filter(pk=model.pk, total_run_count=counted).update(
        last_run_at=model.last_run_at, total_run_count=model.total_run_count)
    if not written:
        raise SentElsewhere(model.name)


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
