"""Whether a message is still on its way: queued in the broker, or held by a worker.

The reconciler asks before it calls an execution that no worker started "stranded": a slot
behind a long backlog, a retry with a countdown, a message a busy worker has prefetched are
all late, not lost, and must not be recorded MISSED or LOST (or be sent again and again).

* **Redis** (and ``rediss``): exact. A queued message is an entry of the queue's lists (one
  per priority step); a message a worker received but has not acknowledged (prefetched,
  waiting for its countdown, or running) is an entry of the transport's ``unacked`` hash,
  which also holds the messages of workers that died until the visibility timeout gives them
  back (so such a message counts as on its way: it will be delivered again). Both are read
  for their task ids, up to ``SCAN_LIMIT`` entries per look; past that the answer is
  "cannot tell".
* **AMQP** (RabbitMQ): a queue's messages cannot be read without taking them, so a message is
  only known to be gone when its queue holds no ready message and no worker reports the task
  (``query_task`` and ``scheduled``: reserved, running or waiting for its countdown). While the
  queue has a backlog, or no worker answers, the answer is "cannot tell". A worker must be
  able to answer while it runs jobs: the prefork and threads pools can, a busy ``solo`` worker
  cannot (its prefetched message would look gone if another worker answered).
* Any other transport: ``None`` — the reconciler falls back to the grace period alone.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

import celery

logger = logging.getLogger(__name__)

#: Verdicts of ``locate`` for one task id.
QUEUED, GONE, UNKNOWN = "queued", "gone", "unknown"
#: Most broker entries (list items and hash fields) one call reads on Redis.
SCAN_LIMIT = 100_000
_CHUNK = 1000


def queue_of(app: celery.Celery, task_name: str, options: dict[str, Any] | None = None) -> str:
    """The queue a message of this task is routed to (the task's options, then ``task_routes``)."""
    try:
        route = app.amqp.router.route(dict(options or {}), task_name)
        queue = route.get("queue")
        name = getattr(queue, "name", queue)
        if name:
            return str(name)
    except Exception:  # an odd router must not stop the reconciler: assume the default queue
        logger.debug("could not route %s", task_name, exc_info=True)
    return str(app.conf.task_default_queue)


def locate(app: celery.Celery, wanted: dict[str, str], *, held_only: bool = False) -> dict[str, str] | None:
    """For each task id in ``wanted`` (task id -> queue name): QUEUED, GONE or UNKNOWN.

    ``held_only``: look only where a worker holds messages (the second look, for messages that
    may have been taken off their queue in between). ``None`` when the broker's transport is
    not one this module can read (see the module's docstring)."""
    if not wanted:
        return {}
    with app.connection_for_read() as conn:
        driver = conn.transport.driver_type
        if driver == "redis":
            return _on_redis(conn, wanted, held_only)
        if driver == "amqp":
            return _on_amqp(app, conn, wanted, held_only)
    return None


#: A message's own task id in its JSON (``"id": "..."``; ``root_id`` and ``parent_id`` do not match).
_TASK_ID = re.compile(rb'"id": ?"([^"]+)"')


def _on_redis(conn: Any, wanted: dict[str, str], held_only: bool) -> dict[str, str]:
    channel = conn.default_channel
    client = channel.client
    prefix = str(getattr(client, "global_keyprefix", "") or "")  # kombu prefixes only some commands itself
    seen: set[bytes] = set()
    budget = SCAN_LIMIT

    def read(entries: Iterable[bytes]) -> None:
        nonlocal budget
        for raw in entries:
            budget -= 1
            seen.update(_TASK_ID.findall(raw))

    if not held_only:
        for queue in sorted(set(wanted.values())):
            for key in dict.fromkeys(channel._q_for_pri(queue, pri) for pri in channel.priority_steps):
                start = 0
                while budget > 0:
                    chunk = client.lrange(prefix + key, start, start + _CHUNK - 1)
                    read(chunk)
                    if len(chunk) < _CHUNK:
                        break
                    start += _CHUNK
    cursor = 0
    while budget > 0:
        cursor, fields = client.hscan(prefix + channel.unacked_key, cursor, count=_CHUNK)
        read(fields.values())
        if cursor == 0:
            break
    unread = budget <= 0
    return {task_id: QUEUED if task_id.encode() in seen else (UNKNOWN if unread else GONE) for task_id in wanted}


def _on_amqp(app: celery.Celery, conn: Any, wanted: dict[str, str], held_only: bool) -> dict[str, str]:
    answered, held = _held_by_workers(app, list(wanted))
    backlog: dict[str, int] = {}
    for queue in set(wanted.values()) if not held_only else ():
        channel = conn.channel()  # a failed passive declare closes its channel: one each
        try:
            _, count, _ = channel.queue_declare(queue=queue, passive=True)
            backlog[queue] = int(count)
        except Exception:  # the queue is unreadable (or does not exist): cannot tell
            logger.debug("could not read the size of queue %s", queue, exc_info=True)
        finally:
            try:
                channel.close()
            except Exception:
                logger.debug("closing a probe channel failed", exc_info=True)
    verdicts = {}
    for task_id, queue in wanted.items():
        if task_id in held:
            verdicts[task_id] = QUEUED
        elif answered and (held_only or backlog.get(queue) == 0):
            verdicts[task_id] = GONE
        else:  # a backlog hides it, or no worker answered (remote control off, all too slow)
            verdicts[task_id] = UNKNOWN
    return verdicts


def _held_by_workers(app: celery.Celery, task_ids: list[str]) -> tuple[bool, set[str]]:
    """(whether any worker answered, the task ids some worker has received: running,
    reserved, or waiting for their countdown)."""
    inspect = app.control.inspect(timeout=1.0)
    held: set[str] = set()
    answered = False
    try:
        replies = inspect.query_task(*task_ids) or {}
        answered = bool(replies)
        for answer in replies.values():
            held.update(answer)
        for requests in (inspect.scheduled() or {}).values():
            held.update(str(item.get("request", {}).get("id", "")) for item in requests)
    except Exception:  # no answer: nobody can say the message is gone
        logger.debug("could not ask the workers which tasks they hold", exc_info=True)
    return answered, held & set(task_ids)
