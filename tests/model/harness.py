"""The real side of the model test: jobs that are real Celery tasks, worker threads that receive
their messages from the session's real Redis queue, and helpers that read and nudge the rows.

Every operation runs in a thread of its own, so it holds a database connection of its own, as a
separate worker, beat, reconciler or admin would. A job's body blocks until the state machine
tells it how to end, so a claimed run stays RUNNING across steps while other operations happen.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import queue as queue_module
import threading
from collections.abc import Callable, Iterator
from typing import Any

import redis
from celery.exceptions import Retry, SoftTimeLimitExceeded
from django.conf import settings
from django.db import connection, transaction
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from cron_celery import TrackedTask, models, reconciler
from cron_celery.decisions import dispatch as cron_dispatch
from cron_celery.decisions import jobs as cron_jobs
from cron_celery.decisions import repairs
from cron_celery.declaring import registry
from cron_celery.run import runs, tasks
from tests.celery_app import app
from tests.conftest import wait_for
from tests.model.reference import Spec

EXE = models.CronExecution._meta.db_table
JOB = models.CronJob._meta.db_table
ALERT = models.Alert._meta.db_table
LEASE_SECONDS = 3600  # far longer than any example: a lease expires only when a step says so
EXPIRE_BY = 4000  # seconds a lease is moved into the past to expire it
GRACE = 600  # the reconciler's PENDING_GRACE
TIME_PASSES_BY = 700  # more than GRACE, less than LEASE_SECONDS
REPUBLISH_LIMIT = 2
SETTINGS = {
    "LEASE_SECONDS": LEASE_SECONDS,
    "RECONCILE": {"INTERVAL": 0, "PENDING_GRACE": GRACE, "MISSED_GRACE": 120, "REPUBLISH_LIMIT": REPUBLISH_LIMIT,
                  "BATCH": 500},
}
#: The first slot of every job; slots are hourly and in the future, so no reconciler pass ever
#: finds a slot the beat did not dispatch (that step has tests of its own).
BASE_SLOT = dt.datetime(2031, 3, 1, tzinfo=dt.UTC)
WAIT = 60.0  # generous: the machine is shared
#: Which of the things on hand (queued messages, running bodies...) a rule takes: an index, taken
#: modulo the number on hand. How many there are may depend on which of two racing workers won, so
#: a replay must not draw from a list of that length (Hypothesis would see a different draw).
PICK = st.integers(0, 63)
INTERNAL = "cron_celery."  # the package's own tasks (alert deliveries): not the model's

#: The jobs of the model: every pattern, both overlap policies, retries on some.
SPECS = [
    Spec("std", "standard", "skip", max_retries=2, retry_on_failure=True, catch_up="latest", alert_after=1),
    Spec("rof", "rerun_on_failure", "allow", max_retries=1, retry_on_failure=False, catch_up="none", alert_after=2),
    Spec("alw", "always", "skip", max_retries=0, retry_on_failure=False, catch_up="all", alert_after=1),
    Spec("alwa", "always", "allow", max_retries=0, retry_on_failure=False, catch_up="latest", alert_after=1),
    Spec("rl", "rate_limited", "skip", max_retries=1, retry_on_failure=True, catch_up="latest", alert_after=1),
    Spec("cap", "always", "allow", max_retries=1, retry_on_failure=True, catch_up="all", alert_after=1,
         max_concurrency=1),  # the limit path without a Redis lock, met often (3 in tests/faults)
    Spec("buf", "always", "buffer_one", max_retries=1, retry_on_failure=True, catch_up="latest", alert_after=1),
]


def slot(index: int) -> dt.datetime:
    return BASE_SLOT + dt.timedelta(hours=index)


# ---- the bodies -------------------------------------------------------------------------------


class Worker(threading.Thread):
    """One delivery (or in-process call) on a connection of its own.

    ``entered`` is set when the job's body starts (it then waits for ``end``); ``done`` when the
    call returned. ``outcome`` is what the call returned or raised."""

    def __init__(self, target: Callable[[], Any], barrier: threading.Barrier | None = None) -> None:
        super().__init__(daemon=True)
        self.target = target
        self.barrier = barrier
        self.entered = threading.Event()
        self.done = threading.Event()
        self.commands: queue_module.Queue[str] = queue_module.Queue()
        self.run_info: runs.Run | None = None
        self.returned: Any = None
        self.raised: BaseException | None = None
        self.backend_pid: int | None = None

    def run(self) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                self.backend_pid = int(cursor.fetchone()[0])
            if self.barrier is not None:
                self.barrier.wait(timeout=WAIT)
            self.returned = self.target()
        except BaseException as exc:
            self.raised = exc
        finally:
            connection.close()
            self.done.set()

    def settle(self) -> None:
        """Wait until the body is running (blocked on its command) or the call is over."""
        wait_for(lambda: self.entered.is_set() or self.done.is_set(), WAIT,
                 "a delivery to start its body or return", poll=0.005)

    def end(self, command: str) -> None:
        """Let the body end with ``command`` (ok, fail, logical, timeout) and wait for the call."""
        assert self.entered.is_set() and not self.done.is_set()
        self.commands.put(command)
        assert self.done.wait(WAIT), "a run did not end"
        self.join(WAIT)


def body(run: runs.Run) -> Any:
    """Every model job's body: wait for the state machine's word, then end as told."""
    worker = threading.current_thread()
    assert isinstance(worker, Worker)
    worker.run_info = run
    worker.entered.set()
    command = worker.commands.get(timeout=600)
    if command == "ok":
        return "ok"
    if command == "logical":
        return {"error": True, "message": "the job reported a failure", "error_code": "LOGICAL"}
    if command == "timeout":
        raise SoftTimeLimitExceeded()
    raise RuntimeError("the job raised")


@dataclasses.dataclass
class Jobs:
    """The model's jobs: declarations, Celery tasks and row ids."""

    declared: dict[str, registry.Job]
    tasks: dict[str, TrackedTask]
    ids: dict[str, int] = dataclasses.field(default_factory=dict)

    def key_of_task(self, task_name: str) -> str | None:
        for key, job in self.declared.items():
            if job.task_name == task_name:
                return key
        return None

    def key_of_id(self, job_id: int) -> str:
        return next(key for key, known in self.ids.items() if known == job_id)


