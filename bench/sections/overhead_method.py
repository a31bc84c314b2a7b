"""The method part of the overhead section: what each of the five variants runs and keeps, and how
a run is timed. Fixed prose and one table; only the worker's concurrency and warm-up come from the
results."""

from __future__ import annotations

from typing import Any

from bench.figures import table


def overhead_method(settings: dict[str, Any]) -> list[str]:
    """What the five variants run and keep, and how each run is timed."""
    return [
        "`bench/overhead.py` sends one no-op task body through a real worker in five ways and counts",
        "tasks per second:",
        "",
        *table(["variant", "what runs", "what it keeps per task"], [
            ["(i) bare Celery", "a `@shared_task`, no result backend", "nothing"],
            ["(ii) django-celery-results", 'the same task with `CELERY_RESULT_BACKEND = "django-db"`',
             "one `TaskResult` row"],
            ["(iii) cron_celery", '`@cron_task(pattern="always", overlap="allow")`, a slot of its own per '
             "message, no result backend", "one `CronExecution` row, claimed before the body and finished after it"],
            ["(iv) celery-once", "a `@shared_task(base=QueueOnce)` with celery-once's Redis backend, no result "
             "backend", "a Redis lock per message: taken when it is published, deleted by the worker when the "
             "task returns"],
            ["(v) a plain task, tracked", "the task of (i), its messages sent as the beat sends a periodic task "
             "that `TRACK_PERIODIC_TASKS` tracks", "one `CronExecution` row, as (iii)"],
        ]),
        "",
        "The body (`bench/tasks.py`) is one Redis `INCR` on a counter of the run. The counter is how",
        "the completions of (i) and (iv) are counted, and every variant pays for it, so the variants",
        "differ only in the bookkeeping around the body. (ii) is the usual way to keep a record of",
        "each task; (iv) is the usual way to keep a task from being queued twice, with no record at",
        "all. celery-once takes its lock when a message is published, and publishing happens before",
        "the clock starts (for every variant), so (iv) is charged for the worker's side only: one",
        "`DEL` after the task.",
        "",
        "### How it is timed",
        "",
        "For every variant and repeat a fresh",
        f"`celery worker --pool prefork --concurrency {settings['concurrency']}` starts in its own process",
        "group (stopped, then killed, in a `finally`).",
        "",
        f"1. Once it answers a `ping`, it runs {settings['warmup']} warm-up messages from a separate queue,",
        "   so that the pool processes have imported everything and opened their connections.",
        "2. All N messages are published to the run's own queue, which the worker is not consuming",
        "   yet: the queue is full before anything is timed.",
        "3. The worker is told to consume that queue (`add_consumer`). The clock starts when the first",
        "   of the N has finished (the task writes the time to Redis); timing from `add_consumer` would",
        "   add up to a second, until the worker's blocking poll of the warm-up queue returns.",
        "4. The clock stops when the last is done: (i) the Redis counter reaches N; (ii) N `TaskResult`",
        "   rows have status `SUCCESS`; (iii) N `CronExecution` rows have status `SUCCEEDED`; (iv) the",
        "   counter reaches N and none of the N locks is left. Redis is polled every 2 ms, then the",
        "   database or the locks every 5 ms.",
        "",
        "Throughput is (N - 1) / elapsed. The variants take turns (i, ii, iii, iv, i, …) so that drift on",
        "the machine falls on all of them alike, the tables are emptied before every run, and the",
        "medians of the repeats are compared. The script works in its own database",
        "(`cron_celery_bench`, created and migrated by it) and in Redis keys and queues named with a",
        "per-run tag; it never flushes Redis, and deletes only what carries its tag.",
        "",
    ]
