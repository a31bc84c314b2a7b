"""``TrackedTask`` (the Celery base class of every job) and the two ways to declare a job."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any, ClassVar

import celery

from cron_celery import enums, exceptions, slots
from cron_celery.decisions import dependencies, dispatch, groups, in_effect, jobs, oneoffs, tracked, waiting
from cron_celery.declaring import params, registry
from cron_celery.run import clocks, outcomes, runs

logger = logging.getLogger(__name__)

#: Message headers that beat and ``run_cron_task --enqueue`` put on a job's message.
HEADER_SLOT = "cron_slot"
HEADER_EXECUTION = "cron_execution_id"
HEADER_TRIGGER = "cron_trigger"
HEADER_FORCE = "cron_force"
HEADER_RERUN = "cron_rerun"
#: The code of a tracked periodic task's job (``decisions.tracked``): its body is the task's own.
HEADER_JOB = "cron_job"

def headers(execution_id: int, slot: dt.datetime, trigger: str, *, force: bool = False,
            rerun: bool = False) -> dict[str, Any]:
    """The message headers that point a delivery at its execution row."""
    values: dict[str, Any] = {HEADER_SLOT: slots.iso(slot), HEADER_EXECUTION: execution_id,
                              HEADER_TRIGGER: trigger}
    if force:
        values[HEADER_FORCE] = True
    if rerun:
        values[HEADER_RERUN] = True
    return values


#: The Celery task attributes that say where a job's message goes (``queue=``,
#: ``priority=``... given to the decorator or set on the task's class).
MESSAGE_OPTIONS = ("queue", "routing_key", "exchange", "exchange_type", "priority", "delivery_mode")


def message_options(app: celery.Celery, task_name: str) -> dict[str, Any]:
    """The options every message of a job is sent with — beat's dispatch, ``send_run``
    (``--enqueue``, the admin, the API, backfills), retries, the parent's and the
    reconciler's resends: the task's own ``queue``, ``routing_key``, ``priority``...
    ``send_task`` then applies ``task_routes`` to what the task leaves unset (the task's own
    options win, as with ``apply_async``). Passed explicitly because before Celery 5.7
    ``send_task`` ignored the task's options, and 5.7 applies them only once the app is
    finalized. A task this process does not know gets ``task_routes`` alone. A tracked periodic
    task's job (its row names an alias: ``decisions.tracked``) adds its periodic task's own
    ``queue``, ``exchange``, ``routing_key`` and ``priority`` over its task's."""
    code = tracked.code_of(task_name)
    if code is not None:
        try:
            sent = tracked.contents(code)
        except Exception:  # its periodic task is gone, or its row cannot be read: sending it says so
            return {}
        return {**message_options(app, sent.task),
                **{key: value for key, value in sent.options.items() if key in MESSAGE_OPTIONS}}
    try:
        task = app.tasks.get(task_name)
    except RuntimeError:  # an app declared with autofinalize=False that is not finalized yet
        task = None
    if task is None:
        return {}
    return {name: value for name in MESSAGE_OPTIONS if (value := getattr(task, name, None)) is not None}


def publish(app: celery.Celery, task_name: str, message_headers: dict[str, Any], *, task_id: str | None = None,
            countdown: float | None = None, **transport: Any) -> Any:
    """Send one message of a job with its routing (``message_options``); ``transport`` is
    ``producer=`` or ``connection=``. A ``countdown`` becomes an ``eta`` on the database's clock
    (``clocks``). Returns Celery's ``AsyncResult``.

    A tracked periodic task's job (its row names an alias: ``decisions.tracked``) is sent as
    ``DatabaseScheduler`` sends its periodic task: its own task, with the periodic task's arguments,
    options (``expires`` too) and headers, and ours beside them (``HEADER_JOB`` names the job)."""
    eta = clocks.eta(countdown) if countdown else None
    code = tracked.code_of(task_name)
    if code is not None:
        sent = tracked.contents(code)
        return app.send_task(sent.task, args=sent.args, kwargs=sent.kwargs, task_id=task_id, eta=eta,
                             headers={**sent.headers, **message_headers, HEADER_JOB: code},
                             **{**message_options(app, sent.task), **sent.options}, **transport)
    return app.send_task(task_name, task_id=task_id, headers=message_headers, eta=eta,
                         **message_options(app, task_name), **transport)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sent:
    """A run sent to the workers on request: its PENDING execution and Celery task."""

    execution_id: int
    run_number: int
    celery_task_id: str


