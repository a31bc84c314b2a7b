"""The real side of the features model test (tests/model/test_features_model.py): jobs that use
every feature added after the claim protocol's model was written, a real beat on a clock the test
moves, edits made the way the admin makes them, deploys that remove and bring back jobs, and a
broker that goes away while the reconciler passes.

The jobs (``FEATURES``):

- ``up1`` and ``up2``: hourly upstream jobs; ``down`` runs ``after=`` both (a fan-in), ``tail`` after
  ``down`` (a chain of three). ``up1`` has timing bounds; ``up2`` is the one whose window is edited.
- ``g1`` and ``g2``: two jobs sharing the concurrency group ``modelgroup`` (a limit of 2).
- ``par``: a job with a parameter (``region``), run with values a person gives beside its slots.
- ``jit``: a jittered job with catch-up ``all``.

Slots are hourly on a virtual clock that starts a month ahead of the database's, so every slot and
one-off is in the future by the database's clock: only the beat's rounds, run with the virtual
``now``, decide which slots are due; the reconciler's grace periods and the timing bounds are judged
by the database's clock, and the test moves rows' times into the past where it wants them passed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

from celery import current_app
from django.db import OperationalError, connection, transaction
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from cron_celery import TrackedTask, models
from cron_celery.beat import Scheduler, schedule_sync
from cron_celery.decisions import audit, leadership, pauses
from cron_celery.decisions import dispatch as cron_dispatch
from cron_celery.decisions import jobs as cron_jobs
from cron_celery.declaring import params, registry
from cron_celery.run import runs
from cron_celery.schedules import every
from tests.celery_app import app
from tests.model import harness as h

GROUP, GROUP_LIMIT = "modelgroup", 2
#: The alerts go to a webhook nobody listens at: the rows are what the test reads (deliveries are dropped).
SETTINGS = {**h.SETTINGS, "CONCURRENCY_GROUPS": {GROUP: GROUP_LIMIT},
            "NOTIFICATIONS": {"webhook": {"url": "http://127.0.0.1:9/alerts"}}}
UPSTREAMS = {"down": ("up1", "up2"), "tail": ("down", "jit")}
#: Jobs a deploy may remove (and a later one bring back): an upstream (``down`` then runs after ``up2``
#: alone), the chain's end, a job of the group, the job with parameters.
REMOVABLE = ("up1", "tail", "g2", "par")
HOUR = dt.timedelta(hours=1)
UNREACHABLE = "redis://127.0.0.1:9/0"  # nothing listens there


def body_with_region(run: runs.Run, *, region: str = "eu") -> Any:
    return h.body(run)


#: key -> (declaration options, the body's function). Every job alerts its failures to a webhook.
FEATURES: dict[str, dict[str, Any]] = {
    "up1": dict(pattern="standard", overlap="skip", schedule=every(hours=1), catch_up="latest", max_retries=1,
                retry_on_failure=True, start_deadline=1, max_runtime=1, min_runtime=0.5),
    # Its catch-up window: a beat round three hours on records the oldest slot (two hours old) MISSED.
    "up2": dict(pattern="always", overlap="skip", schedule=every(hours=1), catch_up="all",
                catch_up_window=90 * 60),
    "down": dict(pattern="standard", overlap="skip", after=["up1", "up2"], alert_on_upstream=True, max_retries=1),
    "tail": dict(pattern="always", overlap="skip", after=["down", "jit"], start_deadline=1),  # a second fan-in
    "g1": dict(pattern="always", overlap="allow", schedule=every(hours=1), catch_up="all", max_retries=1,
               retry_on_failure=True, concurrency_group=GROUP),
    "g2": dict(pattern="always", overlap="allow", schedule=every(hours=1), catch_up="latest",
               concurrency_group=GROUP, max_concurrency=1),
    # It pauses itself at its second final failure in a row (pause_after_failures).
    "par": dict(pattern="standard", overlap="skip", schedule=every(hours=1), catch_up="none", pause_after_failures=2),
    "jit": dict(pattern="always", overlap="skip", schedule=every(hours=1), catch_up="all", jitter=600),
}


@dataclasses.dataclass
class World:
    """The features' jobs: every declaration (as the code declares it), the Celery tasks, row ids."""

    declared: dict[str, registry.Job]
    tasks: dict[str, TrackedTask]
    ids: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def as_jobs(self) -> h.Jobs:
        return h.Jobs(self.declared, self.tasks, self.ids)

    def key_of_id(self, job_id: int) -> str:
        return next(key for key, known in self.ids.items() if known == job_id)


