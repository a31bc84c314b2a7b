"""``manage.py run_cron_task NAME [DATE] [--at TIME] [--param NAME=VALUE ...] [--force] [--rerun] [--cascade]
[--enqueue | --schedule]``."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import sys
from collections.abc import Iterator
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from cron_celery import enums, exceptions, slots
from cron_celery.decisions import dispatch, in_effect, jobs
from cron_celery.declaring import params, registry
from cron_celery.run import callers, runs, tasks

#: Exit codes: 0 ran (or the slot was already done), 1 failed or bad input, 2 refused.
EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2
REFUSED = {enums.SkipReason.ALREADY_RUNNING, enums.SkipReason.OVERLAP,
           enums.SkipReason.PAUSED, enums.SkipReason.LOCK_UNAVAILABLE, enums.SkipReason.CONCURRENCY}


class _NotTheOutcome(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, runs.OUTCOME, False)


@contextlib.contextmanager
def said_once() -> Iterator[None]:
    """In a project whose logging names no handler for cron_celery's records, Python's last
    resort would print the run's outcome to stderr and the command would print it again: while
    the run goes on, warnings go to stderr as before, less the outcome, which the command says."""
    found = logging.getLogger("cron_celery")
    if found.hasHandlers():  # the project's logging decides; its handlers keep every record
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.addFilter(_NotTheOutcome())
    found.addHandler(handler)
    try:
        yield
    finally:
        found.removeHandler(handler)


class Command(BaseCommand):
    help = (
        "Run one slot of a registered cron job in this process (or send it to the workers "
        "with --enqueue). Exit code 0: succeeded or already done; 1: failed, unknown job or "
        "bad date; 2: refused because the job is already running or paused."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job", help="the job's name (or code)")
        parser.add_argument("date", nargs="?", help="execution date YYYY-MM-DD (default: today)")
        parser.add_argument("--at", dest="at", help="exact slot, e.g. 2026-11-29T01:00 "
                            "(job's timezone unless an offset or Z is given)")
        parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                            help="a value of one of the job's parameters (again for each): a run with parameters, "
                                 "its own execution of the slot; the others take the scheduled values (the "
                                 "periodic task's kwargs), then the defaults")
        parser.add_argument("--force", action="store_true",
                            help="start a new run even if the slot already ran or the job is paused")
        parser.add_argument("--rerun", action="store_true",
                            help="run the slot again even if it already succeeded")
        parser.add_argument("--cascade", action="store_true",
                            help="when the run succeeds, run the slot of the jobs declared after= it again too")
        parser.add_argument("--enqueue", action="store_true",
                            help="send the run to the Celery workers instead of running it here")
        parser.add_argument("--schedule", action="store_true",
                            help="record a one-off run at --at (a future time) that the beat sends to the "
                                 "workers then, once; cancel it in the admin's history")

    def fail(self, message: str, code: int = EXIT_FAILED) -> CommandError:
        return CommandError(message.splitlines()[0] if message else "failed", returncode=code)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["schedule"]:
            together = [f"--{name}" for name in ("enqueue", "rerun", "cascade") if options[name]]
            if together or not options["at"]:
                raise self.fail(f"--schedule cannot be combined with {', '.join(together)}: a one-off run is a new "
                                "run at a time of its own." if together else
                                "--schedule needs --at, the time of the one-off run (e.g. --at 2026-12-01T18:00).")
        try:
            job = registry.get(options["job"])
            given = self._given(job, options["param"])
            slot = in_effect.slot_for(job, options["date"], options["at"])
            if options["schedule"]:
                self._schedule(job, slot, force=options["force"], given=given)
                return
            if given or any(param.required for param in job.parameters):
                tasks.with_scheduled(job, given)  # a required parameter left without a value: refused now
        except exceptions.CronCeleryError as exc:
            raise self.fail(str(exc)) from None
        if options["enqueue"]:
            self._enqueue(job, slot, force=options["force"], rerun=options["rerun"], cascade=options["cascade"],
                          given=given)
            return
        from celery import current_app

        task = current_app.tasks.get(job.task_name)
        if task is None:
            raise self.fail(f"Job {job.name!r} has no Celery task {job.task_name!r}.")
        try:  # before the --cascade row is written: nothing is recorded for a run that cannot run here
            callers.refuse_in_transaction(job.name)
        except exceptions.RunInTransaction as exc:
            raise self.fail(str(exc), EXIT_REFUSED) from None
        trigger = enums.Trigger.MANUAL
        execution_id = None
        if options["cascade"]:  # the row carries the cascade, so the database trigger sees it at the end
            execution_id, _number = dispatch.enqueue(
                job=job, job_id=jobs.job_id(job), slot=slot, execution_date=slots.execution_date(slot, job.tzinfo),
                trigger=trigger, forced=options["force"] or options["rerun"], force=options["force"], cascade=True,
                given=given)
        with said_once():
            outcome = runs.execute(
                job, slot, lambda run: runs.call_job(task.run, run, **run.params), trigger=trigger,
                execution_id=execution_id, force=options["force"], rerun=options["rerun"], given=given,
                params_given=bool(given),
            )
        if outcome.frees_job:  # a run the workers' backfill or retries wait for may start now
            tasks.send_waiting(current_app, job)
        if (outcome.status == enums.Status.SUCCEEDED and outcome.execution_id is not None
                and registry.has_downstream(job.name)):
            tasks.send_downstream(current_app, outcome.execution_id)  # jobs declared after= it
        label = f"{job.name} {slots.iso(slot)}" + (f" with {params.shown(given)}" if given else "")
        where = (f"(execution {outcome.execution_id}, recorded as a skip)" if outcome.status == enums.Status.SKIPPED
                 else f"(execution {outcome.execution_id}, run #{outcome.run_number})")
        if outcome.status == enums.Status.SUCCEEDED:
            self.stdout.write(self.style.SUCCESS(
                f"{label} succeeded {where}: {outcome.message.splitlines()[0] if outcome.message else 'ok'}"
            ))
            return
        if outcome.status == enums.Status.SKIPPED:
            text = f"{label} {outcome.message} {where}"
            if outcome.skip_reason in REFUSED:
                raise self.fail(text, EXIT_REFUSED)
            self.stdout.write(self.style.WARNING(text))
            return
        first = outcome.message.splitlines()[0] if outcome.message else ""
        raise self.fail(f"{label} {outcome.status.lower()} {where}: {first[:500]}")

    def _given(self, job: registry.Job, pairs: list[str]) -> dict[str, params.Json] | None:
        """The ``--param`` values, checked against the job's parameters (``InvalidParams`` names the
        one that is wrong); None without any."""
        if not pairs:
            return None
        split = []
        for text in pairs:
            try:
                split.append(params.parse_pair(text))
            except ValueError as error:
                raise exceptions.InvalidParams(f"--param: {error}.", job=job.name, field="--param") from None
        return params.from_text(job.parameters, split, job=job.name, tz=job.tzinfo)

    def _schedule(self, job: registry.Job, at: dt.datetime, *, force: bool,
                  given: dict[str, params.Json] | None = None) -> None:
        recorded = tasks.schedule_one_off(job, at, force=force, given=given)
        local = at.astimezone(job.tzinfo)
        self.stdout.write(self.style.SUCCESS(
            f"{job.name}: one-off run recorded for {slots.iso(at)} ({local:%Y-%m-%d %H:%M %Z} in {job.timezone}), "
            f"execution {recorded.execution_id}; the beat sends it then. Cancel it in the admin's history "
            "(action 'Cancel one-off runs not sent yet')."
        ))

    def _enqueue(self, job: registry.Job, slot: dt.datetime, *, force: bool, rerun: bool, cascade: bool,
                 given: dict[str, params.Json] | None = None) -> None:
        try:
            sent = tasks.send_run(job, slot, enums.Trigger.ENQUEUE, force=force, rerun=rerun, cascade=cascade,
                                  given=given)
        except exceptions.PublishFailed as exc:
            raise self.fail(f"{job.name} {slots.iso(slot)} {exc}") from None
        self.stdout.write(self.style.SUCCESS(
            f"{job.name} {slots.iso(slot)} sent to the workers "
            f"(execution {sent.execution_id}, run #{sent.run_number}, task {sent.celery_task_id})"
        ))