def with_scheduled(job: registry.Job, given: Mapping[str, params.Json] | None) -> dict[str, params.Json]:
    """The values a run sent now runs with: ``given`` (a person's, checked) over the job's scheduled
    ones (its periodic task's kwargs in effect), the rest its defaults. Raises ``InvalidParams`` when
    they would not run — a required parameter without a value, or a scheduled value the code no
    longer takes (a deploy since the kwargs were checked) — before anything is recorded or sent."""
    merged = {**(jobs.scheduled_params(job) or {}), **(given or {})} if job.parameters else dict(given or {})
    checked = params.from_json(job.parameters, merged, job=job.name, tz=job.tzinfo)
    params.require(job.parameters, checked, job=job.name)
    return checked


def send_run(job: registry.Job, slot: dt.datetime, trigger: str, *, force: bool = False,
             rerun: bool = False, cascade: bool = False, given: Mapping[str, params.Json] | None = None) -> Sent:
    """Send one run of a slot to the workers (``run_cron_task --enqueue``, the API, the admin,
    backfills): a PENDING execution, then its message. If the broker refuses the message the
    execution is closed FAILED (``PUBLISH_FAILED``) and ``PublishFailed`` is raised.

    ``given``: parameter values a person gave (checked: ``params.from_text``/``from_json``). Then it
    is a run with parameters: its own execution of the slot, which the slot's regular run neither
    counts nor is skipped by (see ``claims``); its row holds them over the scheduled ones. Without
    them the run takes the scheduled values and is a regular run of the slot, as before."""
    from celery import current_app

    if given or any(param.required for param in job.parameters):
        with_scheduled(job, given)  # refuse a run that could only fail for a missing value
    execution_id, run_number = dispatch.enqueue(
        job=job, job_id=jobs.job_id(job), slot=slot, execution_date=slots.execution_date(slot, job.tzinfo),
        trigger=trigger, forced=force or rerun, force=force, cascade=cascade, given=given or None,
    )
    try:
        result = publish(current_app, job.task_name, headers(execution_id, slot, trigger, force=force, rerun=rerun))
    except Exception as exc:
        # Nothing was sent: close the PENDING row so it does not block the slot.
        outcomes.unsent(job, execution_id, f"Could not send the run to the broker: {exc}")
        raise exceptions.PublishFailed(f"({type(exc).__name__}: {exc})") from None
    dispatch.set_celery_task_id(execution_id, result.id)
    return Sent(execution_id=execution_id, run_number=run_number, celery_task_id=str(result.id))


def schedule_one_off(job: registry.Job, at: dt.datetime, *, force: bool = False,
                     given: Mapping[str, params.Json] | None = None) -> oneoffs.Recorded:
    """Record a one-off run of ``job`` at ``at`` for the beat to send then (``oneoffs``): the
    ``--schedule`` of ``run_cron_task``, the admin and the run endpoint. Raises ``OneOffRefused``
    saying what to do instead: ``at`` is past, a slot the job's schedule in effect runs anyway (not
    paused, inside its window), or already holds a one-off of the job waiting to be sent. ``at`` is
    read as ``run_cron_task --at`` reads it (a naive time in the job's timezone; whole seconds)."""
    at = slots.parse_slot(at, job.tzinfo)
    schedule = (in_effect.slots_of(job) if job.after else in_effect.in_effect(job)).schedule
    try:
        is_slot = schedule is not None and schedule.next_after(at - dt.timedelta(microseconds=1)) == at
    except (exceptions.InvalidSchedule, *slots.CALENDAR_ERRORS):
        raise exceptions.OneOffRefused(f"the job's schedule has no slot from then on before the calendar ends "
                                       f"({schedule}); choose an earlier time.", job=job.name,
                                       at=slots.iso(at)) from None
    if is_slot and in_effect.runs_at(job, at):
        raise exceptions.OneOffRefused(
            f"it is a slot the job's schedule in effect runs anyway ({schedule}); choose another minute "
            "(or send a run now with --enqueue).", job=job.name, at=slots.iso(at))
    if given or any(param.required for param in job.parameters):
        with_scheduled(job, given)
    try:
        return oneoffs.record(job, jobs.job_id(job), at, force=force, given=given or None)
    except ValueError as error:
        raise exceptions.OneOffRefused(f"{error}.", job=job.name, at=slots.iso(at)) from None


def send(app: celery.Celery, task_name: str, *, execution_id: int, slot: dt.datetime, trigger: str,
         countdown: float | None = None, celery_task_id: str | None = None, rerun: bool = False) -> None:
    """Send a message for an existing execution (a retry, the reconciler re-sending one, a
    recorded backfill slot)."""
    publish(app, task_name, headers(execution_id, slot, trigger, rerun=rerun), task_id=celery_task_id,
            countdown=countdown)


def named_slot(job: registry.Job, slot: object, day: object) -> dt.datetime | None:
    """The slot a direct call names (``slot=``, else ``execution_date=``), None for none; ``InvalidSlot``
    when it cannot be read or is outside the calendar."""
    if slot is None and day is not None:
        slot = day if isinstance(day, dt.date) else slots.parse_date(str(day))
    return None if slot is None else slots.parse_slot(slot, job.tzinfo)