@dataclasses.dataclass
class _Declared:
    jobs: Jobs
    names: list[str]


def declare_jobs(tag: str) -> _Declared:
    """Register the model's jobs (with the registry and the Celery app) for one test."""
    declared: dict[str, registry.Job] = {}
    made: dict[str, TrackedTask] = {}
    for spec in SPECS:
        task_name = f"tests.model.{tag}.{spec.key}"
        job = registry.register(registry.declare(
            name=f"model-{tag}-{spec.key}", code=f"M{tag}{spec.key}"[:30], task_name=task_name,
            pattern=spec.pattern, overlap=spec.overlap, catch_up=spec.catch_up, max_retries=spec.max_retries,
            retry_on_failure=spec.retry_on_failure, retry_backoff=1, retry_jitter=False,
            notify={"on_failure": ["webhook"], "on_recovery": ["webhook"]}, alert_after=spec.alert_after,
            max_concurrency=spec.max_concurrency,
        ))
        declared[spec.key] = job
        made[spec.key] = app.task(name=task_name, base=TrackedTask, job=job, max_retries=spec.max_retries,
                                  shared=False, lazy=False)(body)
    return _Declared(Jobs(declared, made), [job.name for job in declared.values()])


def forget_jobs(declared: _Declared) -> None:
    for name in declared.names:
        registry.unregister(name)
    for job in declared.jobs.declared.values():
        app.tasks.pop(job.task_name, None)


def reset(jobs: Jobs) -> None:
    """A fresh world for one example: no rows of the model's jobs, an empty queue, no cached ids."""
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {ALERT}")
        cursor.execute(f"DELETE FROM {EXE}")
        for counts in (models.Tally, models.Hour, models.Durations):  # the trigger-kept counts of the jobs
            cursor.execute(f"DELETE FROM {counts._meta.db_table}")
        cursor.execute(f"DELETE FROM {JOB}")
        cursor.execute(f"DELETE FROM {models.Lease._meta.db_table}")
    broker().delete(settings.CELERY_TASK_DEFAULT_QUEUE)
    cron_jobs._job_ids.clear()
    jobs.ids = {key: cron_jobs.job_id(job) for key, job in jobs.declared.items()}


