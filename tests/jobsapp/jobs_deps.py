"""Dependencies whose upstream never runs a slot, and a job removed from the code
(tests/faults/test_dependency_gaps.py). Declared only in the processes the test starts, by
CRON_TEST_DEPS:

- ``paused`` / ``window``: ``fan-a`` and ``fan-b`` every two seconds, ``fan-in`` after both
  (``alert_on_upstream=True``) and ``fan-end`` after ``fan-in``. Under ``window`` the window of
  ``fan-b`` opens in 2099: it never runs a slot of today. Under ``cancel`` the messages of ``fan-b``
  go to a queue no worker of the test consumes: its slots stay PENDING until somebody cancels them.
- ``chain``: ``rm-up`` every two seconds and ``rm-down`` after it; ``chain-removed``: ``rm-up``
  alone (the deploy that removed ``rm-down``). With CRON_TEST_DIE_AFTER_RM_UP set, a worker kills
  itself (its whole process group) once a success of ``rm-up`` is committed and announced: the
  downstream execution it recorded is never sent.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

from django.dispatch import receiver

from cron_celery import Run, cron_task
from cron_celery.alerts.signals import execution_succeeded
from cron_celery.schedules import every
from tests.jobsapp.tasks import mark

MODE = os.environ.get("CRON_TEST_DEPS", "")
_TICK: dict[str, Any] = {"schedule": every(seconds=2), "pattern": "always", "overlap": "allow", "catch_up": "none"}

if MODE in ("paused", "window", "cancel"):
    _b_extra: dict[str, Any] = {"active_from": dt.datetime(2099, 1, 1, tzinfo=dt.UTC)} if MODE == "window" else {}
    if MODE == "cancel":
        _b_extra["queue"] = f"{os.environ.get('CRON_CELERY_TEST_QUEUE', 'cron-celery-test')}-q-nobody"

    @cron_task(name="fan-a", code="D501", **_TICK)
    def fan_a(run: Run) -> str:
        mark(run, "fan-a")
        return "a"

    @cron_task(name="fan-b", code="D502", **_TICK, **_b_extra)
    def fan_b(run: Run) -> str:
        mark(run, "fan-b")
        return "b"

    @cron_task(name="fan-in", code="D503", after=["fan-a", "fan-b"], alert_on_upstream=True)
    def fan_in(run: Run) -> str:
        mark(run, "fan-in")
        return "in"

    @cron_task(name="fan-end", code="D504", after="fan-in", alert_on_upstream=True)
    def fan_end(run: Run) -> str:
        mark(run, "fan-end")
        return "end"

if MODE in ("chain", "chain-removed"):
    @cron_task(name="rm-up", code="D511", **_TICK)
    def rm_up(run: Run) -> str:
        mark(run, "rm-up")
        return "up"

if MODE == "chain":
    @cron_task(name="rm-down", code="D512", after="rm-up")
    def rm_down(run: Run) -> str:
        mark(run, "rm-down")
        return "down"


@receiver(execution_succeeded)
def _die_after_rm_up(sender: object = None, **kwargs: Any) -> None:
    if kwargs.get("job") == "rm-up" and os.environ.get("CRON_TEST_DIE_AFTER_RM_UP"):
        os.killpg(os.getpgid(0), 9)  # the whole worker, between the committed success and the send
