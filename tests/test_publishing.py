"""The beat's ``RoundSender`` sends the message ``send_task`` sends: the same headers, body,
properties and routing (queue, exchange, routing key, priority), for every routing a job can
have, through the real broker; and the same publish signals fire."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import celery
import pytest
from celery.signals import after_task_publish, before_task_publish
from django.conf import settings

from cron_celery.beat import publishing
from cron_celery.decisions import oneoffs
from cron_celery.run import tasks
from tests.celery_app import app
from tests.jobsapp import jobs_routing

SLOT = dt.datetime(2026, 12, 3, 15, 0, tzinfo=dt.UTC)
#: Fields that differ between any two messages: the task's id and what is derived from it.
PER_MESSAGE = {"id", "root_id", "correlation_id", "delivery_tag"}

#: (task name, the queue its message lands in): the task's own queue= and priority=, a base class's,
#: CELERY_TASK_ROUTES, a plain job (the default queue, a time limit of its own), a task this
#: process does not know.
CASES = [
    (jobs_routing.own_queue.name, jobs_routing.OWN_QUEUE),
    (jobs_routing.own_base.name, jobs_routing.OWN_QUEUE),
    (jobs_routing.ROUTED_TASK, jobs_routing.ROUTED_QUEUE),
    ("tests.jobsapp.tasks.exclusive", settings.CELERY_TASK_DEFAULT_QUEUE),
    ("not.a.task.of.this.process", settings.CELERY_TASK_DEFAULT_QUEUE),
]


def take(queue: str) -> list[Any]:
    """Every message waiting in ``queue`` (all priorities), taken off the broker."""
    taken = []
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            taken.append(message)
    return taken


def comparable(message: Any) -> dict[str, Any]:
    headers = {key: value for key, value in message.headers.items() if key not in PER_MESSAGE}
    properties = {key: value for key, value in message.properties.items()
                  if key not in PER_MESSAGE and key != "delivery_info"}
    info = message.delivery_info
    return {"headers": headers, "properties": properties, "body": json.loads(message.body),
            "route": (info.get("exchange"), info.get("routing_key"), info.get("priority")),
            "content": (message.content_type, message.content_encoding)}


@pytest.mark.parametrize(("task_name", "queue"), CASES)
def test_a_round_sends_the_message_send_task_sends(task_name: str, queue: str) -> None:
    take(queue)  # nothing left over from another test
    headers = tasks.headers(41, SLOT, "BEAT")
    with app.producer_or_acquire() as producer:
        tasks.publish(app, task_name, dict(headers), task_id=str(uuid.uuid4()), producer=producer)
    [expected] = take(queue)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    with app.producer_or_acquire() as producer:
        sender = publishing.RoundSender(app, producer)
        for task_id in ids:  # the first declares the queue; the next two do not
            sender.send(task_name, dict(headers), task_id)
    got = take(queue)
    assert [message.headers["id"] for message in got] == ids
    assert [message.properties["correlation_id"] for message in got] == ids
    for message in got:
        assert comparable(message) == comparable(expected)
    assert expected.headers["cron_execution_id"] == 41 and expected.headers["task"] == task_name


def test_a_round_fires_the_publish_signals_of_each_message() -> None:
    seen: list[tuple[str, str, str]] = []

    def before(sender: str, headers: dict[str, Any], **_: Any) -> None:
        seen.append(("before", sender, headers["id"]))

    def after(sender: str, headers: dict[str, Any], **_: Any) -> None:
        seen.append(("after", sender, headers["id"]))

    before_task_publish.connect(before, weak=False)
    after_task_publish.connect(after, weak=False)
    try:
        with app.producer_or_acquire() as producer:
            sender = publishing.RoundSender(app, producer)
            sender.send(jobs_routing.own_queue.name, tasks.headers(1, SLOT, "BEAT"), "first")
            sender.send(jobs_routing.ROUTED_TASK, tasks.headers(2, SLOT, "BEAT"), "second")
    finally:
        before_task_publish.disconnect(before)
        after_task_publish.disconnect(after)
        take(jobs_routing.OWN_QUEUE)
        take(jobs_routing.ROUTED_QUEUE)
    assert seen == [("before", jobs_routing.own_queue.name, "first"), ("after", jobs_routing.own_queue.name, "first"),
                    ("before", jobs_routing.ROUTED_TASK, "second"), ("after", jobs_routing.ROUTED_TASK, "second")]


#: A task declared with ``expires=`` (a documented Celery option of a job): ``send_task`` gives its
#: message the broker's TTL (the ``expiration`` property) as well as the ``expires`` header.
@app.task(name="tests.test_publishing.expiring", expires=60, shared=False)
def expiring() -> None:  # pragma: no cover - never run, only sent
    pass


def test_a_task_with_expires_gets_the_broker_ttl_send_task_gives_it() -> None:
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    take(queue)
    headers = tasks.headers(42, SLOT, "BEAT")
    with app.producer_or_acquire() as producer:
        tasks.publish(app, expiring.name, dict(headers), task_id=str(uuid.uuid4()), producer=producer)
    [expected] = take(queue)
    with app.producer_or_acquire() as producer:
        publishing.RoundSender(app, producer).send(expiring.name, dict(headers), str(uuid.uuid4()))
    [got] = take(queue)
    assert expected.headers["expires"] is not None and got.headers["expires"] is not None
    assert expected.properties.get("expiration") == "60000"
    assert got.properties.get("expiration") == expected.properties.get("expiration")


def test_a_round_leaves_no_result_subscriptions_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a Redis result backend, ``send_task`` subscribes the sender to the result channel of
    each task it sends (``backend.on_task_call``) and unsubscribes when the ``AsyncResult`` it
    returns is dropped. The beat never reads a result: a round must not leave it subscribed to
    the channel of every message it ever sent."""
    import gc

    from celery.backends.redis import RedisBackend

    backend = RedisBackend(app=app, url=settings.CELERY_BROKER_URL)
    monkeypatch.setattr(app, "_backend", backend)
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    take(queue)
    try:
        with app.producer_or_acquire() as producer:
            for _ in range(3):
                tasks.publish(app, "not.a.task.of.this.process", tasks.headers(43, SLOT, "BEAT"),
                              task_id=str(uuid.uuid4()), producer=producer)
        gc.collect()
        assert backend.result_consumer.subscribed_to == set()  # send_task's: none left
        with app.producer_or_acquire() as producer:
            sender = publishing.RoundSender(app, producer)
            for _ in range(3):
                sender.send("not.a.task.of.this.process", tasks.headers(43, SLOT, "BEAT"), str(uuid.uuid4()))
        gc.collect()
        assert backend.result_consumer.subscribed_to == set()
    finally:
        take(queue)
        consumer = backend.result_consumer
        if consumer._pubsub is not None:
            consumer._pubsub.close()