# ---- the broker -------------------------------------------------------------------------------


_broker: redis.Redis | None = None


def broker() -> redis.Redis:
    global _broker
    if _broker is None:
        _broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    return _broker


@dataclasses.dataclass(frozen=True)
class Message:
    raw: bytes
    headers: dict[str, Any]
    args: list[Any]
    kwargs: dict[str, Any]

    @property
    def task(self) -> str:
        return str(self.headers["task"])

    @property
    def task_id(self) -> str:
        return str(self.headers["id"])

    @property
    def execution_id(self) -> int | None:
        value = self.headers.get(tasks.HEADER_EXECUTION)
        return int(value) if value is not None else None


def _parse(raw: bytes) -> Message:
    payload = json.loads(raw)
    body = json.loads(base64.b64decode(payload["body"]))
    return Message(raw=raw, headers=payload["headers"], args=list(body[0]), kwargs=dict(body[1]))


def queued() -> list[Message]:
    """The job messages in the session's queue (the package's own, alert deliveries, are dropped: the
    alert rows are what the model checks)."""
    name = settings.CELERY_TASK_DEFAULT_QUEUE
    messages = []
    for raw in reversed(broker().lrange(name, 0, -1)):
        assert isinstance(raw, bytes)
        message = _parse(raw)
        if message.task.startswith(INTERNAL):
            broker().lrem(name, 1, raw)  # type: ignore[arg-type]  # redis-py takes bytes too
            continue
        messages.append(message)
    # In an order that does not depend on which thread published first, so an example replays alike.
    return sorted(messages, key=lambda message: (message.execution_id or 0, str(message.headers.get("cron_trigger")),
                                                 int(message.headers.get("retries") or 0),
                                                 message.headers.get("eta") is not None,
                                                 bool(message.headers.get(tasks.HEADER_FORCE)),
                                                 bool(message.headers.get(tasks.HEADER_RERUN))))


def take(message: Message) -> bool:
    """Take one message off the queue, as a worker receives it."""
    return bool(broker().lrem(settings.CELERY_TASK_DEFAULT_QUEUE, 1, message.raw))  # type: ignore[arg-type]


def take_one(history: list[Message], index: int) -> Message | None:
    """Take the ``index``-th queued message (counting round) off the queue and add it to ``history``;
    None when the queue is empty."""
    messages = queued()
    if not messages:
        return None
    message = messages[index % len(messages)]
    assert take(message)
    history.append(message)
    return message


def take_all(history: list[Message]) -> list[Message]:
    """Take every message off the queue (each added to ``history``), to deliver them all."""
    messages = queued()
    for message in messages:
        assert take(message)
        history.append(message)
    return messages


def deliver(jobs: Jobs, message: Message) -> Callable[[], Any]:
    """What a worker does with a message: Celery's request built from it, then the task called
    (``TrackedTask.__call__``: claim, body, retry or fenced finish, the next waiting one sent)."""
    key = jobs.key_of_task(message.task)
    assert key is not None, message.task
    task = jobs.tasks[key]

    def call() -> Any:
        request = {**message.headers, "args": message.args, "kwargs": message.kwargs, "called_directly": False,
                   "is_eager": False, "hostname": "model-worker",
                   "delivery_info": {"exchange": "", "routing_key": settings.CELERY_TASK_DEFAULT_QUEUE}}
        task.push_request(**request)
        try:
            return task(*message.args, **message.kwargs)
        except Retry as retry:
            return retry
        finally:
            task.pop_request()

    return call


def run_in_process(jobs: Jobs, key: str, at: dt.datetime, *, force: bool = False,
                   rerun: bool = False) -> Callable[[], Any]:
    """What ``run_cron_task JOB --at SLOT`` does (no ``--enqueue``): the run in this process."""
    job = jobs.declared[key]
    task = jobs.tasks[key]

    def call() -> Any:
        outcome = runs.execute(job, at, lambda run: runs.call_job(task.run, run), trigger=models.Trigger.MANUAL,
                               force=force, rerun=rerun)
        if outcome.frees_job:
            tasks.send_waiting(app, job)
        return outcome

    return call


