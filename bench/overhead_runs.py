"""One timed run of ``bench/overhead.py``: a fresh worker warmed up, N messages of one variant
queued before the clock starts, the worker told to consume them, and the time from the first of
them finished to the last one done; and ``--profile``'s run of the tracked variant under py-spy.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from bench import flame
from bench.common import ROOT, BenchError, clean_tracked_tables, count_rows, log, tracked_plain_code
from bench.overhead_database import status_counts
from bench.overhead_variants import PREFIX, SLOT_BASE, VARIANTS, WARMUP_BASE, Variant
from bench.overhead_worker import PROFILE_RATE, Worker, queue_keys, start_profiler, stop_profiler


@dataclasses.dataclass(frozen=True)
class RunNames:
    """What one run's queues, worker node and Redis counter are called; each carries the run's tag."""

    queue: str
    warm_queue: str
    node: str
    counter: str

    @classmethod
    def of(cls, label: str) -> RunNames:
        queue = f"{PREFIX}-{label}"
        return cls(queue=queue, warm_queue=f"{queue}-warm", node=f"{PREFIX}-{label}@{socket.gethostname()}",
                   counter=f"{PREFIX}:{label}:done")


def wait_for(what: str, condition: Callable[[], bool], timeout: float, worker: Worker,
             interval: float = 0.002) -> float:
    """Poll until ``condition()``; returns the wall-clock time it was first seen to hold."""
    deadline = time.monotonic() + timeout
    polls = 0
    while True:
        if condition():
            return time.time()
        polls += 1
        if polls % 200 == 0:
            worker.check_alive()
        if time.monotonic() > deadline:
            worker.check_alive()
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}\n{worker.tail()}")
        time.sleep(interval)


def publish(app: Any, variant: Variant, queue: str, count: int, base: dt.datetime) -> list[str]:
    """Publish ``count`` messages; returns the celery-once lock keys they took (if any)."""
    task = app.tasks[variant.task]
    lock_keys = []
    beat_sent = beat_rows(count, base) if variant.tracked_plain else {}
    with app.producer_or_acquire() as producer:
        for i in range(count):
            kwargs = {}
            slot = (base + dt.timedelta(minutes=i)).isoformat()
            if variant.task in ("bench.tracked_noop", "bench.once_noop"):
                kwargs["slot"] = slot
            if variant.once:  # the queue's name carries the run's tag into the lock's key
                kwargs["tag"] = queue
                lock_keys.append(task.get_key((), kwargs))
            options: dict[str, Any] = {}
            if beat_sent:  # (v): the message the beat sends for the slot's PENDING execution
                options = {"headers": beat_sent[i][0], "task_id": beat_sent[i][1]}
            task.apply_async(kwargs=kwargs, queue=queue, producer=producer, **options)
    return lock_keys


def beat_rows(count: int, base: dt.datetime) -> dict[int, tuple[dict[str, Any], str]]:
    """(v): what the leading beat writes and sends for ``count`` slots of the tracked periodic task, a
    minute apart from ``base``: each slot's PENDING execution, inserted as its dispatch inserts them
    (before the timed run, as the beat does before the worker sees the message), and the headers and
    Celery task id of its message, by slot index."""
    from cron_celery.decisions import dispatch, jobs, tracked

    code = tracked_plain_code()
    job = tracked.load_job(code)
    if job is None:
        raise BenchError(f"the tracked periodic task's job {code} has no row")
    inserted = dispatch.enqueue_many(job=job, job_id=jobs.job_id(job), trigger="BEAT",
                                     slots=[base + dt.timedelta(minutes=i) for i in range(count)])
    return {i: ({"cron_job": code, "cron_slot": row.slot.isoformat(), "cron_execution_id": row.execution_id,
                 "cron_trigger": "BEAT"}, row.celery_task_id) for i, row in enumerate(inserted)}


# ------------------------------------------------------------------ what "done" means


def counted(client: redis.Redis, counter: str, total: int) -> Callable[[], bool]:
    """The bodies' Redis counter has reached ``total``."""
    def check() -> bool:
        return int(client.get(counter) or 0) >= total
    return check


