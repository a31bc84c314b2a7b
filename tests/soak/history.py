"""The soak's history as the checker reads it: the execution rows, the alert rows and the lines
the processes wrote to marker files (bodies, alerts, the tracked task, the person)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from tests.soak import spec as specs

OPEN = ("PENDING", "RUNNING", "RETRYING")
BODY_STATUSES = ("SUCCEEDED", "FAILED", "TIMED_OUT")
FAILURES = ("FAILED", "TIMED_OUT", "LOST")
DISPATCH_MISSED = "Missed: the scheduler did not dispatch this slot in time."
TAKEN_OVER = "taken over after its lease expired"


@dataclasses.dataclass
class Row:
    id: int
    job: str
    slot: dt.datetime
    run_number: int
    status: str
    trigger: str
    skip_reason: str
    created_at: dt.datetime
    started: dt.datetime | None
    ended: dt.datetime | None
    fence: int | None
    retry_count: int
    attempts: list[dict[str, Any]]
    error_code: str
    message: str
    republished: int
    due_at: dt.datetime | None = None
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    params_given: bool = False

    @property
    def spec(self) -> specs.JobSpec:
        found = specs.spec_of(self.job)
        assert found is not None, self.job
        return found

    @property
    def scheduled(self) -> bool:
        """The slot's own run, as the schedule made it (not a person's run, nor a one-off)."""
        return self.trigger in ("BEAT", "CATCH_UP", "UPSTREAM") and not self.params_given

    def claims(self) -> list[dict[str, Any]]:
        """Every attempt this execution had: the ``attempts`` history, else its own columns."""
        if self.attempts:
            return self.attempts
        if self.fence is None:
            return []
        return [{"attempt": 1, "fence": self.fence, "status": self.status, "started": self.started,
                 "ended": self.ended, "error_code": self.error_code, "message": self.message}]


@dataclasses.dataclass
class Result:
    anomalies: dict[str, list[str]] = dataclasses.field(default_factory=lambda: defaultdict(list))
    notes: Counter[str] = dataclasses.field(default_factory=Counter)
    statuses: Counter[str] = dataclasses.field(default_factory=Counter)
    slots: int = 0
    bodies: int = 0
    alerts: int = 0

    def flag(self, kind: str, row: Row | int | None, why: str) -> None:
        ident = row.id if isinstance(row, Row) else row
        self.anomalies[kind].append(f"execution {ident}: {why}" if ident is not None else why)


def _time(value: Any) -> dt.datetime | None:
    if value is None or isinstance(value, dt.datetime):
        return value
    return dt.datetime.fromisoformat(str(value))


def load_rows(cursor: Any) -> list[Row]:
    cursor.execute(
        """SELECT id, task_code, slot, run_number, status, trigger, skip_reason, created_at, started, ended, fence,
                  retry_count, attempts, error_code, message, republished, due_at, params, params_given
           FROM cron_celery_cronexecution ORDER BY task_code, slot, run_number""")
    rows = []
    for values in cursor.fetchall():
        attempts = values[12] if isinstance(values[12], list) else json.loads(values[12] or "[]")
        for attempt in attempts:
            attempt["started"], attempt["ended"] = _time(attempt.get("started")), _time(attempt.get("ended"))
        given = values[17] if isinstance(values[17], dict) or values[17] is None else json.loads(values[17])
        rows.append(Row(*values[:12], attempts, *values[13:17], given or {}, bool(values[18])))  # type: ignore[arg-type]
    return rows


def load_alerts(cursor: Any) -> list[tuple[Any, ...]]:
    """(alert id, execution id, job code, event, status, created_at)."""
    cursor.execute("""SELECT a.id, a.execution_id, j.code, a.event, a.status, a.created_at FROM cron_celery_alert a
                      JOIN cron_celery_cronjob j ON j.id = a.job_id ORDER BY a.id""")
    return [tuple(row) for row in cursor.fetchall()]  # type: ignore[misc]


def load_pause_ends(cursor: Any) -> list[tuple[str, float]]:
    """(job code, epoch seconds) of each pause that ended by itself (the audit log's rows)."""
    cursor.execute("""SELECT job_code, extract(epoch FROM changed_at)::float8 FROM cron_celery_schedulechange
                      WHERE source = 'system (pause ended)' AND changes ? 'enabled' ORDER BY id""")
    return [(str(row[0]), float(row[1])) for row in cursor.fetchall()]


def read_lines(directory: Path, prefix: str) -> list[dict[str, Any]]:
    lines = []
    for path in sorted(directory.glob(f"{prefix}-*.jsonl")):
        for text in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                lines.append(json.loads(text))
            except ValueError:  # a line cut by SIGKILL mid-write
                continue
    return lines


def load_jobs(cursor: Any) -> dict[str, dict[str, Any]]:
    """Each job row's code to the columns the feature checks read."""
    cursor.execute("SELECT code, jitter_ms FROM cron_celery_cronjob")
    return {code: {"jitter_ms": jitter} for code, jitter in cursor.fetchall()}
