"""What the admin's job dashboard shows: badges, schedules in words, 7-day figures and a
small bar chart of the last 30 executions — each computed in the changelist's one query.

The 7-day figures come from rollups kept by triggers as executions end (``models.Hour``:
finished and successful runs per hour of slots; ``models.Durations``: successes' durations
per day, in 32 buckets a doubling), so a job that runs every second costs the page 169 hour
rows, not 604,800 executions. A job with at most ``EXACT_UP_TO`` ended executions in the week
is read from its executions instead (at most that many rows of the ``(job, slot)`` index), and
its figures are exact. A busier job's success rate counts the slots from the start of the hour
seven days ago, and its median is estimated from the duration buckets (within about 1 %; shown
with "≈"). The chart reads the last 30 executions through the same index.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet
from django.db.models.expressions import RawSQL
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from cron_celery import enums, models, schedules
from cron_celery.check_errors import process_errors
from cron_celery.decisions import timing

S = enums.Status
EXE = models.CronExecution._meta.db_table
JOB = models.CronJob._meta.db_table
#: Bars in the chart, newest on the right.
BARS = 30

#: Badge colours (background, text) per status; accessible contrast on white.
COLOURS: dict[str, tuple[str, str]] = {
    S.SUCCEEDED: ("#1a7f37", "#ffffff"), S.FAILED: ("#cf222e", "#ffffff"), S.TIMED_OUT: ("#bc4c00", "#ffffff"),
    S.LOST: ("#8250df", "#ffffff"), S.RUNNING: ("#0969da", "#ffffff"), S.PENDING: ("#6e7781", "#ffffff"),
    S.RETRYING: ("#9a6700", "#ffffff"), S.SKIPPED: ("#d0d7de", "#24292f"), S.MISSED: ("#57606a", "#ffffff"),
    S.REVOKED: ("#24292f", "#ffffff"),
}


BADGE_STYLE = "display:inline-block;padding:1px 8px;border-radius:9px;font-weight:600;white-space:nowrap;"


def badge(status: str, label: str | None = None) -> SafeString:
    background, text = COLOURS.get(status, ("#eaeef2", "#57606a")) if status else ("#eaeef2", "#57606a")
    return format_html('<span class="cron-badge" style="{}background:{};color:{}">{}</span>', BADGE_STYLE,
                       background, text, label or (status.replace("_", " ").lower() if status else "never run"))


def when(moment: Any) -> SafeString:
    """A UTC time that does not wrap: "2026-11-30 02:13 UTC", with seconds when it has them."""
    if moment is None:
        return mark_safe("—")
    shown = moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC" if moment.second else "%Y-%m-%d %H:%M UTC")
    return format_html('<span style="white-space:nowrap">{}</span>', shown)


def pause_said(job: Any) -> SafeString:
    """What was said of a paused job's pause, under its badge: "until 2026-12-08 08:00 UTC · by alice:
    warehouse migration" (each part only when there is one)."""
    parts = [format_html("until {}", when(job.paused_until))] if job.paused_until else []
    parts += [format_html("by {}", job.paused_by)] if job.paused_by else []
    said = format_html_join(" · ", "{}", ((part,) for part in parts))
    if job.pause_note:
        said = format_html("{}{}{}", said, ": " if parts else "", job.pause_note[:200])
    return format_html('<div class="cron-pause" style="font-size:11px;color:#57606a">{}</div>', said) if (
        parts or job.pause_note) else mark_safe("")


def pause_summary(job: Any) -> dict[str, Any] | None:
    """The pause in effect for the API and the commands: its note, author, start and end (None: not paused)."""
    if not job.paused:
        return None
    return {"note": job.pause_note or None, "by": job.paused_by or None,
            "since": job.paused_at.isoformat() if job.paused_at else None,
            "until": job.paused_until.isoformat() if job.paused_until else None}


def when_stacked(moment: Any) -> SafeString:
    """A UTC time in a narrow column: the date over the time of day ("2026-11-30" / "02:13 UTC")."""
    if moment is None:
        return mark_safe("—")
    utc = moment.astimezone(dt.UTC)
    return format_html('<span style="white-space:nowrap">{}</span><br> <span style="white-space:nowrap">{}</span>',
                       f"{utc:%Y-%m-%d}", utc.strftime("%H:%M:%S UTC" if utc.second else "%H:%M UTC"))


def _ago(seconds: float) -> str:
    """A lapse in a badge: "40 s", "4 min", "2 h", "3 d"."""
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{max(0, int(seconds))} s"


def timing_badges(pair: list[Any] | None) -> SafeString:
    """The status cell's timing badges from ``with_figures``' ``timing``: "late 4 min" while a run
    waits past its job's start_deadline, "running 2 h" while one runs past its max_runtime."""
    late, running = (pair or [None, None])[:2]
    shown = [badge(S.RETRYING, f"late {_ago(float(late))}")] if late is not None else []
    shown += [badge(S.TIMED_OUT, f"running {_ago(float(running))}")] if running is not None else []
    return format_html_join("", "<br>{}", ((item,) for item in shown))