def _due(options: dict[str, Any]) -> dt.datetime:
    """When a message sent with these ``apply_async`` options is due to run (UTC)."""
    eta = options.get("eta")
    if isinstance(eta, str):
        eta = dt.datetime.fromisoformat(eta)
    if isinstance(eta, dt.datetime):  # naive: UTC, as Celery reads it by default
        return eta if eta.tzinfo is not None else eta.replace(tzinfo=dt.UTC)
    now = clocks.now()
    countdown = options.get("countdown")
    return now + dt.timedelta(seconds=float(countdown)) if countdown else now


def send_waiting(app: celery.Celery, job: registry.Job) -> None:
    """A run of this job with a limit (overlap ``skip``, ``max_concurrency``, a concurrency group)
    just ended: send the execution that waits for its place, if any — the job's oldest (``waiting``),
    or for a job of a group the group's oldest that fits (``groups``). If the broker refuses, the
    reconciler sends it after ``PENDING_GRACE``."""
    grouped = job.concurrency_group is not None and groups.limit(job.concurrency_group) is not None
    if job.limit is None and not grouped:
        return
    try:
        nxt = groups.next_to_run(job.concurrency_group) if grouped and job.concurrency_group \
            else waiting.next_to_run(jobs.job_id(job))
        if nxt is not None:
            send(app, nxt.task_name, execution_id=nxt.execution_id, slot=nxt.slot, trigger=nxt.trigger,
                 celery_task_id=nxt.celery_task_id or None)
    except Exception:  # the outcome is recorded; the reconciler covers a lost send
        logger.exception("could not send the execution of %s that waits for the run that just ended", job.name)


def send_downstream(app: celery.Celery, execution_id: int) -> int:
    """After the commit of an execution's success: send the downstream executions it created (jobs
    declared with ``after=``; see ``dependencies``). A send that fails is logged; the reconciler
    sends such an execution after ``PENDING_GRACE``, as any PENDING one no worker started."""
    sent = 0
    try:
        for item in dependencies.created_by([execution_id]):
            send(app, item.task_name, execution_id=item.execution_id, slot=item.slot, trigger=enums.Trigger.UPSTREAM,
                 celery_task_id=item.celery_task_id or None)
            sent += 1
    except Exception:  # recorded in the database; the reconciler covers a lost send
        logger.exception("could not send the downstream executions of execution %s; the reconciler will",
                         execution_id)
    return sent


