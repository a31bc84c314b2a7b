"""What tracking a run costs: no-op tasks per second through one real prefork worker.

Four variants of the same no-op body (one Redis ``INCR``, see ``bench/tasks.py``):

  (i)   a bare Celery task, no result backend;
  (ii)  the same task with django-celery-results storing a row per task (``django-db``);
  (iii) a ``cron_task`` job (pattern "always", overlap "allow"), one slot per message,
        recorded as a ``CronExecution`` row; no result backend;
  (iv)  a celery-once task (``base=QueueOnce``, Redis backend): each message takes a Redis
        lock when it is published and the worker deletes it after the task; no result backend.

For each variant and repeat a fresh ``celery worker --pool prefork --concurrency 2`` is
started on a warm-up queue; once it answers a ping and has run a few warm-up messages,
N messages are published to a second queue (the queue is pre-filled) and the worker is
told to consume it (``add_consumer``). The clock starts when the first of the N has
finished (the task writes that time to Redis) and stops when the last one is done: the
Redis counter reached N for (i), and the result rows (ii) or succeeded executions (iii)
in PostgreSQL reached N, and for (iv) the counter reached N and none of the N locks is left.
Throughput is (N - 1) / elapsed. The variants are interleaved (i, ii, iii, iv, i, ii...)
and the medians of the repeats are reported, with the ratios (iii)/(i), (iii)/(ii) and
(iii)/(iv).

It also counts, in this process, the SQL statements and transactions of 100 tracked runs
(the task called directly) and of 100 django-db result writes, and times one WAL flush on this
machine (pg_test_fsync beside the data directory, for the server's ``wal_sync_method``).

``--also-commit-off`` adds (ii) and (iii) again, in turn with the others, their worker's connections
with ``synchronous_commit = off``: the commit cost taken out on both sides. ``--profile SVG`` then runs
N tracked runs once more under py-spy and draws the pool processes' flame graph (``bench/flame.py``).

Usage, from the repository root::

    ./.venv-dj52/bin/python bench/overhead.py            # N=2000, 3 repeats
    ./.venv-dj52/bin/python bench/overhead.py --quick    # N=200, 1 repeat: a smoke test

Needs Redis (REDIS_URL, default redis://127.0.0.1:6379/0) and PostgreSQL (DATABASE_URL;
its host, port and user are used with the database ``cron_celery_bench``, created and
migrated here). Redis is never flushed: the queues, counters and bindings this run
created carry a unique tag and only those are deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import itertools
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``bench`` and ``cron_celery`` importable
    sys.path.insert(0, str(ROOT))

from bench import flame, overhead_figures  # noqa: E402
from bench.common import (  # noqa: E402
    BenchError,
    broker_client,
    clean_tracked_tables,
    count_rows,
    log,
    log_machine,
    run,
    stop_on_sigterm,
    write_results,
)
from bench.common import ensure_database as create_database  # noqa: E402

os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

TAG = uuid.uuid4().hex[:10]
PREFIX = f"cron-celery-bench-{TAG}"
# Read by bench/settings.py at import, here and in the workers (inherited environment).
os.environ["BENCH_DEFAULT_QUEUE"] = f"{PREFIX}-default"

#: The timed runs' slots: from a week ago, a minute apart, so that each run's final write updates
#: the hourly and duration rollups as a live job's does (a slot older than their 8-day horizon
#: skips them). Each phase empties the tables first, so phases may reuse slots; a phase of more
#: than 10,080 runs reaches slots in the future, which changes nothing here.
SLOT_BASE = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0) - dt.timedelta(days=7)
WARMUP_BASE = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
PRIORITY_SEP = "\x06\x16"  # kombu's Redis transport: "queue\x06\x16<priority>" keys
PRIORITY_STEPS = (3, 6, 9)


@dataclasses.dataclass(frozen=True)
class Variant:
    key: str
    label: str
    task: str  # the task's name
    result_backend: str  # "" = none
    table: str = ""  # the table whose rows mark completion ("" = the Redis counter only)
    done_status: str = ""
    reuse: bool = True  # False: the worker runs without CELERY_DB_REUSE_MAX
    once: bool = False  # celery-once: done when the counter is complete and no lock is left
    commit: str = ""  # "off": the worker's connections run with synchronous_commit = off


VARIANTS = (
    Variant("bare", "(i)   bare Celery task", "bench.noop", ""),
    Variant("results", "(ii)  + django-celery-results", "bench.noop", "django-db",
            "django_celery_results_taskresult", "SUCCESS"),
    Variant("tracked", "(iii) cron_task (tracked)", "bench.tracked_noop", "",
            "cron_celery_cronexecution", "SUCCEEDED"),
    Variant("once", "(iv)  celery-once QueueOnce", "bench.once_noop", "", once=True),
)
#: With ``--also-without-reuse``: (ii) and (iii) again, without CELERY_DB_REUSE_MAX.
NO_REUSE_VARIANTS = (
    Variant("results-noreuse", "(ii')  (ii) without DB_REUSE_MAX", "bench.noop", "django-db",
            "django_celery_results_taskresult", "SUCCESS", reuse=False),
    Variant("tracked-noreuse", "(iii') (iii) without DB_REUSE_MAX", "bench.tracked_noop", "",
            "cron_celery_cronexecution", "SUCCEEDED", reuse=False),
)
#: With ``--also-commit-off``: (ii) and (iii) again, their worker's connections with
#: ``synchronous_commit = off`` (a commit returns before its WAL is flushed): the commit cost
#: taken out on both sides, so that what is left between them is code.
COMMIT_OFF_VARIANTS = (
    Variant("results-commit-off", "(ii*)  (ii), synchronous_commit off", "bench.noop", "django-db",
            "django_celery_results_taskresult", "SUCCESS", commit="off"),
    Variant("tracked-commit-off", "(iii*) (iii), synchronous_commit off", "bench.tracked_noop", "",
            "cron_celery_cronexecution", "SUCCEEDED", commit="off"),
)
ALL_VARIANTS = VARIANTS + NO_REUSE_VARIANTS + COMMIT_OFF_VARIANTS


# --------------------------------------------------------------------------- database


def ensure_database() -> str:
    """Create the benchmark's database when missing; returns its name."""
    from bench import settings as bench_settings

    db: dict[str, Any] = bench_settings.DATABASES["default"]
    create_database(db)
    return str(db["NAME"])


