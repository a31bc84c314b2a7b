"""Worker memory over a long run: a tracked job against a plain task with django-celery-results.

Two variants of the same no-op body (one Redis ``INCR``, see ``bench/tasks.py``), one after the
other, each through a fresh ``celery worker --pool prefork --concurrency 2``:

  tracked  the ``cron_task`` ``bench.tracked_noop`` (pattern "always", overlap "allow"): every
           message runs a slot of its own, recorded as a ``CronExecution`` row; no result backend;
  results  the plain Celery task ``bench.noop`` with django-celery-results' ``django-db`` backend:
           a ``TaskResult`` row per task (the peer).

Messages are published in chunks, at most ``--ahead`` waiting in the queue at any time, up to
each checkpoint (``--checkpoints``, default 1,000, 10,000, 25,000, 50,000 and 100,000 runs;
``--quick``: 500, 2,000 and 5,000). At each, once every run so far has finished and written its
row, the resident memory (``VmRSS`` of ``/proc/<pid>/status``) of the worker's main process and
of each pool process is read; a first sample is taken once the worker answers a ping, before any
run. The growth that matters is from the checkpoint at 10,000 runs (the first at a tenth of the
last or beyond) to the last one: what a worker keeps per run, if anything.

Usage, from the repository root::

    ./.venv-dj52/bin/python bench/memory.py             # up to 100,000 runs a variant
    ./.venv-dj52/bin/python bench/memory.py --quick     # up to 5,000: a smoke test

Needs Redis (REDIS_URL, default redis://127.0.0.1:6379/0) and PostgreSQL (DATABASE_URL; its host,
port and user are used with the database ``BENCH_DB``, default ``cron_celery_bench``, created and
migrated here; its execution, job and task-result tables are emptied). Redis is never flushed:
only this run's queues, counters and binding entries (named with a per-run tag) are deleted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``bench`` and ``cron_celery`` importable
    sys.path.insert(0, str(ROOT))

from bench import kombu_keys  # noqa: E402
from bench.common import (  # noqa: E402
    BenchError,
    broker_client,
    clean_tracked_tables,
    count_rows,
    ensure_database,
    log,
    log_machine,
    resident_mib,
    run,
    stop_on_sigterm,
    write_results,
)

TAG = uuid.uuid4().hex[:10]
PREFIX = f"cron-celery-memory-{TAG}"
#: Set by ``main`` (never at import: a test importing this module must not change its environment);
#: read by bench/settings.py at import, here and in the workers (inherited environment).
ENVIRONMENT = {"DJANGO_SETTINGS_MODULE": "bench.settings", "BENCH_DEFAULT_QUEUE": f"{PREFIX}-default"}

CHECKPOINTS = (1000, 10_000, 25_000, 50_000, 100_000)
QUICK_CHECKPOINTS = (500, 2000, 5000)
#: Where the growth is measured from: the checkpoint at this many runs (or the first beyond a
#: tenth of the last, for other checkpoints).
FROM_RUNS = 10_000
#: Growth of a process's resident memory that is noise, not a leak: this many MiB, or this share
#: of its size, whichever is larger.
NOISE_MIB, NOISE_SHARE = 2.0, 0.03
SLOT_BASE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
CHUNK = 500  # messages published in one go


@dataclasses.dataclass(frozen=True)
class Variant:
    key: str
    label: str
    task: str
    result_backend: str  # "" = none
    table: str  # the table whose rows mark a finished run
    done_status: str


VARIANTS = (
    Variant("tracked", "cron_task (tracked)", "bench.tracked_noop", "", "cron_celery_cronexecution", "SUCCEEDED"),
    Variant("results", "plain task + django-celery-results", "bench.noop", "django-db",
            "django_celery_results_taskresult", "SUCCESS"),
)


# ------------------------------------------------------------------------ pure helpers


def children_from_stats(stats: dict[int, str], parent: int) -> list[int]:
    """The pids whose ``/proc/<pid>/stat`` text (``stats``) names ``parent`` as their parent."""
    found = []
    for pid, text in stats.items():
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so read after the last ")".
        fields = text.rpartition(")")[2].split()
        if len(fields) >= 2 and fields[1].isdigit() and int(fields[1]) == parent:
            found.append(pid)
    return sorted(found)


def sample_total(sample: dict[str, Any]) -> float | None:
    """The main process's and the pool processes' resident memory added up (MiB)."""
    values = [sample.get("main_mib"), *(child.get("mib") for child in sample.get("children", []))]
    if not values or any(value is None for value in values):
        return None
    return round(sum(float(value) for value in values if value is not None), 1)


def baseline(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The sample growth is measured from: at ``FROM_RUNS`` runs, else the first at a tenth of the
    last sample's runs or beyond (never the start, before any run)."""
    runs = [sample for sample in samples if sample["runs"] > 0]
    if not runs:
        raise ValueError("no sample after any run")
    exact = [sample for sample in runs if sample["runs"] == FROM_RUNS]
    if exact and exact[0] is not runs[-1]:
        return exact[0]
    tenth = runs[-1]["runs"] / 10
    return next(sample for sample in runs if sample["runs"] >= tenth)