def next_run(job: models.CronJob, one_off: dt.datetime | None, now: dt.datetime) -> SafeString:
    """The dashboard's "next" cell: the next slot, or a one-off run when it comes first, and the
    job's window when it matters (not open yet, or ended: no more slots)."""
    slot = job.next_run_at
    ended = slot is not None and job.active_until is not None and slot >= job.active_until
    if one_off is not None and (slot is None or ended or one_off < slot):
        return format_html('<small class="cron-quiet">one-off</small><br>{}', when_stacked(one_off))
    if ended:
        assert job.active_until is not None
        return format_html('<small class="cron-quiet">window ended</small><br>{}', when_stacked(job.active_until))
    if slot is not None and job.active_from is not None and job.active_from > now:
        return format_html('{}<br><small class="cron-quiet">window opens then</small>', when_stacked(slot))
    return when_stacked(slot)


#: A job with at most this many ended executions in the week gets its figures from its rows.
EXACT_UP_TO = 250
#: Duration buckets a doubling, from one millisecond (the rollup trigger's, ``migrations/_initial/counting.py``).
PER_DOUBLING, SMALLEST = 32, 0.001


def with_figures(queryset: QuerySet[models.CronJob]) -> QuerySet[models.CronJob]:
    """The jobs with the dashboard's figures: ``week`` = [finished runs, successes, median
    seconds of the successes (exact), duration buckets [[bucket, count], ...] (a busy job's,
    to estimate the median from; ``None`` when the median is exact)], and ``recent``, the last
    executions' [status, seconds] for the chart."""
    hours, durations = models.Hour._meta.db_table, models.Durations._meta.db_table
    exact = (f"SELECT json_build_array(count(*) FILTER (WHERE completed AND status <> 'SKIPPED'), "
             f"count(*) FILTER (WHERE status = 'SUCCEEDED'), percentile_cont(0.5) WITHIN GROUP "
             f"(ORDER BY extract(epoch FROM ended - started)) "
             f"FILTER (WHERE status = 'SUCCEEDED' AND started IS NOT NULL), NULL) "
             f"FROM {EXE} WHERE job_id = {JOB}.id AND slot >= now() - interval '7 days'")
    buckets = (f"SELECT coalesce(json_agg(json_build_array(bucket, n) ORDER BY bucket), '[]') FROM ("
               f"SELECT bucket, sum(count) AS n FROM {durations} WHERE job_id = {JOB}.id "
               f"AND day >= ((now() - interval '7 days') AT TIME ZONE 'UTC')::date "
               f"GROUP BY bucket HAVING sum(count) > 0) AS b")
    return queryset.annotate(
        week=RawSQL(
            f"SELECT CASE WHEN r.ended <= {EXACT_UP_TO} THEN ({exact}) "
            f"ELSE json_build_array(r.finished, r.succeeded, NULL, ({buckets})) END "
            f"FROM (SELECT coalesce(sum(ended), 0) AS ended, coalesce(sum(finished), 0) AS finished, "
            f"coalesce(sum(succeeded), 0) AS succeeded FROM {hours} WHERE job_id = {JOB}.id "
            f"AND hour >= date_trunc('hour', now() - interval '7 days', 'UTC')) AS r", []),
        # [seconds the oldest run waits past its start_deadline, seconds the oldest live run has run past
        # its max_runtime] (each null when none is): the status cell's "late 4 min", "running 2 h".
        timing=RawSQL(timing.badges_sql(JOB), []),
        # The earliest one-off run not sent yet (the "next" column says it when it comes first).
        next_one_off=RawSQL(
            f"SELECT min(due_at) FROM {EXE} WHERE job_id = {JOB}.id AND status = 'PENDING' AND trigger = 'ONE_OFF' "
            f"AND celery_task_id = ''", []),
        recent=RawSQL(
            f"SELECT coalesce(json_agg(json_build_array(status, extract(epoch FROM ended - started)) "
            f"ORDER BY slot, run_number), '[]') FROM (SELECT status, started, ended, slot, run_number FROM {EXE} "
            f"WHERE job_id = {JOB}.id ORDER BY slot DESC, run_number DESC LIMIT {BARS}) AS last", []),
    )


@dataclass(frozen=True)
class Week:
    """A job's 7-day figures as the dashboard shows them."""

    finished: int
    succeeded: int
    median: float | None  # seconds
    estimated: bool  # the median is estimated from the duration buckets


def week(figures: list[Any] | None) -> Week:
    """``with_figures``' ``week`` as numbers."""
    finished, succeeded, median, buckets = figures or (0, 0, None, None)
    if buckets is not None:
        return Week(int(finished), int(succeeded), estimated_median([(int(b), int(n)) for b, n in buckets]), True)
    return Week(int(finished or 0), int(succeeded or 0), None if median is None else float(median), False)


