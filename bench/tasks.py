"""The tasks the overhead benchmark runs; found by autodiscovery (``bench`` is an app).

Every variant runs the same body, ``_done()``: one Redis ``INCR`` of the counter named by
``BENCH_COUNTER_KEY`` (set in the worker's environment). That counter is how the bare
variant's completions are counted; the other variants run it too, so that the only
difference between them is the bookkeeping around the body. The message that brings the
counter to ``BENCH_FIRST`` (the first timed one) also writes the time it finished.
"""

from __future__ import annotations

import os
import time

import redis
from celery import shared_task
from celery_once import QueueOnce

from cron_celery import Run, cron_task

_client: redis.Redis | None = None
_client_pid = 0


def _done() -> None:
    global _client, _client_pid
    key = os.environ.get("BENCH_COUNTER_KEY")
    if not key:  # called in-process (statement count): nothing to count
        return
    if _client is None or _client_pid != os.getpid():  # one client per worker process
        _client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
        _client_pid = os.getpid()
    if _client.incr(key) == int(os.environ.get("BENCH_FIRST", "0")):
        # The first timed message: note when it finished (the clock starts here).
        _client.set(f"{key}:first", repr(time.time()))


@shared_task(name="bench.noop")
def noop() -> None:
    """Variants (i) and (ii): a plain Celery task (the result backend decides (ii))."""
    _done()


@cron_task(
    name="bench-noop", code="BENCH-NOOP", pattern="always", overlap="allow",
    task_name="bench.tracked_noop",
)
def tracked_noop(run: Run) -> None:
    """Variant (iii): the same body as a job; every message runs its own slot."""
    _done()


@shared_task(name="bench.once_noop", base=QueueOnce, once={"graceful": False})
def once_noop(slot: str = "", tag: str = "") -> None:
    """Variant (iv): the same body under celery-once. Publishing takes a Redis lock named
    after the task and its arguments (every message has its own ``slot``; ``tag`` puts the
    run's tag into the key); the worker deletes it when the task has returned."""
    _done()
