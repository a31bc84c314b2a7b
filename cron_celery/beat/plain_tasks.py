"""django-celery-beat's own periodic tasks (those that are no cron job's): sent by the leading beat
alone, and once per due time across a change of leader.

``DatabaseScheduler`` keeps what it sent in memory, each entry's last run and run count, and writes
it to the database every few minutes; a beat that stands by reads the entries when it starts and then
not again until the schedule changes. A leader killed between a send and that write, and a standby
taking over with the copy it read at its start, would send again what had just been sent: an interval
or a crontab's due time a second time, and a clocked one-off twice. So:

- the leader writes an entry's last run and run count to its row *before* it sends the entry
  (``record_reserved``, from ``Scheduler.reserve``), and
- a beat that becomes the leader reads every entry again before it sends any (``read_again``), and so
  does a leader whose round failed.

What it gives up: a leader killed between that write and the send leaves that one due time unsent,
where before it was sent twice. A periodic task with no record of its own has no row to send it again
from; a cron job's slots are recorded before they are sent, and the reconciler sends what was not.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django_celery_beat.models import PeriodicTask


def record_reserved(model: PeriodicTask) -> None:
    """Write what the send about to happen changes on the entry's row: its last run and run count
    (a one-off with a run counted is disabled by the next look at it, on whichever beat). Only those
    two columns: an admin's concurrent edit of the others stands."""
    PeriodicTask.objects.filter(pk=model.pk).update(last_run_at=model.last_run_at,
                                                    total_run_count=model.total_run_count)


def read_again(scheduler: Any) -> None:
    """Forget the entries ``scheduler`` (a ``DatabaseScheduler``) holds and read them from the
    database: the last leader's sends are there. Nothing it holds is written back first: what it
    holds is older than the rows."""
    scheduler._dirty.clear()
    scheduler._initial_read = False
    scheduler._schedule = scheduler.all_as_schedule()
    scheduler._last_timestamp = scheduler.Changes.last_change()
    scheduler._last_full_sync = dt.datetime.now()  # naive local time, as DatabaseScheduler keeps it
    scheduler._heap = None  # Scheduler.tick builds it again from the entries just read