def setup_django() -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def status_counts(table: str) -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT status, count(*) FROM {table} GROUP BY status")
        return {str(status): int(count) for status, count in cursor.fetchall()}


def server_facts() -> dict[str, str]:
    from django.db import connection

    facts = {}
    with connection.cursor() as cursor:
        for name in ("server_version", "synchronous_commit", "fsync", "shared_buffers"):
            cursor.execute("SELECT current_setting(%s)", [name])
            row = cursor.fetchone()
            facts[name] = str(row[0]) if row else "?"
    return facts


# ------------------------------------------------------------------ statement counting


@dataclasses.dataclass
class SqlCount:
    statements: int = 0
    commits: int = 0
    rollbacks: int = 0
    kinds: Counter[str] = dataclasses.field(default_factory=Counter)

    def minus(self, other: SqlCount) -> SqlCount:
        return SqlCount(self.statements - other.statements, self.commits - other.commits,
                        self.rollbacks - other.rollbacks, self.kinds - other.kinds)

    def copy(self) -> SqlCount:
        return SqlCount(self.statements, self.commits, self.rollbacks, Counter(self.kinds))


_KIND = re.compile(r"^\s*(\w+)(?:.*?\b(?:UPDATE|INTO|FROM)\s+\"?(\w+))?", re.S | re.I)


def _kind(statement: str) -> str:
    found = _KIND.match(statement)
    if found is None:
        return statement.split(None, 1)[0] if statement.strip() else "?"
    verb, table = found.group(1).upper(), found.group(2)
    if verb == "UPDATE":  # "UPDATE <table>": the table follows the verb directly
        table = statement.split()[1].strip('"')
    return f"{verb} {table}" if table else verb


@contextlib.contextmanager
def counting_sql() -> Iterator[SqlCount]:
    """Count the statements Django sends (``execute_wrapper``) and its commits/rollbacks."""
    from django.db import connections

    conn = connections["default"]
    count = SqlCount()

    def wrapper(execute: Callable[..., Any], statement: str, params: Any, many: bool,
                context: Any) -> Any:
        count.statements += 1
        count.kinds[_kind(statement)] += 1
        return execute(statement, params, many, context)

    real_commit, real_rollback = conn.commit, conn.rollback

    def commit() -> None:
        count.commits += 1
        real_commit()

    def rollback() -> None:
        count.rollbacks += 1
        real_rollback()

    setattr(conn, "commit", commit)  # noqa: B010 - shadow the bound method on this instance
    setattr(conn, "rollback", rollback)  # noqa: B010
    try:
        with conn.execute_wrapper(wrapper):
            yield count
    finally:
        delattr(conn, "commit")
        delattr(conn, "rollback")


