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
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import math
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``bench`` and ``cron_celery`` importable
    sys.path.insert(0, str(ROOT))

from bench import latency_mix  # noqa: E402
from bench.common import (  # noqa: E402
    BenchError,
    broker_client,
    log,
    log_machine,
    run,
    setup_django,
    stop_on_sigterm,
    write_results,
)

CRON = "cron_celery"
DBS = "dbs"
SIDES = (CRON, DBS)
LABELS = {CRON: "cron_celery", DBS: "DatabaseScheduler"}
DEFAULT_SIZES = (100, 1000, 10_000)
QUICK_SIZES = (100,)
PRIORITY_SEP = "\x06\x16"  # kombu's Redis transport names priority lists "queue\x06\x16<n>"
#: The steps measured, in the table's order: (key, words); the last differs by scheduler.
STEPS = (("recorded", "slot → recorded (row)"), ("handed", "slot → handed to kombu"), ("published", "slot → published"),
         ("started", "slot → body start"), ("ended", "slot → final write"))
#: Steps only cron_celery has: its row, and a publish pipeline apart from the send.
OPTIONAL_STEPS = ("recorded", "handed")
END_WORDS = {CRON: "slot → final write", DBS: "slot → body end"}
ROUND_RE = re.compile(r"dispatched (\d+) slot\(s\) of (\d+) job\(s\) in (\d+) ms")


# ------------------------------------------------------------------------ the figures


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sample:
    """One slot of one job (epoch seconds); None: that did not happen (or was not seen)."""

    slot: float
    recorded: float | None = None
    handed: float | None = None
    published: float | None = None
    started: float | None = None
    ended: float | None = None


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile (``share`` in 0..1] of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(share * len(ordered))) - 1]


def spread(values: list[float]) -> dict[str, float | int | None]:
    """Count, p50, p95, p99 and max of ``values`` (None for an empty list)."""
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
    return {"n": len(values), "p50": percentile(values, 0.50), "p95": percentile(values, 0.95),
            "p99": percentile(values, 0.99), "max": max(values)}


def delays(samples: Iterable[Sample], step: str) -> list[float]:
    """Seconds from each slot to ``step`` (a ``Sample`` field), where it happened."""
    return [moment - sample.slot for sample in samples if (moment := getattr(sample, step)) is not None]


def done_in_minute(samples: Iterable[Sample], expected: Mapping[float, int]) -> list[dict[str, Any]]:
    """Per minute of the window (``expected``: its slots by the minute's start): how many of its
    slots had their final write before the next minute began."""
    done: Counter[float] = Counter()
    for sample in samples:
        minute = math.floor(sample.slot / 60) * 60.0
        if minute in expected and sample.ended is not None and sample.ended < minute + 60:
            done[minute] += 1
    return [{"minute": utc(minute).strftime("%H:%M"), "expected": count, "done": done[minute]}
            for minute, count in sorted(expected.items())]


def throughput(ends: Iterable[float], window: int = 5) -> dict[str, float | int]:
    """Final writes per second over the seconds in which at least one landed (``busy_s``), and
    the best ``window`` consecutive seconds."""
    per_second = Counter(math.floor(moment) for moment in ends)
    if not per_second:
        return {"completions": 0, "busy_s": 0, "per_s": 0.0, "peak_per_s": 0.0}
    total = sum(per_second.values())
    first, last = min(per_second), max(per_second)
    best = max(sum(per_second.get(second + k, 0) for k in range(window)) for second in range(first, last + 1))
    return {"completions": total, "busy_s": len(per_second), "per_s": total / len(per_second),
            "peak_per_s": best / window}


def summarize(samples: list[Sample], expected: Mapping[float, int]) -> dict[str, Any]:
    """The figures of one scheduler at one size, from the window's samples."""
    return {
        "expected": sum(expected.values()),
        "seen": len(samples),
        "delays": {step: spread(delays(samples, step)) for step, _words in STEPS},
        "per_minute": done_in_minute(samples, expected),
        "throughput": throughput(sample.ended for sample in samples if sample.ended is not None),
    }


def dispatch_rounds(log_text: str) -> dict[str, Any]:
    """The cron_celery beat's dispatch rounds, from its log lines: count, largest, time per round."""
    rounds = [(int(slots), int(ms)) for slots, _jobs, ms in ROUND_RE.findall(log_text)]
    if not rounds:
        return {"rounds": 0}
    times = [float(ms) for _slots, ms in rounds]
    return {"rounds": len(rounds), "largest": max(slots for slots, _ms in rounds),
            "ms_p50": percentile(times, 0.5), "ms_max": max(times),
            "slots_per_s": sum(slots for slots, _ms in rounds) / (sum(times) / 1000) if sum(times) else None}


