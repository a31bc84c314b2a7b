"""The jobs, the plain task and the publish stamps of ``bench/latency.py``.

Imported by every beat and worker the script starts (``CELERY_IMPORTS`` in
``bench/latency_settings.py``), which reads its environment:

  ``LATENCY_KEY``      the start of the Redis keys (broker Redis) this run writes;
  ``LATENCY_SIDE``     ``cron_celery``: declare ``LATENCY_JOBS`` jobs with the ``LATENCY_MIX``
                       schedules (``bench/latency_mix.py``); anything else: none (the
                       DatabaseScheduler side sends the plain task ``bench.latency_plain``);
  ``LATENCY_STAMP``    ``1`` in the beats: note every publish (below).

What is written, each a Redis hash under ``LATENCY_KEY``:

  ``:pub``    task id -> "<due> <time>": a task message left ``send_task``. <due> is the slot
              (cron_celery: the message's ``cron_slot`` header; DatabaseScheduler: the instant
              its entry was due, noted by ``bench.latency_beat.DueScheduler``);
  ``:wire``   task id -> time the Redis pipeline that carried the message was executed. The
              cron_celery beat publishes through kombu's batch (``Producer.batch``), which holds
              the messages in a pipeline until it flushes; the signal above fires when a message
              enters it. The wire time is what the workers can see, so it is the publish instant;
              messages sent outside a batch (DatabaseScheduler) have only ``:pub``;
  ``:start``  cron_celery: execution id -> the body's first instant; plain task: task id -> it;
  ``:end``    plain task: task id -> its body's last instant (cron_celery's is the row's ``ended``).

The beat buffers its notes and writes them from a thread every quarter of a second (a Redis
round trip per publish would slow the very step that is measured), and once more at exit.
"""

from __future__ import annotations

import atexit
import datetime as dt
import os
import threading
import time
from typing import Any

import redis
from celery import shared_task
from celery.signals import after_task_publish

from bench import latency_mix

KEY = os.environ.get("LATENCY_KEY", "latency-unset")
SIDE = os.environ.get("LATENCY_SIDE", "")
PLAIN_TASK = "bench.latency_plain"

_client: redis.Redis | None = None
_client_pid = 0


def client() -> redis.Redis:
    """A client of the broker's Redis, one per process (the pool's children each get theirs)."""
    global _client, _client_pid
    if _client is None or _client_pid != os.getpid():
        _client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
        _client_pid = os.getpid()
    return _client


# ------------------------------------------------------------------------------- bodies


def latency_body(run: Any) -> None:
    """Every cron_celery job of the run: note when the body began."""
    began = time.time()
    client().hset(f"{KEY}:start", str(run.execution_id), repr(began))


@shared_task(name=PLAIN_TASK, bind=True)
def plain(self: Any) -> None:
    """The DatabaseScheduler's periodic tasks: note when the body began and ended."""
    began = time.time()
    task_id = str(self.request.id)
    pipe = client().pipeline(transaction=False)
    pipe.hset(f"{KEY}:start", task_id, repr(began))
    pipe.hset(f"{KEY}:end", task_id, repr(time.time()))
    pipe.execute()


def declare_jobs(n: int, mix: str) -> None:
    """``n`` cron jobs (default pattern and overlap: the job lock is taken on the masters)."""
    from cron_celery import cron_task, schedules

    by_kind: dict[str, object] = {kind: schedules.cron(expression) for kind, expression in latency_mix.CRON.items()}
    by_kind[latency_mix.EVERY_10S] = schedules.every(seconds=10)
    for i in range(n):
        kind = latency_mix.kind_of(i, mix)
        cron_task(name=latency_mix.job_name(i, kind), code=f"LAT-{i:05d}", task_name=f"bench.latency.job_{i:05d}",
                  schedule=by_kind[kind])(latency_body)


if SIDE == "cron_celery":
    declare_jobs(int(os.environ.get("LATENCY_JOBS") or 0), os.environ.get("LATENCY_MIX", "minute"))


# ------------------------------------------------------------------------ publish stamps


class Stamps:
    """The beat's notes of its publishes, written to Redis in the background."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pub: dict[str, str] = {}
        self.wire: dict[str, str] = {}
        self.in_batch: list[str] = []  # task ids in the kombu pipeline not executed yet
        self.due: float | None = None  # set by DueScheduler around each DatabaseScheduler send
        self.thread: threading.Thread | None = None

    def published(self, task_id: str, due: float | None) -> None:
        with self.lock:
            self.pub[task_id] = f"{due if due is not None else ''} {time.time()!r}"
        if self.thread is None:
            self.thread = threading.Thread(target=self.loop, name="latency-stamps", daemon=True)
            self.thread.start()

    def on_wire(self, task_ids: list[str]) -> None:
        moment = repr(time.time())
        with self.lock:
            for task_id in task_ids:
                self.wire[task_id] = moment

    def flush(self) -> None:
        with self.lock:
            pub, self.pub = self.pub, {}
            wire, self.wire = self.wire, {}
        if not pub and not wire:
            return
        pipe = client().pipeline(transaction=False)
        if pub:
            pipe.hset(f"{KEY}:pub", mapping=pub)  # type: ignore[arg-type]
        if wire:
            pipe.hset(f"{KEY}:wire", mapping=wire)  # type: ignore[arg-type]
        try:
            pipe.execute()
        except redis.RedisError:  # kept for the next round
            with self.lock:
                self.pub.update(pub)
                self.wire.update(wire)

    def loop(self) -> None:
        while True:
            time.sleep(0.25)
            self.flush()


STAMPS = Stamps()


def slot_epoch(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def on_publish(sender: Any = None, headers: dict[str, Any] | None = None, **_kwargs: Any) -> None:
    headers = headers or {}
    task_id = headers.get("id")
    if task_id:
        due = slot_epoch(headers.get("cron_slot"))
        STAMPS.published(str(task_id), due if due is not None else STAMPS.due)


def watch_kombu_batches() -> None:
    """Note when kombu's Redis publish pipeline is executed, and which messages it carried."""
    from kombu.transport import redis as kombu_redis

    batch_cls: Any = kombu_redis.PublishBatch
    real_publish, real_flush, real_discard = batch_cls.publish, batch_cls.flush, batch_cls.discard

    def publish(self: Any, message: Any, **kwargs: Any) -> Any:
        result = real_publish(self, message, **kwargs)
        task_id = str((message.get("headers") or {}).get("id") or "")
        if task_id:
            if self._buffered:  # still in the pipeline
                STAMPS.in_batch.append(task_id)
            else:  # the pipeline was executed with it
                STAMPS.on_wire([task_id])
        return result

    def flush(self: Any) -> Any:
        result = real_flush(self)
        carried, STAMPS.in_batch[:] = list(STAMPS.in_batch), []
        STAMPS.on_wire(carried)
        return result

    def discard(self: Any) -> Any:
        STAMPS.in_batch.clear()
        return real_discard(self)

    batch_cls.publish, batch_cls.flush, batch_cls.discard = publish, flush, discard


if os.environ.get("LATENCY_STAMP") == "1":
    after_task_publish.connect(on_publish, weak=False)
    watch_kombu_batches()
    atexit.register(STAMPS.flush)
