"""Is the system doing its job? The dead-man's switch behind ``health/`` and ``cron_check``.

Healthy means: a beat leads and was seen within ``HEALTH["BEAT_STALE_SECONDS"]`` (only
required while a beat is needed, ``beat_needed``: not for a job whose active window has ended),
and no unpaused job's next slot is more than ``HEALTH["OVERDUE_SECONDS"]`` late after its
jitter and its window's opening (``due_at``), nor any one-off run not sent yet. Each check is
one indexed query.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from django.db import connection
from django.utils import timezone

from cron_celery import conf, models
from cron_celery.decisions import beat_needed, oneoffs

JOB = models.CronJob._meta.db_table
EXE = models.CronExecution._meta.db_table
BEAT = models.BeatHeartbeat._meta.db_table  # its column "leading" is a reserved word in SQL: always quoted
#: Most overdue jobs named in a report.
OVERDUE_SHOWN = 50


#: A beat whose clock is further than this (seconds) from the database's is told so in its log.
CLOCK_SKEW_WARNING = 5.0


def beat_seen(identity: str, leading: bool) -> dt.datetime:
    """Record that this beat is alive (called by the scheduler every few seconds); returns the
    database's clock at that moment."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {BEAT} (identity, "leading", started_at, seen_at) VALUES (%s, %s, now(), now())
            ON CONFLICT (identity) DO UPDATE SET "leading" = EXCLUDED."leading", seen_at = now()
            RETURNING seen_at
            """,
            [identity[:200], leading],
        )
        row = cursor.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def clock_skew(database: dt.datetime, before: float, after: float) -> float | None:
    """How far (seconds, + = ahead) this machine's clock is from the database's, when that is
    more than ``CLOCK_SKEW_WARNING`` beyond what the round trip (``before``..``after``, this
    machine's epoch seconds around the statement that read ``database``) can explain; else None."""
    skew = (before + after) / 2 - database.timestamp()
    return skew if abs(skew) > CLOCK_SKEW_WARNING + (after - before) / 2 else None


def beat_gone(identity: str) -> None:
    """A beat that stops says so, so that health does not wait for it to go stale."""
    with connection.cursor() as cursor:
        cursor.execute(f'UPDATE {BEAT} SET "leading" = false, seen_at = now() WHERE identity = %s', [identity[:200]])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Report:
    ok: bool
    reasons: list[str]
    beat: dict[str, Any] | None  # the freshest leading beat
    overdue: list[dict[str, Any]]
    checked_at: dt.datetime

    def as_dict(self) -> dict[str, Any]:
        return {"status": "ok" if self.ok else "unhealthy", "reasons": self.reasons, "beat": self.beat,
                "overdue": self.overdue, "checked_at": self.checked_at.isoformat()}


def check() -> Report:
    options = conf.settings.HEALTH
    stale = float(options["BEAT_STALE_SECONDS"])
    late = float(options["OVERDUE_SECONDS"])
    reasons: list[str] = []
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT now(), {beat_needed.SQL}, b.identity, b.seen_at, extract(epoch FROM now() - b.seen_at)
            FROM (SELECT 1) AS one
            LEFT JOIN LATERAL (SELECT identity, seen_at FROM {BEAT} WHERE "leading" ORDER BY seen_at DESC LIMIT 1) AS b
                ON true
            """
        )
        now, needed, identity, seen_at, age = cursor.fetchone()
        cursor.execute(
            f"""
            SELECT name, code, next_run_at, extract(epoch FROM now() - due_at) FROM {JOB}  -- late after its jitter
            WHERE due_at < now() - make_interval(secs => %s) AND NOT paused
            ORDER BY due_at LIMIT %s
            """,
            [late, OVERDUE_SHOWN],
        )
        overdue = [{"job": name, "code": code, "next_slot": slot.isoformat(), "late_seconds": round(float(behind), 1)}
                   for name, code, slot, behind in cursor.fetchall()]
        # One-off runs a beat should have sent by now (their own partial index; see ``oneoffs``).
        cursor.execute(
            f"""
            SELECT job.name, job.code, e.due_at, extract(epoch FROM now() - e.due_at), e.id
            FROM {EXE} AS e JOIN {JOB} AS job ON job.id = e.job_id
            WHERE {oneoffs.UNSENT} AND e.due_at < now() - make_interval(secs => %s)
            ORDER BY e.due_at LIMIT %s
            """,
            [late, OVERDUE_SHOWN],
        )
        overdue += [{"job": name, "code": code, "next_slot": at.isoformat(), "late_seconds": round(float(behind), 1),
                     "one_off": int(execution_id)} for name, code, at, behind, execution_id in cursor.fetchall()]
    beat = None
    if identity is not None:
        beat = {"identity": identity, "seen_at": seen_at.isoformat(), "age_seconds": round(float(age), 1)}
    if needed and beat is None:  # an overdue slot or one-off is due, so needs a beat too
        reasons.append("no beat is leading: start `celery beat -S cron_celery.beat.Scheduler`")
    elif needed and beat is not None and float(age) > stale:
        reasons.append(f"the leading beat {identity} was last seen {float(age):.0f} s ago (limit {stale:g} s)")
    for item in overdue:
        what = f"one-off run (execution {item['one_off']})" if "one_off" in item else "slot"
        reasons.append(f"job {item['job']} ({item['code']}) is {item['late_seconds']:.0f} s late for its {what} "
                       f"{item['next_slot']} (limit {late:g} s)")
    return Report(ok=not reasons, reasons=reasons, beat=beat, overdue=overdue, checked_at=now or timezone.now())
