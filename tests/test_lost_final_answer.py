"""A final write whose COMMIT reached PostgreSQL but whose answer never came back (issue 35, item 15):
the run path tries again on a new connection, finds its outcome already written (``written_by``),
and the listeners hear of it exactly once, with what they would have heard had the answer arrived
(the first success after a failure is a recovery).

The connection is cut for real: the test's database connections go through a TCP proxy that
forwards the final write's ``COMMIT`` to the server and then closes both sides before the server's
answer is forwarded.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, connections
from django.test import override_settings

from cron_celery.alerts import signals
from cron_celery.models import CronExecution, Status, Trigger
from cron_celery.run import events, runs
from tests.conftest import make_job
from tests.proxy import TcpProxy

pytestmark = pytest.mark.django_db(transaction=True)

SLOT = dt.datetime(2031, 7, 1, 0, 0, tzinfo=dt.UTC)


class CommitCutter(TcpProxy):
    """Forwards everything; once ``armed``, the next ``COMMIT`` a client sends reaches the server and
    then the connection is closed both ways, before the server's answer is forwarded."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        super().__init__(target_port, target_host)
        self.armed = threading.Event()
        self.cut_done = threading.Event()

    def cut_after(self, from_client: bool, data: bytes) -> bool:
        """Once armed, the connection ends right after the client's COMMIT reaches the server: the
        caller closes both sockets, so the server's answer is never forwarded."""
        if from_client and self.armed.is_set() and b"COMMIT\x00" in data:
            self.armed.clear()
            self.cut_done.set()
            return True
        return False


@pytest.fixture
def cutter() -> Iterator[CommitCutter]:
    """The default connection (in every thread) goes through the proxy for the test."""
    saved = dict(connection.settings_dict)
    proxy = CommitCutter(int(saved.get("PORT") or 5432), str(saved.get("HOST") or "127.0.0.1"))
    proxy.start()
    connections.close_all()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=str(proxy.port))
    try:
        yield proxy
    finally:
        connections.close_all()
        connection.settings_dict.update(HOST=saved.get("HOST"), PORT=saved.get("PORT"))
        proxy.close()


class Heard(events.Listener):
    """Every announcement, as the listeners hear it."""

    name = "test-heard"

    def __init__(self) -> None:
        self.ended_events: list[events.Ended] = []

    def ended(self, ended: events.Ended) -> None:
        self.ended_events.append(ended)


@contextlib.contextmanager
def listening() -> Iterator[tuple[Heard, list[tuple[str, int]]]]:
    heard, sent = Heard(), []

    def on_signal(signal_name: str) -> Any:
        def receive(sender: str, execution_id: int, **_: Any) -> None:
            sent.append((signal_name, execution_id))
        return receive

    receivers = {signal: on_signal(name) for name, signal in
                 (("succeeded", signals.execution_succeeded), ("recovered", signals.execution_recovered))}
    for signal, receiver in receivers.items():
        signal.connect(receiver, weak=False)
    events.subscribe(heard)
    try:
        yield heard, sent
    finally:
        events.unsubscribe(heard.name)
        for signal, receiver in receivers.items():
            signal.disconnect(receiver)


def test_a_final_write_whose_answer_was_lost_is_announced_once_as_the_recovery_it_is(cutter):
    job, _job_id = make_job("always", "allow", max_retries=0)
    alerting = override_settings(CRON_CELERY={**settings.CRON_CELERY, "NOTIFICATIONS": {
        "on_failure": ["webhook"], "on_recovery": ["webhook"], "webhook": {"url": "http://127.0.0.1:9/hook"}}})
    with alerting, listening() as (heard, sent):
        failed = runs.execute(job, SLOT, lambda run: {"error": True}, trigger=Trigger.MANUAL)
        assert failed.status == Status.FAILED
        heard.ended_events.clear()
        outcome = runs.execute(job, SLOT + dt.timedelta(minutes=1), lambda run: cutter.armed.set() or "ok",
                               trigger=Trigger.MANUAL)
    assert cutter.cut_done.is_set(), "the final write's COMMIT was not cut"
    assert outcome.status == Status.SUCCEEDED and outcome.execution_id is not None
    assert CronExecution.objects.get(id=outcome.execution_id).status == Status.SUCCEEDED
    mine = [event for event in heard.ended_events if event.execution_id == outcome.execution_id]
    assert [(event.status, event.recovered) for event in mine] == [(Status.SUCCEEDED, True)]
    assert sorted(sent) == [("recovered", outcome.execution_id), ("succeeded", outcome.execution_id)]