def count_statements(runs: int) -> dict[str, Any]:
    """Statements per tracked run (task called directly) and per django-db result write."""
    from django_celery_results.backends.database import DatabaseBackend

    from bench import tasks
    from bench.celery_app import app
    from cron_celery.decisions import jobs as cron_jobs

    clean_tracked_tables()
    cron_jobs._job_ids.clear()  # the job's row was just truncated: the first run creates it
    per_run: list[SqlCount] = []
    with counting_sql() as count:
        for i in range(runs):
            before = count.copy()
            outcome = tasks.tracked_noop(slot=(SLOT_BASE + dt.timedelta(minutes=i)).isoformat())
            if outcome["status"] != "SUCCEEDED":
                raise BenchError(f"in-process tracked run {i} ended {outcome}")
            per_run.append(count.minus(before))
    steady = per_run[1:] or per_run
    tracked = {
        "runs": runs,
        "first_run_statements": per_run[0].statements,
        "first_run_kinds": dict(per_run[0].kinds),
        "statements_per_run": statistics.mean(c.statements for c in steady),
        "transactions_per_run": statistics.mean(c.commits for c in steady),
        "rollbacks": sum(c.rollbacks for c in per_run),
        "kinds_per_run": dict(steady[-1].kinds),
        "total_statements": count.statements,
    }

    backend = DatabaseBackend(app=app)
    writes: list[SqlCount] = []
    with counting_sql() as count:
        for _ in range(runs):
            before = count.copy()
            backend.mark_as_done(uuid.uuid4().hex, None)
            writes.append(count.minus(before))
    results = {
        "writes": runs,
        "statements_per_task": statistics.mean(c.statements for c in writes),
        "transactions_per_task": statistics.mean(c.commits for c in writes),
        "kinds_per_task": dict(writes[-1].kinds),
    }
    clean_tracked_tables()
    cron_jobs._job_ids.clear()
    return {"tracked": tracked, "results": results, "commit_cost": time_commits(max(runs, 1000))}


def time_commits(runs: int) -> dict[str, float]:
    """Milliseconds per tracked run (the task called directly) and per django-db result write,
    in this process, with PostgreSQL's ``synchronous_commit`` on (as measured above) and, for
    reference only, off: the difference is what waiting for each commit's WAL flush costs."""
    from django.db import connection
    from django_celery_results.backends.database import DatabaseBackend

    from bench import tasks
    from bench.celery_app import app
    from cron_celery.decisions import jobs as cron_jobs

    backend = DatabaseBackend(app=app)
    slots = itertools.count()

    def tracked() -> None:
        tasks.tracked_noop(slot=(SLOT_BASE + dt.timedelta(minutes=next(slots))).isoformat())

    def result() -> None:
        backend.mark_as_done(uuid.uuid4().hex, None)

    def wal_position() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')")
            return int(cursor.fetchone()[0])

    def per_call(call: Callable[[], None]) -> tuple[float, float]:
        """Milliseconds and bytes of WAL per call (the WAL of the whole server: run it quiet)."""
        for _ in range(10):  # warm: connection open, statements prepared
            call()
        wal = wal_position()
        started = time.perf_counter()
        for _ in range(runs):
            call()
        return (time.perf_counter() - started) * 1000 / runs, (wal_position() - wal) / runs

    figures: dict[str, float] = {}
    try:
        for mode in ("on", "off"):
            with connection.cursor() as cursor:
                cursor.execute(f"SET synchronous_commit = {mode}")
            suffix = "" if mode == "on" else "_async_commit"
            figures[f"tracked_ms{suffix}"], figures[f"tracked_wal_bytes{suffix}"] = per_call(tracked)
            figures[f"results_ms{suffix}"], figures[f"results_wal_bytes{suffix}"] = per_call(result)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET synchronous_commit")
        clean_tracked_tables()
        cron_jobs._job_ids.clear()
    return figures


# ----------------------------------------------------------------------------- worker