def _router_with(monkeypatch: pytest.MonkeyPatch, router: Any) -> None:
    """``task_routes`` = [router] for this test (``send_task`` and ``RoundSender`` both read
    ``app.amqp.router``)."""
    from celery.app.routes import Router

    monkeypatch.setattr(app.amqp, "router", Router([router], app.amqp.queues, True, app=app))


def test_a_router_sees_the_message_headers_send_task_gives_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``task_routes`` function is given the options of the message, its ``headers`` among
    them (``send_task`` routes after merging them): one that sends one-off runs to a queue of
    their own sends a round's one-off there too."""
    urgent = f"{settings.CELERY_TASK_DEFAULT_QUEUE}-q-urgent"

    def route(name: str, args: Any, kwargs: Any, options: dict[str, Any], task: Any = None, **_: Any) -> Any:
        if (options.get("headers") or {}).get(tasks.HEADER_TRIGGER) == oneoffs.ONE_OFF:
            return {"queue": urgent}
        return None

    _router_with(monkeypatch, route)
    take(urgent)
    take(settings.CELERY_TASK_DEFAULT_QUEUE)
    headers = tasks.headers(44, SLOT, oneoffs.ONE_OFF)
    with app.producer_or_acquire() as producer:
        tasks.publish(app, "not.a.task.of.this.process", dict(headers), task_id=str(uuid.uuid4()), producer=producer)
    assert len(take(urgent)) == 1  # send_task's
    with app.producer_or_acquire() as producer:
        publishing.RoundSender(app, producer).send("not.a.task.of.this.process", dict(headers), str(uuid.uuid4()))
    try:
        assert len(take(urgent)) == 1
    finally:
        take(settings.CELERY_TASK_DEFAULT_QUEUE)


