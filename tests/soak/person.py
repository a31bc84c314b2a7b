"""The soak's person: what somebody does to the jobs while the nemesis breaks the machines.

At seeded random moments the person records one-off runs of the job with parameters (some with
values given, some cancelled a moment later), sends runs of it with values given, and fires admin
edits (the nemesis' ``admin-edit`` fault): the fan-in's upstream S04 paused and resumed, and the
kwargs of S14's periodic task set to values good and bad (the fuzzed kinds of the admin-edit fuzz
test). Each act is a line in the markers' ``person.jsonl``, which the checker reads. It runs in the
soak's own process (Django set up), through the product's own functions and the ORM, as the admin
and ``run_cron_task`` do.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import DatabaseError, close_old_connections
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from tests.soak import spec as specs
from tests.soak.nemesis import HealLater

logger = logging.getLogger("soak")

#: Kwargs the admin-edit fault writes on S14's periodic task: taken (valid for its parameters)...
GOOD_KWARGS = ('{}', '{"region": "us"}', '{"region": "eu", "n": 7}', '{"n": -3}', '{"region": "us", "n": 0}')
#: ... and refused for that job alone (it keeps its previous values, and no other job stops).
BAD_KWARGS = ('{"region": "asia"}', '{"region": "\\u0000"}', '{"region": "\\ud800"}', '{"n": "seven"}',
              '{"n": 1' + "0" * 5000 + '}', '{"nope": 1}', 'not json at all', '[1, 2]', '{"region": "eu"',
              '{"region": "' + "x" * 100_000 + '"}', '{"region": "\\u202eus"}', '{"n": 1e400}',
              '{"n": true}', "{" * 3000 + "}" * 3000)


def periodic_task_of(code: str) -> PeriodicTask:
    spec = specs.BY_CODE[code]
    return PeriodicTask.objects.get(name=f"{spec.name} ({spec.code})")


def make_tracked_task() -> None:
    """The plain periodic task the soak tracks (TRACK_PERIODIC_TASKS names it): every 2 s."""
    every, _ = IntervalSchedule.objects.get_or_create(every=specs.BY_CODE["PT"].every,
                                                      period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.update_or_create(name=specs.TRACKED_TASK,
                                          defaults={"task": specs.TRACKED_TASK_NAME, "interval": every})


class Person:
    def __init__(self, markers: Path, seed: int, *, until: float) -> None:
        """``until``: wall-clock time the beats stop; no one-off is recorded for later than that."""
        self.until = until
        self.random = random.Random(seed * 7919 + 1)
        self.log_path = markers / "person.jsonl"
        self.next_act = time.monotonic() + self.random.uniform(2, 6)
        self.next_watch = time.monotonic()
        self.self_paused: dict[str, dt.datetime] = {}
        self.counts: dict[str, int] = {}

    def write(self, event: str, **fields: Any) -> None:
        self.counts[event] = self.counts.get(event, 0) + 1
        with open(self.log_path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"ev": event, "t": time.time(), **fields}) + "\n")

    def step(self, later: Callable[[float, Callable[[], None]], None]) -> None:
        """Act when the next act is due: a one-off (maybe cancelled ``later``) or a run with values."""
        if time.monotonic() < self.next_act:
            return
        self.next_act = time.monotonic() + self.random.expovariate(1 / 6)
        act = self.random.choice(["one-off", "one-off", "run"])
        given = self.random.choice([None, {"region": "us"}, {"region": "eu", "n": self.random.randint(-5, 99)}])
        try:
            if act == "run":
                self._run(given)
            else:
                self._one_off(given, later)
        except DatabaseError as error:  # the database is down or restarting: the person tries later
            close_old_connections()
            self.write("refused", act=act, why=f"{type(error).__name__}: {error}"[:300])

    def _run(self, given: dict[str, Any] | None) -> None:
        from cron_celery import exceptions, slots
        from cron_celery.declaring import registry
        from cron_celery.models import Trigger
        from cron_celery.run import tasks

        job = registry.get(specs.BY_CODE["S14"].name)
        instant = int(time.time())
        instant -= 1 if instant % specs.BY_CODE["S14"].every == 0 else 0  # not a slot the beat runs too
        slot = slots.parse_slot(dt.datetime.fromtimestamp(instant, dt.UTC), job.tzinfo)
        try:
            sent = tasks.send_run(job, slot, Trigger.ENQUEUE, given=given)
        except exceptions.PublishFailed as error:  # the broker is down: the row is closed FAILED
            self.write("run-unsent", given=given, why=str(error)[:300])
            return
        self.write("run", exec=sent.execution_id, given=given, slot=slot.timestamp())

    def _one_off(self, given: dict[str, Any] | None, later: Callable[[float, Callable[[], None]], None]) -> None:
        from cron_celery import exceptions
        from cron_celery.declaring import registry
        from cron_celery.run import tasks

        job = registry.get(specs.BY_CODE["S14"].name)
        at = int(time.time()) + self.random.randint(3, 25)
        at += 1 if at % specs.BY_CODE["S14"].every == 0 else 0  # never one of the job's own slots
        if at > self.until - 20:  # the beats end with the faults: a fault near the end could leave it unsent
            return
        try:
            recorded = tasks.schedule_one_off(job, dt.datetime.fromtimestamp(at, dt.UTC), given=given)
        except exceptions.OneOffRefused as error:
            self.write("one-off-refused", at=at, why=str(error)[:300])
            return
        self.write("one-off", exec=recorded.execution_id, at=at, given=given)
        if self.random.random() < 0.3:
            later(self.random.uniform(0, 6), lambda: self._cancel(recorded.execution_id))

    def _cancel(self, execution_id: int) -> None:
        from cron_celery.run import outcomes

        try:
            done = outcomes.cancelled([execution_id], "the soak's person")
        except DatabaseError as error:
            close_old_connections()
            self.write("cancel-failed", exec=execution_id, why=str(error)[:300])
            return
        self.write("cancelled" if done else "cancel-too-late", exec=execution_id)

    @staticmethod
    def _pause(task: PeriodicTask, seconds: float | None) -> dt.datetime | None:
        """Pause as the admin's Pause… does: the task disabled and, with ``seconds``, an end that far
        ahead of the database's clock, in one transaction. Returns the end."""
        from django.db import transaction

        from cron_celery.decisions import leadership, pauses

        with transaction.atomic():
            task.enabled = False
            task.save()
            if seconds is None:
                return None
            until = leadership.database_now() + dt.timedelta(seconds=seconds)
            pauses.say(task.cron_job.id, note="the soak's person", until=until, by="soak")
            return until

    # --- jobs that pause themselves ---------------------------------------------------------------

    def watch(self, later: Callable[[float, Callable[[], None]], None]) -> None:
        """A job that paused itself after its failures (``pause_after_failures``) is resumed a few
        seconds later, as a person who read its PAUSED alert would. Looked at once a second."""
        if time.monotonic() < self.next_watch:
            return
        self.next_watch = time.monotonic() + 1
        from cron_celery.decisions import pauses
        from cron_celery.models import CronJob

        for spec in specs.SPECS:
            if spec.pause_after_failures is None:
                continue
            try:
                found = CronJob.objects.filter(code=spec.code).values_list("paused", "paused_by", "paused_at").first()
            except DatabaseError:
                close_old_connections()
                return
            if not found or not found[0] or found[1] != pauses.BY_FAILURES or found[2] is None:
                continue
            if self.self_paused.get(spec.code) == found[2]:
                continue
            self.self_paused[spec.code] = found[2]
            self.write("self-paused", job=spec.code, at=found[2].timestamp())
            later(self.random.uniform(1, 5), functools.partial(self._resume, spec.code, later))

    def _resume(self, code: str, later: Callable[[float, Callable[[], None]], None]) -> None:
        try:
            task = periodic_task_of(code)
            if not task.enabled:
                self.write("resuming", job=code)  # before the save: the resume may commit from here on
                task.enabled = True
                task.save()
            self.write("resume", job=code)
        except DatabaseError:
            close_old_connections()
            later(3, functools.partial(self._resume, code, later))

    # --- the admin-edit fault -------------------------------------------------------------------

    def edit(self, pick: random.Random) -> tuple[str, str, Callable[[], None] | None] | None:
        """One admin edit: (target, detail, the heal that undoes it, if any), or None when the
        database is away (the nemesis draws another fault)."""
        try:
            return self._edit(pick)
        except PeriodicTask.DoesNotExist:  # no beat has synced the jobs yet
            return None
        except DatabaseError:
            close_old_connections()
            return None

    def _edit(self, pick: random.Random) -> tuple[str, str, Callable[[], None] | None]:
        if pick.random() < 0.4:
            task = periodic_task_of("S04")
            if not task.enabled:
                return "S04", "already paused", None

            def resume() -> None:
                for _ in range(6):
                    try:
                        task.refresh_from_db()
                        if task.enabled:  # its end came first: it resumed itself
                            self.write("resumed-by-end", job="S04")
                            return
                        task.enabled = True
                        task.save()
                        self.write("resume", job="S04")
                        return
                    except DatabaseError:
                        close_old_connections()
                        time.sleep(0.5)
                raise HealLater("S04 not resumed yet: the database is away")

            # Half the pauses have an end a few seconds ahead (the database's clock): the job resumes
            # itself then, unless the heal (a person's resume) comes first.
            ends = pick.random() < 0.5
            seconds = pick.uniform(2, 10)
            self.write("pause", job="S04")  # before the save: the pause starts after this line
            try:
                until = self._pause(task, seconds if ends else None)
            except DatabaseError:  # it may have committed all the same: resumed like any pause
                close_old_connections()
                self.write("pause-failed", job="S04")
                return "S04", "pause answered by a database error", resume
            if until is not None:
                self.write("pause-ends", job="S04", until=until.timestamp())
            return "S04", f"paused until {until:%H:%M:%S}" if until else "paused", resume
        text = pick.choice(GOOD_KWARGS if pick.random() < 0.5 else BAD_KWARGS)
        task = periodic_task_of("S14")
        good = text in GOOD_KWARGS
        said = {"job": "S14", "kwargs": text if len(text) < 200 else text[:60] + "...", "good": good,
                "values": json.loads(text) if good else None}
        task.kwargs = text
        try:
            task.save()
        except DatabaseError:  # it may have committed: from here on, either values may be in effect
            close_old_connections()
            self.write("kwargs", **said, uncertain=True)
            return "S14", f"kwargs answered by a database error: {text[:40]!r}", None
        self.write("kwargs", **said)
        return "S14", f"kwargs {'good' if good else 'bad'}: {text[:40]!r}", None
