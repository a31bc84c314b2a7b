"""A run's start and end reach the listeners, and a listener that fails never changes the outcome."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from cron_celery.alerts import signals
from cron_celery.models import Alert, CronExecution, CronJob, Status, Trigger
from cron_celery.run import events, runs
from tests.conftest import make_job

pytestmark = pytest.mark.django_db

SLOT = dt.datetime(2026, 11, 30, 3, 0, tzinfo=dt.UTC)


class Boom(events.Listener):
    """Hears everything, keeps it, and raises where it is told to."""

    def __init__(self, name: str, *, raise_on: tuple[str, ...] = (), records: bool = False,
                 sql: str = "") -> None:
        self.name = name
        self.raise_on = raise_on
        self.wants_record = records
        self.sql = sql
        self.heard: list[tuple[str, Any]] = []

    def _maybe(self, moment: str) -> None:
        if moment in self.raise_on:
            raise RuntimeError(f"{self.name} broke on {moment}")

    def records(self, ended: events.Ended) -> bool:
        return self.wants_record

    def record(self, ended: events.Ended) -> None:
        self.heard.append(("record", ended))
        if self.sql:
            with connection.cursor() as cursor:
                cursor.execute(self.sql, [ended.job_id])
        self._maybe("record")

    def started(self, started: events.Started) -> None:
        self.heard.append(("started", started))
        self._maybe("started")

    def ended(self, ended: events.Ended) -> None:
        self.heard.append(("ended", ended))
        self._maybe("ended")


@pytest.fixture
def first_in_line() -> Iterator[list[events.Listener]]:
    """Put listeners before the app's own (they are heard first); the app's are kept as they were."""
    before = events.listeners()
    added: list[events.Listener] = []
    yield added
    for listener in added:
        events.unsubscribe(listener.name)
    assert events.listeners() == before


def put_first(added: list[events.Listener], listener: events.Listener) -> None:
    kept = events.listeners()
    for known in kept:
        events.unsubscribe(known.name)
    for known in (listener, *kept):
        events.subscribe(known)
    added.append(listener)


def test_the_app_subscribes_the_outbox_the_signals_and_sentry_crons_in_that_order():
    assert [listener.name for listener in events.listeners()] == ["alerts", "signals", "sentry-crons"]


def test_a_listener_that_raises_at_the_start_and_the_end_changes_nothing_and_the_others_still_hear(
        first_in_line, caplog):
    job, job_id = make_job("always", "allow")
    boom = Boom("boom", raise_on=("started", "ended"))
    put_first(first_in_line, boom)
    heard: list[dict[str, Any]] = []

    def receiver(sender: str, **details: Any) -> None:
        heard.append(details)

    signals.execution_succeeded.connect(receiver)
    before = events.failures().get("boom", 0)
    try:
        with caplog.at_level(logging.ERROR, logger="cron_celery.run.events"):
            outcome = runs.execute(job, SLOT, lambda run: "done", trigger=Trigger.MANUAL)
    finally:
        signals.execution_succeeded.disconnect(receiver)
    assert outcome.status == Status.SUCCEEDED and outcome.execution_id is not None
    assert CronExecution.objects.get(id=outcome.execution_id).status == Status.SUCCEEDED
    assert [moment for moment, _ in boom.heard] == ["started", "ended"]
    started, ended = boom.heard[0][1], boom.heard[1][1]
    assert (started.execution_id, started.attempt, started.slot) == (outcome.execution_id, 1, SLOT)
    assert (ended.status, ended.final, ended.job_id) == (Status.SUCCEEDED, True, job_id)
    assert [details["execution_id"] for details in heard] == [outcome.execution_id]  # the signals came after
    assert events.failures()["boom"] == before + 2
    assert sum("the boom listener failed" in record.getMessage() for record in caplog.records) == 2


def test_a_recording_listener_that_raises_rolls_back_only_its_own_rows(first_in_line):
    """Its savepoint is rolled back (its write undone, the transaction usable even after a
    statement PostgreSQL refused); the outcome and the outbox's alert are written."""
    job, job_id = make_job("standard", "skip", notify={"on_failure": ["webhook"]})
    table = CronJob._meta.db_table
    boom = Boom("boom", records=True, raise_on=("record",),
                sql=f"UPDATE {table} SET paused = true WHERE id = %s")
    refused = Boom("refused", records=True, sql=f"SELECT 1 / 0 FROM {table} WHERE id = %s")
    put_first(first_in_line, refused)
    put_first(first_in_line, boom)
    before = events.failures()
    webhook = {"webhook": {"url": "http://127.0.0.1:9/hook", "secret": "a long random string"}}
    with override_settings(CRON_CELERY={**settings.CRON_CELERY, "NOTIFICATIONS": webhook}):
        outcome = runs.execute(job, SLOT, lambda run: {"error": True, "message": "partner down"},
                               trigger=Trigger.MANUAL)
    assert outcome.status == Status.FAILED
    row = CronJob.objects.get(id=job_id)
    assert (row.paused, row.consecutive_failures, row.last_status) == (False, 1, Status.FAILED)
    assert list(Alert.objects.filter(execution_id=outcome.execution_id).values_list("event", "channel")) == [
        ("FAILED", "webhook")]
    assert events.failures()["boom"] == before.get("boom", 0) + 1
    assert events.failures()["refused"] == before.get("refused", 0) + 1
    assert [moment for moment, _ in boom.heard] == ["started", "record", "ended"]


@pytest.mark.django_db(transaction=True)
def test_nothing_opens_a_transaction_for_an_outcome_no_listener_records(first_in_line, django_assert_num_queries):
    """With no channel configured the final write stays one statement: a listener that records
    nothing costs no transaction and no savepoint."""
    job, _ = make_job("always", "allow")
    put_first(first_in_line, Boom("quiet"))
    runs.execute(job, SLOT, lambda run: "warm", trigger=Trigger.MANUAL)  # the job's row id is cached now
    with django_assert_num_queries(2):  # the claim and the final write
        runs.execute(job, SLOT + dt.timedelta(minutes=1), lambda run: "done", trigger=Trigger.MANUAL)