def in_thread(target: Callable[[], Any]) -> Any:
    """Run ``target`` on a connection of its own and return its result (or raise its error)."""
    worker = Worker(target)
    worker.start()
    assert worker.done.wait(WAIT), "an operation did not return"
    worker.join(WAIT)
    if worker.raised is not None:
        raise worker.raised
    return worker.returned


# ---- the beat, the admin, the reconciler ---------------------------------------------------------


def dispatch(jobs: Jobs, key: str, expected: dt.datetime | None, next_run_at: dt.datetime,
             run: list[dt.datetime], missed: list[dt.datetime]) -> tuple[bool, list[cron_dispatch.ToPublish]]:
    """What the leading beat does for one due job: one ``dispatch_many`` statement, then the
    messages of the rows it inserted, and the alert for slots it recorded MISSED."""
    from cron_celery.run import outcomes

    job = jobs.declared[key]
    decision = cron_dispatch.Decision(job_id=jobs.ids[key], expected_next_run_at=expected, next_run_at=next_run_at,
                               run=run, missed=missed, tz=job.tzinfo)
    advanced, publish, missed_count = cron_dispatch.dispatch_many([decision])
    for item in publish:
        tasks.publish(app, job.task_name, tasks.headers(item.execution_id, item.slot, item.trigger),
                      task_id=item.celery_task_id)
    if missed_count:
        outcomes.missed(repairs.newest_missed([jobs.ids[key]]))
    return jobs.ids[key] in advanced, publish


def reconcile() -> reconciler.Report:
    report = reconciler.run_pass()
    assert report.ran
    return report


class RowHolder(threading.Thread):
    """An open transaction that locks a job's row (an admin edit, the beat) until released."""

    def __init__(self, statement: str, params: list[Any]) -> None:
        super().__init__(daemon=True)
        self.statement, self.params = statement, params
        self.locked = threading.Event()
        self.release = threading.Event()
        self.done = threading.Event()
        self.backend_pid: int | None = None
        self.raised: BaseException | None = None

    def hold(self, cursor: Any) -> None:
        """What the transaction does before it waits (it holds what that locked)."""
        cursor.execute(self.statement, self.params)

    def run(self) -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                self.backend_pid = int(cursor.fetchone()[0])
                self.hold(cursor)
                self.locked.set()
                assert self.release.wait(WAIT)
        except BaseException as exc:
            self.raised = exc
        finally:
            self.locked.set()
            connection.close()
            self.done.set()


def blocked_by(holder_pid: int) -> bool:
    """Whether some backend waits for a lock that ``holder_pid`` holds."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", [holder_pid])
        return bool(cursor.fetchone()[0])


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    wait_for(predicate, WAIT, what, poll=0.005)


# ---- the clock and the rows ------------------------------------------------------------------------


def shift(seconds: int, execution_id: int | None = None) -> None:
    """Advance the database's clock for the model's rows: every (or one) due time and creation
    time moves ``seconds`` into the past (running attempts keep their leases: their workers renew them)."""
    only = "" if execution_id is None else " WHERE id = %s"
    params: list[Any] = [seconds, seconds, seconds] + ([] if execution_id is None else [execution_id])
    with connection.cursor() as cursor:
        cursor.execute(
            # A running attempt's worker renews its lease meanwhile: only due times move.
            f"UPDATE {EXE} SET lease_until = CASE WHEN status = 'RUNNING' THEN lease_until"
            f" ELSE lease_until - make_interval(secs => %s) END,"
            f" created_at = created_at - make_interval(secs => %s),"
            f" waiting_since = waiting_since - make_interval(secs => %s){only}",
            params,
        )


def expire(execution_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {EXE} SET lease_until = lease_until - make_interval(secs => %s) WHERE id = %s",
                       [EXPIRE_BY, execution_id])


@dataclasses.dataclass(frozen=True)
class Row:
    id: int
    job_id: int
    slot: dt.datetime
    run_number: int
    status: str
    trigger: str
    skip_reason: str
    forced: bool
    force: bool
    retry_count: int
    fence: int | None
    live: bool
    waiting: bool
    attempts: list[dict[str, Any]]
    celery_task_id: str
    error_code: str


#: The columns of a ``Row``, in its order.
ROW_COLUMNS = ("id, job_id, slot, run_number, status, trigger, skip_reason, forced, force, retry_count, fence,"
               " status = 'RUNNING' AND lease_until > now(), waiting_since IS NOT NULL, attempts, celery_task_id,"
               " error_code")


def read_rows(columns: str = ROW_COLUMNS) -> list[tuple[Any, ...]]:
    """Every execution's ``columns``, oldest first (``attempts``, the 14th, read from its JSON)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {columns} FROM {EXE} ORDER BY id")
        found = cursor.fetchall()
    return [tuple(item if i != 13 else (json.loads(item) if isinstance(item, str) else item)
                  for i, item in enumerate(values)) for values in found]