def rows_done(variant: Variant, total: int) -> Callable[[], bool]:
    """``total`` rows of the variant's table have its done status."""
    return lambda: count_rows(variant.table, variant.done_status) >= total


def released(client: redis.Redis, keys: list[str]) -> Callable[[], bool]:
    """None of the celery-once locks ``keys`` is left."""
    return lambda: not keys or int(client.exists(*keys)) == 0


# ------------------------------------------------------------------------- the steps


def worker_environment(variant: Variant, counter: str, warmup: int) -> dict[str, str]:
    """This process's environment, with what the worker of ``variant`` is told through it."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="bench.settings",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        BENCH_COUNTER_KEY=counter,
        BENCH_FIRST=str(warmup + 1),
        BENCH_RESULT_BACKEND=variant.result_backend,
        BENCH_DB_REUSE_MAX=os.environ.get("BENCH_DB_REUSE_MAX", "") if variant.reuse else "0",
        BENCH_SYNCHRONOUS_COMMIT=variant.commit,
    )
    return env


def warm_up(app: Any, client: redis.Redis, variant: Variant, worker: Worker, names: RunNames,
            warmup: int) -> None:
    """Every pool process imports, connects and runs a few messages: ``warmup`` of them, done."""
    warm_locks = publish(app, variant, names.warm_queue, warmup, WARMUP_BASE)
    wait_for("the warm-up messages", counted(client, names.counter, warmup), 60, worker)
    if variant.table:
        wait_for("the warm-up rows", rows_done(variant, warmup), 60, worker)
    wait_for("the warm-up locks to be released", released(client, warm_locks), 60, worker)


def fill_queue(app: Any, client: redis.Redis, variant: Variant, queue: str, n: int) -> list[str]:
    """The ``n`` timed messages, all in ``queue`` (and their locks taken) before anything is timed;
    returns their celery-once lock keys."""
    lock_keys = publish(app, variant, queue, n, SLOT_BASE)
    if variant.once and int(client.exists(*lock_keys)) != n:
        raise BenchError(f"expected {n} celery-once locks, found {client.exists(*lock_keys)}")
    queued = int(client.llen(queue))
    if queued != n:
        raise BenchError(f"expected {n} messages in {queue}, found {queued}")
    return lock_keys


def start_consuming(app: Any, names: RunNames) -> None:
    """Tell the worker to consume the timed queue; it must say it does."""
    queue = names.queue
    replies = app.control.add_consumer(
        queue, exchange=queue, exchange_type="direct", routing_key=queue,
        destination=[names.node], reply=True, timeout=5,
    )
    if not replies:
        raise BenchError(f"the worker did not confirm consuming {queue}")


def wait_for_the_last(client: redis.Redis, variant: Variant, worker: Worker, names: RunNames, *,
                      n: int, total: int, lock_keys: list[str]) -> float:
    """When the last of the ``n`` was done: the counter at ``total``, then the rows, then the locks."""
    t1 = wait_for(f"{n} completions", counted(client, names.counter, total), max(120.0, n / 10), worker)
    if variant.table:
        t1 = wait_for(f"{n} rows in {variant.table}", rows_done(variant, total), 60, worker, 0.005)
    if variant.once:
        t1 = wait_for(f"{n} celery-once locks to be released", released(client, lock_keys), 60, worker, 0.005)
    return t1


def first_finished(client: redis.Redis, counter: str) -> float:
    """When the first timed message finished (its body wrote the time)."""
    first = client.get(f"{counter}:first")
    if first is None:
        raise BenchError("the first timed message did not record its time")
    return float(first)


def check_left(client: redis.Redis, variant: Variant, queue: str, total: int) -> dict[str, int]:
    """Every row done and no message left behind; returns the rows' statuses, counted."""
    statuses = status_counts(variant.table) if variant.table else {}
    if variant.table and statuses != {variant.done_status: total}:
        raise BenchError(f"unexpected rows in {variant.table}: {statuses}")
    left = int(client.llen(queue))
    if left:
        raise BenchError(f"{left} messages left in {queue}")
    return statuses