def declare(tag: str) -> World:
    declared: dict[str, registry.Job] = {}
    made: dict[str, TrackedTask] = {}
    for key, declared_options in FEATURES.items():
        options = dict(declared_options)
        task_name = f"tests.model.{tag}.{key}"
        func = body_with_region if key == "par" else h.body
        after = [f"feat-{tag}-{name}" for name in options.pop("after", [])] or None
        job = registry.declare(
            name=f"feat-{tag}-{key}", code=f"F{tag}{key}"[:30], task_name=task_name, after=after,
            retry_backoff=1, retry_jitter=False, notify={"on_failure": ["webhook"], "on_recovery": ["webhook"]},
            parameters=params.from_signature(func, skip=1, job=key), **options)
        declared[key] = job
        made[key] = app.task(name=task_name, base=TrackedTask, job=job, max_retries=job.max_retries, shared=False,
                             lazy=False)(func)
    return World(declared, made)


def forget(world: World) -> None:
    for job in world.declared.values():
        app.tasks.pop(job.task_name, None)


@contextlib.contextmanager
def registry_of(world: World) -> Iterator[None]:
    """The process's registry holds the features' jobs alone while the test runs (so the beat's sync
    and the removals' deploys see this code, not every test app's jobs), and what it held after."""
    saved = (dict(registry._by_name), dict(registry._by_code), dict(registry._by_task), registry._discovered)
    with registry._lock:
        registry._by_name.clear()
        registry._by_code.clear()
        registry._by_task.clear()
        registry._discovered = True
    registry._forget_upstreams()
    for job in world.declared.values():
        registry.register(job)
    try:
        yield
    finally:
        with registry._lock:
            registry._by_name.clear()
            registry._by_name.update(saved[0])
            registry._by_code.clear()
            registry._by_code.update(saved[1])
            registry._by_task.clear()
            registry._by_task.update(saved[2])
            registry._discovered = saved[3]
        registry._forget_upstreams()


def deploy(world: World, removed: set[str], now: dt.datetime) -> None:
    """A beat of code that declares every job but ``removed`` starts: its sync marks them removed (or
    brings back those declared again). ``down`` is declared after the upstreams still there."""
    for job in world.declared.values():
        registry.unregister(job.name)
    for key, job in world.declared.items():
        if key in removed:
            continue
        ups = UPSTREAMS.get(key)
        left = tuple(world.declared[up].name for up in ups if up not in removed) if ups else ()
        registry.register(dataclasses.replace(job, after=left) if ups and len(left) < len(ups) else job)
    schedule_sync.sync(now, source=audit.DEPLOY_BEAT)


def reset(world: World, base: dt.datetime) -> None:
    """A fresh world for one example: the model's rows gone, the code's jobs synced from ``base``."""
    models.CronDependency.objects.all().delete()
    h.reset(h.Jobs({}, {}))
    PeriodicTask.objects.filter(name__startswith="feat-").delete()
    for job in world.declared.values():
        registry.unregister(job.name)
        registry.register(job)
    schedule_sync.sync(base - dt.timedelta(seconds=1), source=audit.DEPLOY_BEAT)
    cron_jobs._job_ids.clear()
    world.ids = {key: cron_jobs.job_id(job) for key, job in world.declared.items()}


