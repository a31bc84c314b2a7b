"""The schedulers the beat scale benchmark compares, each given N every-minute jobs: django-celery-beat's
``DatabaseScheduler`` and cron_celery's scheduler, plain, with jitter, and with jobs that run after others."""

from __future__ import annotations

import time
from typing import Any

from bench.beat_scale_stores import crontab
from bench.beat_scale_tallies import next_boundary, utc
from bench.common import BenchError

EVERY_MINUTE = "* * * * *"
EDITED = "*/2 * * * *"  # the crontab one job is moved to
SHARED_EDIT = "*/1"  # the shared row's new minute field: the same slots, a different row


class Variant:
    """One scheduler with N every-minute jobs: what differs between the two."""

    key = ""
    label = ""

    def __init__(self, app: Any, n: int) -> None:
        self.app = app
        self.n = n

    def prepare(self) -> None:
        """Put the N jobs in place (not part of the build time)."""
        raise NotImplementedError

    def construct(self) -> Any:
        raise NotImplementedError

    def arm(self, boundary: float) -> None:
        """Make every job's next slot ``boundary`` (the next minute) and nothing due before."""
        raise NotImplementedError

    def edit_target(self) -> Any:
        """The ``PeriodicTask`` of the job whose crontab is edited."""
        raise NotImplementedError

    def has_crontab(self, scheduler: Any, task: Any, row: Any, expression: str) -> bool:
        """Whether the scheduler now runs the edited job on ``row`` (``expression``)."""
        raise NotImplementedError

    def all_on_minute(self, scheduler: Any, minute: str) -> bool:
        """Whether the scheduler runs all N jobs with this minute field."""
        raise NotImplementedError

    def burst_rows(self, boundary: float) -> int | None:
        """Executions recorded for the burst's slot (None: this scheduler records none)."""
        return None

    def teardown(self) -> None:
        pass

    def build(self) -> Any:
        scheduler = self.construct()
        scheduler.schedule  # noqa: B018 - the first read of the schedule is part of the build
        return scheduler

    @staticmethod
    def close(scheduler: Any) -> None:
        """Close without writing back the run times of entries that are thrown away."""
        dirty = getattr(scheduler, "_dirty", None)
        if isinstance(dirty, set):
            dirty.clear()
        try:
            scheduler.close()
        finally:
            finalize = getattr(scheduler, "_finalize", None)
            if finalize is not None:
                finalize.cancel()  # its sync() would otherwise run at exit, on emptied tables


