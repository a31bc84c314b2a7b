"""What a run is told of its job's history (``run.previous``, ``run.last_success``), read with its
claim, in the claim's own statement or transaction.

Both go by slot order, not by when runs ended: the previous run is the job's newest execution before
this run's (slot, run number) that was claimed and ended (SUCCEEDED, FAILED, TIMED_OUT, LOST or
REVOKED, with a start: a skipped or missed slot, a message never sent or never delivered, a run
revoked before it started did not run; a run still going has no outcome yet); the last success is
the newest SUCCEEDED one before it. A run of the newest slot is told about the slots before it, a
backfilled day about the days before that day, and a second run of a slot (forced, re-run) about the
slot's first. Both are read through the (job, slot, run number) index, backwards from this run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

from cron_celery.decisions import executions

EXE = executions.EXE

#: The statuses of executions that ran a body and ended.
RAN = ("SUCCEEDED", "FAILED", "TIMED_OUT", "LOST", "REVOKED")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreviousRun:
    """An earlier execution of the job, as a run is told of it."""

    execution_id: int
    slot: dt.datetime
    run_number: int
    status: str
    result: Any  # what it returned (as stored: JSON), None for a failure
    ended: dt.datetime | None
    trigger: str

    @property
    def ok(self) -> bool:
        return self.status == "SUCCEEDED"


def _newest(job: str, slot: str, run_number: str, statuses: tuple[str, ...], seen_by: str | None) -> str:
    chosen = ", ".join(f"'{status}'" for status in statuses)
    seen = "" if seen_by is None else f" AND p.ended <= {seen_by}"
    return f"""(SELECT jsonb_build_object('id', p.id, 'slot', p.slot, 'run_number', p.run_number,
                                          'status', p.status, 'result', p.result, 'ended', p.ended,
                                          'trigger', p.trigger)
                FROM {EXE} AS p
                WHERE p.job_id = {job} AND p.slot <= {slot} AND (p.slot, p.run_number) < ({slot}, {run_number})
                  AND p.status IN ({chosen}) AND p.started IS NOT NULL{seen}
                ORDER BY p.slot DESC, p.run_number DESC LIMIT 1)"""


def columns(job: str, slot: str, run_number: str, seen_by: str | None = None) -> str:
    """SQL for two jsonb columns (of a claim's RETURNING, or a SELECT): the previous run and the last
    success of the run of job ``job`` at ``slot`` numbered ``run_number`` (SQL expressions); with
    ``seen_by``, of those that had ended by then (a claim found again reads what it saw when made)."""
    return (f"{_newest(job, slot, run_number, RAN, seen_by)}, "
            f"{_newest(job, slot, run_number, ('SUCCEEDED',), seen_by)}")


def of_row(table: str, seen_by: str | None = None) -> str:
    """``columns`` for the row of ``table`` (a table name or alias) a statement claims."""
    return columns(f"{table}.job_id", f"{table}.slot", f"{table}.run_number", seen_by)


def read(cursor: Any, job_id: int, slot: dt.datetime, run_number: int) -> tuple[PreviousRun | None, PreviousRun | None]:
    """The previous run and the last success, on the claim's cursor (in its transaction)."""
    cursor.execute(f"SELECT {columns('%(job)s', '%(slot)s', '%(run)s')}",
                   {"job": job_id, "slot": slot, "run": run_number})
    row = cursor.fetchone()
    return loaded(row[0]), loaded(row[1])


def loaded(raw: object) -> PreviousRun | None:
    """A column of ``columns`` as a ``PreviousRun`` (None: there is none)."""
    value = json.loads(raw) if isinstance(raw, str | bytes) else raw
    if not isinstance(value, dict):
        return None
    ended = value.get("ended")
    return PreviousRun(execution_id=int(value["id"]), slot=_moment(value["slot"]), run_number=int(value["run_number"]),
                       status=str(value["status"]), result=value.get("result"),
                       ended=None if ended is None else _moment(ended), trigger=str(value["trigger"]))


def _moment(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).astimezone(dt.UTC)
