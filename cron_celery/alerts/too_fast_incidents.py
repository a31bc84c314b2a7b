"""Too-fast incidents: whether a success of a job with ``min_runtime`` alerts TOO_FAST, alerts its
recovery, or says nothing — grouped like the job's failures.

A success whose body took less than ``min_runtime`` seconds is too fast. Successes too fast in a row
make one incident: it is alerted at the ``alert_after``-th of them, then again only when
``alert_repeat`` seconds passed since its last alert (never, without ``alert_repeat``). The first
success that took long enough ends it: when it was alerted, that success alerts
``TOO_FAST_RECOVERED``. A failure neither continues nor ends an incident (it says nothing about how
long a success takes); only the worker's own final write of a success, which knows how long the body
took, decides.

Kept on the job's row (``too_fast_in_a_row``, ``too_fast_alerted_at``), in one statement that locks
it, in the transaction of the success's final write (``alerts.Outbox``), so a fenced or rolled-back
write decides nothing. "Since its last alert" is the database's clock (``now()``).
"""

from __future__ import annotations

from django.db import connection

from cron_celery.decisions import executions

JOB = executions.JOB

#: What ``decide`` found: the success opens or repeats the alert of a too-fast incident, or ends an
#: alerted one.
ALERT, RECOVERED = "TOO_FAST", "TOO_FAST_RECOVERED"


def decide(job_id: int, *, fast: bool, alerting: bool) -> str | None:
    """Count this success of job row ``job_id`` (``fast``: its body took less than ``min_runtime``)
    and say what it alerts: ``ALERT``, ``RECOVERED`` or None. ``alerting``: the job has a channel
    for TOO_FAST (without one nothing is alerted, so no incident is marked alerted and no recovery
    follows). Call it inside the transaction of the success's final write."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH old AS (SELECT id, too_fast_in_a_row, too_fast_alerted_at FROM {JOB} WHERE id = %(job)s FOR UPDATE)
            UPDATE {JOB} AS job SET
                too_fast_in_a_row = CASE WHEN %(fast)s THEN old.too_fast_in_a_row + 1 ELSE 0 END,
                too_fast_alerted_at = CASE
                    WHEN NOT %(fast)s THEN NULL
                    WHEN %(alerting)s AND (
                        (old.too_fast_alerted_at IS NULL AND old.too_fast_in_a_row + 1 >= job.alert_after)
                        OR (old.too_fast_alerted_at IS NOT NULL AND job.alert_repeat IS NOT NULL
                            AND old.too_fast_alerted_at <= now() - make_interval(secs => job.alert_repeat)))
                    THEN now()
                    ELSE old.too_fast_alerted_at END
            FROM old WHERE job.id = old.id
            RETURNING old.too_fast_alerted_at, job.too_fast_alerted_at
            """,
            {"job": job_id, "fast": fast, "alerting": alerting},
        )
        row = cursor.fetchone()
    if row is None:
        return None
    before, after = row
    if fast:
        return ALERT if after is not None and after != before else None
    return RECOVERED if before is not None else None
