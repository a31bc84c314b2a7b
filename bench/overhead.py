"""What tracking a run costs: no-op tasks per second through one real prefork worker.

Five variants of the same no-op body (one Redis ``INCR``, see ``bench/tasks.py``):

  (i)   a bare Celery task, no result backend;
  (ii)  the same task with django-celery-results storing a row per task (``django-db``);
  (iii) a ``cron_task`` job (pattern "always", overlap "allow"), one slot per message,
        recorded as a ``CronExecution`` row; no result backend;
  (iv)  a celery-once task (``base=QueueOnce``, Redis backend): each message takes a Redis
        lock when it is published and the worker deletes it after the task; no result backend;
  (v)   the bare task (i) as a tracked periodic task (``TRACK_PERIODIC_TASKS``): each message
        carries the headers the beat puts on a tracked task's message, and the worker's wrapper
        claims its slot before the body and records it as a ``CronExecution`` row.

For each variant and repeat a fresh ``celery worker --pool prefork --concurrency 2`` is
started on a warm-up queue; once it answers a ping and has run a few warm-up messages,
N messages are published to a second queue (the queue is pre-filled) and the worker is
told to consume it (``add_consumer``). The clock starts when the first of the N has
finished (the task writes that time to Redis) and stops when the last one is done: the
Redis counter reached N for (i), and the result rows (ii) or succeeded executions (iii), (v)
in PostgreSQL reached N, and for (iv) the counter reached N and none of the N locks is left.
Throughput is (N - 1) / elapsed. The variants are interleaved (i, ii, iii, iv, i, ii...)
and the medians of the repeats are reported, with the ratios (iii)/(i), (iii)/(ii),
(iii)/(iv), (v)/(i) and (v)/(ii).

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
import datetime as dt
import os
import platform
import sys
import tempfile
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
    log,
    log_machine,
    run,
    stop_on_sigterm,
    write_results,
)
from bench.kombu_keys import sweep  # noqa: E402
from bench.overhead_database import (  # noqa: E402
    count_statements,
    ensure_database,
    measure_fsync,
    server_facts,
    setup_django,
)
from bench.overhead_runs import profile_tracked, run_once  # noqa: E402
from bench.overhead_variants import ALL_VARIANTS, PREFIX, Variant, chosen_variants, parse_variants  # noqa: E402

os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
# Read by bench/settings.py at import, here and in the workers (inherited environment).
os.environ["BENCH_DEFAULT_QUEUE"] = f"{PREFIX}-default"


def profile(app: Any, client: redis.Redis, args: argparse.Namespace, n: int) -> dict[str, Any]:
    """``--profile``: ``profile_tracked``, printed; a profiler that cannot run (py-spy missing, no
    right to trace) is recorded as such and fails nothing."""
    try:
        profiled = profile_tracked(app, client, n=n, warmup=args.warmup, concurrency=args.concurrency,
                                   svg=args.profile, key=args.profile_variant)
    except BenchError as error:
        log(f"\nnot profiled: {error}")
        return {"error": str(error).splitlines()[0]}
    log(f"\n{n:,} tracked runs at {profiled['rate']:.0f} runs/s under py-spy; flame graph: {args.profile}")
    for line in flame.summary_lines(profiled["summary"]):
        log(line)
    return profiled


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


def build_parser() -> argparse.ArgumentParser:
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
    parser.add_argument("--profile-variant", choices=("tracked", "plain-tracked"), default="tracked",
                        help="the variant --profile samples: (iii), the default, or (v)")
    parser.add_argument("--json", type=Path, default=None,
                        help="write the results here (default bench/results/overhead-<time>.json)")
    return parser


# ----------------------------------------------------------------------- what is printed


def run_settings(app: Any, args: argparse.Namespace, client: redis.Redis, *, n: int, repeat: int,
                 facts: dict[str, str], started_at: dt.datetime, redis_url: str, db_name: str) -> dict[str, Any]:
    """The results' ``settings``: the run's sizes, the worker's and the database's settings, the
    server's ``facts`` (``server_facts``) and the versions of everything."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    return {
        "date": started_at.strftime("%Y-%m-%d %H:%M UTC"),
        "n": n, "repeat": repeat, "warmup": args.warmup, "pool": "prefork",
        "concurrency": args.concurrency,
        "prefetch_multiplier": app.conf.worker_prefetch_multiplier,
        "CONN_MAX_AGE": db["CONN_MAX_AGE"], "CELERY_DB_REUSE_MAX": app.conf.get("CELERY_DB_REUSE_MAX"),
        "database": f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/{db_name}",
        "broker": redis_url, "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
        "postgresql": facts, **versions(client),
    }


