"""Who has an exclusive or limited job's room, and what a run that may not have it is told.

Pure functions of the claim's state (``slot_state.read``), under the job's row lock: the job's own
limit (``max_concurrency``, 1 for an exclusive job), the older runs that wait for the room and go first
(oldest first), and ``overlap="buffer_one"``'s one waiting slot. The claim (``claims``) decides with
them; the skip messages are the words its rows and its callers show.
"""

from __future__ import annotations

from typing import Any

from cron_celery import enums
from cron_celery.declaring import registry

#: A skip behind older runs of the job that wait for its room (they go first).
BEHIND_MESSAGE = ("Skipped: {ahead} older run(s) of this job wait to run first (catch-up slots, retries, runs "
                  "asked for); a slot sent on time does not go ahead of them.")
#: A regular slot of an ``overlap="buffer_one"`` job when another slot already waits for the job.
BUFFER_FULL_MESSAGE = ("Skipped: another slot of this job already waits for its running execution, and "
                       "overlap='buffer_one' keeps one waiting slot at most.")

SKIP_MESSAGES: dict[str, str] = {
    enums.SkipReason.PAUSED: "Skipped: the job is paused.",
    enums.SkipReason.ALREADY_RAN: "Skipped: this slot already ran.",
    enums.SkipReason.ALREADY_RUNNING: "Skipped: this slot is already running or queued.",
    enums.SkipReason.OVERLAP: "Skipped: another execution of this job is running.",
    enums.SkipReason.LOCK_UNAVAILABLE: "Skipped: another server holds the job's lock.",
    enums.SkipReason.CONCURRENCY: "Skipped: the job already has as many runs at once as its max_concurrency allows.",
}


def job_full(job: registry.Job, state: dict[str, Any]) -> bool:
    return job.limit is not None and (state.get("live_count") or 0) >= job.limit


def behind(job: registry.Job, state: dict[str, Any]) -> bool:
    """The job has room, but not once the older runs waiting for it have theirs (``slot_state``'s ``ahead``)."""
    return job.limit is not None and (state.get("live_count") or 0) + (state.get("ahead") or 0) >= job.limit


def _buffering(job: registry.Job, state: dict[str, Any]) -> bool:
    """A regular beat slot of an ``overlap="buffer_one"`` job (never a ``rate_limited`` one: its calls that
    meet its live run are skipped whatever its overlap)."""
    return (job.overlap == enums.Overlap.BUFFER_ONE and state.get("own_trigger") == enums.Trigger.BEAT
            and job.pattern != enums.ExecutionPattern.RATE_LIMITED)


def buffers_one(job: registry.Job, state: dict[str, Any]) -> bool:
    """``overlap="buffer_one"``: this regular beat slot, kept from the job by a live run (or older runs that
    wait), waits for its turn — as long as no other beat slot of the job waits already (``buffered``: a forced
    one, the last slot of a ``one_off`` task, waits as a run asked for and does not count)."""
    return _buffering(job, state) and not state.get("buffered")


def waits_for(job: registry.Job, state: dict[str, Any], reason: str) -> dict[str, Any]:
    """What a waiting execution's note names: the older runs it waits behind, the job's own limit, else
    its group's."""
    if not job_full(job, state) and behind(job, state):  # room for it, but not once the older have theirs
        return {"ahead": state["ahead"]}
    if reason != enums.SkipReason.CONCURRENCY:
        return {}
    if job_full(job, state):
        return {"limit": job.limit}
    return {"group": job.concurrency_group, "limit": state["group_full"]}


def skip_message(job: registry.Job, state: dict[str, Any], reason: str) -> str:
    if reason in (enums.SkipReason.OVERLAP, enums.SkipReason.LOCK_UNAVAILABLE) and _buffering(job, state):
        return BUFFER_FULL_MESSAGE
    if waits_for(job, state, reason).get("ahead"):
        return BEHIND_MESSAGE.format(ahead=state["ahead"])
    if reason == enums.SkipReason.CONCURRENCY and not job_full(job, state):
        return (f"Skipped: the job's concurrency group {job.concurrency_group!r} already has "
                f"{state['group_full']} runs at once, as many as CONCURRENCY_GROUPS allows.")
    return SKIP_MESSAGES[reason]
