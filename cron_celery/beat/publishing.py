"""Sending many job messages at once: the beat's rounds and their one-off runs.

``app.send_task`` spends most of its time per message on what is the same for every message of
a round: reading the app's configuration (through Django's settings, several look-ups a
message), routing the task, declaring its queue again, and ``repr`` of empty arguments. A
``RoundSender`` does those once per task (routing, when every route is a plain mapping) or once
per round (configuration, queue declarations) and builds each message with Celery's own
``create_task_message`` and sends it with ``send_task_message``: the same message format
(headers, time limits, the broker's time to live of ``expires=``), the same routing and the
same ``before_task_publish`` / ``after_task_publish`` signals and ``task-sent`` events as
``send_task``. It is meant for the beat, which is never inside a task (no parent to inherit
a root id or priority from).

What it leaves out, on purpose:

- ``backend.on_task_call``: the beat never waits for a result (``send_task`` subscribes to the
  result's channel with a Redis result backend, and its ``AsyncResult`` unsubscribes again);
- wrappers that other libraries put around ``Celery.send_task`` itself (sentry-sdk's Celery
  integration adds trace headers there), so the beat's messages start a trace of their own in
  the worker. An app whose own class overrides ``send_task`` (multi-tenant apps add a header
  there) gets ``SendTaskSender`` from ``sender_for`` instead: every message through it.

``tests/test_publishing.py`` checks that a message sent this way is the message ``send_task``
sends, for the routings a job can have.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Protocol

import celery
from celery.app.routes import MapRoute
from celery.utils.nodenames import anon_nodename

from cron_celery.decisions import tracked
from cron_celery.run import tasks

#: What ``create_task_message`` takes from a task's own options rather than routing.
_MESSAGE_OPTIONS = ("time_limit", "soft_time_limit", "expires", "ignore_result")


class Sender(Protocol):
    def send(self, task_name: str, message_headers: dict[str, Any], task_id: str) -> None: ...


def sender_for(app: celery.Celery, producer: Any) -> Sender:
    """A ``RoundSender``, unless the app's class overrides ``send_task`` (multi-tenant apps put a
    header of their own there): then each message goes through its ``send_task``."""
    if type(app).send_task is not celery.Celery.send_task:
        return SendTaskSender(app, producer)
    return RoundSender(app, producer)


class SendTaskSender:
    """Each message through ``app.send_task``, as every other path sends a job's message."""

    def __init__(self, app: celery.Celery, producer: Any) -> None:
        self.app, self.producer = app, producer

    def send(self, task_name: str, message_headers: dict[str, Any], task_id: str) -> None:
        tasks.publish(self.app, task_name, message_headers, task_id=task_id, producer=self.producer)


class RoundSender:
    """Sends job messages over one producer: route each task once (when every route is a plain
    mapping), read Celery's settings once, declare each queue once."""

    def __init__(self, app: celery.Celery, producer: Any) -> None:
        self.app = app
        self.amqp = app.amqp
        self.producer = producer
        self.sent_event = bool(app.conf.task_send_sent_event)
        self.reply_to = app.thread_oid
        self.origin = anon_nodename()  # the message's "origin" header, as Celery writes it
        # A router function may look at the message's headers or the time: route each message then.
        routes = getattr(self.amqp.router, "routes", None) or ()
        self.cached_routes = all(isinstance(route, MapRoute) for route in routes)
        self._options: dict[str, tuple[dict[str, Any], dict[str, Any], Any]] = {}
        self._routes: dict[str, dict[str, Any]] = {}
        # Queues declared in this round. After a reconnect within a round, kombu declares again
        # only for the message it retries; the next round declares every queue afresh.
        self._declared: set[str] = set()

    def options(self, task_name: str) -> tuple[dict[str, Any], dict[str, Any], Any]:
        """(options to route, the message's own options, the task) of a task: its own options
        (``queue=``, ``priority=``, time limits...) with cron_celery's ``message_options`` over
        them, as ``send_task`` takes them (Celery 5.7; older versions ignored the task's own)."""
        known = self._options.get(task_name)
        if known is not None:
            return known
        try:
            task = self.app.tasks.get(task_name)
        except RuntimeError:  # an app declared with autofinalize=False that is not finalized yet
            task = None
        options: dict[str, Any] = {}
        get_exec_options = getattr(task, "_get_exec_options", None)
        if callable(get_exec_options):
            options.update({key: value for key, value in get_exec_options().items() if value is not None})
        options.update(tasks.message_options(self.app, task_name))
        own = {key: options.pop(key, None) for key in _MESSAGE_OPTIONS}
        self._options[task_name] = known = (options, own, task)
        return known

    def route(self, task_name: str, message_headers: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(routing options, the message's own options): ``task_routes`` applied as ``send_task``
        applies it, to the options with the message's headers among them."""
        options, own, task = self.options(task_name)
        if self.cached_routes:
            routed = self._routes.get(task_name)
            if routed is None:
                routed = self._routes[task_name] = self.amqp.router.route(
                    dict(options), task_name, (), {}, task)  # type: ignore[arg-type]
            return {**routed, "headers": message_headers}, own
        return self.amqp.router.route({**options, "headers": message_headers}, task_name, (), {},
                                      task), own  # type: ignore[arg-type]

    def expiration(self, expires: Any) -> float | None:
        """The broker's time to live of a message of a task with ``expires=`` (seconds, at least 0),
        as ``send_task`` sets it beside the ``expires`` header."""
        if expires is None:
            return None
        if isinstance(expires, str):
            expires = dt.datetime.fromisoformat(expires)
        if isinstance(expires, dt.datetime):
            return max(0.0, (expires - self.app.now()).total_seconds())
        return max(0.0, float(expires))

    def queue_to_declare(self, routing: dict[str, Any]) -> str | None:
        """The queue ``send_task_message`` declares for this routing: the routed one, or the
        default queue when neither a queue nor an exchange is routed (an exchange alone: none)."""
        queue = routing.get("queue")
        if queue is None:
            return None if routing.get("exchange") is not None else str(self.amqp.default_queue.name)
        return queue if isinstance(queue, str) else str(queue.name)

    def send(self, task_name: str, message_headers: dict[str, Any], task_id: str) -> None:
        if tracked.code_of(task_name) is not None:  # a tracked periodic task's: its own task, arguments, options
            tasks.publish(self.app, task_name, message_headers, task_id=task_id, producer=self.producer)
            return
        routing, own = self.route(task_name, message_headers)
        expiration = self.expiration(own["expires"])
        if expiration is not None:
            routing["expiration"] = expiration
        message = self.amqp.create_task_message(
            task_id, task_name, (), {}, None, None, None, None, own["expires"], 0, None, None, None,
            self.reply_to, own["time_limit"], own["soft_time_limit"], self.sent_event, None, None, None, None,
            ignore_result=own["ignore_result"], argsrepr="()", kwargsrepr="{}", origin=self.origin, **routing,
        )
        queue = self.queue_to_declare(routing)
        # None: Celery declares the queue (kombu remembers it); []: already declared this round.
        declare: list[Any] | None = [] if queue is not None and queue in self._declared else None
        # No ``backend.on_task_call``: the beat never waits for a result (with a Redis result backend
        # it would subscribe this process to every message's result channel for good).
        self.amqp.send_task_message(self.producer, task_name, message, declare=declare, **routing)
        if queue is not None:
            self._declared.add(queue)
