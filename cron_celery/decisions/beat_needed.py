"""Whether a leading beat is needed now: the one answer the health check (``health``) and the
``cron_beat_needed`` metric (``metrics``, which gates the beat alerts) share.

A beat is needed while any of these holds:

- a job that is not paused has a slot to send: its ``due_at`` is set. The ``due_at`` trigger
  (the ``cron_celery_job_due`` trigger) keeps it empty once the job's next slot reaches the end of its active
  window (``active_until``), so a job whose window has ended needs no beat; a job whose window
  opens later has one (its ``due_at`` is the opening, plus its jitter) and needs a beat now;
- a job that is not paused, or that the beat set aside for its schedule (paused with a
  ``schedule_problem``), has an edit no beat has taken in yet (``schedule_version`` ahead of
  ``schedule_seen``): a window moved later, a job enabled again, a fixed schedule, a new schedule
  or a new job reach the job's row, and so its ``due_at``, only through a beat;
- a one-off run waits to be sent;
- a pause has an end (``paused_until``): the job has slots again then, which only a beat sends.

Each is one probe of an index: ``due_at``'s, the partial index of edited jobs, the one-offs' own,
the pause ends'.
"""

from __future__ import annotations

from cron_celery import models
from cron_celery.decisions import oneoffs

JOB = models.CronJob._meta.db_table

#: A boolean SQL expression (a select list's item): true while a beat is needed.
SQL = f"""(
    (SELECT id FROM {JOB} WHERE due_at IS NOT NULL AND NOT paused ORDER BY due_at LIMIT 1) IS NOT NULL
    OR (SELECT id FROM {JOB} WHERE schedule_version <> schedule_seen AND (NOT paused OR schedule_problem <> '')
        ORDER BY id LIMIT 1) IS NOT NULL
    OR {oneoffs.earliest()} IS NOT NULL
    OR (SELECT id FROM {JOB} WHERE paused_until IS NOT NULL ORDER BY paused_until LIMIT 1) IS NOT NULL
)"""