def base_slot() -> dt.datetime:
    """The first slot: a whole hour a month after the database's clock."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT date_trunc('hour', now()) + interval '30 days'")
        found = cursor.fetchone()[0]
    assert isinstance(found, dt.datetime)
    return found


# ---- the beat ---------------------------------------------------------------------------------


@contextlib.contextmanager
def clock(now: dt.datetime) -> Iterator[None]:
    """The beats' idle query reports ``now`` as the database's clock meanwhile (what a round
    decides by: edits taken in, due one-offs and slots); everything else reads the real clock."""
    real = cron_dispatch.next_due

    def at_now() -> tuple[dt.datetime | None, bool, dt.datetime]:
        next_at, edited, _clock = real()
        return next_at, edited, now

    with mock.patch.object(cron_dispatch, "next_due", at_now):
        yield


def scheduler() -> Scheduler:
    return Scheduler(app=app, lazy=True)


# ---- edits through the admin ------------------------------------------------------------------------


def periodic_task(job_id: int) -> PeriodicTask | None:
    task_id = models.CronJob.objects.filter(id=job_id).values_list("periodic_task_id", flat=True).first()
    return None if task_id is None else PeriodicTask.objects.get(id=task_id)


def edit(job_id: int, field: str, value: Any) -> bool:
    """Save one field of the job's periodic task as the admin saves it (the model's ``save``, whose
    trigger marks the job edited); False when the job has no periodic task (removed, or a downstream)."""
    task = periodic_task(job_id)
    if task is None:
        return False
    if field == "interval":
        task.interval, _ = IntervalSchedule.objects.get_or_create(every=int(value), period=IntervalSchedule.HOURS)
        task.crontab = None
    elif field == "kwargs":
        task.kwargs = value
    else:
        setattr(task, field, value)
    task.save()
    return True


class EditHolder(h.RowHolder):
    """An admin's save whose transaction stays open (holding the job's row) until released."""

    def __init__(self, job_id: int, field: str, value: Any) -> None:
        super().__init__("", [])
        self.job_id, self.field, self.value = job_id, field, value
        self.applied = False

    def hold(self, cursor: Any) -> None:
        self.applied = edit(self.job_id, self.field, self.value)


# ---- the broker away --------------------------------------------------------------------------------


@contextlib.contextmanager
def broker_unreachable() -> Iterator[None]:
    """The broker cannot be reached from this process (every new connection is refused) meanwhile."""
    old = app.conf.broker_url
    _new_pools()
    app.conf.broker_url = UNREACHABLE  # type: ignore[misc]  # Celery's settings take it at runtime
    try:
        sending_to = current_app.connection_for_write()  # what the reconciler sends with
        assert (sending_to.hostname, sending_to.port) == ("127.0.0.1", 9), sending_to.as_uri()
        yield
    finally:
        _new_pools()
        app.conf.broker_url = old  # type: ignore[misc]


def _new_pools() -> None:
    """The app forgets its connection and producer pools (kombu keeps them, per broker URL): the next
    send takes those of the broker URL then in effect."""
    app._pool = None
    app.amqp._producer_pool = None


# ---- the rows ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Row(h.Row):
    """An execution as the claim protocol's model reads it, and what the features add."""

    params_given: bool
    late_alerted: bool
    long_alerted: bool
    upstream_execution_id: int | None

    @property
    def claims(self) -> tuple[int, ...]:
        return tuple(h.claim_fences(self))


def rows() -> list[Row]:
    extra = ", params_given, late_alerted, long_alerted, upstream_execution_id"
    return [Row(*values) for values in h.read_rows(h.ROW_COLUMNS + extra)]


@dataclasses.dataclass(frozen=True)
class JobRow:
    id: int
    paused: bool
    removed: bool
    active_from: dt.datetime | None
    active_until: dt.datetime | None
    next_run_at: dt.datetime | None
    schedule_problem: str


