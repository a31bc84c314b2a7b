"""``manage.py run_cron_task NAME [DATE] [--at TIME] [--force] [--rerun] [--enqueue]``."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from cron_celery import claims, exceptions, models, registry, runs, schedule_sync, schedules, tasks

#: Exit codes: 0 ran (or the slot was already done), 1 failed or bad input, 2 refused.
EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2
REFUSED = {models.SkipReason.ALREADY_RUNNING, models.SkipReason.OVERLAP,
           models.SkipReason.PAUSED, models.SkipReason.LOCK_UNAVAILABLE}


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
        parser.add_argument("--force", action="store_true",
                            help="start a new run even if the slot already ran or the job is paused")
        parser.add_argument("--rerun", action="store_true",
                            help="run the slot again even if it already succeeded")
        parser.add_argument("--enqueue", action="store_true",
                            help="send the run to the Celery workers instead of running it here")

    def fail(self, message: str, code: int = EXIT_FAILED) -> CommandError:
        return CommandError(message.splitlines()[0] if message else "failed", returncode=code)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            job = registry.get(options["job"])
            slot = self._slot(job, options["date"], options["at"])
        except exceptions.CronCeleryError as exc:
            raise self.fail(str(exc)) from None
        if options["enqueue"]:
            self._enqueue(job, slot, force=options["force"], rerun=options["rerun"])
            return
        from celery import current_app

        task = current_app.tasks.get(job.task_name)
        if task is None:
            raise self.fail(f"Job {job.name!r} has no Celery task {job.task_name!r}.")
        trigger = models.Trigger.MANUAL
        outcome = runs.execute(
            job, slot, lambda run: runs.call_job(task.run, run), trigger=trigger,
            force=options["force"], rerun=options["rerun"],
        )
        label = f"{job.name} {schedules.iso(slot)}"
        where = f"(execution {outcome.execution_id}, run #{outcome.run_number})"
        if outcome.status == models.Status.SUCCEEDED:
            self.stdout.write(self.style.SUCCESS(
                f"{label} succeeded {where}: {outcome.message.splitlines()[0] if outcome.message else 'ok'}"
            ))
            return
        if outcome.status == models.Status.SKIPPED:
            text = f"{label} {outcome.message} {where}"
            if outcome.skip_reason in REFUSED:
                raise self.fail(text, EXIT_REFUSED)
            self.stdout.write(self.style.WARNING(text))
            return
        first = outcome.message.splitlines()[0] if outcome.message else ""
        raise self.fail(f"{label} {outcome.status.lower()} {where}: {first[:500]}")

    def _slot(self, job: registry.Job, day: str | None, at: str | None) -> dt.datetime:
        if at:
            slot = schedules.parse_slot(at, job.tzinfo)
            if day and schedules.execution_date(slot, job.tzinfo) != schedules.parse_date(day):
                raise exceptions.InvalidSlot(
                    f"--at falls on {schedules.execution_date(slot, job.tzinfo)} in "
                    f"{job.timezone}, not on {day}.", value=at)
            return slot
        date = schedules.parse_date(day) if day else dt.datetime.now(job.tzinfo).date()
        first = schedule_sync.in_effect(job).first_slot_on(date)
        if first is None:
            raise exceptions.InvalidSlot(
                f"job {job.name!r} has no slot on {date} ({job.schedule}); name one with --at.",
                value=day or str(date))
        return first

    def _enqueue(self, job: registry.Job, slot: dt.datetime, *, force: bool, rerun: bool) -> None:
        from celery import current_app

        execution_id, run_number = claims.enqueue(
            job=job, job_id=runs.job_id(job), slot=slot,
            execution_date=schedules.execution_date(slot, job.tzinfo),
            trigger=models.Trigger.ENQUEUE, forced=force or rerun,
        )
        headers = {tasks.HEADER_SLOT: schedules.iso(slot), tasks.HEADER_EXECUTION: execution_id,
                   tasks.HEADER_TRIGGER: models.Trigger.ENQUEUE}
        if force:
            headers[tasks.HEADER_FORCE] = True
        if rerun:
            headers[tasks.HEADER_RERUN] = True
        try:
            result = current_app.send_task(job.task_name, headers=headers)
        except Exception as exc:
            # Nothing was sent: close the PENDING row so it does not block the slot.
            claims.abandon(execution_id, f"Could not send the run to the broker: {exc}")
            raise self.fail(f"{job.name} {schedules.iso(slot)} could not be sent to the broker "
                            f"({type(exc).__name__}: {exc}); nothing will run.") from None
        claims.set_celery_task_id(execution_id, result.id)
        self.stdout.write(self.style.SUCCESS(
            f"{job.name} {schedules.iso(slot)} sent to the workers "
            f"(execution {execution_id}, run #{run_number}, task {result.id})"
        ))