def end_run(client: redis.Redis, worker: Worker, spy: subprocess.Popen[bytes] | None, names: RunNames) -> None:
    """py-spy killed if it still runs, the worker stopped, and the run's keys deleted."""
    if spy is not None and spy.poll() is None:
        spy.kill()
        spy.wait(timeout=10)
    worker.stop()
    client.delete(names.counter, f"{names.counter}:first", *queue_keys(names.queue),
                  *queue_keys(names.warm_queue), *queue_keys(f"{names.node}.celery.pidbox"))


# ---------------------------------------------------------------------------- the run


def run_once(app: Any, client: redis.Redis, variant: Variant, *, n: int, warmup: int,
             concurrency: int, label: str, logdir: Path, profile: Path | None = None) -> dict[str, Any]:
    """One timed run of ``n`` messages of one variant through a fresh worker. With ``profile``,
    py-spy samples the worker's processes while the ``n`` run and writes its raw stacks there."""
    names = RunNames.of(label)
    clean_tracked_tables()
    env = worker_environment(variant, names.counter, warmup)
    worker = Worker(node=names.node, queue=names.warm_queue, env=env, concurrency=concurrency,
                    log_path=logdir / f"worker-{label}.log")
    spy: subprocess.Popen[bytes] | None = None
    try:
        started = time.perf_counter()
        wait_for("the worker to answer a ping",
                 lambda: bool(app.control.ping(destination=[names.node], timeout=0.5)),
                 120, worker, interval=0.2)
        ready_s = time.perf_counter() - started
        warm_up(app, client, variant, worker, names, warmup)
        lock_keys = fill_queue(app, client, variant, names.queue, n)

        spy = start_profiler(worker, profile, logdir) if profile is not None else None
        consume_at = time.time()
        start_consuming(app, names)
        t1 = wait_for_the_last(client, variant, worker, names, n=n, total=warmup + n, lock_keys=lock_keys)
        if spy is not None:
            stop_profiler(spy)
        # The clock starts when the first of the N finished (the worker wrote the time):
        # the worker's Redis poll only picks the new queue up when its current BRPOP on
        # the warm-up queue returns (up to a second later), which must not be counted.
        t0 = first_finished(client, names.counter)
        elapsed = t1 - t0
        statuses = check_left(client, variant, names.queue, warmup + n)
        return {"variant": variant.key, "n": n, "seconds": elapsed, "rate": (n - 1) / elapsed,
                "pickup_seconds": t0 - consume_at, "worker_ready_seconds": ready_s,
                "rows": statuses}
    except BaseException:
        log(f"worker log ({worker.log_path}):\n{worker.tail()}")
        raise
    finally:
        end_run(client, worker, spy, names)


def profile_tracked(app: Any, client: redis.Redis, *, n: int, warmup: int, concurrency: int,
                    svg: Path, key: str = "tracked") -> dict[str, Any]:
    """``--profile``: N tracked runs (iii, or the variant ``key`` names) through one worker under py-spy;
    the flame graph of its pool processes goes to ``svg``, and where their time went is returned
    (``flame.summary``)."""
    variant = next(v for v in VARIANTS if v.key == key)
    with tempfile.TemporaryDirectory(prefix="cron-celery-bench-") as tmp:
        raw = Path(tmp) / "stacks.txt"
        result = run_once(app, client, variant, n=n, warmup=warmup, concurrency=concurrency,
                          label="profile", logdir=Path(tmp), profile=raw)
        text = raw.read_text(encoding="utf-8", errors="replace")
        stacks = flame.parse(text)
    pool = flame.pool_main_threads(stacks)
    if not pool:
        raise BenchError("py-spy recorded no sample of a pool process")
    svg.parent.mkdir(parents=True, exist_ok=True)
    title = (f"A worker's pool processes running {n:,} tracked no-op runs {variant.label.split()[0]}, "
             f"{result['rate']:.0f} runs/s, sampled by py-spy at {PROFILE_RATE}/s")
    svg.write_text(flame.svg(pool, title), encoding="utf-8")
    return {"rate": result["rate"], "svg": str(svg), "summary": flame.summary(pool)}