def bucket_bounds(bucket: int) -> tuple[float, float]:
    """The durations (seconds) a bucket holds: [low, high); bucket 0 also holds the quicker ones."""
    high = SMALLEST * 2 ** ((bucket + 1) / PER_DOUBLING)
    return (0.0 if bucket <= 0 else SMALLEST * 2 ** (bucket / PER_DOUBLING)), high


def estimated_median(buckets: list[tuple[int, int]]) -> float | None:
    """The median of the durations counted in ``buckets`` ([(bucket, count)], by bucket), as
    PostgreSQL's ``percentile_cont(0.5)`` would give it of the durations themselves: each
    value is placed evenly within its bucket, and an even count averages the middle two."""
    total = sum(count for _, count in buckets)
    if total <= 0:
        return None

    def value(rank: int) -> float:  # the rank-th smallest duration (0-based)
        seen = 0
        for bucket, count in buckets:
            if count > 0 and rank < seen + count:
                low, high = bucket_bounds(bucket)
                return low + (high - low) * (rank - seen + 0.5) / count
            seen += count
        raise ValueError(rank)  # pragma: no cover - rank < total

    middle = (total - 1) / 2
    below, above = value(int(middle)), value(int(middle + 0.5))
    return (below + above) / 2


def chart(recent: list[list[Any]] | None) -> SafeString:
    """An inline SVG: one bar per execution, height = duration (relative), colour = status."""
    bars = recent or []
    if not bars:
        return mark_safe('<span class="cron-muted">no runs yet</span>')
    longest = max((float(seconds or 0) for _, seconds in bars), default=0.0) or 1.0
    width, height, gap = 4, 24, 1
    rects = []
    for index, (status, seconds) in enumerate(bars):
        bar = max(3.0, height * float(seconds or 0) / longest) if seconds is not None else 3.0
        colour = COLOURS.get(status, ("#d0d7de", ""))[0]
        rects.append((index * (width + gap), f"{height - bar:.1f}", width, f"{bar:.1f}", colour,
                      f"{status} {float(seconds or 0):.2f} s"))
    body = format_html_join(
        "", '<rect x="{}" y="{}" width="{}" height="{}" fill="{}"><title>{}</title></rect>', rects)
    return format_html('<svg class="cron-chart" width="{}" height="{}" role="img" aria-label="last {} runs">{}</svg>',
                       len(bars) * (width + gap), height, len(bars), body)


DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]


def schedule_words(job: models.CronJob) -> str:
    """The job's schedule in words; for a job declared with ``after=`` (no schedule of its own), the
    jobs it runs after: "after extract, transform" (its upstream edges, prefetched by the admin)."""
    if not job.schedule:
        upstreams = sorted(edge.upstream.name for edge in job.upstream_edges.all())
        if upstreams:
            return f"after {', '.join(upstreams)}"
    return describe(job.schedule)


def describe(expression: str) -> str:
    """A schedule in words: "every 5 minutes", "every day at 06:00", "Mondays at 09:30"..."""
    if not expression:
        return "no schedule"
    found = re.fullmatch(r"every (\d+)s", expression)
    if found:
        seconds = int(found.group(1))
        return str(schedules.Interval(seconds)) if seconds >= 1 else f"cron {expression}"
    fields = expression.split()
    if len(fields) != 5:
        return expression
    minute, hour, dom, month, dow = fields
    step = re.fullmatch(r"\*/(\d+)", minute)
    if step and (hour, dom, month, dow) == ("*", "*", "*", "*"):
        return f"every {step.group(1)} minutes"
    if minute.isdigit() and hour == "*" and (dom, month, dow) == ("*", "*", "*"):
        return f"every hour at :{int(minute):02d}"
    if minute.isdigit() and hour.isdigit():
        at = f"{int(hour):02d}:{int(minute):02d}"
        if (dom, month, dow) == ("*", "*", "*"):
            return f"every day at {at}"
        if (dom, month) == ("*", "*") and re.fullmatch(r"[0-7](,[0-7])*", dow):
            names = [DAYS[int(day) % 7] + "s" for day in dow.split(",")]
            return f"{', '.join(names)} at {at}"
        if dom.isdigit() and (month, dow) == ("*", "*"):
            return f"monthly on day {int(dom)} at {at}"
    return f"cron {expression}"


def schedule_problem(job: models.CronJob) -> SafeString:
    """Why the job's periodic task's schedule was not applied, and what the job does meanwhile;
    empty when the schedule in effect is the periodic task's."""
    if not job.schedule_problem:
        return mark_safe("")
    meanwhile = ("paused until the schedule is fixed" if job.paused or job.next_run_at is None
                 else "runs on its previous schedule until the schedule is fixed")
    return format_html('<div class="cron-schedule-problem" role="alert" style="color:#cf222e;max-width:32em">'
                       '<strong>Edit not applied:</strong> {}<br><small>{}</small></div>',
                       job.schedule_problem, meanwhile)


def check_errors() -> list[dict[str, str]]:
    """This web process's cron_celery system check errors, for the dashboard's banner (the
    checks run once per process: ``process_errors``)."""
    return [{"id": message.id or "", "message": message.msg, "hint": message.hint or ""}
            for message in process_errors()]