def growth(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """From ``baseline(samples)`` to the last sample: each process's change (MiB), the total's, per
    10,000 runs, and whether every process stayed within the noise (``NOISE_MIB``/``NOISE_SHARE``).
    A pool process replaced in between (another pid) is compared all the same, and named."""
    first, last = baseline(samples), samples[-1]
    pairs = [("main", first.get("main_mib"), last.get("main_mib"), False)]
    before = first.get("children", [])
    after = last.get("children", [])
    for index in range(max(len(before), len(after))):
        old = before[index] if index < len(before) else {}
        new = after[index] if index < len(after) else {}
        pairs.append((f"pool process {index + 1}", old.get("mib"), new.get("mib"),
                      old.get("pid") != new.get("pid")))
    processes = []
    flat = True
    for name, start, end, replaced in pairs:
        change = None if start is None or end is None else round(end - start, 1)
        within = change is not None and change <= max(NOISE_MIB, NOISE_SHARE * float(start or 0))
        flat = flat and within
        processes.append({"process": name, "from_mib": start, "to_mib": end, "change_mib": change,
                          "replaced": replaced, "within_noise": within})
    total_from, total_to = sample_total(first), sample_total(last)
    runs = last["runs"] - first["runs"]
    total_change = None if total_from is None or total_to is None else round(total_to - total_from, 1)
    per_10k = None if total_change is None or runs <= 0 else round(total_change * 10_000 / runs, 2)
    return {"from_runs": first["runs"], "to_runs": last["runs"], "processes": processes,
            "total_from_mib": total_from, "total_to_mib": total_to, "total_change_mib": total_change,
            "per_10k_runs_mib": per_10k, "flat": flat}


def parse_checkpoints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected counts such as 10000,100000: {text!r}") from exc
    if not values or any(value < 1 for value in values) or list(values) != sorted(set(values)):
        raise argparse.ArgumentTypeError("checkpoints are increasing counts of runs, at least 1")
    return values


# ---------------------------------------------------------------------------- processes


def process_stats() -> dict[int, str]:
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stats[int(entry.name)] = (entry / "stat").read_text(encoding="utf-8", errors="replace")
    return stats


def sample(pid: int, runs: int) -> dict[str, Any]:
    """Resident memory of the worker's main process and of each of its pool processes."""
    children = children_from_stats(process_stats(), pid)
    taken = {"runs": runs, "at": time.time(), "main_pid": pid, "main_mib": resident_mib(pid),
             "children": [{"pid": child, "mib": resident_mib(child)} for child in children]}
    taken["total_mib"] = sample_total(taken)
    return taken


class Worker:
    """One ``celery worker --pool prefork`` subprocess, in a process group of its own."""

    def __init__(self, *, node: str, queue: str, env: dict[str, str], concurrency: int, log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        cmd = [sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker", "--pool", "prefork",
               "--concurrency", str(concurrency), "-Q", queue, "-n", node, "--without-gossip",
               "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise BenchError(f"the worker exited with {self.proc.returncode}:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Warm shutdown of its group (SIGTERM), then SIGKILL for whatever is left of it."""
        group = self.proc.pid  # start_new_session: the group's id is the leader's pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self._log.close()


def at_least(count: Callable[[], int], target: int) -> Callable[[], bool]:
    return lambda: count() >= target


def wait_for(what: str, condition: Callable[[], bool], timeout: float, worker: Worker,
             interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        worker.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}\n{worker.tail()}")
        time.sleep(interval)


# ----------------------------------------------------------------------------- database


# ---------------------------------------------------------------------------------- run


def publish(app: Any, variant: Variant, queue: str, first: int, count: int, producer: Any) -> None:
    task = app.tasks[variant.task]
    for i in range(first, first + count):
        kwargs = {"slot": (SLOT_BASE + dt.timedelta(minutes=i)).isoformat()} if variant.key == "tracked" else {}
        task.apply_async(kwargs=kwargs, queue=queue, producer=producer)


def measure(app: Any, client: Any, variant: Variant, checkpoints: tuple[int, ...], ahead: int,
            concurrency: int, logdir: Path) -> dict[str, Any]:
    queue = f"{PREFIX}-{variant.key}"
    node = f"{PREFIX}-{variant.key}@{socket.gethostname()}"
    counter = f"{PREFIX}:{variant.key}:done"
    clean_tracked_tables()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "BENCH_COUNTER_KEY": counter,
           "BENCH_RESULT_BACKEND": variant.result_backend,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    worker = Worker(node=node, queue=queue, env=env, concurrency=concurrency,
                    log_path=logdir / f"worker-{variant.key}.log")
    began = time.monotonic()
    try:
        wait_for("the worker to answer a ping", lambda: bool(app.control.ping(destination=[node], timeout=0.5)),
                 120, worker, interval=0.2)
        samples = [sample(worker.proc.pid, 0)]
        log(f"  {variant.label:<36} {0:>8,} runs: {describe(samples[-1])}")
        published = 0
        with app.producer_or_acquire() as producer:
            for checkpoint in checkpoints:
                while published < checkpoint:
                    done = int(client.get(counter) or 0)
                    room = min(CHUNK, ahead - (published - done), checkpoint - published)
                    if room <= 0:
                        worker.check_alive()
                        time.sleep(0.02)
                        continue
                    publish(app, variant, queue, published, room, producer)
                    published += room
                wait_for(f"{checkpoint:,} runs", at_least(lambda: int(client.get(counter) or 0), checkpoint),
                         max(120.0, ahead / 20), worker)
                wait_for(f"{checkpoint:,} rows in {variant.table}",
                         at_least(lambda: count_rows(variant.table, variant.done_status), checkpoint), 120, worker,
                         0.2)
                samples.append(sample(worker.proc.pid, checkpoint))
                log(f"  {variant.label:<36} {checkpoint:>8,} runs: {describe(samples[-1])}")
        seconds = time.monotonic() - began
        finished = count_rows(variant.table, variant.done_status)
        if finished != checkpoints[-1]:
            raise BenchError(f"{finished} rows in {variant.table} for {checkpoints[-1]} runs")
    finally:
        worker.stop()
        kombu_keys.sweep(client, f"{PREFIX}-{variant.key}")
        client.delete(counter)
    return {"label": variant.label, "task": variant.task, "result_backend": variant.result_backend,
            "seconds": round(seconds, 1), "samples": samples, "growth": growth(samples)}


def describe(taken: dict[str, Any]) -> str:
    children = ", ".join(f"{child['mib']} MiB" for child in taken["children"])
    return f"main {taken['main_mib']} MiB, pool [{children}], total {taken['total_mib']} MiB"


def versions() -> dict[str, str]:
    import celery
    import django
    import django_celery_results
    import kombu
    import psycopg
    import redis

    return {"python": platform.python_version(), "django": django.get_version(), "celery": celery.__version__,
            "kombu": kombu.__version__, "psycopg": psycopg.__version__, "redis_py": redis.__version__,
            "django_celery_results": getattr(django_celery_results, "__version__", "?")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--checkpoints", type=parse_checkpoints, default=None,
                        help="runs at which memory is sampled, comma-separated (default "
                             f"{','.join(map(str, CHECKPOINTS))})")
    parser.add_argument("--quick", action="store_true",
                        help=f"checkpoints {','.join(map(str, QUICK_CHECKPOINTS))} (unless --checkpoints)")
    parser.add_argument("--ahead", type=int, default=5000, help="messages waiting in the queue at most")
    parser.add_argument("--concurrency", type=int, default=2, help="pool processes of the worker")
    parser.add_argument("--variants", default=",".join(v.key for v in VARIANTS),
                        help=f"comma-separated, of {', '.join(v.key for v in VARIANTS)} (default all)")
    parser.add_argument("--json", type=Path, default=None,
                        help="write the results here (default bench/results/memory-<time>.json)")
    args = parser.parse_args(argv)
    checkpoints: tuple[int, ...] = args.checkpoints or (QUICK_CHECKPOINTS if args.quick else CHECKPOINTS)
    known = {variant.key: variant for variant in VARIANTS}
    chosen = [name.strip() for name in args.variants.split(",") if name.strip()]
    if not chosen or any(name not in known for name in chosen):
        parser.error(f"--variants takes some of {', '.join(known)}, not {args.variants!r}")
    if args.ahead < CHUNK or args.concurrency < 1:
        parser.error(f"--ahead is at least {CHUNK}, --concurrency at least 1")

    os.environ.update(ENVIRONMENT)
    stop_on_sigterm()
    redis_url, client = broker_client()
    from django.conf import settings

    ensure_database(dict(settings.DATABASES["default"]))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
    from bench.celery_app import app

    started_at = dt.datetime.now(dt.UTC)
    header = {"date": started_at.strftime("%Y-%m-%d %H:%M UTC"), "checkpoints": list(checkpoints),
              "ahead": args.ahead, "concurrency": args.concurrency, "variants": chosen, "broker": redis_url,
              "database": settings.DATABASES["default"]["NAME"], "from_runs": FROM_RUNS,
              "noise_mib": NOISE_MIB, "noise_share": NOISE_SHARE, "cpus": os.cpu_count(),
              "loadavg": os.getloadavg(), **versions()}
    log(f"worker memory benchmark, {header['date']}: checkpoints {', '.join(f'{c:,}' for c in checkpoints)}")
    log(f"  database {header['database']}, broker {redis_url}; Python {header['python']}, Celery {header['celery']}, "
        f"django-celery-results {header['django_celery_results']}")
    log_machine(header["cpus"], header["loadavg"][0], "slower (memory is not affected much)")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="cron-celery-memory-") as logdir:
        try:
            for name in chosen:
                results[name] = measure(app, client, known[name], checkpoints, args.ahead, args.concurrency,
                                        Path(logdir))
                change = results[name]["growth"]
                log(f"  {known[name].label}: {change['total_change_mib']} MiB from {change['from_runs']:,} to "
                    f"{change['to_runs']:,} runs ({change['per_10k_runs_mib']} MiB per 10,000), "
                    f"{'flat' if change['flat'] else 'GROWING'}; {results[name]['seconds']} s")
        finally:
            with contextlib.suppress(Exception):
                clean_tracked_tables()
            kombu_keys.sweep(client, PREFIX)
    write_results("memory", started_at, {"settings": header, "results": results}, args.json)
    return 0


if __name__ == "__main__":
    run(main)