class Worker:
    """One ``celery worker`` subprocess in its own process group."""

    def __init__(self, *, node: str, queue: str, env: dict[str, str], concurrency: int,
                 log_path: Path) -> None:
        self.node = node
        self.log_path = log_path
        self.cmd = [
            sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker",
            "--pool", "prefork", "--concurrency", str(concurrency), "-Q", queue, "-n", node,
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "--loglevel", "WARNING",
        ]
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise BenchError(f"the worker exited with {self.proc.returncode}:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Warm shutdown (SIGTERM to the group), then SIGKILL whatever is left of it."""
        pgid = self.proc.pid  # start_new_session: the group id is the leader's pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)  # the leader or orphaned pool children
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            raise BenchError(f"worker process group {pgid} is still alive")
        self._log.close()


# ------------------------------------------------------------------------------ redis


def queue_keys(queue: str) -> list[str]:
    return [queue, *(f"{queue}{PRIORITY_SEP}{p}" for p in PRIORITY_STEPS),
            f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}"]


def sweep_redis(client: redis.Redis, marks: list[str]) -> int:
    """Delete the keys, binding members and unacked entries that carry one of ``marks``.

    Shared keys (``_kombu.binding.*`` sets of common exchanges, ``unacked``) are never
    deleted; only their members naming this run's queues or nodes are removed.
    """
    removed = 0

    def ours(value: bytes | str) -> bool:
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        return any(mark in text for mark in marks)

    for mark in marks:
        for key in client.scan_iter(match=f"*{mark}*", count=500):
            removed += int(client.delete(key))
    for pattern in ("_kombu.binding.*", "_kombu.binding_permanent.*"):
        for key in client.scan_iter(match=pattern, count=500):
            if client.type(key) != b"set":
                continue
            members = [m for m in client.smembers(key) if ours(m)]
            if members:
                removed += int(client.srem(key, *members))
    if client.type("_kombu.binding_deadlines") == b"zset":
        members = [m for m, _ in client.zscan_iter("_kombu.binding_deadlines") if ours(m)]
        if members:
            removed += int(client.zrem("_kombu.binding_deadlines", *members))
    if client.type("unacked") == b"hash":  # only after a crash: messages of our queues
        tags = [tag for tag, value in client.hscan_iter("unacked") if ours(value)]
        if tags:
            removed += int(client.hdel("unacked", *tags))
            if client.type("unacked_index") == b"zset":
                client.zrem("unacked_index", *tags)
    return removed


# ------------------------------------------------------------------------------- runs


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
    with app.producer_or_acquire() as producer:
        for i in range(count):
            kwargs = {}
            if variant.task in ("bench.tracked_noop", "bench.once_noop"):
                kwargs["slot"] = (base + dt.timedelta(minutes=i)).isoformat()
            if variant.once:  # the queue's name carries the run's tag into the lock's key
                kwargs["tag"] = queue
                lock_keys.append(task.get_key((), kwargs))
            task.apply_async(kwargs=kwargs, queue=queue, producer=producer)
    return lock_keys


def run_once(app: Any, client: redis.Redis, variant: Variant, *, n: int, warmup: int,
             concurrency: int, label: str, logdir: Path, profile: Path | None = None) -> dict[str, Any]:
    """One timed run of ``n`` messages of one variant through a fresh worker. With ``profile``,
    py-spy samples the worker's processes while the ``n`` run and writes its raw stacks there."""
    queue = f"{PREFIX}-{label}"
    warm_queue = f"{queue}-warm"
    node = f"{PREFIX}-{label}@{socket.gethostname()}"
    counter = f"{PREFIX}:{label}:done"
    clean_tracked_tables()
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
    worker = Worker(node=node, queue=warm_queue, env=env, concurrency=concurrency,
                    log_path=logdir / f"worker-{label}.log")
    spy: subprocess.Popen[bytes] | None = None
    try:
        started = time.perf_counter()
        wait_for("the worker to answer a ping",
                 lambda: bool(app.control.ping(destination=[node], timeout=0.5)),
                 120, worker, interval=0.2)
        ready_s = time.perf_counter() - started

        def done(total: int) -> Callable[[], bool]:
            def check() -> bool:
                return int(client.get(counter) or 0) >= total
            return check

        def rows(total: int) -> Callable[[], bool]:
            return lambda: count_rows(variant.table, variant.done_status) >= total

        def released(keys: list[str]) -> Callable[[], bool]:
            return lambda: not keys or int(client.exists(*keys)) == 0

        # Warm-up: every pool process imports, connects and runs a few messages.
        warm_locks = publish(app, variant, warm_queue, warmup, WARMUP_BASE)
        wait_for("the warm-up messages", done(warmup), 60, worker)
        if variant.table:
            wait_for("the warm-up rows", rows(warmup), 60, worker)
        wait_for("the warm-up locks to be released", released(warm_locks), 60, worker)

        lock_keys = publish(app, variant, queue, n, SLOT_BASE)
        if variant.once and int(client.exists(*lock_keys)) != n:
            raise BenchError(f"expected {n} celery-once locks, found {client.exists(*lock_keys)}")
        queued = int(client.llen(queue))
        if queued != n:
            raise BenchError(f"expected {n} messages in {queue}, found {queued}")

        spy = start_profiler(worker, profile, logdir) if profile is not None else None
        consume_at = time.time()
        replies = app.control.add_consumer(
            queue, exchange=queue, exchange_type="direct", routing_key=queue,
            destination=[node], reply=True, timeout=5,
        )
        if not replies:
            raise BenchError(f"the worker did not confirm consuming {queue}")
        total = warmup + n
        t1 = wait_for(f"{n} completions", done(total), max(120.0, n / 10), worker)
        if variant.table:
            t1 = wait_for(f"{n} rows in {variant.table}", rows(total), 60, worker, 0.005)
        if variant.once:
            t1 = wait_for(f"{n} celery-once locks to be released", released(lock_keys), 60, worker, 0.005)
        if spy is not None:
            stop_profiler(spy)
        # The clock starts when the first of the N finished (the worker wrote the time):
        # the worker's Redis poll only picks the new queue up when its current BRPOP on
        # the warm-up queue returns (up to a second later), which must not be counted.
        first = client.get(f"{counter}:first")
        if first is None:
            raise BenchError("the first timed message did not record its time")
        t0 = float(first)
        elapsed = t1 - t0
        statuses = status_counts(variant.table) if variant.table else {}
        if variant.table and statuses != {variant.done_status: total}:
            raise BenchError(f"unexpected rows in {variant.table}: {statuses}")
        left = int(client.llen(queue))
        if left:
            raise BenchError(f"{left} messages left in {queue}")
        return {"variant": variant.key, "n": n, "seconds": elapsed, "rate": (n - 1) / elapsed,
                "pickup_seconds": t0 - consume_at, "worker_ready_seconds": ready_s,
                "rows": statuses}
    except BaseException:
        log(f"worker log ({worker.log_path}):\n{worker.tail()}")
        raise
    finally:
        if spy is not None and spy.poll() is None:
            spy.kill()
            spy.wait(timeout=10)
        worker.stop()
        client.delete(counter, f"{counter}:first", *queue_keys(queue), *queue_keys(warm_queue),
                      *queue_keys(f"{node}.celery.pidbox"))


def profile(app: Any, client: redis.Redis, args: argparse.Namespace, n: int) -> dict[str, Any]:
    """``--profile``: ``profile_tracked``, printed; a profiler that cannot run (py-spy missing, no
    right to trace) is recorded as such and fails nothing."""
    try:
        profiled = profile_tracked(app, client, n=n, warmup=args.warmup, concurrency=args.concurrency,
                                   svg=args.profile)
    except BenchError as error:
        log(f"\nnot profiled: {error}")
        return {"error": str(error).splitlines()[0]}
    log(f"\n{n:,} tracked runs at {profiled['rate']:.0f} runs/s under py-spy; flame graph: {args.profile}")
    for line in flame.summary_lines(profiled["summary"]):
        log(line)
    return profiled


# ------------------------------------------------------------------------------ fsync

def pg_test_fsync(server_version: str) -> str | None:
    """The server's own pg_test_fsync (Debian's /usr/lib/postgresql/<major>/bin), else any."""
    major = server_version.split(".", 1)[0].split(None, 1)[0]
    candidates = [Path(f"/usr/lib/postgresql/{major}/bin/pg_test_fsync"),
                  *sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_test_fsync"), reverse=True)]
    for path in candidates:
        if path.exists():
            return str(path)
    return shutil.which("pg_test_fsync")


def measure_fsync(seconds: int) -> dict[str, Any]:
    """One WAL flush on this machine: pg_test_fsync on a file beside PostgreSQL's data directory
    (same filesystem), the figure of the server's ``wal_sync_method``. ``measured`` is False,
    with ``why``, where it cannot be (a server elsewhere, no pg_test_fsync, no rights)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('wal_sync_method'), current_setting('server_version'), "
                       "current_setting('data_directory', true), inet_server_addr()::text")
        method, version, data_dir, address = cursor.fetchone()
    facts: dict[str, Any] = {"method": method, "data_directory": data_dir, "seconds_per_test": seconds}
    tool = pg_test_fsync(str(version))
    parent = Path(data_dir).parent if data_dir else None
    if tool is None:
        return {**facts, "measured": False, "why": "pg_test_fsync is not installed"}
    if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK):
        return {**facts, "measured": False,
                "why": f"the data directory ({data_dir or 'not readable'}) is not on a filesystem this process can "
                       f"write to (server at {address or 'a socket'})"}
    scratch = Path(tempfile.mkdtemp(prefix="cron-celery-fsync-", dir=parent))
    try:
        done = subprocess.run([tool, "-s", str(seconds), "-f", str(scratch / "test.out")],
                              capture_output=True, text=True, timeout=60 * seconds + 120, check=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode != 0:
        return {**facts, "measured": False, "why": f"pg_test_fsync failed: {done.stderr.strip()[:300]}"}
    parsed = overhead_figures.parse_pg_test_fsync(done.stdout)
    usecs = parsed["usecs_per_op"].get(str(method))
    if usecs is None:
        return {**facts, "measured": False, "why": f"pg_test_fsync gave no figure for {method}", **parsed}
    return {**facts, "measured": True, "tool": tool, "directory": str(parent), "usecs": usecs, **parsed}


# ---------------------------------------------------------------------------- summary

def parse_variants(text: str) -> tuple[str, ...]:
    keys = tuple(key.strip() for key in text.split(",") if key.strip())
    known = {v.key for v in ALL_VARIANTS}
    unknown = [key for key in keys if key not in known]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(sorted(known))} (got {text!r})")
    return keys


# ---------------------------------------------------------------------------- profile

#: Samples per second of each sampled process (py-spy's default is 100).
PROFILE_RATE = 200


def py_spy() -> str:
    """py-spy beside this interpreter (the dev extras install it), else on the PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if not found:
        raise BenchError("--profile needs py-spy (pip install py-spy; it is in the dev extras)")
    return found


def start_profiler(worker: Worker, out: Path, logdir: Path) -> subprocess.Popen[bytes]:
    """py-spy on the worker and its pool processes: every thread, idle ones too (a wait on
    PostgreSQL is time a run takes), one frame per function, raw (collapsed) stacks to ``out``."""
    cmd = [py_spy(), "record", "--pid", str(worker.proc.pid), "--subprocesses", "--idle", "--threads",
           "--nolineno", "--rate", str(PROFILE_RATE), "--format", "raw", "--output", str(out)]
    spy_log = open(logdir / "py-spy.log", "wb")  # noqa: SIM115 - the child keeps it; closed with it
    spy = subprocess.Popen(cmd, stdout=spy_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           start_new_session=True)
    spy_log.close()
    deadline = time.monotonic() + 10
    while b"Sampling" not in (logdir / "py-spy.log").read_bytes():
        if spy.poll() is not None or time.monotonic() > deadline:
            raise BenchError(f"py-spy did not start: {(logdir / 'py-spy.log').read_text(errors='replace')}")
        time.sleep(0.05)
    return spy


def stop_profiler(spy: subprocess.Popen[bytes]) -> None:
    """Ctrl-C for py-spy: it writes its file and ends."""
    spy.send_signal(signal.SIGINT)
    try:
        spy.wait(timeout=60)
    except subprocess.TimeoutExpired:
        spy.kill()
        raise BenchError("py-spy did not stop within a minute") from None


def profile_tracked(app: Any, client: redis.Redis, *, n: int, warmup: int, concurrency: int,
                    svg: Path) -> dict[str, Any]:
    """``--profile``: N tracked runs (iii) through one worker under py-spy; the flame graph of its
    pool processes goes to ``svg``, and where their time went is returned (``flame.summary``)."""
    variant = next(v for v in VARIANTS if v.key == "tracked")
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
    title = (f"A worker's pool processes running {n:,} tracked no-op runs (iii), "
             f"{result['rate']:.0f} runs/s, sampled by py-spy at {PROFILE_RATE}/s")
    svg.write_text(flame.svg(pool, title), encoding="utf-8")
    return {"rate": result["rate"], "svg": str(svg), "summary": flame.summary(pool)}


# ------------------------------------------------------------------------------- main


def versions(client: redis.Redis) -> dict[str, str]:
    from importlib import metadata

    import celery
    import django
    import django_celery_results
    import kombu

    return {"python": platform.python_version(), "django": django.get_version(),
            "celery": celery.__version__, "kombu": kombu.__version__,
            "django_celery_results": getattr(django_celery_results, "__version__", "?"),
            "celery_once": metadata.version("celery-once"),
            "psycopg": psycopg.__version__, "redis_py": redis.__version__,
            "redis_server": str(client.info("server").get("redis_version", "?"))}


def fmt_rate(value: float) -> str:
    return f"{value:8.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=None, help="messages per run (default 2000)")
    parser.add_argument("--repeat", type=int, default=None, help="runs per variant (default 3)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: N=200, 1 repeat (unless --n/--repeat say otherwise)")
    parser.add_argument("--concurrency", type=int, default=2, help="pool processes (default 2)")
    parser.add_argument("--warmup", type=int, default=20, help="warm-up messages per run")
    parser.add_argument("--statement-runs", type=int, default=100,
                        help="in-process tracked runs whose SQL is counted (default 100)")
    parser.add_argument("--also-without-reuse", action="store_true",
                        help="also run (ii) and (iii) without CELERY_DB_REUSE_MAX (not in the ratios)")
    parser.add_argument("--also-commit-off", action="store_true",
                        help="also run (ii) and (iii) with synchronous_commit = off in the worker (the commit "
                             "cost taken out on both sides)")
    parser.add_argument("--fsync-seconds", type=int, default=1,
                        help="seconds per test of pg_test_fsync, run beside the data directory (0: skip)")
    parser.add_argument("--variants", type=parse_variants, default=None,
                        help=f"only these variants ({', '.join(v.key for v in ALL_VARIANTS)}), comma-separated: "
                             "for a quick look; the page needs the four of the default run")
    parser.add_argument("--profile", type=Path, default=None, metavar="SVG",
                        help="after the timed runs, sample the pool processes of one more worker running N tracked "
                             "runs (iii) with py-spy: the flame graph goes to SVG, where the time goes to the JSON")
    parser.add_argument("--json", type=Path, default=None,
                        help="write the results here (default bench/results/overhead-<time>.json)")
    args = parser.parse_args(argv)
    n = args.n or (200 if args.quick else 2000)
    if n < 2:
        parser.error("--n must be at least 2")
    repeat = args.repeat or (1 if args.quick else 3)

    stop_on_sigterm()  # a SIGTERM must still stop the workers
    redis_url, client = broker_client()
    db_name = ensure_database()
    setup_django()

    from django.conf import settings

    from bench.celery_app import app

    db = settings.DATABASES["default"]
    reuse = app.conf.get("CELERY_DB_REUSE_MAX")
    facts = server_facts()
    started_at = dt.datetime.now(dt.UTC)
    header = {
        "date": started_at.strftime("%Y-%m-%d %H:%M UTC"),
        "n": n, "repeat": repeat, "warmup": args.warmup, "pool": "prefork",
        "concurrency": args.concurrency,
        "prefetch_multiplier": app.conf.worker_prefetch_multiplier,
        "CONN_MAX_AGE": db["CONN_MAX_AGE"], "CELERY_DB_REUSE_MAX": reuse,
        "database": f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/{db_name}",
        "broker": redis_url, "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
        "postgresql": facts, **versions(client),
    }
    log(f"cron_celery overhead benchmark, {header['date']}")
    log(f"  N={n} messages per run, {repeat} repeat(s), {args.warmup} warm-up messages first")
    log(f"  worker: celery worker --pool prefork --concurrency {args.concurrency} "
        f"(prefetch multiplier {header['prefetch_multiplier']}), one per run")
    log(f"  database: {header['database']}  CONN_MAX_AGE={db['CONN_MAX_AGE']}  "
        f"CELERY_DB_REUSE_MAX={reuse}")
    log(f"  PostgreSQL {facts['server_version']} (synchronous_commit={facts['synchronous_commit']}, "
        f"fsync={facts['fsync']}); broker {redis_url}")
    log(f"  Python {header['python']}, Django {header['django']}, Celery {header['celery']}, "
        f"django-celery-results {header['django_celery_results']}, celery-once {header['celery_once']}, "
        f"psycopg {header['psycopg']}, Redis {header['redis_server']}")
    log_machine(header["cpus"], header["loadavg"][0], "low and noisy")

    statements = count_statements(args.statement_runs)
    tracked_sql, results_sql = statements["tracked"], statements["results"]
    log("")
    log(f"SQL per tracked run (in-process, {tracked_sql['runs']} runs of the task called "
        f"directly): {tracked_sql['statements_per_run']:g} statements in "
        f"{tracked_sql['transactions_per_run']:g} transactions")
    log(f"  {tracked_sql['kinds_per_run']}")
    log(f"  the process's first run also registers the job: {tracked_sql['first_run_statements']} "
        f"statements {tracked_sql['first_run_kinds']}")
    log(f"SQL per django-db result (in-process, {results_sql['writes']} writes): "
        f"{results_sql['statements_per_task']:g} statements in "
        f"{results_sql['transactions_per_task']:g} transactions  {results_sql['kinds_per_task']}")
    cost = statements["commit_cost"]
    log(f"ms per call in-process: tracked run {cost['tracked_ms']:.3f}, django-db result {cost['results_ms']:.3f}; "
        f"with synchronous_commit off (reference): {cost['tracked_ms_async_commit']:.3f} and "
        f"{cost['results_ms_async_commit']:.3f}")
    log(f"WAL per call: tracked run {cost['tracked_wal_bytes']:,.0f} bytes, django-db result "
        f"{cost['results_wal_bytes']:,.0f} bytes")
    fsync = measure_fsync(args.fsync_seconds) if args.fsync_seconds > 0 else None
    if fsync is not None and fsync.get("measured"):
        log(f"one WAL flush ({fsync['method']}, pg_test_fsync -s {args.fsync_seconds} in {fsync['directory']}): "
            f"{fsync['usecs']:.0f} µs")
    elif fsync is not None:
        log(f"one WAL flush: not measured ({fsync['why']})")
    log("")

    variants = VARIANTS + (NO_REUSE_VARIANTS if args.also_without_reuse else ()) \
        + (COMMIT_OFF_VARIANTS if args.also_commit_off else ())
    if args.variants:
        variants = tuple(v for v in ALL_VARIANTS if v.key in args.variants)
    rates: dict[str, list[float]] = {v.key: [] for v in variants}
    details: list[dict[str, Any]] = []
    marks = [PREFIX, app.control.mailbox.oid]
    try:
        with tempfile.TemporaryDirectory(prefix="cron-celery-bench-") as tmp:
            for rep in range(1, repeat + 1):
                for variant in variants:
                    result = run_once(app, client, variant, n=n, warmup=args.warmup,
                                      concurrency=args.concurrency,
                                      label=f"{variant.key}-{rep}", logdir=Path(tmp))
                    result["repeat"] = rep
                    details.append(result)
                    rates[variant.key].append(result["rate"])
                    log(f"run {rep}/{repeat} {variant.label:<32} {result['rate']:8.1f} tasks/s "
                        f"({n - 1} in {result['seconds']:.3f}s after the first)")
        profiled = profile(app, client, args, n) if args.profile is not None else None
    finally:
        sweep_redis(client, marks)
        with contextlib.suppress(Exception):
            clean_tracked_tables()

    summary = overhead_figures.summarise(rates, args.concurrency)
    medians = summary["medians"]
    log("")
    runs_header = "".join(f"   run {i}" for i in range(1, repeat + 1))
    log(f"{'variant':<38}{runs_header}   median  (tasks/s)")
    for variant in variants:
        cells = "".join(fmt_rate(r) for r in rates[variant.key])
        log(f"{variant.label:<38}{cells} {fmt_rate(medians[variant.key])}")
    log("")
    for line in overhead_figures.summary_lines(summary, fsync):
        log(line)
    log(f"statements per tracked run: {tracked_sql['statements_per_run']:g} in "
        f"{tracked_sql['transactions_per_run']:g} transactions "
        f"(django-db result: {results_sql['statements_per_task']:g} in "
        f"{results_sql['transactions_per_task']:g})")

    ratios = summary["ratios"]
    write_results("overhead", started_at, {
        "settings": header, "statements": statements, "runs": details, "fsync": fsync, "profile": profiled,
        "medians": medians, "ratio_iii_i": ratios.get("bare"), "ratio_iii_ii": ratios.get("results"),
        "ratio_iii_iv": ratios.get("once"), "ratio_iii_ii_commit_off": ratios.get("results-commit-off"),
        "gap_us": summary["gap_us"],
    }, args.json)
    return 0


if __name__ == "__main__":
    run(main)
