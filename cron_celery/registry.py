"""Job declarations (name, code, policies) and their lookup.

A job is declared once in code with ``@cron_task`` or ``@register_task``; this module
keeps the declarations and refuses two jobs with the same name or code.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import threading
import zoneinfo
from typing import TypeVar

from django.conf import settings as django_settings

from cron_celery import conf, exceptions, models, schedules

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,99}$")
CODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,49}$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
    """A job's declaration: what it is called and how its slots may run."""

    name: str
    code: str
    task_name: str
    pattern: models.ExecutionPattern
    overlap: models.Overlap
    timezone: str
    description: str = ""
    schedule: schedules.Schedule | None = None
    catch_up: models.CatchUp = models.CatchUp.LATEST

    @property
    def tzinfo(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.timezone)

    def first_slot_on(self, day: dt.date) -> dt.datetime | None:
        """The job's first slot on a local date: its schedule's, or local midnight."""
        midnight = schedules.slot_for_date(day, self.tzinfo)
        if self.schedule is None:
            return midnight
        slot = self.schedule.next_after(midnight - dt.timedelta(seconds=1))
        return slot if schedules.execution_date(slot, self.tzinfo) == day else None

    def next_slot(self, after: dt.datetime) -> dt.datetime | None:
        return self.schedule.next_after(after) if self.schedule is not None else None


_lock = threading.RLock()
_by_name: dict[str, Job] = {}
_by_code: dict[str, Job] = {}
_by_task: dict[str, Job] = {}
_discovered = False


E = TypeVar("E", models.ExecutionPattern, models.Overlap, models.CatchUp)


def _choice(enum: type[E], value: object, job: str, what: str) -> E:
    if isinstance(value, enum):
        return value
    if isinstance(value, str):
        for member in enum:
            if value.lower() in (member.value, member.name.lower()):
                return member
    allowed = ", ".join(repr(member.value) for member in enum)
    raise exceptions.ImproperlyDeclared(
        f"{what} must be one of {allowed}, not {value!r}.", job=job
    )


def declare(
    *,
    name: str,
    code: str,
    task_name: str,
    pattern: object = None,
    overlap: object = None,
    timezone: str | None = None,
    description: str = "",
    schedule: object = None,
    catch_up: object = None,
) -> Job:
    """Validate a declaration and build its ``Job``; raises ``ImproperlyDeclared``."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise exceptions.ImproperlyDeclared(
            "the name must be a lower-case slug (letters, digits, '-' or '_'), "
            "at most 100 characters.",
            job=name,
        )
    if not isinstance(code, str) or not CODE_RE.match(code):
        raise exceptions.ImproperlyDeclared(
            "the code must be 1-50 letters, digits, '.', '-' or '_', e.g. 'A001'.", job=name
        )
    tz = timezone or conf.settings.DEFAULT_TIMEZONE or django_settings.TIME_ZONE or "UTC"
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise exceptions.ImproperlyDeclared(
            f"unknown timezone {tz!r} (use an IANA name such as 'Europe/Amsterdam').", job=name
        ) from exc
    parsed: schedules.Schedule | None = None
    if schedule is not None:
        try:
            parsed = schedules.from_celery(schedule).in_timezone(tz)
            parsed.next_after(dt.datetime(2000, 1, 1, tzinfo=dt.UTC))  # it must fire at all
        except (exceptions.InvalidSchedule, ValueError) as exc:
            raise exceptions.ImproperlyDeclared(f"its schedule is invalid: {exc}", job=name) from exc
    return Job(
        schedule=parsed,
        catch_up=_choice(models.CatchUp, catch_up if catch_up is not None else "latest", name, "catch_up"),
        name=name,
        code=code,
        task_name=task_name,
        pattern=_choice(
            models.ExecutionPattern,
            pattern if pattern is not None else conf.settings.DEFAULT_PATTERN,
            name,
            "pattern",
        ),
        overlap=_choice(
            models.Overlap,
            overlap if overlap is not None else conf.settings.DEFAULT_OVERLAP,
            name,
            "overlap",
        ),
        timezone=tz,
        description=description,
    )


def register(job: Job) -> Job:
    """Add a job; the same task declared again (a module re-import) replaces itself."""
    with _lock:
        for field, index in (("name", _by_name), ("code", _by_code)):
            existing = index.get(getattr(job, field))
            if existing is not None and existing.task_name != job.task_name:
                raise exceptions.DuplicateJob(
                    field=field,
                    value=getattr(job, field),
                    first=existing.task_name,
                    second=job.task_name,
                )
        old = _by_task.get(job.task_name)
        if old is not None:
            _by_name.pop(old.name, None)
            _by_code.pop(old.code, None)
        _by_name[job.name] = job
        _by_code[job.code] = job
        _by_task[job.task_name] = job
    return job


def unregister(name: str) -> None:
    """Forget a job (tests that declare jobs on the fly use this)."""
    with _lock:
        job = _by_name.pop(name, None)
        if job is not None:
            _by_code.pop(job.code, None)
            _by_task.pop(job.task_name, None)


def autodiscover() -> None:
    """Import every installed app's ``tasks`` module once, so that all jobs are declared."""
    global _discovered
    if _discovered or not conf.settings.AUTODISCOVER:
        return
    from django.utils.module_loading import autodiscover_modules

    with _lock:
        if not _discovered:
            autodiscover_modules("tasks")
            _discovered = True


def all_jobs() -> list[Job]:
    autodiscover()
    with _lock:
        return sorted(_by_name.values(), key=lambda job: job.name)


def get(name_or_code: str) -> Job:
    """The job with this name (or code); raises ``UnknownJob`` with the known names."""
    autodiscover()
    with _lock:
        job = _by_name.get(name_or_code) or _by_code.get(name_or_code)
        if job is not None:
            return job
        known = ", ".join(sorted(_by_name)) or "(none)"
    raise exceptions.UnknownJob(name=name_or_code, known=known)


def by_task_name(task_name: str) -> Job | None:
    with _lock:
        return _by_task.get(task_name)