class CeleryBeatVariant(Variant):
    key = "dbs"
    label = "DatabaseScheduler"

    def name(self, index: int) -> str:
        return f"dbs-{index:06d}"

    def prepare(self) -> None:
        from django_celery_beat.models import PeriodicTask, PeriodicTasks

        self.shared = crontab()
        self.other = crontab(minute="*/2")
        PeriodicTask.objects.bulk_create(
            [PeriodicTask(name=self.name(i), task="bench.noop", crontab=self.shared, enabled=True)
             for i in range(self.n)],
            batch_size=2000,
        )
        PeriodicTasks.update_changed()  # bulk_create sends no signal

    def construct(self) -> Any:
        from django_celery_beat.schedulers import DatabaseScheduler

        return DatabaseScheduler(app=self.app)

    def arm(self, boundary: float) -> None:
        from django.utils import timezone
        from django_celery_beat.models import PeriodicTask

        if next_boundary() != boundary:
            raise BenchError("arming past the minute")
        # Last run "now": each entry's next slot is the next minute (no signal: not a change).
        PeriodicTask.objects.update(last_run_at=timezone.now())

    def edit_target(self) -> Any:
        from django_celery_beat.models import PeriodicTask

        return PeriodicTask.objects.get(name=self.name(self.n // 2))

    def has_crontab(self, scheduler: Any, task: Any, row: Any, expression: str) -> bool:
        entry = scheduler._schedule.get(task.name)
        return entry is not None and entry.model.crontab_id == row.id

    def all_on_minute(self, scheduler: Any, minute: str) -> bool:
        ours = [entry for name, entry in scheduler._schedule.items() if name.startswith("dbs-")]
        return len(ours) == self.n and all(entry.model.crontab.minute == minute for entry in ours)


class CronCeleryVariant(Variant):
    key = "cron_celery"
    label = "cron_celery"

    def prepare(self) -> None:
        from cron_celery import schedules
        from cron_celery.declaring import registry

        every_minute = schedules.cron(EVERY_MINUTE)
        self.names: list[str] = []
        started = time.perf_counter()
        for i in range(self.n):
            job = self.declare(i, every_minute)
            registry.register(job)
            self.names.append(job.name)
        self.declare_seconds = time.perf_counter() - started
        self.other = crontab(minute="*/2")  # an insert: no job's version moves

    def declare(self, i: int, schedule: Any) -> Any:
        from cron_celery.declaring import registry

        return registry.declare(name=f"beat-scale-{i:06d}", code=f"BS-{i:06d}",
                                task_name=f"bench.beat_scale.job_{i:06d}", schedule=schedule)

    def construct(self) -> Any:
        from cron_celery.beat import Scheduler

        return Scheduler(app=self.app)

    def arm(self, boundary: float) -> None:
        from cron_celery.models import CronJob

        if next_boundary() != boundary:
            raise BenchError("arming past the minute")
        CronJob.objects.filter(code__startswith="BS-").update(next_run_at=utc(boundary))

    def edit_target_job_id(self) -> int:
        from cron_celery.models import CronJob

        return int(CronJob.objects.values_list("id", flat=True).get(code=f"BS-{self.n // 2:06d}"))

    def edit_target(self) -> Any:
        from cron_celery.models import CronJob

        job = CronJob.objects.select_related("periodic_task").get(code=f"BS-{self.n // 2:06d}")
        if job.periodic_task is None:
            raise BenchError(f"job {job.name} has no periodic task after the sync")
        return job.periodic_task

    def has_crontab(self, scheduler: Any, task: Any, row: Any, expression: str) -> bool:
        from cron_celery.models import CronJob

        job = CronJob.objects.get(periodic_task_id=task.id)
        return job.schedule == expression and job.schedule_version == job.schedule_seen

    def all_on_minute(self, scheduler: Any, minute: str) -> bool:
        from django.db.models import F

        from cron_celery.models import CronJob

        jobs = CronJob.objects.filter(code__startswith="BS-")
        expression = f"{minute} * * * *"
        return (not jobs.exclude(schedule_version=F("schedule_seen")).exists()
                and jobs.filter(schedule=expression).count() == self.n)

    def burst_rows(self, boundary: float) -> int | None:
        from cron_celery.models import CronExecution

        return CronExecution.objects.filter(slot=utc(boundary), status="PENDING",
                                            task_code__startswith="BS-").count()

    def teardown(self) -> None:
        from cron_celery.declaring import registry

        for name in getattr(self, "names", []):
            registry.unregister(name)


class JitterVariant(CronCeleryVariant):
    """The same N jobs with ``jitter=30``: each slot sent a fixed offset below 30 s after it, so
    the burst spreads over half a minute; the idle tick must stay what it was."""

    key = "cron_celery_jitter"
    label = "cron_celery, jitter=30"
    jitter = 30

    def declare(self, i: int, schedule: Any) -> Any:
        from cron_celery.declaring import registry

        return registry.declare(name=f"beat-scale-{i:06d}", code=f"BS-{i:06d}",
                                task_name=f"bench.beat_scale.job_{i:06d}", schedule=schedule, jitter=self.jitter)


class DependentsVariant(CronCeleryVariant):
    """The same N jobs and 1,000 more declared ``after=`` them (job i after job i mod N): they have
    no schedule, so the beat never dispatches them; the idle tick must stay what it was."""

    key = "cron_celery_after"
    label = "cron_celery + 1,000 after="
    dependents = 1000

    def prepare(self) -> None:
        from cron_celery.declaring import registry

        super().prepare()
        started = time.perf_counter()
        for i in range(self.dependents):
            job = registry.declare(name=f"beat-scale-after-{i:06d}", code=f"BA-{i:06d}",
                                   task_name=f"bench.beat_scale.after_{i:06d}", after=[self.names[i % self.n]])
            registry.register(job)
            self.names.append(job.name)
        self.declare_seconds += time.perf_counter() - started


VARIANTS: tuple[type[Variant], ...] = (CeleryBeatVariant, CronCeleryVariant, JitterVariant, DependentsVariant)
#: The variants the page compares with DatabaseScheduler row by row (the first two are the pair).
CRON_VARIANTS = ("cron_celery", "cron_celery_jitter", "cron_celery_after")