def job_rows() -> dict[int, JobRow]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, paused, removed_at IS NOT NULL, active_from, active_until, next_run_at,"
                       f" schedule_problem FROM {h.JOB}")
        return {int(values[0]): JobRow(*values) for values in cursor.fetchall()}


def pause_with_an_end(job_id: int) -> bool:
    """The admin's Pause… with an end a moment ahead of the database's clock (the task disabled, the end
    said, one transaction), then that moment waited out: the end has passed. False: no periodic task."""
    task = periodic_task(job_id)
    if task is None:
        return False
    with transaction.atomic():
        task.enabled = False
        task.save()
        pauses.say(job_id, note="model", until=leadership.database_now() + dt.timedelta(milliseconds=50), by="model")
    time.sleep(0.1)
    return True


def pauses_left_behind() -> list[tuple[int, bool, dt.datetime]]:
    """(job id, paused, end) of each job whose pause end has passed by the database's clock."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, paused, paused_until FROM {h.JOB} WHERE paused_until <= now()")
        return [(int(a), bool(b), c) for a, b, c in cursor.fetchall()]


def self_paused() -> dict[int, dt.datetime]:
    """Job id -> ``paused_at`` of each job paused by its own failures (``pause_after_failures``)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, paused_at FROM {h.JOB} WHERE paused AND paused_by = %s", [pauses.BY_FAILURES])
        return {int(a): b for a, b in cursor.fetchall()}


def outcomes_before(job_id: int, moment: dt.datetime, count: int) -> list[str]:
    """The statuses of the job's ``count`` newest final outcomes of runs that started, ended by ``moment``."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT status FROM {h.EXE} WHERE job_id = %s AND started IS NOT NULL AND ended <= %s"
                       " AND status IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'LOST') ORDER BY ended DESC, id DESC"
                       " LIMIT %s", [job_id, moment, count])
        return [str(row[0]) for row in cursor.fetchall()]


def alerts() -> list[tuple[int, int | None, str]]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT job_id, execution_id, event FROM {h.ALERT}")
        return [(int(a), None if b is None else int(b), str(c)) for a, b, c in cursor.fetchall()]


def make_late(execution_id: int) -> None:
    """The database's clock passes the start deadline of a PENDING execution that was sent."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {h.EXE} SET due_at = now() - interval '5 seconds',"
                       f" created_at = least(created_at, now() - interval '5 seconds') WHERE id = %s",
                       [execution_id])


def unsent_one_offs() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {h.EXE} WHERE trigger = 'ONE_OFF' AND status = 'PENDING'"
                       " AND celery_task_id = '' ORDER BY id")
        return [int(row[0]) for row in cursor.fetchall()]


def edges(world: World) -> list[tuple[str, str]]:
    """The edges of ``after=`` as the rows hold them: (downstream, upstream)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT downstream_id, upstream_id FROM {models.CronDependency._meta.db_table}")
        return [(world.key_of_id(int(down)), world.key_of_id(int(up))) for down, up in cursor.fetchall()]


def time_passes(seconds: int) -> None:
    """The database's clock moves on for the rows: what ``harness.shift`` moves, and when runs ended
    (the reconciler decides late only the downstream slots of upstreams that ended a while ago)."""
    h.shift(seconds)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {h.EXE} SET ended = ended - make_interval(secs => %s) WHERE ended IS NOT NULL",
                       [seconds])
        cursor.execute(f"UPDATE {h.JOB} SET created_at = created_at - make_interval(secs => %s)", [seconds])


def row_locked(job_id: int) -> bool:
    """Whether another transaction holds the job's row (asked without waiting, on a connection of its own)."""
    def ask() -> bool:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"SELECT 1 FROM {h.JOB} WHERE id = %s FOR UPDATE NOWAIT", [job_id])
            return False
        except OperationalError:
            return True
    return bool(h.in_thread(ask))
