"""Slot to publish, to start, to end: real beats and workers, cron_celery against DatabaseScheduler.

For every N (``--sizes``; 100, 1,000 and 10,000 by default) two schedulers run, one after the
other, each for the same ``--minutes`` whole minutes, with the tables and the queue emptied in
between:

  cron_celery        two ``celery beat -S cron_celery.beat.Scheduler`` (the first started is
                     the leader, the second its standby) with three lock masters of their own
                     (``redis-server`` on free ports: the leader's Redlock and every run's job
                     lock); N jobs (``bench/latency_jobs.py``: default pattern and overlap) whose
                     body notes when it began;
  DatabaseScheduler  one ``celery beat`` with django-celery-beat's scheduler (``bench.latency_beat``:
                     unchanged but for noting when each entry was due) and N ``PeriodicTask`` rows
                     of a plain task whose body notes when it began and ended. It has no leader
                     election, so a second beat would send every task twice: it runs alone.

Both send to the same ``--workers`` prefork workers (``--concurrency`` each), which consume a
queue of the run's own. The jobs run every minute (``--mix minute``) or a mix (``--mix mix``:
seven in ten every minute, one every 10 s, one hourly at :00, one daily at 00:00; see
``bench/latency_mix.py``).

Measured for every slot in the window (the ``--minutes`` minutes that begin at the first minute
boundary after every process is ready, or ``--warmup`` minutes later), as delays after the slot:

  recorded     cron_celery only: the execution row's ``created_at`` (``now()`` as the beat's
               insert began);
  handed       cron_celery only: ``send_task`` handed the message to kombu's publish batch
               (Celery's ``after_task_publish``); the batch reaches Redis later, at "published";
  published    the message reached Redis: for cron_celery the moment kombu's publish pipeline
               carrying it was executed, for DatabaseScheduler the return of its publish (both
               noted in the beat process, ``bench/latency_jobs.py``);
  body start   the body's own ``time.time()`` at its first line;
  final write  cron_celery: the row's ``ended``; DatabaseScheduler: the body's last instant
               (the plain task writes nothing else).

p50 / p95 / p99 / max of each; how many of each minute's slots had their final write before
the next minute began; and the workers' throughput (final writes per second over the seconds in
which at least one landed, and the best 5 s) so that a reader sees whether the beat or the
workers set the limit. The run goes on after the window until every window slot sent has
ended and the beat has sent a slot past the window, or ``--drain-cap`` seconds.

Usage, from the repository root::

    ./.venv-dj52/bin/python bench/latency.py --sizes 100,1000 --minutes 2
    ./.venv-dj52/bin/python bench/latency.py --quick            # N = 100, one minute
    ./.venv-dj52/bin/python bench/latency.py --mix mix --sizes 1000

Needs Redis (REDIS_URL, default redis://127.0.0.1:6379/0: the broker, and the notes under
``cron-celery-latency-<tag>``, deleted at the end), ``redis-server`` on the PATH (the lock
masters) and PostgreSQL (DATABASE_URL; its host, port and user with the database
``cron_celery_latency`` (``BENCH_LATENCY_DB``), created and migrated here; its cron_celery and
periodic-task tables are emptied before each scheduler and at the end. It is not
``cron_celery_bench``, so that another benchmark working there at the same time is not disturbed).

This module runs the phases; its parts are ``bench/latency_figures.py`` (the samples, percentiles
and the table), ``bench/latency_processes.py`` (the beats, workers and lock masters),
``bench/latency_database.py`` (the tables) and ``bench/latency_redis.py`` (the notes and the queue).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import os
import platform
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``bench`` and ``cron_celery`` importable
    sys.path.insert(0, str(ROOT))

from bench import latency_mix  # noqa: E402
from bench.common import (  # noqa: E402
    broker_client,
    log,
    log_machine,
    run,
    setup_django,
    stop_on_sigterm,
    write_results,
)
from bench.kombu_keys import sweep  # noqa: E402
from bench.latency_database import (  # noqa: E402
    beats_seen,
    create_periodic_tasks,
    cron_ready,
    cron_samples,
    cron_window_done,
    reset_tables,
)
from bench.latency_figures import (  # noqa: E402
    CRON,
    DBS,
    LABELS,
    SIDES,
    Sample,
    delays,
    dispatch_rounds,
    done_in_minute,
    next_boundary,
    percentile,
    render,
    seconds,
    spread,
    summarize,
    throughput,
    utc,
)
from bench.latency_processes import Process, RedisMaster, wait_until  # noqa: E402
from bench.latency_redis import Notes, clear_notes, dbs_window_done, publish_cost, purge_queue  # noqa: E402

#: The figures are computed in ``bench.latency_figures``; they are named here too, for the
#: script's tests and for anyone reading a run's figures through this module.
__all__ = ["Sample", "delays", "dispatch_rounds", "done_in_minute", "percentile", "render", "seconds", "spread",
           "summarize", "throughput", "utc"]

DEFAULT_SIZES = (100, 1000, 10_000)
QUICK_SIZES = (100,)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Setup:
    """What every phase of one invocation shares."""

    tag: str
    key: str  # the Redis notes' prefix, also the queue's
    queue: str
    masters: tuple[str, ...]
    logs: Path
    args: argparse.Namespace

    def env(self, side: str, n: int, *, beat: bool = False) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if key != "CRON_CELERY_BEAT_ALWAYS_LEAD"}
        env.update({
            "DJANGO_SETTINGS_MODULE": "bench.latency_settings", "BENCH_DEFAULT_QUEUE": self.queue,
            "LATENCY_KEY": self.key, "LATENCY_SIDE": side, "LATENCY_JOBS": str(n), "LATENCY_MIX": self.args.mix,
            "LATENCY_MASTERS": ",".join(self.masters), "LATENCY_PREFIX": f"cron_celery:{self.key}",
            "LATENCY_STAMP": "1" if beat else "", "PYTHONUNBUFFERED": "1",
        })
        return env


def celery(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "bench.celery_app", *args]


def start_workers(job: Setup, side: str, n: int) -> list[Process]:
    from bench.celery_app import app

    workers = []
    for i in range(job.args.workers):
        node = f"latency{i}-{job.tag}@{socket.gethostname()}"
        workers.append(Process(f"worker {node}", celery(
            "worker", "--pool", "prefork", "--concurrency", str(job.args.concurrency), "-Q", job.queue, "-n", node,
            "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING",
        ), job.env(side, n), job.logs / f"{side}-{n}-worker{i}.log"))
    nodes = {f"latency{i}-{job.tag}@{socket.gethostname()}" for i in range(job.args.workers)}

    def answered() -> bool:
        replies = app.control.ping(destination=sorted(nodes), timeout=1.0)
        return {name for reply in replies for name in reply} >= nodes

    wait_until("the workers to answer a ping", answered, 120 + n / 100, list(workers), interval=0.2)
    return workers


def start_beat(job: Setup, side: str, n: int, name: str) -> Process:
    scheduler = "cron_celery.beat.Scheduler" if side == CRON else "bench.latency_beat:DueScheduler"
    schedule_file = job.logs / f"{side}-{n}-{name}.schedule"  # unused by both schedulers; kept out of the tree
    return Process(f"beat {name}", celery("beat", "-S", scheduler, "--loglevel", "WARNING", "-s", str(schedule_file)),
                   job.env(side, n, beat=True), job.logs / f"{side}-{n}-{name}.log")


def phase(job: Setup, side: str, n: int, client: Any) -> dict[str, Any]:
    """One scheduler at one size: start, measure the window, drain, stop, collect."""
    args = job.args
    reset_tables()
    clear_notes(client, job.key)
    purge_queue(client, job.queue)
    if side == DBS:
        create_periodic_tasks(n, args.mix)
    processes: list[Process] = []
    begun = time.time()
    try:
        processes += start_workers(job, side, n)
        leader = start_beat(job, side, n, "leader")
        processes.append(leader)
        if side == CRON:
            wait_until("the first beat to lead", lambda: cron_ready(n), 180 + n / 50, processes)
            processes.append(start_beat(job, side, n, "standby"))
            wait_until("the standby beat's heartbeat", lambda: beats_seen() >= 2, 180 + n / 50, processes)
        else:
            wait_until("DatabaseScheduler to read its entries", lambda: bool(client.exists(f"{job.key}:ready:dbs")),
                       180 + n / 50, processes)
        ready = time.time()
        start = next_boundary(ready + 3) + 60 * args.warmup
        end = start + 60 * args.minutes
        log(f"  {LABELS[side]:<18} N={n:<6} ready in {ready - begun:.1f} s; window "
            f"{utc(start):%H:%M:%S}-{utc(end):%H:%M:%S} UTC")
        while time.time() < end:
            for process in processes:
                process.check_alive()
            time.sleep(min(1.0, max(0.0, end - time.time())))
        deadline = end + args.drain_cap
        if side == CRON:
            def done() -> bool:
                return cron_window_done(start, end)
        else:
            def done() -> bool:
                return dbs_window_done(client, job.key, end)
        while not (drained := done()) and time.time() < deadline:
            for process in processes:
                process.check_alive()
            time.sleep(1.0)
        drain_s = time.time() - end
        time.sleep(0.6)  # the beats' last notes (written every quarter of a second)
    finally:
        for process in reversed(processes):  # the beats first: nothing new is sent to stopping workers
            process.stop()
    leader_log = leader.text()
    notes = Notes.read(client, job.key)
    expected = latency_mix.expected_per_minute(n, args.mix, start, args.minutes)
    if side == CRON:
        samples, statuses = cron_samples(start, end, notes)
    else:
        samples, statuses = notes.dbs_samples(start, end), {}
    result = summarize(samples, expected)
    result.update({
        "scheduler": LABELS[side], "n": n, "window": [utc(start).isoformat(), utc(end).isoformat()],
        "ready_s": ready - begun, "drained": drained, "drain_s": drain_s, "statuses": statuses,
        "beats": 2 if side == CRON else 1, "dispatch": dispatch_rounds(leader_log) if side == CRON else None,
    })
    figures = result["delays"]
    log(f"  {'':<18} {'':<8} published p99 {seconds(figures['published']['p99'])}, final write p99 "
        f"{seconds(figures['ended']['p99'])}; {result['throughput']['per_s']:.1f} final writes/s"
        + ("" if drained else " (drain cap reached)"))
    return result


def versions() -> dict[str, str]:
    import celery as celery_package
    import django
    import django_celery_beat
    import kombu
    import redis

    return {"python": platform.python_version(), "django": django.get_version(),
            "celery": celery_package.__version__, "kombu": kombu.__version__,
            "django_celery_beat": getattr(django_celery_beat, "__version__", "?"), "redis_py": redis.__version__}


def parse_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected sizes such as 100,1000: {text!r}") from exc
    if not sizes or any(size < 1 or size > 99_999 for size in sizes):
        raise argparse.ArgumentTypeError("sizes are 1..99999")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", type=parse_sizes, default=None,
                        help="numbers of jobs, comma-separated (default 100,1000,10000)")
    parser.add_argument("--minutes", type=int, default=None,
                        help="whole minutes measured per scheduler (default 2; 1 with --quick)")
    parser.add_argument("--workers", type=int, default=2, help="celery workers (default 2)")
    parser.add_argument("--concurrency", type=int, default=2, help="prefork processes per worker (default 2)")
    parser.add_argument("--mix", choices=latency_mix.MIXES, default="minute",
                        help="minute: every job every minute (default); mix: 7/10 every minute, 1/10 every 10 s, "
                             "1/10 hourly at :00, 1/10 daily at 00:00")
    parser.add_argument("--schedulers", default=",".join(SIDES),
                        help=f"which to run, comma-separated (default {','.join(SIDES)})")
    parser.add_argument("--warmup", type=int, default=0,
                        help="whole minutes run before the window, not measured (default 0: the window's first "
                             "minute meets freshly started pool processes)")
    parser.add_argument("--drain-cap", type=float, default=120.0,
                        help="seconds after the window to wait for its slots to end (default 120)")
    parser.add_argument("--quick", action="store_true", help="N = 100 and one minute (unless given)")
    parser.add_argument("--json", type=Path, default=None,
                        help="write the results here (default bench/results/latency-<time>.json)")
    args = parser.parse_args(argv)
    sizes: tuple[int, ...] = args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    if args.minutes is None:
        args.minutes = 1 if args.quick else 2
    sides = [side.strip() for side in args.schedulers.split(",") if side.strip()]
    if not sides or any(side not in SIDES for side in sides):
        parser.error(f"--schedulers takes some of {', '.join(SIDES)}")
    if args.minutes < 1 or args.workers < 1 or args.concurrency < 1 or args.warmup < 0:
        parser.error("--minutes, --workers and --concurrency are at least 1, --warmup at least 0")

    tag = uuid.uuid4().hex[:10]
    key = f"cron-celery-latency-{tag}"
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.latency_settings"
    os.environ["BENCH_DEFAULT_QUEUE"] = f"{key}-q"
    os.environ.pop("CRON_CELERY_BEAT_ALWAYS_LEAD", None)
    stop_on_sigterm()
    redis_url, client = broker_client()
    db_name = setup_django()
    started_at = dt.datetime.now(dt.UTC)
    settings = {
        "date": started_at.strftime("%Y-%m-%d %H:%M UTC"), "sizes": list(sizes), "minutes": args.minutes,
        "workers": args.workers, "concurrency": args.concurrency, "mix": args.mix, "schedulers": sides,
        "warmup_minutes": args.warmup, "drain_cap_s": args.drain_cap, "queue": f"{key}-q", "broker": redis_url,
        "database": db_name,
        "cpus": os.cpu_count(), "loadavg": os.getloadavg(), "lock_masters": 3, **versions(),
    }
    log(f"latency benchmark, {settings['date']}: N = {', '.join(f'{n:,}' for n in sizes)}, mix {args.mix}, "
        f"{args.minutes} minute(s) per scheduler, {args.workers} worker(s) x {args.concurrency}")
    log_machine(settings["cpus"], settings["loadavg"][0], "indicative only")

    results: dict[str, dict[str, Any]] = {}
    masters: list[RedisMaster] = []
    logs = Path(tempfile.mkdtemp(prefix="cron-celery-latency-"))  # kept: the beats' and workers' logs
    log(f"  logs of the beats, workers and lock masters in {logs}")
    try:
        masters = [RedisMaster(logs) for _ in range(3)]
        job = Setup(tag=tag, key=key, queue=f"{key}-q", masters=tuple(m.url for m in masters), logs=logs, args=args)
        settings["publish_cost"] = cost = publish_cost(client, f"{key}-q")
        log(f"  publishing a round of {cost['messages']:,} messages: {cost['round_us']:.0f} us a message, "
            f"send_task per message {cost['send_task_us']:.0f} us (x{cost['ratio']:.2f})")
        for n in sizes:
            results[str(n)] = {}
            for side in sides:
                results[str(n)][side] = phase(job, side, n, client)
            log("")
            for line in render({str(n): results[str(n)]}, settings):
                log(line)
    finally:
        for master in masters:
            master.stop(grace=5)
        with contextlib.suppress(Exception):
            reset_tables()
        sweep(client, tag)

    write_results("latency", started_at, {"settings": settings, "results": results}, args.json)
    return 0


if __name__ == "__main__":
    run(main)
