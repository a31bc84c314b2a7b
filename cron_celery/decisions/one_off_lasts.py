"""The last slot of a job whose periodic task is ``one_off``, as django-celery-beat has it: sent once,
then the periodic task disabled (which the database's trigger turns into a pause of the job), so that
last slot runs past that pause (``dispatch.dispatch_many``)."""

from __future__ import annotations

from typing import Any

from django_celery_beat.models import PeriodicTask

from cron_celery.decisions import audit, executions

JOB = executions.JOB
EXE = executions.EXE
PERIODIC_TASK = PeriodicTask._meta.db_table


def hold(cursor: Any, lasts: list[int], *, lock_wait: str) -> list[int]:
    """Lock the periodic tasks of the jobs whose last slot this round sends; the ids of those still
    ``one_off`` now that they are held. The periodic tasks first, as an admin's save locks them, then
    the job rows; a sync locks them the other way round, so this round gives way rather than wait:
    past ``lock_wait`` it fails whole (nothing written, nothing sent) and the next tick plans it again."""
    cursor.execute(f"SET LOCAL lock_timeout = '{lock_wait}'")
    audit.set_author(source=audit.BEAT_ONE_OFF, cursor=cursor)  # the disable, in the audit log
    cursor.execute(
        f"SELECT job.id FROM {PERIODIC_TASK} AS task JOIN {JOB} AS job ON job.periodic_task_id = task.id"
        " WHERE job.id = ANY(%s) AND task.one_off ORDER BY task.id FOR UPDATE OF task", [lasts])
    return [int(row[0]) for row in cursor.fetchall()]


def end(cursor: Any, ended: list[int], rows: list[tuple[Any, ...]]) -> None:
    """The last slot of each ``ended`` job, among ``rows`` (``dispatch_many``'s: kind, execution id, job
    id, ...), forced past the pause, and its periodic task disabled."""
    cursor.execute(f"UPDATE {EXE} SET force = true WHERE id = ANY(%s)",
                   [[row[1] for row in rows if row[0] == "exe" and row[2] in ended]])
    cursor.execute(
        f"UPDATE {PERIODIC_TASK} AS task SET enabled = false FROM {JOB} AS job"
        " WHERE job.id = ANY(%s) AND task.id = job.periodic_task_id AND task.enabled", [ended])
