"""How often the reconciler sends again an execution whose message the broker cannot tell about.

While a RabbitMQ queue has a backlog its messages cannot be read (``inflight`` answers "cannot
tell"). Sending the stranded execution again is safe — the claim runs it once, whichever copy
arrives first — but every copy joins the backlog being waited on. So these sends are spaced and
bounded:

* after its k-th send the execution is looked at again ``PENDING_GRACE * 2**k`` seconds later
  (``gap``: twice as long each time, never longer than ``MAX_GAP`` nor shorter than the grace);
* each send counts in the execution's ``republished``, with the sends of messages found gone, so
  ``REPUBLISH_LIMIT`` bounds all of them together. At the limit it is not sent again while the
  broker cannot tell: it is left waiting and looked at again every gap. It is never given up for
  that: only a broker that answers "gone" ends it (``LOST``, or ``MISSED`` by the job's catch-up
  policy). An execution that waited its turn counts from 0 again each time it waits (its message
  arrived: ``waiting.mark``).

The next look is kept in ``lease_until`` (for a PENDING or RETRYING execution it is when it was
last sent, or is due), pushed ahead by the gap less the grace that ``repairs.stranded`` adds.
"""

from __future__ import annotations

from django.db import connection

from cron_celery.decisions import executions

EXE = executions.EXE
#: The longest gap between two looks at one execution (seconds), however often it was sent.
MAX_GAP = 3600.0


def gap(grace: float, sent: int) -> float:
    """Seconds from the ``sent``-th send of an execution to the next look at it."""
    return max(grace, min(grace * 2.0 ** min(sent, 32), MAX_GAP))


def counted(execution_id: int, seen: int, grace: float) -> bool:
    """Count a send of an execution the broker cannot tell about (``seen``: its count when the pass
    read it) and put its next look a gap ahead; False when it no longer waits, or another pass
    counted a send since (a pass that outlived its lease): that copy is not counted twice."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {EXE} SET republished = republished + 1,
                lease_until = now() + make_interval(secs => %(ahead)s)
            WHERE id = %(id)s AND status IN ('PENDING', 'RETRYING') AND republished = %(seen)s
            """,
            {"id": execution_id, "seen": seen, "ahead": gap(grace, seen + 1) - grace},
        )
        return bool(cursor.rowcount == 1)


def held(execution_id: int, sent: int, grace: float) -> bool:
    """Leave an execution sent ``sent`` times (the limit) waiting, unsent, until its next look."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {EXE} SET lease_until = now() + make_interval(secs => %(ahead)s)
            WHERE id = %(id)s AND status IN ('PENDING', 'RETRYING')
            """,
            {"id": execution_id, "ahead": gap(grace, sent) - grace},
        )
        return bool(cursor.rowcount == 1)