def seconds(value: float | int | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if abs(value) < 1 else f"{value:.2f} s"


def render(results: Mapping[str, Mapping[str, Mapping[str, Any]]], settings: Mapping[str, Any]) -> list[str]:
    """The printed table: per N, per scheduler, each step's percentiles, the minutes, the workers."""
    lines: list[str] = []
    head = f"  {'':<18} {'':<24} {'count':>13} {'p50':>9} {'p95':>9} {'p99':>9} {'max':>9}"
    for size, by_side in results.items():
        first = next(iter(by_side.values()))
        lines.append(f"N = {int(size):,} ({settings['mix']}), {settings['minutes']} minute(s) from "
                     f"{first['window'][0][11:16]} UTC, {first['expected']:,} slots; "
                     f"{settings['workers']} worker(s) x {settings['concurrency']}")
        lines.append(head)
        for side, result in by_side.items():
            label = LABELS.get(side, side)
            for step, step_words in STEPS:
                figures = result["delays"][step]
                if step in OPTIONAL_STEPS and not figures["n"]:
                    continue
                words = END_WORDS.get(side, step_words) if step == "ended" else step_words
                count = f"{figures['n']:,}/{result['expected']:,}"
                lines.append(f"  {label:<18} {words:<24} {count:>13} {seconds(figures['p50']):>9} "
                             f"{seconds(figures['p95']):>9} {seconds(figures['p99']):>9} "
                             f"{seconds(figures['max']):>9}")
                label = ""
            minutes = ", ".join(f"{m['minute']} {m['done']:,}/{m['expected']:,}" for m in result["per_minute"])
            lines.append(f"  {'':<18} done before the next minute: {minutes}")
            flow = result["throughput"]
            lines.append(f"  {'':<18} workers: {flow['completions']:,} final writes, {flow['per_s']:.1f}/s over "
                         f"{flow['busy_s']} busy s, best 5 s {flow['peak_per_s']:.1f}/s")
            rounds = result.get("dispatch")
            if rounds and rounds.get("rounds"):
                lines.append(f"  {'':<18} beat: {rounds['rounds']} dispatch round(s), largest {rounds['largest']:,} "
                             f"slots, {rounds['ms_p50']:.0f} ms median, {rounds['ms_max']:.0f} ms max")
            if not result.get("drained", True):
                lines.append(f"  {'':<18} (stopped by --drain-cap before every window slot had ended)")
        lines.append("")
    return lines


def utc(moment: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(moment, tz=dt.UTC)


def next_boundary(after: float) -> float:
    """The first whole minute strictly after ``after``."""
    return (math.floor(after / 60) + 1) * 60.0


# -------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Process:
    """A subprocess in its own process group, its output in a log file."""

    def __init__(self, name: str, cmd: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(env), stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise BenchError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def stop(self, grace: float = 30) -> None:
        """SIGTERM to the process (a worker's warm shutdown lets its pool finish the tasks in
        hand; a signal to the whole group would kill them mid-task), then SIGKILL whatever is
        left of its group."""
        group = self.proc.pid  # start_new_session: the group's id is the leader's pid
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)  # the leader, or orphaned pool children
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self._log.close()


class RedisMaster(Process):
    """A throw-away ``redis-server`` on a free port: one of the three lock masters."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        directory = workdir / f"redis-{self.port}"
        directory.mkdir(parents=True, exist_ok=True)
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        super().__init__(f"redis-server :{self.port}",
                         [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                          "--dir", str(directory)], os.environ, directory / "redis.log")
        import redis

        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.Redis(port=self.port, socket_timeout=1).ping():
                    break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise BenchError(f"redis-server on port {self.port} did not start") from None
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


def wait_until(what: str, condition: Callable[[], bool], timeout: float, processes: list[Process],
               interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for process in processes:
            process.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


# --------------------------------------------------------------------------- database


def reset_tables() -> None:
    """Empty cron_celery's and django-celery-beat's tables in the script's own database (only there)."""
    from django.apps import apps
    from django.db import connection

    from bench import latency_settings
    from bench.run import FORBIDDEN_DATABASES

    name = connection.settings_dict["NAME"]
    if name != latency_settings.LATENCY_DB or name in FORBIDDEN_DATABASES:
        raise BenchError(f"refusing to empty tables in {name}")
    tables = [model._meta.db_table for label in ("cron_celery", "django_celery_beat")
              for model in apps.get_app_config(label).get_models() if not model._meta.proxy]
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")


def create_periodic_tasks(n: int, mix: str) -> None:
    """N periodic tasks of the plain task, the mix's schedules, each last run "now": the first
    slot of each is its schedule's next (the 10 s interval: the next multiple of 10 s)."""
    from django.utils import timezone
    from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask, PeriodicTasks

    from bench.latency_jobs import PLAIN_TASK

    crontabs = {}
    for kind, expression in latency_mix.CRON.items():
        minute, hour, day, month, weekday = expression.split()
        crontabs[kind] = CrontabSchedule.objects.create(minute=minute, hour=hour, day_of_month=day,
                                                        month_of_year=month, day_of_week=weekday, timezone="UTC")
    interval = IntervalSchedule.objects.create(every=latency_mix.PERIOD[latency_mix.EVERY_10S],
                                               period=IntervalSchedule.SECONDS)
    now = timezone.now()
    aligned = utc(math.floor(now.timestamp() / 10) * 10.0)
    rows = []
    for i in range(n):
        kind = latency_mix.kind_of(i, mix)
        if kind == latency_mix.EVERY_10S:
            rows.append(PeriodicTask(name=latency_mix.job_name(i, kind), task=PLAIN_TASK, interval=interval,
                                     last_run_at=aligned, enabled=True))
        else:
            rows.append(PeriodicTask(name=latency_mix.job_name(i, kind), task=PLAIN_TASK, crontab=crontabs[kind],
                                     last_run_at=now, enabled=True))
    PeriodicTask.objects.bulk_create(rows, batch_size=2000)
    PeriodicTasks.update_changed()  # bulk_create sends no signal


def cron_ready(n: int) -> bool:
    """The leader has synced the N jobs and ticked (its heartbeat says it leads)."""
    from cron_celery.models import BeatHeartbeat, CronJob

    return (BeatHeartbeat.objects.filter(leading=True).exists()
            and CronJob.objects.filter(code__startswith="LAT-", next_run_at__isnull=False).count() == n)


def beats_seen() -> int:
    from cron_celery.models import BeatHeartbeat

    return BeatHeartbeat.objects.count()


#: Statuses of a row whose body never ran: their ``ended`` is no final write of a run.
UNRUN = ("SKIPPED", "MISSED")
TERMINAL = ("SUCCEEDED", "FAILED", "TIMED_OUT", "LOST", "SKIPPED", "MISSED", "REVOKED")


def cron_window_done(start: float, end: float) -> bool:
    """Every window execution is over, and the beat has recorded a slot past the window."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) FILTER (WHERE slot < %(end)s AND status <> ALL(%(terminal)s)),
                   count(*) FILTER (WHERE slot >= %(end)s)
            FROM cron_celery_cronexecution WHERE task_code LIKE 'LAT-%%' AND slot >= %(start)s
            """,
            {"start": utc(start), "end": utc(end), "terminal": list(TERMINAL)},
        )
        row = cursor.fetchone()
    assert row is not None
    return int(row[0]) == 0 and int(row[1]) > 0


def cron_samples(start: float, end: float, notes: Notes) -> tuple[list[Sample], dict[str, int]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT id, slot, created_at, ended, status, trigger, celery_task_id FROM cron_celery_cronexecution
            WHERE task_code LIKE 'LAT-%%' AND slot >= %s AND slot < %s
            """,
            [utc(start), utc(end)],
        )
        rows = cursor.fetchall()
    samples: list[Sample] = []
    statuses: Counter[str] = Counter()
    for execution_id, slot, created_at, ended, status, trigger, task_id in rows:
        statuses[f"{status} {trigger}"] += 1
        noted = notes.pub.get(str(task_id))
        samples.append(Sample(slot=slot.timestamp(), recorded=created_at.timestamp(),
                              handed=noted[1] if noted else None, published=notes.published_at(str(task_id)),
                              started=notes.start.get(str(execution_id)),
                              ended=ended.timestamp() if ended is not None and status not in UNRUN else None))
    return samples, dict(statuses)


# ----------------------------------------------------------------------------- notes


@dataclasses.dataclass
class Notes:
    """What the beats and bodies wrote to Redis (``bench/latency_jobs.py``)."""

    pub: dict[str, tuple[float | None, float]]  # task id -> (due, signal time)
    wire: dict[str, float]
    start: dict[str, float]
    end: dict[str, float]

    @classmethod
    def read(cls, client: Any, key: str) -> Notes:
        def floats(name: str) -> dict[str, float]:
            return {k.decode(): float(v) for k, v in client.hgetall(f"{key}:{name}").items()}

        pub: dict[str, tuple[float | None, float]] = {}
        for field, value in client.hgetall(f"{key}:pub").items():
            due, _, moment = value.decode().partition(" ")
            pub[field.decode()] = (float(due) if due else None, float(moment))
        return cls(pub=pub, wire=floats("wire"), start=floats("start"), end=floats("end"))

    def published_at(self, task_id: str) -> float | None:
        if task_id in self.wire:
            return self.wire[task_id]
        noted = self.pub.get(task_id)
        return noted[1] if noted else None

    def dbs_samples(self, start: float, end: float) -> list[Sample]:
        return [Sample(slot=due, published=moment, started=self.start.get(task_id), ended=self.end.get(task_id))
                for task_id, (due, moment) in self.pub.items() if due is not None and start <= due < end]


def dbs_window_done(client: Any, key: str, end: float) -> bool:
    """Every publish due in the window has its body's end, and one past the window was sent."""
    notes = Notes.read(client, key)
    window = [task_id for task_id, (due, _moment) in notes.pub.items() if due is not None and due < end]
    past = any(due is not None and due >= end for due, _moment in notes.pub.values())
    return past and all(task_id in notes.end for task_id in window)


# -------------------------------------------------------------------------------- run


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


# ------------------------------------------------------------------------------ redis


def publish_cost(client: Any, queue: str, messages: int = 2000, repeats: int = 3) -> dict[str, Any]:
    """Microseconds per message of the beat's way to publish a round (``publishing.RoundSender``)
    against ``app.send_task`` per message, as the beat did before: ``messages`` messages of as many
    task names (a round of distinct jobs) into kombu's publish batch, to the run's queue before any
    worker consumes it (emptied after each). Alternated ``repeats`` times; medians."""
    import statistics

    from bench.celery_app import app
    from cron_celery.beat import publishing
    from cron_celery.run import tasks

    slot = utc(next_boundary(time.time()))
    names = [f"bench.latency_cost_{i:06d}" for i in range(messages)]

    def by_send_task(producer: Any) -> None:
        for i, name in enumerate(names):
            tasks.publish(app, name, tasks.headers(i, slot, "BEAT"), task_id=uuid.uuid4().hex, producer=producer)

    def by_round(producer: Any) -> None:
        sender = publishing.RoundSender(app, producer)
        for i, name in enumerate(names):
            sender.send(name, tasks.headers(i, slot, "BEAT"), uuid.uuid4().hex)

    per_message: dict[str, list[float]] = {"send_task": [], "round": []}
    for _ in range(repeats + 1):  # the first pair warms up
        for way, send in (("send_task", by_send_task), ("round", by_round)):
            with app.producer_or_acquire() as producer, producer.batch(max_size=1000):
                started = time.perf_counter()
                send(producer)
            per_message[way].append((time.perf_counter() - started) / messages * 1e6)
            if client.llen(queue) != messages:
                raise BenchError(f"publish cost: {client.llen(queue)} messages in {queue}, {messages} sent")
            purge_queue(client, queue)
    send_task_us = statistics.median(per_message["send_task"][1:])
    round_us = statistics.median(per_message["round"][1:])
    return {"messages": messages, "repeats": repeats, "send_task_us": send_task_us, "round_us": round_us,
            "ratio": round_us / send_task_us}


def clear_notes(client: Any, key: str) -> None:
    for name in ("pub", "wire", "start", "end", "ready:dbs"):
        client.delete(f"{key}:{name}")


def purge_queue(client: Any, queue: str) -> None:
    client.delete(queue, *(f"{queue}{PRIORITY_SEP}{p}" for p in (3, 6, 9)))


def sweep(client: Any, tag: str) -> int:
    """Delete the keys, binding members and unacked entries that carry the run's tag."""
    mark = tag.encode()
    removed = 0
    for key in client.scan_iter(match=f"*{tag}*", count=500):
        removed += int(client.delete(key))
    for pattern in ("_kombu.binding.*", "_kombu.binding_permanent.*"):
        for key in client.scan_iter(match=pattern, count=500):
            if client.type(key) == b"set":
                members = [m for m in client.smembers(key) if mark in m]
                if members:
                    removed += int(client.srem(key, *members))
    if client.type("_kombu.binding_deadlines") == b"zset":
        stale = [m for m, _ in client.zscan_iter("_kombu.binding_deadlines") if mark in m]
        if stale:
            removed += int(client.zrem("_kombu.binding_deadlines", *stale))
    if client.type("unacked") == b"hash":  # only after a worker was killed: its messages
        tags = [field for field, value in client.hscan_iter("unacked") if mark in value]
        if tags:
            removed += int(client.hdel("unacked", *tags))
            if client.type("unacked_index") == b"zset":
                client.zrem("unacked_index", *tags)
    return removed


# ------------------------------------------------------------------------------- main


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