def log_settings(header: dict[str, Any]) -> None:
    facts = header["postgresql"]
    log(f"cron_celery overhead benchmark, {header['date']}")
    log(f"  N={header['n']} messages per run, {header['repeat']} repeat(s), {header['warmup']} warm-up messages first")
    log(f"  worker: celery worker --pool prefork --concurrency {header['concurrency']} "
        f"(prefetch multiplier {header['prefetch_multiplier']}), one per run")
    log(f"  database: {header['database']}  CONN_MAX_AGE={header['CONN_MAX_AGE']}  "
        f"CELERY_DB_REUSE_MAX={header['CELERY_DB_REUSE_MAX']}")
    log(f"  PostgreSQL {facts['server_version']} (synchronous_commit={facts['synchronous_commit']}, "
        f"fsync={facts['fsync']}); broker {header['broker']}")
    log(f"  Python {header['python']}, Django {header['django']}, Celery {header['celery']}, "
        f"django-celery-results {header['django_celery_results']}, celery-once {header['celery_once']}, "
        f"psycopg {header['psycopg']}, Redis {header['redis_server']}")
    log_machine(header["cpus"], header["loadavg"][0], "low and noisy")


def log_statements(statements: dict[str, Any]) -> None:
    """The in-process figures of ``count_statements``: SQL per run and per result, time and WAL per call."""
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


def wal_flush(seconds: int) -> dict[str, Any] | None:
    """``measure_fsync`` for ``--fsync-seconds`` (None when 0), printed."""
    fsync = measure_fsync(seconds) if seconds > 0 else None
    if fsync is not None and fsync.get("measured"):
        log(f"one WAL flush ({fsync['method']}, pg_test_fsync -s {seconds} in {fsync['directory']}): "
            f"{fsync['usecs']:.0f} µs")
    elif fsync is not None:
        log(f"one WAL flush: not measured ({fsync['why']})")
    return fsync


def log_summary(variants: tuple[Variant, ...], rates: dict[str, list[float]], summary: dict[str, Any],
                fsync: dict[str, Any] | None, statements: dict[str, Any], repeat: int) -> None:
    """The rates of every run with their medians, the ratios and gaps, and the statements again."""
    tracked_sql, results_sql = statements["tracked"], statements["results"]
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


# ------------------------------------------------------------------------------- main


def timed_runs(app: Any, client: redis.Redis, variants: tuple[Variant, ...], args: argparse.Namespace, *,
               n: int, repeat: int) -> tuple[dict[str, list[float]], list[dict[str, Any]]]:
    """Every variant in turn, ``repeat`` times; returns each variant's rates and every run's result."""
    rates: dict[str, list[float]] = {v.key: [] for v in variants}
    details: list[dict[str, Any]] = []
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
    return rates, details


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    n = args.n or (200 if args.quick else 2000)
    if n < 2:
        parser.error("--n must be at least 2")
    repeat = args.repeat or (1 if args.quick else 3)

    stop_on_sigterm()  # a SIGTERM must still stop the workers
    redis_url, client = broker_client()
    db_name = ensure_database()
    setup_django()

    from bench.celery_app import app

    facts = server_facts()
    started_at = dt.datetime.now(dt.UTC)
    header = run_settings(app, args, client, n=n, repeat=repeat, facts=facts, started_at=started_at,
                          redis_url=redis_url, db_name=db_name)
    log_settings(header)

    statements = count_statements(args.statement_runs)
    log_statements(statements)
    fsync = wal_flush(args.fsync_seconds)
    log("")

    variants = chosen_variants(args.variants, without_reuse=args.also_without_reuse,
                               commit_off=args.also_commit_off)
    marks = [PREFIX, app.control.mailbox.oid]
    try:
        rates, details = timed_runs(app, client, variants, args, n=n, repeat=repeat)
        profiled = profile(app, client, args, n) if args.profile is not None else None
    finally:
        sweep(client, *marks)
        with contextlib.suppress(Exception):
            clean_tracked_tables()

    summary = overhead_figures.summarise(rates, args.concurrency)
    log_summary(variants, rates, summary, fsync, statements, repeat)
    ratios = summary["ratios"]
    write_results("overhead", started_at, {
        "settings": header, "statements": statements, "runs": details, "fsync": fsync, "profile": profiled,
        "medians": summary["medians"], "ratio_iii_i": ratios.get("bare"), "ratio_iii_ii": ratios.get("results"),
        "ratio_iii_iv": ratios.get("once"), "ratio_iii_ii_commit_off": ratios.get("results-commit-off"),
        "ratio_v_i": ratios.get("plain-bare"), "ratio_v_ii": ratios.get("plain-results"),
        "gap_us": summary["gap_us"],
    }, args.json)
    return 0


if __name__ == "__main__":
    run(main)