def test_a_round_declares_the_default_queue_after_an_exchange_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """A route with an exchange and no queue (a topic exchange's) declares nothing; a route with
    neither (``{"priority": 3}``) lands in the default queue, which ``send_task`` declares. The
    round must not take the first for the second ("no queue" is not "the default queue")."""
    from kombu import Exchange

    topic = Exchange(f"{settings.CELERY_TASK_DEFAULT_QUEUE}-topic", type="topic")

    def route(name: str, *_: Any, **__: Any) -> Any:
        if name == "rv.by.exchange":
            return {"exchange": topic, "routing_key": "rv.by.exchange", "exchange_type": "topic"}
        return {"priority": 3}

    _router_with(monkeypatch, route)
    declared: list[tuple[str, Any]] = []

    def before(sender: str, declare: Any, **_: Any) -> None:
        declared.append((sender, None if declare is None else [getattr(e, "name", e) for e in declare]))

    before_task_publish.connect(before, weak=False)
    try:
        with app.producer_or_acquire() as producer:
            topic(producer.channel).declare()
            tasks.publish(app, "rv.no.queue", tasks.headers(45, SLOT, "BEAT"), task_id=str(uuid.uuid4()),
                          producer=producer)
            sender = publishing.RoundSender(app, producer)
            sender.send("rv.by.exchange", tasks.headers(46, SLOT, "BEAT"), str(uuid.uuid4()))
            sender.send("rv.no.queue", tasks.headers(47, SLOT, "BEAT"), str(uuid.uuid4()))
    finally:
        before_task_publish.disconnect(before)
        take(settings.CELERY_TASK_DEFAULT_QUEUE)
    by_send_task, _, by_round = declared
    assert by_send_task == ("rv.no.queue", [settings.CELERY_TASK_DEFAULT_QUEUE])
    assert by_round == by_send_task


def test_an_app_whose_class_overrides_send_task_keeps_it_for_every_message() -> None:
    """Multi-tenant apps add a header of their own in ``send_task``: the beat then sends each
    message through it rather than around it."""

    class TenantApp(celery.Celery):
        def send_task(self, *args: Any, **kwargs: Any) -> Any:
            kwargs["headers"] = {**(kwargs.get("headers") or {}), "tenant": "acme"}
            return super().send_task(*args, **kwargs)

    tenant_app = TenantApp("tenant-test", set_as_current=False)
    tenant_app.config_from_object(app.conf)
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    take(queue)
    with app.producer_or_acquire() as producer:
        assert isinstance(publishing.sender_for(app, producer), publishing.RoundSender)
    with tenant_app.producer_or_acquire() as producer:
        sender = publishing.sender_for(tenant_app, producer)
        assert isinstance(sender, publishing.SendTaskSender)
        sender.send("not.a.task.of.this.process", tasks.headers(48, SLOT, "BEAT"), str(uuid.uuid4()))
    [message] = take(queue)
    assert message.headers["tenant"] == "acme" and message.headers["cron_execution_id"] == 48
