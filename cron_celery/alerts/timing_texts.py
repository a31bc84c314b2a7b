"""What a timing alert says (LATE, LONG_RUNNING, TOO_FAST and its recovery): what it was decided on —
when the run was due or its attempt started, when the reconciler found it so, how long its body took —
and what the execution says when the alert is delivered."""

from __future__ import annotations

import datetime as dt
from typing import Any

from cron_celery import enums, models

E = enums.Event


def _seconds(value: float) -> str:
    """A duration as people read it: "0.42 s", "48 s", "4 min 10 s", "2 h 5 min"."""
    if value < 10:
        return f"{value:.2f} s"
    whole = round(value)
    hours, rest = divmod(whole, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    return f"{seconds} s"


def _utc(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _fact_time(facts: dict[str, Any], key: str, fallback: dt.datetime | None) -> dt.datetime | None:
    value = facts.get(key)
    if isinstance(value, str):
        try:
            return dt.datetime.fromisoformat(value)
        except ValueError:
            pass
    return fallback


def story(event: str, execution: models.CronExecution, facts: dict[str, Any] | None = None) -> str:
    """What a LATE, LONG_RUNNING or TOO_FAST alert says: what it was decided on (the alert's
    ``facts``: when the run was due, when its attempt started, how long its body took), and what
    the execution and its job's row say when it is delivered (a late run that started meanwhile
    says when)."""
    job, facts = execution.job, facts or {}
    if event == E.LATE:
        due = _fact_time(facts, "due", execution.due_at or execution.created_at)
        assert due is not None
        seen = _fact_time(facts, "found", None)
        so_far = _seconds((seen - due).total_seconds()) if seen else f"{_seconds(job.start_deadline or 0)} or more"
        said = (f"Not started {so_far} after it was due ({_utc(due)}; "
                + (f"found at {_utc(seen)}; " if seen else "") + f"start_deadline {job.start_deadline or 0:g} s): ")
        if execution.trigger == enums.Trigger.ONE_OFF and not execution.celery_task_id:
            said += "no beat has sent this one-off run (is a beat running?)."
        elif execution.waiting_since is not None:
            note = (execution.message.strip().splitlines() or [""])[0]
            said += "it waits for room to run" + (f": {note}" if note else " (overlap or concurrency limit).")
        else:
            said += "no worker has taken its message (the queue is backed up, or no worker consumes its queue)."
        if execution.started is not None:
            waited = (execution.started - due).total_seconds()
            said += f" It started at {_utc(execution.started)}, {_seconds(waited)} after it was due."
        return said
    if event == E.LONG_RUNNING:
        began = _fact_time(facts, "started", execution.started)
        assert began is not None
        seen = _fact_time(facts, "found", None)
        ran = _seconds((seen - began).total_seconds()) if seen else f"{_seconds(job.max_runtime or 0)} or more"
        said = (f"Still running {ran} after its attempt started at {_utc(began)} ("
                + (f"found at {_utc(seen)}; " if seen else "") + f"max_runtime {job.max_runtime or 0:g} s), "
                f"on {execution.worker or 'a worker'}"
                + (f" (pid {execution.pid})" if execution.pid else "") + ". It is not stopped (time_limit does that).")
        if execution.ended is not None:
            said += f" It ended {execution.status} at {_utc(execution.ended)}."
        return said
    took = facts.get("runtime")
    if event == E.TOO_FAST_RECOVERED:
        return (f"Took at least its min_runtime of {job.min_runtime or 0:g} s again"
                + (f" (its body took {_seconds(float(took))})" if isinstance(took, int | float) else "") + ".")
    return ("Succeeded faster than its min_runtime of " f"{job.min_runtime or 0:g} s"
            + (f" (its body took {_seconds(float(took))})" if isinstance(took, int | float) else "")
            + ": did it do its work? A job that finds nothing to do returns quickly; so does one that "
              "silently skips it.")