def rows() -> list[Row]:
    return [Row(*values) for values in read_rows()]


def claim_fences(row: Row) -> list[int]:
    """The fence of each claim of an execution, in order: its ``attempts`` history, or, while that
    is empty (a first attempt never retried, taken over or superseded), the row's own fence."""
    if row.attempts:
        return [int(entry["fence"]) for entry in row.attempts]
    return [row.fence] if row.fence is not None else []


@dataclasses.dataclass(frozen=True)
class JobRow:
    id: int
    paused: bool
    fence: int
    consecutive_failures: int
    fenced_count: int
    alerted: bool
    next_run_at: dt.datetime | None


def job_rows() -> dict[int, JobRow]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, paused, fence, consecutive_failures, fenced_count, alerted_at IS NOT NULL,"
                       f" next_run_at FROM {JOB}")
        return {int(values[0]): JobRow(*values) for values in cursor.fetchall()}


def alert_rows() -> set[tuple[int, int, str]]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT job_id, execution_id, event FROM {ALERT}")
        return {(int(a), int(b), str(c)) for a, b, c in cursor.fetchall()}


def expired_in_pass_order() -> list[int]:
    """The RUNNING executions whose lease expired, in the order the reconciler's first step takes them."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {EXE} WHERE status = 'RUNNING' AND lease_until < now() ORDER BY lease_until")
        return [int(row[0]) for row in cursor.fetchall()]


@dataclasses.dataclass
class Held:
    """Threads the example started; all are ended before the next example."""

    workers: list[Worker] = dataclasses.field(default_factory=list)

    def running(self) -> Iterator[Worker]:
        for worker in self.workers:
            if worker.entered.is_set() and not worker.done.is_set():
                yield worker

    def end_all(self) -> None:
        """Let every body still running end, and wait for every thread."""
        for worker in list(self.running()):
            worker.commands.put("ok")
        for worker in self.workers:
            worker.join(WAIT)


class Machine(RuleBasedStateMachine):
    """What the model tests' state machines share: the threads an example started, the messages
    workers received, and the drain at the end of each example (each machine says what a delivery
    and the end of a run are checked against)."""

    def __init__(self) -> None:
        super().__init__()
        self.held = Held()
        self.history: list[Message] = []  # every message a worker received
        self.ready = False  # the example's world is made: ``drain`` runs at its end

    def drain(self) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        try:
            if self.ready:
                self.drain()
        finally:
            self.held.end_all()

    def _deliver(self, message: Message) -> Any:
        raise NotImplementedError

    def _end_run(self, worker: Worker, result: str) -> None:
        raise NotImplementedError

    def settle_everything(self) -> bool:
        """Let every running body end ok and deliver every queued message; whether anything moved."""
        running = list(self.held.running())
        for worker in running:
            self._end_run(worker, "ok")
        messages = take_all(self.history)
        for message in messages:
            self._deliver(message)
        return bool(running or messages)


def delivery_rules() -> tuple[Any, Any]:
    """The rules of a worker receiving a message, for a ``Machine`` (set in its class body where the
    rules are listed: their place there is part of what a fixed-seed profile draws)."""

    @rule(index=PICK)
    def deliver(self: Machine, index: int) -> None:
        message = take_one(self.history, index)
        if message is not None:
            self._deliver(message)

    @rule(index=PICK)
    def deliver_again(self: Machine, index: int) -> None:
        """A broker redelivers a message a worker already received."""
        if self.history:
            self._deliver(self.history[index % len(self.history)])

    return deliver, deliver_again
