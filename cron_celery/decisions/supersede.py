"""A claim that supersedes a stale run: the run of its job (or of its slot) whose worker stopped
renewing its lease gives up its fence, so its late writes are refused (``claims.begin``)."""

from __future__ import annotations

from typing import Any

from cron_celery import enums
from cron_celery.decisions import executions
from cron_celery.declaring import registry

EXE = executions.EXE
#: The patterns whose slot is checked (``claims.SLOT_CHECKED``).
SLOT_CHECKED = (enums.ExecutionPattern.STANDARD, enums.ExecutionPattern.RERUN_ON_FAILURE)


def stale_runs(cursor: Any, job: registry.Job, job_id: int, state: dict[str, Any], fence: int) -> None:
    """This claim runs a job with a limit (exclusive, ``max_concurrency``, a group) while another of its
    runs is RUNNING with an expired lease (its worker froze, or lost the database, and did not renew):
    that run no longer owns the job. Or it runs a slot of a slot-checked job whose earlier run of the
    slot is such a run: that one no longer owns the slot. It takes this claim's fence, so its heartbeat
    and final write, which carry the old one, are refused (FENCED, its run told to stop), and two runs
    of the job (of the slot) are never both recorded. Its row stays RUNNING with the expired lease: the
    reconciler ends it (``LEASE_EXPIRED``, retried by the job's policy) as it would have without this claim.

    Every such row that was stale when the claim looked (``state``) is superseded, not only those whose
    lease is still expired now: a heartbeat that renewed one since (it takes no job lock) must not leave
    the job with two live runs (or more than its limit): its lease is ended too. A run that was live
    when the claim looked (a ``max_concurrency`` job's) is not touched."""
    stale = (state["stale_ids"] if job.limit is not None or job.concurrency_group
             else state["slot_stale_ids"] if job.pattern in SLOT_CHECKED else None)
    if not stale:
        return
    # Its history keeps the fence it ran under: a first attempt (no history yet) gets its entry now.
    cursor.execute(
        f"""
        UPDATE {EXE} SET fence = %(fence)s, lease_until = least(lease_until, now()),
            attempts = CASE WHEN jsonb_array_length(attempts) > 0 THEN attempts
                ELSE jsonb_build_array(jsonb_build_object('attempt', retry_count + 1, 'started', started,
                                                          'worker', worker, 'pid', pid, 'fence', fence)) END
        WHERE job_id = %(job)s AND id = ANY(%(stale)s) AND status = 'RUNNING' AND fence < %(fence)s
        """,
        {"fence": fence, "job": job_id, "stale": list(stale)},
    )
