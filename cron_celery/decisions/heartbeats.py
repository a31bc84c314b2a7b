"""The lease of a claimed run kept alive (``heartbeat``: fenced, so a run taken over learns it at its
next renewal); a claim this process made found again when the answer was lost (``own_claim``); and the
Sentry check-in id kept on the execution's row."""

from __future__ import annotations

from django.db import connection

from cron_celery import enums
from cron_celery.decisions import executions, previous
from cron_celery.decisions.claims import Claim

S = enums.Status

EXE = executions.EXE


def heartbeat(execution_id: int, fence: int, lease_seconds: int) -> bool:
    """Extend the lease; False means this worker was fenced and must stop."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {EXE} SET lease_until = now() + make_interval(secs => %s)
            WHERE id = %s AND fence = %s AND status = 'RUNNING'
            """,
            [lease_seconds, execution_id, fence],
        )
        return bool(cursor.rowcount == 1)


def set_checkin(execution_id: int, check_in_id: str) -> None:
    """Keep the Sentry check-in id of an execution (sent at its first claim)."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {EXE} SET sentry_checkin_id = %s WHERE id = %s", [check_in_id, execution_id])


def checkin_of(execution_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT sentry_checkin_id FROM {EXE} WHERE id = %s", [execution_id])
        row = cursor.fetchone()
    return str(row[0]) if row else ""


def own_claim(execution_id: int, worker: str, pid: int) -> Claim | None:
    """The claim this process made of ``execution_id`` and committed, though the answer was lost
    with the connection: the row is RUNNING, by this worker and process, with a live lease."""
    with connection.cursor() as cursor:
        told = previous.of_row(EXE, seen_by=executions.attempt_started(EXE))  # what it was told when made
        cursor.execute(
            f"SELECT run_number, fence, retry_count, params, {told}"
            f" FROM {EXE} WHERE id = %s AND status = 'RUNNING' AND worker = %s AND pid = %s AND lease_until > now()",
            [execution_id, worker, pid],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return Claim(outcome=S.RUNNING, execution_id=execution_id, run_number=row[0], fence=row[1], retry_count=row[2],
                 params=executions.loaded(row[3]), previous=previous.loaded(row[4]),
                 last_success=previous.loaded(row[5]))