class TrackedTask(celery.Task):  # type: ignore[type-arg]
    """A Celery task that runs one slot of a job exactly once and records it.

    Called by a worker with the slot headers (from beat or ``--enqueue``) it claims that
    execution; called without them (``task.delay(slot=...)``, ``task()``) it creates one
    for the given slot (``slot=`` or ``execution_date=``; default: the current minute).
    """

    #: The job's declaration; set when the task is declared.
    job: ClassVar[registry.Job | None] = None
    #: Acknowledge after the run, and requeue if the worker dies: safe, because the
    #: database claim refuses a second run of the same execution.
    acks_late = True
    reject_on_worker_lost = True
    #: The worker's parent records a child killed by the hard time limit or lost (``parent``).
    Request = "cron_celery.run.parent:CronRequest"
    #: Jobs take a ``Run``, not the message's arguments: do not check call signatures.
    typing = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        job = self.job or registry.by_task_name(self.name)
        if job is None:
            raise exceptions.UnknownJob(name=self.name, known="(not declared as a job)")
        request = self.request
        execution_id = request.get(HEADER_EXECUTION)
        slot_value = kwargs.pop("slot", None) or request.get(HEADER_SLOT)
        day = kwargs.pop("execution_date", None)
        force = bool(kwargs.pop("force", False) or request.get(HEADER_FORCE))
        rerun = bool(kwargs.pop("rerun", False) or request.get(HEADER_RERUN))
        slot = named_slot(job, slot_value, day) or slots.floor_minute(clocks.now())
        trigger = request.get(HEADER_TRIGGER) or (
            enums.Trigger.BEAT if execution_id is not None else enums.Trigger.DIRECT
        )
        on_worker = not (request.called_directly or request.is_eager)
        # A direct call's keyword arguments that name the job's parameters are its values: checked,
        # and stored on the execution it inserts. A message for an existing execution runs with the
        # values on its row, whatever it carries (the row is the truth).
        names = {param.name for param in job.parameters}
        passed = {name: kwargs.pop(name) for name in list(kwargs) if name in names}
        given, refused = None, None
        if passed and execution_id is None:
            try:
                given = params.from_json(job.parameters, passed, job=job.name, tz=job.tzinfo)
            except exceptions.InvalidParams as error:  # recorded: the run fails with it, uncalled
                refused = error
        elif passed:
            # A retry of a direct call carries its first message's arguments again: nothing to warn of.
            logger.info("%s: the message's %s are ignored; execution %s runs with the parameters on its row",
                        job.name, ", ".join(sorted(passed)), execution_id)

        def call(run: runs.Run) -> Any:
            if refused is not None:
                raise refused
            return runs.call_job(self.run, run, *args, **kwargs, **run.params)

        outcome = runs.execute(
            job, slot, call,
            trigger=trigger, execution_id=int(execution_id) if execution_id else None,
            force=force, rerun=rerun, celery_task_id=request.id or "", allow_retry=on_worker, given=given,
        )
        if outcome.frees_job:
            send_waiting(self.app, job)
        if (outcome.status == enums.Status.SUCCEEDED and outcome.execution_id is not None
                and registry.has_downstream(job.name)):
            send_downstream(self.app, outcome.execution_id)
        if outcome.status == enums.Status.RETRYING and outcome.execution_id is not None:
            # The lock is released and the row says RETRYING; the new message claims it.
            raise self.retry(
                countdown=outcome.countdown, exc=outcome.exc if isinstance(outcome.exc, Exception) else None,
                max_retries=job.max_retries,
                headers=headers(outcome.execution_id, slot, trigger, force=force, rerun=rerun),
                **message_options(self.app, self.name),
            )
        if outcome.exc is not None:
            raise outcome.exc
        return {
            "execution_id": outcome.execution_id,
            "status": outcome.status,
            "message": outcome.message[:500],
            "result": outcome.result,
        }

    def apply_async(self, args: Any = None, kwargs: Any = None, *rest: Any, **options: Any) -> Any:
        """Send a message; one that names no slot (``delay()``) names its minute now — the
        minute it is due (``eta``/``countdown``), else the current one — so a redelivery later (a
        worker died) runs the same slot, not the minute it arrives in. Both the minute and a
        ``countdown`` (a retry's too) are read on the database's clock (``clocks``), not this
        process's: the countdown is sent as an ``eta``."""
        if options.get("countdown") and options.get("eta") is None:
            options["eta"] = clocks.eta(options.pop("countdown"))
        message_headers = dict(options.pop("headers", None) or {})
        named = bool(kwargs) and any(key in kwargs for key in ("slot", "execution_date"))
        job = self.job or registry.by_task_name(self.name)
        if named and job is not None:  # a slot that cannot be read is refused here, not lost on a worker
            named_slot(job, kwargs.get("slot"), kwargs.get("execution_date"))
        if not named and HEADER_SLOT not in message_headers and HEADER_EXECUTION not in message_headers:
            message_headers[HEADER_SLOT] = slots.iso(slots.floor_minute(_due(options)))
        return super().apply_async(args, kwargs, *rest, headers=message_headers, **options)

    def run(self, run: runs.Run, *args: Any, **kwargs: Any) -> Any:
        """Class-style jobs implement ``execute(date)`` (with their parameters after ``*``); this calls it."""
        return self.execute(run.execution_date, **run.params)

    def execute(self, date: dt.date) -> Any:
        """The body of a class-style job: a subclass declared with ``@register_task`` overrides it.

        It is called once per run, in the worker (or in-process for ``run_cron_task``), with the
        run's execution date; the job's parameters, if it has any, are keyword-only arguments
        after ``*`` (``def execute(self, date, *, region: str = "eu")``), read from this signature
        when the job is declared. It may be ``async def``.

        What it returns is recorded as the run's outcome: any JSON value is a success (a string
        becomes the execution's message); ``{"error": False, "message": ...}`` is a success with
        that message; ``{"error": True, "message": ..., "error_code": ...}`` is a failure (error
        code ``JOB_ERROR`` when none is given) while the Celery task itself returns normally; a
        value that is not JSON is a failure with error code ``NOT_JSON``. A failure ends ``FAILED``
        once no retry is left.

        An exception it raises is a failure with its message, error code (its ``error_code``
        attribute, else its class name) and traceback, raised again after it is recorded so Celery
        sees it; Celery's ``SoftTimeLimitExceeded`` is recorded ``TIMED_OUT``. Raise
        ``JobFailed(message, error_code=...)`` to report a failure Celery should see. A job with
        ``max_retries`` retries the exceptions in ``retry_on`` (any ``Exception`` by default), and
        reported failures (``{"error": True}``, ``JobFailed``) only with ``retry_on_failure=True``.

        ```python
        def execute(self, date: dt.date) -> str:
            return f"Books of {date} closed"
        ```

        :param date: The execution date: the run's slot as a date in the job's timezone.
        :returns: The run's result: a JSON value, or the ``{"error": ...}`` dict above.
        :raises NotImplementedError: the subclass does not override it.
        """
        raise NotImplementedError(f"{type(self).__name__} must define execute(self, date)")
