"""Jobs removed from the code (``removals.sync``) against real PostgreSQL, with what runs at once with it.
The real-process tests are in tests/faults/test_dependency_gaps.py."""

from __future__ import annotations

import datetime as dt
import functools
import threading
from collections.abc import Callable

import pytest
from django.db import connection, connections, transaction

from cron_celery.decisions import audit, dispatch, jobs, removals
from cron_celery.models import CronExecution, CronJob, Status, Trigger
from cron_celery.schedules import every

pytestmark = pytest.mark.django_db(transaction=True)

SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)


def _in_thread(work: Callable[[], object], errors: list[BaseException]) -> threading.Thread:
    def body() -> None:
        try:
            work()
        except BaseException as error:  # reported by the test
            errors.append(error)
        finally:
            connections.close_all()
    thread = threading.Thread(target=body)
    thread.start()
    return thread


def test_two_beats_of_different_code_syncing_at_once_never_deadlock(declare):
    """A rolling deploy: the beat of the old code and the beat of the new one start at the same moment.
    Each brings back a job the other removed, while both removed jobs have an execution a retry left
    waiting. Each sync locks every job row it may write in one order (by id) before it writes, so one
    waits for the other instead of each holding the row the other wants (PostgreSQL would end one
    with "deadlock detected", and that beat would fail to start)."""
    kept = declare("rmc-kept", "RMC1", schedule=every(hours=1))
    old = declare("rmc-old", "RMC2", schedule=every(hours=1))  # declared by the old code only
    new = declare("rmc-new", "RMC3", schedule=every(hours=1))  # declared by the new code only
    ids = jobs.refresh_job_ids([kept, old, new])
    for _attempt in range(6):
        CronJob.objects.filter(id__in=[ids[old.code], ids[new.code]]).update(removed_at=SLOT)
        for job in (old, new):
            dispatch.enqueue(job=job, job_id=ids[job.code], slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.BEAT)
        held, release = threading.Event(), threading.Event()
        errors: list[BaseException] = []

        def hold(held: threading.Event = held, release: threading.Event = release) -> None:
            # an admin's save holding both rows: the syncs queue behind it, then go together
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM cron_celery_cronjob WHERE id = ANY(%s) FOR UPDATE",
                               [[ids[old.code], ids[new.code]]])
                held.set()
                release.wait(timeout=10)

        holder = _in_thread(hold, errors)
        assert held.wait(timeout=10)
        syncs = [_in_thread(functools.partial(removals.sync, code, source=audit.DEPLOY_SYNC), errors)
                 for code in ([kept, old], [kept, new])]
        threading.Event().wait(0.5)  # both syncs wait for the rows now
        release.set()
        for thread in (holder, *syncs):
            thread.join(timeout=30)
        assert not errors, errors
        assert CronJob.objects.filter(id=ids[kept.code], removed_at__isnull=True).exists()
        assert not CronExecution.objects.filter(job_id__in=[ids[old.code], ids[new.code]], status=Status.PENDING,
                                                job__removed_at__isnull=False).exists()
        CronExecution.objects.all().delete()
