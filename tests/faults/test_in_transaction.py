"""An in-process run inside the caller's own transaction (``transaction.atomic()``, a view under
``ATOMIC_REQUESTS``), with a real ``celery beat`` running: the run is refused at once with
``RunInTransaction`` and nothing is written or locked, so the beat keeps dispatching the job's and
every other job's slots while the caller's transaction stays open. Outside the transaction the
same call runs."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.db.models import Max

from cron_celery import exceptions
from cron_celery.models import CronExecution, Status, Trigger
from tests.conftest import Queue, wait_for
from tests.faults.test_beat import beat_log, start_beat, stop
from tests.jobsapp import jobs_ident

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: The beat's jobs: txn-held and txn-other every second; one beat that always leads.
TICKING = {"CRON_TEST_IN_TRANSACTION": "1", "CRON_CELERY_BEAT_ALWAYS_LEAD": "1"}
CODES = ("X701", "X702")
#: How many new slots of each job the beat must dispatch while the caller's transaction is open.
SLOTS = 3


def newest(code: str) -> int:
    return CronExecution.objects.filter(task_code=code).aggregate(newest=Max("id"))["newest"] or 0


def dispatched_since(marks: dict[str, int]) -> dict[str, int]:
    """Slots the beat committed, per job, since ``marks`` (read on the calling thread's own connection)."""
    return {code: CronExecution.objects.filter(task_code=code, id__gt=marks[code], trigger=Trigger.BEAT).count()
            for code in CODES}


def test_an_in_process_run_inside_a_callers_transaction_is_refused_and_the_beat_goes_on(tmp_path: Path,
                                                                                       queue: Queue):
    """Issue 35 item 7."""
    beat = start_beat(tmp_path, TICKING, 0)
    try:
        wait_for(lambda: all(newest(code) for code in CODES), timeout=60,
                 what="the beat to dispatch both one-second jobs")
        marks = {code: newest(code) for code in CODES}
        seen: dict[str, int] = {}
        went_on = threading.Event()

        def watch() -> None:
            """On a connection of its own: did the beat commit new slots of both jobs meanwhile?"""
            try:
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    seen.update(dispatched_since(marks))
                    if all(count >= SLOTS for count in seen.values()):
                        went_on.set()
                        return
                    time.sleep(0.2)
            finally:
                jobs_ident.RELEASE.set()  # today's in-process run holds on until now
                connection.close()

        jobs_ident.RELEASE.clear()
        jobs_ident.SEEN.clear()
        watcher = threading.Thread(target=watch)
        refused: exceptions.RunInTransaction | None = None
        result: object = None
        began = time.monotonic()
        with transaction.atomic():
            CronExecution.objects.filter(task_code="X702").exists()  # the caller's own work in its transaction
            watcher.start()
            try:
                result = jobs_ident.txn_held()
            except exceptions.RunInTransaction as error:
                refused = error
            refused_after = time.monotonic() - began
            watcher.join(timeout=90)  # the caller keeps its transaction open meanwhile
        assert went_on.is_set(), (
            f"while a caller's transaction was open around an in-process run of txn-held, the beat committed "
            f"only {seen} new slots in 20 s (in-process result: {result}, told to stop: {jobs_ident.SEEN})")
        assert refused is not None, f"the in-process run inside the transaction was not refused: {result}"
        assert refused_after < 10, "refused only after the run"  # a guard, not a measure: it ran at once or not
        assert refused.error_code == "IN_TRANSACTION" and "inside the caller's database transaction" in str(refused)
        assert "'txn-held'" in str(refused)
        assert not CronExecution.objects.filter(task_code="X701").exclude(trigger=Trigger.BEAT).exists(), \
            "the refused run left a row"
        # Outside the transaction the same call runs in-process, and the beat still goes on.
        jobs_ident.RELEASE.set()
        outcome = jobs_ident.txn_held()
        assert outcome["status"] == Status.SUCCEEDED and outcome["result"] == "released", outcome
        marks = {code: newest(code) for code in CODES}
        wait_for(lambda: all(count >= 1 for count in dispatched_since(marks).values()), timeout=30,
                 what="the beat to go on after the run")
        assert beat.poll() is None, beat_log(tmp_path, 0)[-3000:]
    finally:
        jobs_ident.RELEASE.set()
        stop(beat)
