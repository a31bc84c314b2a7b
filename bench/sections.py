"""The sections of docs/benchmarks.md: how each benchmark works, and its figures.

Each ``*_ratios`` function computes the comparisons a section shows from one script's
JSON; each ``*_section`` function writes the section (prose, tables, ratios) as lines.
"""

from __future__ import annotations

from typing import Any

from bench.figures import (
    DASH,
    TIMES,
    ResultError,
    Results,
    fmt_ms,
    fmt_number,
    fmt_ratio,
    fmt_seconds,
    measured,
    need,
    ratio,
    table,
)
from bench.latency_section import latency_section

# ----------------------------------------------------------------------------- overhead

OVERHEAD_VARIANTS = (
    ("bare", "(i) bare Celery"),
    ("results", "(ii) django-celery-results"),
    ("tracked", "(iii) cron_celery `cron_task`"),
    ("once", "(iv) celery-once `QueueOnce`"),
)
PEERS = ("bare", "results", "once")  # what a tracked run (iii) is compared with


def overhead_rates(data: dict[str, Any]) -> dict[str, list[float]]:
    """Tasks per second of each variant, one figure per repeat, in repeat order."""
    rates: dict[str, list[float]] = {}
    for run in sorted(need(data, "overhead.json", "runs"), key=lambda run: int(run.get("repeat", 0))):
        rates.setdefault(run["variant"], []).append(float(run["rate"]))
    return rates


def overhead_ratios(data: dict[str, Any]) -> dict[str, float]:
    """A tracked run's throughput over each peer's: medians of the repeats, then divided."""
    medians = need(data, "overhead.json", "medians")
    for key, label in OVERHEAD_VARIANTS:
        if key not in medians:
            raise ResultError(f"overhead.json has no median for {label}: run bench/overhead.py again")
    return {peer: medians["tracked"] / medians[peer] for peer in PEERS}


def overhead_ratios_per_repeat(data: dict[str, Any]) -> dict[str, list[float]]:
    rates = overhead_rates(data)
    return {peer: [t / p for t, p in zip(rates["tracked"], rates[peer], strict=True)] for peer in PEERS}


def overhead_section(results: Results) -> list[str]:
    data = results.data["overhead"]
    settings = need(data, "overhead.json", "settings")
    medians = need(data, "overhead.json", "medians")
    statements = need(data, "overhead.json", "statements")
    ratios = overhead_ratios(data)
    per_repeat = overhead_ratios_per_repeat(data)
    rates = overhead_rates(data)
    n, repeat = int(settings["n"]), int(settings["repeat"])
    lines = [
        "## The cost of tracking a run",
        "",
        "`bench/overhead.py` sends one no-op task body through a real worker in four ways and counts",
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
        "### Results",
        "",
        *table(
            ["variant", *(f"run {i}" for i in range(1, repeat + 1)), "**median** (tasks/s)", "÷ bare Celery"],
            [[label, *(fmt_number(rate) for rate in rates.get(key, [])),
              f"**{fmt_number(medians[key])}**", fmt_ratio(ratio(medians[key], medians["bare"]))]
             for key, label in OVERHEAD_VARIANTS],
            "l" + "r" * (repeat + 2),
        ),
        "",
        *table(["a tracked run (iii) against", "ratio of the medians", "ratio in each repeat"], [
            [label, fmt_ratio(ratios[peer], bold=True), ", ".join(fmt_ratio(r) for r in per_repeat[peer])]
            for peer, label in ((p, dict(OVERHEAD_VARIANTS)[p]) for p in PEERS)
        ], "lrr"),
        "",
        f"N = {n:,} messages per run, {repeat} repeat{'s' if repeat != 1 else ''}. A ratio above 1 means",
        "cron_celery got through more tasks per second than that peer. A tracked run writes and then",
        "finishes one row in PostgreSQL, as (ii) writes one; (i) and (iv) never touch the database, so",
        "they show how far any database-backed record is from plain Celery on this machine.",
        "",
        measured(results, "overhead", settings["date"]),
        "",
        *overhead_commit_off(data),
        *overhead_profile(data.get("profile")),
        *overhead_statements(statements),
        *overhead_reuse(medians, settings),
        *overhead_settings(settings),
        "### One job, one row lock",
        "",
        "Every decision about a job is made under a lock on its `cron_celery_cronjob` row. All the",
        "benchmark's messages belong to one job, so the pool processes take turns on that lock; this",
        "is why the claim and the finish are single statements, which hold the lock for one round trip",
        "each. Real schedules spread their runs over many jobs, so this benchmark is the worst case for",
        "that lock.",
        "",
    ]
    return lines


def overhead_statements(statements: dict[str, Any]) -> list[str]:
    tracked, results = statements["tracked"], statements["results"]

    def trips(count: float, transactions: float) -> str:  # each transaction adds BEGIN and COMMIT
        return f"{count + 2 * transactions:g}"

    tracked_tx = float(tracked["transactions_per_run"])
    return [
        "### SQL per run",
        "",
        "The script also counts, in its own process, the statements Django sends (`execute_wrapper`,",
        f"commits included) for {tracked['runs']} tracked runs of the task called directly and for "
        f"{results['writes']}",
        "result writes through the `django-db` backend:",
        "",
        *table(["", "statements", "transactions", "round trips"], [
            ['(iii) tracked run, pattern `always`, overlap `allow`', f"**{tracked['statements_per_run']:g}**",
             f"{tracked_tx:g}" + (" (autocommit)" if not tracked_tx else ""),
             trips(float(tracked["statements_per_run"]), tracked_tx)],
            ["(ii) django-celery-results row", f"{results['statements_per_task']:g}",
             f"{results['transactions_per_task']:g}",
             trips(float(results["statements_per_task"]), float(results["transactions_per_task"]))],
            ["(i) bare task, (iv) celery-once", "0", "0", "0"],
        ], "lrrr"),
        "",
        "Round trips count `BEGIN` and `COMMIT`. celery-once sends Redis commands instead: `SET NX PX` when",
        "a message is published and `DEL` after the task. The two statements of a tracked run are prepared",
        "once per database session (`PREPARE cron_celery_claim_<digest>(…) AS …`, sent with the first",
        "`EXECUTE` in one round trip) and then sent as `EXECUTE …(…)`: PostgreSQL parses and plans them once",
        "per connection instead of at every run, which was most of what a run cost the server. They are:",
        "",
        "1. **claim**: `WITH j AS (UPDATE cron_celery_cronjob SET fence = fence + 1 … RETURNING fence)",
        "   INSERT INTO cron_celery_cronexecution … SELECT … FROM j` locks the job's row, takes the next",
        "   fence and inserts the `RUNNING` execution with its lease. It is committed before the body",
        "   starts, and that commit is what stops a second worker.",
        "2. **finish**: `WITH j AS (SELECT … FOR UPDATE), e AS (UPDATE cron_celery_cronexecution … WHERE",
        "   id = ? AND fence = ? AND status = 'RUNNING') UPDATE cron_celery_cronjob …` writes the fenced",
        "   outcome and the job's aggregates, with the job's row locked first.",
        "",
        "Jobs that need a check take the full claim instead: three statements in one transaction (lock",
        "and fence the job's row, read the slot's executions and the job's live runs, insert or update",
        "the execution). That is every message from beat or `--enqueue`, and every job with pattern",
        "`standard`, `rerun_on_failure` or `rate_limited` or with overlap `skip`. The lease thread adds",
        "one `UPDATE` per running execution every third of `LEASE_SECONDS`; no-op runs end long before.",
        f"The first run in each process also registers the job ({tracked['first_run_statements']} statements "
        "in this run).",
        "",
        *overhead_commit_cost(statements.get("commit_cost")),
    ]


def overhead_commit_cost(cost: dict[str, float] | None) -> list[str]:
    """Where the difference from django-celery-results goes: one more durable commit."""
    if not cost:
        return []
    gap = cost["tracked_ms"] - cost["results_ms"]
    gap_async = cost["tracked_ms_async_commit"] - cost["results_ms_async_commit"]
    return [
        "### Where the difference from (ii) goes",
        "",
        "A tracked run commits twice and (ii) once: the claim must be on disk before the body runs",
        "(a worker that dies after running the body must find the slot taken when its message comes",
        "back), and the outcome after it. (ii) writes a single row when the task has returned. Timed in",
        "the script's own process, per call:",
        "",
        *table(["", "`synchronous_commit = on` (as measured above)", "`off` (reference only)"], [
            ["(iii) tracked run", f"{cost['tracked_ms']:.3f} ms", f"{cost['tracked_ms_async_commit']:.3f} ms"],
            ["(ii) django-celery-results row", f"{cost['results_ms']:.3f} ms",
             f"{cost['results_ms_async_commit']:.3f} ms"],
            ["difference", f"**{gap:.3f} ms**", f"{gap_async:.3f} ms"],
        ], "lrr"),
        "",
        *overhead_wal(cost),
        "With `synchronous_commit = off` PostgreSQL acknowledges a commit before its WAL is flushed, so",
        "the difference that is left is the Python and SQL work itself; what it removes is the wait for",
        "the extra flush. Do not run cron_celery like that, not even for the claim alone: a PostgreSQL crash",
        "could then forget a claim whose body already ran (the slot runs again, or, for a run sent without",
        "an execution, leaves no row at all), and the job's fence goes back with it, so the next claim is",
        "handed the same fence as the lost one and fencing can no longer tell the two runs apart.",
        "",
    ]


def overhead_wal(cost: dict[str, float]) -> list[str]:
    """The WAL each call wrote (the server's, over the timed calls with durable commits): what each
    commit has to flush. Older results did not measure it."""
    if "tracked_wal_bytes" not in cost or "results_wal_bytes" not in cost:
        return []
    tracked, results = cost["tracked_wal_bytes"], cost["results_wal_bytes"]
    return [
        f"Each call wrote **{tracked:,.0f} bytes** of WAL for a tracked run and {results:,.0f} bytes for a",
        "django-celery-results row (the server's WAL position before and after the calls, so whatever else",
        "the server wrote meanwhile, autovacuum included, counts too). A tracked run inserts its execution",
        "and rewrites it when it ends; the rewrite changes indexed columns (status, completed), so the",
        "table's indexes get a second entry, and the final write's triggers update the job's tallies and",
        "its hourly and duration rollups (the metrics and the dashboard read those instead of the history).",
        "",
    ]


def overhead_commit_off(data: dict[str, Any]) -> list[str]:
    """(iii)/(ii) with durable commits and with ``synchronous_commit = off`` on both sides (same run),
    the per-run gaps, and one WAL flush on the machine (pg_test_fsync)."""
    lines = ["### With the commit cost taken out", ""]
    rates = overhead_rates(data)
    if not (rates.get("results-commit-off") and rates.get("tracked-commit-off")):
        return [*lines, "This run did not measure (ii) and (iii) with `synchronous_commit = off` "
                "(`--also-commit-off`).", ""]
    figures = overhead_commit_off_figures(data)
    concurrency = int(need(data, "overhead.json", "settings", "concurrency"))
    fsync = figures["fsync"]
    flush = (f"{fsync['usecs']:,.0f} µs" if fsync and fsync.get("measured")
             else f"not measured ({(fsync or {}).get('why', 'no pg_test_fsync figure in this run')})")
    method = f"`{fsync['method']}`, " if fsync and fsync.get("method") else ""

    def each(values: list[float]) -> str:
        return ", ".join(fmt_ratio(value) for value in values)

    def us(value: float | None) -> str:
        return DASH if value is None else f"{value:,.0f} µs"

    verdict_code = "met" if figures["ratio_off"] >= 1.0 else "not met"
    verdict_flush = DASH if figures["over_flush"] is None else ("met" if figures["over_flush"] <= 0 else "not met")
    return [
        *lines,
        "(ii\\*) and (iii\\*) are (ii) and (iii) again, in the same run and in turn with the others, their",
        "worker's database connections opened with `-c synchronous_commit=off`: a commit returns once its",
        "WAL is written, without waiting for it to reach the disk. What is left between them is code:",
        "Python, SQL and round trips. A tracked run commits twice (the claim before the body, the outcome",
        "after it) and (ii) once, so the difference between the two gaps below is what durability adds.",
        "",
        *table(["(iii) ÷ (ii)", "ratio of the medians", "ratio in each repeat"], [
            ["durable commits (the figures above)", fmt_ratio(figures["ratio_durable"], bold=True),
             each(figures["per_repeat_durable"])],
            ["`synchronous_commit = off` on both sides", fmt_ratio(figures["ratio_off"], bold=True),
             each(figures["per_repeat_off"])],
        ], "lrr"),
        "",
        *table(["per run", "µs"], [
            [f"how much longer a tracked run holds its pool process than (ii)'s task, durable: "
             f"{concurrency} {TIMES} (1 ÷ (iii) - 1 ÷ (ii))", f"**{us(figures['gap_durable'])}**"],
            ["the same with `synchronous_commit = off` on both sides", us(figures["gap_off"])],
            ["what the durable commits add: the difference", us(figures["durability"])],
            [f"one WAL flush on this machine ({method}`pg_test_fsync`, one 8kB write, beside the data directory)",
             f"**{flush}**"],
        ], "lr"),
        "",
        f"Against the targets: (iii\\*) ÷ (ii\\*) at least 1.00: **{verdict_code}**; the durable gap at most "
        f"one WAL flush: **{verdict_flush}**.",
        "",
        f"With {concurrency} pool processes each busy all along, a run holds its process for concurrency ÷",
        "throughput; a gap below zero means a tracked run is the shorter.",
        "",
        *overhead_what_is_left(data, concurrency),
    ]


def overhead_what_is_left(data: dict[str, Any], concurrency: int) -> list[str]:
    """What this run's figures say about the gaps above: why a tracked run can be the quicker call in
    one process and the slower one through a worker (said only when both hold, commits off), and what
    the durable commits added."""
    figures = overhead_commit_off_figures(data)
    cost = (data.get("statements") or {}).get("commit_cost") or {}
    lines = []
    if cost and cost["tracked_ms_async_commit"] < cost["results_ms_async_commit"] and figures["ratio_off"] < 1:
        wal = ("the row written twice, with its indexes" +
               (" (the WAL below)" if cost.get("tracked_wal_bytes", 0) > cost.get("results_wal_bytes", 0) else "") +
               ", and the final write's triggers that keep the tallies and the hourly and duration rollups")
        lines += [
            f"Timed in one process with commits off (\"Where the difference from (ii) goes\" below), a tracked "
            f"run is the quicker call ({cost['tracked_ms_async_commit']:.3f} against "
            f"{cost['results_ms_async_commit']:.3f} ms: Python, round trips and the server's work together),",
            f"yet through a worker it is the slower. There {concurrency} pool processes, the worker's main process, "
            "PostgreSQL and Redis share the machine's cores, so what a run costs is the work it asks of all of",
            f"them, not one caller's wait, and a tracked run asks PostgreSQL for work that a django-db row does not: "
            f"{wal}.",
            "",
        ]
    if figures["durability"] > 0:
        lines += [f"What the durable commits added ({figures['durability']:,.0f} µs a run) is the claim's own "
                  "commit: one more WAL flush a run, the price of a claim that is on disk before the body starts.", ""]
    else:
        lines += [f"The durable commits added nothing measurable in this run ({figures['durability']:,.0f} µs a run, "
                  "within the repeats' spread).", ""]
    return lines


def overhead_commit_off_figures(data: dict[str, Any]) -> dict[str, Any]:
    """The figures of ``overhead_commit_off``: ratios (medians, then per repeat), gaps in µs per run
    (``concurrency * (1 / tracked - 1 / results)``), durability (their difference) and how far the
    durable gap is over one WAL flush (None when the flush was not measured)."""
    medians = need(data, "overhead.json", "medians")
    rates = overhead_rates(data)
    concurrency = int(need(data, "overhead.json", "settings", "concurrency"))

    def gap(ours: str, peer: str) -> float:
        return concurrency * (1 / float(medians[ours]) - 1 / float(medians[peer])) * 1e6

    fsync = data.get("fsync")
    gap_durable, gap_off = gap("tracked", "results"), gap("tracked-commit-off", "results-commit-off")
    usecs = fsync.get("usecs") if fsync and fsync.get("measured") else None
    return {
        "ratio_durable": medians["tracked"] / medians["results"],
        "ratio_off": medians["tracked-commit-off"] / medians["results-commit-off"],
        "per_repeat_durable": [t / r for t, r in zip(rates["tracked"], rates["results"], strict=False)],
        "per_repeat_off": [t / r for t, r in zip(rates["tracked-commit-off"], rates["results-commit-off"],
                                                 strict=False)],
        "gap_durable": gap_durable, "gap_off": gap_off, "durability": gap_durable - gap_off,
        "fsync": fsync, "over_flush": None if usecs is None else gap_durable - float(usecs),
    }


def overhead_profile(profile: dict[str, Any] | None) -> list[str]:
    """Where a tracked run's time goes in its pool process: py-spy's samples (``--profile``)."""
    lines = ["### Where a tracked run's time goes", ""]
    if not profile or "summary" not in profile:
        why = (profile or {}).get("error", "this run did not profile (`--profile SVG`)")
        return [*lines, f"Not profiled: {why}.", ""]
    found = profile["summary"]
    return [
        *lines,
        f"py-spy sampled the pool processes of one more worker running N tracked runs (iii) after the timed "
        f"runs ({profile['rate']:,.0f} runs/s under the sampler, every thread and idle time included: a wait on",
        "PostgreSQL is time a run takes). The flame graph: [tracked-run-flame.svg](img/tracked-run-flame.svg).",
        "Shares of the pool processes' main threads, first match wins from the top:",
        "",
        *table(["where", "share of the samples"], [
            [item["what"], f"{item['share']:.1%}"] for item in found["buckets"]
        ], "lr"),
        "",
        f"Within a task ({found['in_task']:,} of {found['samples']:,} samples), where the samples ended "
        "(the function on top of the stack):",
        "",
        *table(["function", "share of a task"], [
            [f"`{item['function']}`", f"{item['share_of_task']:.1%}"] for item in found["leaves"][:8]
        ], "lr"),
        "",
    ]


def overhead_reuse(medians: dict[str, float], settings: dict[str, Any]) -> list[str]:
    lines = [
        "### Why connection reuse matters",
        "",
        "Celery's Django fixup closes every database connection of a pool process before and after",
        "each task unless `CELERY_DB_REUSE_MAX` is set; `CONN_MAX_AGE` does not help, because the fixup",
        "calls `close()` itself. Every task that touches the database then opens a new PostgreSQL",
        "connection: a TCP connect and a backend process whose caches start cold. With",
        f"`CELERY_DB_REUSE_MAX = {settings['CELERY_DB_REUSE_MAX']}` the fixup closes them once every that "
        "many tasks, and",
        "`CONN_MAX_AGE` decides the rest. A tracked run always touches the database, so cron_celery warns",
        "with `cron_celery.W001` when the setting is missing (see [configuration](configuration.md)).",
        "",
    ]
    pairs = (("results", "results-noreuse", "(ii) django-celery-results"),
             ("tracked", "tracked-noreuse", "(iii) cron_celery `cron_task`"))
    if not all(without in medians for _, without, _ in pairs):
        return [*lines, "This run did not measure the variants without it (`--also-without-reuse`).", ""]
    return [
        *lines,
        "Measured in the same run (`--also-without-reuse`; these variants are not in the ratios above):",
        "",
        *table(["variant", f"with `CELERY_DB_REUSE_MAX={settings['CELERY_DB_REUSE_MAX']}` (tasks/s)",
                "without it (tasks/s)", "with ÷ without"], [
            [label, fmt_number(medians[with_]), fmt_number(medians[without]),
             fmt_ratio(ratio(medians[with_], medians[without]), bold=True)]
            for with_, without, label in pairs
        ], "lrrr"),
        "",
    ]


def overhead_settings(settings: dict[str, Any]) -> list[str]:
    pg = settings.get("postgresql") or {}
    return [
        "### Settings",
        "",
        "All the variants use one settings module, `bench/settings.py`; only the result backend differs.",
        "",
        *table(["setting", "value"], [
            ['`DATABASES["default"]["CONN_MAX_AGE"]`', f"`{settings['CONN_MAX_AGE']}`"],
            ["`CELERY_DB_REUSE_MAX`", f"`{settings['CELERY_DB_REUSE_MAX']}`"],
            ["pool, concurrency", f"`{settings['pool']}`, `{settings['concurrency']}` (one worker)"],
            ["`worker_prefetch_multiplier`", f"`{settings['prefetch_multiplier']}`"],
            ["N per run, repeats, warm-up", f"{settings['n']:,}, {settings['repeat']}, {settings['warmup']}"],
            ["acknowledgement", "(i), (ii), (iv): Celery's default (early); (iii): `acks_late`, as "
             "`TrackedTask` sets it"],
            ["PostgreSQL", f"{pg.get('server_version', '?')}, "
             f"`synchronous_commit={pg.get('synchronous_commit', '?')}`, `fsync={pg.get('fsync', '?')}`, "
             f"`shared_buffers={pg.get('shared_buffers', '?')}`"],
            ["broker and celery-once's locks", f"Redis {settings.get('redis_server', '?')}, "
             f"`{settings.get('broker', '?')}`"],
        ]),
        "",
    ]


# -------------------------------------------------------------------------------- locks

LOCK_PAIRS = {"cron1": "pottery1", "cron3": "pottery3"}
LOCK_TARGET = 1.1  # cron_celery's JobLock at most this many times pottery's Redlock


def lock_ratios(data: dict[str, Any]) -> dict[str, float]:
    """Medians over the floor's (``<key>_floor``) and cron_celery over pottery (``cron1``, ``cron3``)."""
    summary = need(data, "locks.json", "summary")
    for key in ("raw", *LOCK_PAIRS, *LOCK_PAIRS.values()):
        need(summary, "locks.json summary", key, "median_us")
    floor = float(summary["raw"]["median_us"])
    ratios = {f"{key}_floor": float(values["median_us"]) / floor for key, values in summary.items()}
    for mine, theirs in LOCK_PAIRS.items():
        ratios[mine] = float(summary[mine]["median_us"]) / float(summary[theirs]["median_us"])
    return ratios


def lock_ratios_per_repeat(data: dict[str, Any]) -> dict[str, list[float]]:
    runs = need(data, "locks.json", "per_repeat")
    return {mine: [m["median"] / t["median"] for m, t in zip(runs[mine], runs[theirs], strict=True)]
            for mine, theirs in LOCK_PAIRS.items()}


def locks_section(results: Results) -> list[str]:
    data = results.data["locks"]
    settings = need(data, "locks.json", "settings")
    variants = need(data, "locks.json", "variants")
    summary = need(data, "locks.json", "summary")
    ratios = lock_ratios(data)
    per_repeat = lock_ratios_per_repeat(data)
    rows = []
    for key, variant in variants.items():
        label = variant["label"]
        if variant.get("floor"):
            label += " (the floor)"
        elif variant.get("reference_only"):
            label += " (reference)"
        rows.append([label, str(variant["masters"]), fmt_number(summary[key]["median_us"]),
                     fmt_number(summary[key]["p99_us"]), fmt_ratio(ratios[f"{key}_floor"]),
                     fmt_ratio(ratios[key], bold=True) if key in LOCK_PAIRS else ""])
    met = all(ratios[key] <= LOCK_TARGET for key in LOCK_PAIRS)
    repeat = int(settings["repeat"])
    return [
        "## Locks",
        "",
        "`bench/locks.py` times one acquire followed by its release, from building the lock object to",
        "the end of the release, for cron_celery's job lock and for what it is built on, down to the",
        "bare Redis commands:",
        "",
        *table(["variant", "masters", "one iteration"], [
            ["raw (the floor)", "1", "redis-py: `SET key token NX PX 60000`, then a Lua compare-and-delete "
             "sent with `EVALSHA` (delete the key only if it still holds our token)"],
            ["raw, 3 masters in turn", "3", "the same against three masters one after the other (reference "
             "only)"],
            ["redis-py `Lock`", "1", "`client.lock(name, timeout=60)`, `acquire(blocking=False)`, `release()`"],
            ["pottery `Redlock`", "1 and 3", "`Redlock(key=…, masters=…, auto_release_time=60, "
             "raise_on_redis_errors=True)`, `acquire(blocking=False)`, `release()`"],
            ["cron_celery `JobLock`", "1 and 3", "`cron_celery.run.locks.JobLock(code).acquire()` (must return "
             '`"held"`), then `.release()`'],
        ]),
        "",
        "`JobLock` goes through the package's real configuration: each cron_celery block runs under",
        '`override_settings(CRON_CELERY={"LOCK": {"MASTERS": [...], "TTL": 60}})`, so it uses its own',
        "shared clients as in a worker. The other variants use plain `redis.Redis.from_url()` clients,",
        "made once per variant. Every iteration locks a key no other iteration uses, so no variant",
        "ever finds a lock taken. The masters are three `redis-server` processes the script starts on",
        'free ports of 127.0.0.1 (`--save "" --appendonly no`) and stops at the end; the machine\'s own',
        "Redis is never contacted.",
        "",
        "### How it is timed",
        "",
        "Each repeat runs a warm-up per variant, then the timed iterations in chunks: every variant runs",
        "one chunk, then the next takes its turn, and the order rotates from one repeat to the next, so",
        "load from elsewhere falls on all variants alike. Each iteration is timed on its own",
        "(`perf_counter_ns`). Reported: the median of the repeats' medians and of their 99th",
        "percentiles, each median over the floor's, and cron_celery's over pottery's with the same",
        f"masters (target: at most {LOCK_TARGET}).",
        "",
        "### Results",
        "",
        *table(["variant", "masters", "median (µs)", "p99 (µs)", f"{TIMES} floor", "cron_celery ÷ pottery"], rows,
               "lrrrrr"),
        "",
        f"cron_celery ÷ pottery in each repeat: {', '.join(fmt_ratio(r) for r in per_repeat['cron1'])} with "
        f"one master, {', '.join(fmt_ratio(r) for r in per_repeat['cron3'])} with three. Target "
        f"(at most {LOCK_TARGET} with the same masters): **{'met' if met else 'not met'}**.",
        "",
        measured(results, "locks", settings["date"]) + f" {settings['iterations']:,} timed iterations after "
        f"{settings['warmup']:,} warm-up, {repeat} repeat{'s' if repeat != 1 else ''}, chunks of "
        f"{settings['chunk']}; redis-server {settings.get('redis_server', '?')}, redis-py "
        f"{settings.get('redis_py', '?')}, pottery {settings.get('pottery', '?')}.",
        "",
        "### What the floor means",
        "",
        "The floor is the least any Redis lock can cost here: two round trips to one local master, a",
        "`SET NX PX` to take the key and one script call that deletes it only if it still holds our",
        "token, with no quorum counting and no threads. redis-py's `Lock` sends the same two commands.",
        "Everything above that is the price of Redlock as pottery implements it.",
        "",
        "### Where pottery's time goes",
        "",
        "`--profile` runs cProfile over pottery and cron_celery. cron_celery's own code is a few",
        "microseconds per iteration (`JobLock.__init__` looks up the settings and the shared clients,",
        "then builds the `Redlock`); nearly all the rest is inside pottery, most of it on threads. Each",
        "`Redlock.acquire()` and `release()` makes a new thread pool and submits one task per master,",
        "and every new thread's `start()` waits until it runs: one master means two thread starts per",
        "iteration, three masters five or six. That is why pottery with three masters costs more than",
        "asking the same three local masters one after the other. With remote masters the round trips",
        "would dominate and asking them in parallel would pay off; for a lock taken once per run, a",
        "few milliseconds are small next to the database claim.",
        "",
    ]


# ---------------------------------------------------------------------------------- beat

BEAT_TARGETS = {"n": 10_000, "idle": 0.05, "burst_s": 10.0}


def beat_ratios(data: dict[str, Any]) -> dict[int, dict[str, float | None]]:
    """cron_celery over DatabaseScheduler for each N: build, idle tick, edit pickup, burst."""
    out: dict[int, dict[str, float | None]] = {}
    for size, pair in need(data, "beat_scale.json", "results").items():
        dbs, ours = pair.get("dbs"), pair.get("cron_celery")
        if ours is not None and dbs is None and alone(data, int(size)):
            continue  # measured with cron_celery alone (``--alone-from``): no ratio
        if dbs is None or ours is None:
            raise ResultError(f"beat_scale.json has N = {size} without both schedulers")
        out[int(size)] = {
            "build_first": ratio(ours["build_first"]["seconds"], dbs["build_first"]["seconds"]),
            "build_restart": ratio(ours["build_restart"]["seconds"], dbs["build_restart"]["seconds"]),
            "idle_median": ratio(ours["idle"]["median_ms"], dbs["idle"]["median_ms"]),
            "idle_p95": ratio(ours["idle"]["p95_ms"], dbs["idle"]["p95_ms"]),
            "edit": ratio(ours["edit"]["single"]["ms"], dbs["edit"]["single"]["ms"]),
            "edit_rows": ratio(ours["edit"]["single"]["rows_read"], dbs["edit"]["single"]["rows_read"]),
            "burst_time": ratio(ours["burst"]["time_to_all_s"], dbs["burst"]["time_to_all_s"]),
            "burst_rate": ratio(ours["burst"]["rate_per_s"], dbs["burst"]["rate_per_s"]),
        }
    if not out:
        raise ResultError("beat_scale.json has no results")
    return out


def burst_cell(burst: dict[str, Any]) -> str:
    time_to_all = burst["time_to_all_s"]
    if burst["complete"]:
        return fmt_seconds(time_to_all)
    if time_to_all is None:
        return f"not all ({burst['published']:,} in {burst['cap_seconds']:g} s)"
    return (f"~{fmt_seconds(time_to_all)} extrapolated ({burst['published']:,} in the first "
            f"{burst['cap_seconds']:g} s)")


#: cron_celery's variants besides the plain one, when a run has them: (key, name on the page).
BEAT_VARIANTS = (("cron_celery_jitter", "cron_celery, jitter=30"),
                 ("cron_celery_after", "cron_celery + 1,000 `after=` jobs"))


def alone(data: dict[str, Any], size: int) -> bool:
    """Whether the run measured ``size`` jobs with the cron_celery scheduler alone (``--alone-from``)."""
    start = data.get("settings", {}).get("alone_from")
    return start is not None and size >= int(start)


def beat_figures_row(size: str, name: str, figures: dict[str, Any]) -> list[str]:
    """One scheduler's row of the results table (``size`` is the N cell, empty under the first row)."""
    return [
        size, name,
        fmt_seconds(figures["build_first"]["seconds"]), fmt_seconds(figures["build_restart"]["seconds"]),
        fmt_ms(figures["idle"]["median_ms"]), fmt_ms(figures["idle"]["p95_ms"]),
        f"{fmt_ms(figures['edit']['single']['ms'])} ({figures['edit']['single']['rows_read']:,})",
        burst_cell(figures["burst"]), fmt_number(figures["burst"]["rate_per_s"], 1),
    ]


def beat_rows(size: int, pair: dict[str, Any], ratios: dict[str, float | None] | None) -> list[list[str]]:
    """A size's rows: DatabaseScheduler, cron_celery, their ratios and the variants; only
    cron_celery's row when it was measured alone (``ratios`` None)."""
    def figures_row(key: str, name: str) -> list[str]:
        return beat_figures_row(f"{size:,}" if key == "dbs" else "", name, pair[key])

    if ratios is None:
        return [beat_figures_row(f"{size:,}", "cron_celery alone", pair["cron_celery"])]
    rows = [figures_row("dbs", "DBS"), figures_row("cron_celery", "cron_celery")]
    rows.append(["", "**cron_celery ÷ DBS**", fmt_ratio(ratios["build_first"]), fmt_ratio(ratios["build_restart"]),
                 fmt_ratio(ratios["idle_median"], bold=True), fmt_ratio(ratios["idle_p95"]),
                 f"{fmt_ratio(ratios['edit'], bold=True)} ({fmt_ratio(ratios['edit_rows'])})",
                 fmt_ratio(ratios["burst_time"], bold=True), fmt_ratio(ratios["burst_rate"])])
    rows += [figures_row(key, name) for key, name in BEAT_VARIANTS if key in pair]
    return rows


def beat_targets(data: dict[str, Any], ratios: dict[int, dict[str, float | None]]) -> list[str]:
    largest = max(ratios)
    pair = data["results"][str(largest)]
    ours, dbs = pair["cron_celery"], pair["dbs"]
    idle = ratios[largest]["idle_median"]
    burst = ours["burst"]["time_to_all_s"]
    at_size = largest >= BEAT_TARGETS["n"]

    def verdict(met: bool) -> str:
        if not at_size:
            return f"judged at {BEAT_TARGETS['n']:,} jobs, not measured in this run"
        return "met" if met else "**not met**"

    idle_met = idle is not None and idle <= BEAT_TARGETS["idle"]
    burst_met = bool(ours["burst"]["complete"]) and burst is not None and burst <= BEAT_TARGETS["burst_s"]
    return [
        f"At N = {largest:,}, against the targets (set for {BEAT_TARGETS['n']:,} jobs):",
        "",
        f"- **idle tick**: cron_celery's takes {fmt_ratio(idle)} of DatabaseScheduler's "
        f"({fmt_ms(ours['idle']['median_ms'])} against {fmt_ms(dbs['idle']['median_ms'])}; target at most "
        f"{BEAT_TARGETS['idle']:.0%}: {verdict(idle_met)}).",
        f"- **one admin edit** is taken in after reading {ours['edit']['single']['rows_read']:,} rows; "
        f"DatabaseScheduler re-reads every periodic task ({dbs['edit']['single']['rows_read']:,} rows). "
        "The target is a number of rows that does not grow with N.",
        f"- **every slot of a minute published** {burst_cell(ours['burst'])} after its time (target "
        f"{BEAT_TARGETS['burst_s']:g} s: {verdict(burst_met)}); DatabaseScheduler: {burst_cell(dbs['burst'])}.",
        "",
    ]


def beat_variants_lines(data: dict[str, Any]) -> list[str]:
    """What the jitter and ``after=`` variants show, when the run has them."""
    sizes = sorted(int(size) for size, pair in data["results"].items()
                   if all(key in pair for key, _name in BEAT_VARIANTS))
    if not sizes:
        return []
    lines = ["With jitter and with dependent jobs (the rows *jitter=30* and *+ 1,000 `after=` jobs*), the",
             "idle tick against the plain cron_celery row of the same N:", ""]
    for size in sizes:
        pair = data["results"][str(size)]
        plain = pair["cron_celery"]["idle"]["median_ms"]
        jitter, after = pair["cron_celery_jitter"], pair["cron_celery_after"]
        lines.append(f"- N = {size:,}: {fmt_ms(plain)} plain, {fmt_ms(jitter['idle']['median_ms'])} with jitter "
                     f"({fmt_ratio(ratio(jitter['idle']['median_ms'], plain))}), "
                     f"{fmt_ms(after['idle']['median_ms'])} with 1,000 `after=` jobs "
                     f"({fmt_ratio(ratio(after['idle']['median_ms'], plain))}); with jitter the burst's first "
                     f"message went {jitter['burst']['first_s']:.1f} s and its last {jitter['burst']['last_s']:.1f} s "
                     "after the slot, spread by the jobs' offsets.")
    return [*lines, ""]


#: The admin pages ``beat_scale.py`` requests at each size: (key, name in the table).
BEAT_PAGES = (("index", "admin index"), ("dashboard", "jobs dashboard"), ("history", "history"),
              ("history_job", "one job's history"), ("job", "a job's page"), ("upcoming", "upcoming"))
#: Growth from one size to the next that is still "flat" (the figure may double; N grew tenfold),
#: and beyond which a "linear" figure grew faster than N (this share of N's growth).
FLAT_UP_TO, LINEAR_UP_TO = 2.0, 1.5


def scale_growth(small: float | None, large: float | None, n_growth: float) -> tuple[float | None, str]:
    """How a figure grew between two sizes (``n_growth`` = larger N / smaller N), and in words:
    flat, linear (at most ``LINEAR_UP_TO`` times N's growth) or faster than N."""
    grew = ratio(large, small)
    if grew is None:
        return None, DASH
    if grew <= FLAT_UP_TO:
        return grew, "flat"
    return grew, "linear" if grew <= LINEAR_UP_TO * n_growth else "**faster than N**"


def memory_cells(memory: dict[str, Any], n: int) -> list[str]:
    """Resident memory added over the start (declared, built, after the burst) and per job."""
    start = memory.get("before_mib")

    def added(key: str) -> float | None:
        value = memory.get(key)
        return None if value is None or start is None else value - start

    built = added("built_mib")
    per_job = None if built is None else built * 1024 / n
    return [f"{fmt_number(added(key), 1)} MiB" for key in ("declared_mib", "built_mib", "burst_mib")] + [
        f"{fmt_number(per_job, 2)} KiB"]


def memory_growth(small: int, large: int, before: float | None, after: float | None) -> str:
    """How the memory with the scheduler built grew. The sizes run one after the other in one process,
    so a smaller size may be built in memory an earlier one freed (about nothing added): then only
    the larger figure is told, per job."""
    name = "memory with the scheduler built"
    if after is None:
        return f"- {name}: not measured at N = {large:,}."
    if before is None or before < 1.0:
        return (f"- {name}: {fmt_number(after, 1)} MiB added at N = {large:,} ({fmt_number(after * 1024 / large, 2)} "
                f"KiB a job, should be linear); at N = {small:,} the process built in memory that the sizes before "
                "it had freed, so the two are not compared.")
    grew, verdict = scale_growth(before, after, large / small)
    return (f"- {name}: {fmt_number(before, 2)} MiB to {fmt_number(after, 2)} MiB, {TIMES}{fmt_ratio(grew)}: "
            f"{verdict} (should be linear).")


def page_cell(page: dict[str, Any] | None) -> str:
    if page is None:
        return DASH
    return f"{fmt_ms(page['median_ms'])} ({page['statements']}; {page['rows_read']:,})"


def beat_scale_lines(data: dict[str, Any]) -> list[str]:
    """cron_celery at every size (100,000 in the full run): declaring the jobs, resident memory,
    ``sync_cron_schedules`` and the admin's pages, and how each grew with N."""
    sizes = sorted(int(size) for size, pair in data["results"].items()
                   if "memory" in pair.get("cron_celery", {}) and "pages" in pair["cron_celery"])
    if not sizes:
        return []  # results from before these figures
    ours = {size: data["results"][str(size)]["cron_celery"] for size in sizes}
    scheduler_rows, admin_rows = [], []
    for size in sizes:
        figures = ours[size]
        edit = figures["edit"]
        scheduler_rows.append([
            f"{size:,}", fmt_seconds(figures.get("declare_s")), fmt_seconds(figures["build_first"]["seconds"]),
            fmt_seconds(figures["build_restart"]["seconds"]), fmt_ms(figures["idle"]["median_ms"]),
            f"{fmt_ms(edit['single']['ms'])} ({edit['single']['rows_read']:,})",
            f"{fmt_ms(edit['shared_row']['ms'])} ({edit['shared_row']['rows_read']:,})",
            burst_cell(figures["burst"]), *memory_cells(figures["memory"], size),
        ])
        sync = figures.get("sync_command") or {}
        admin_rows.append([
            f"{size:,}", f"{fmt_seconds(sync.get('seconds'))} ({fmt_number(sync.get('statements'))}; "
                         f"{fmt_number(sync.get('rows_read'))})",
            *(page_cell(figures["pages"].get(key)) for key, _name in BEAT_PAGES),
        ])
    lines = [
        "### cron_celery at the largest N: memory, the sync command and the admin",
        "",
        f"cron_celery alone at each N of the run ({', '.join(f'{size:,}' for size in sizes)}). *Declared* is",
        "the time to declare the N jobs in the process (what every worker and beat pays at start-up);",
        "memory is this process's resident memory (VmRSS) added since before the jobs were declared: once",
        "declared, with the scheduler built, and after the burst (per job: built, divided by N). The",
        "sizes run one after the other in this one process, so a size can be built in memory that the",
        "sizes before it freed (then next to nothing, or less than nothing, is added): the largest N's",
        "figure is the one to read.",
        "",
        *table(["N", "declared", "build, first", "build, restart", "idle tick (median)", "one edit (rows read)",
                "shared crontab edit (rows read)", "burst: all N published after", "memory: declared",
                "built", "after the burst", "per job"], scheduler_rows, "lrrrrrrrrrrr"),
        "",
        "`manage.py sync_cron_schedules` with every job already in place, then the admin's pages as a",
        "logged-in superuser, the burst's N executions in the history and the tables analyzed (as autovacuum",
        "would have by then): median of five requests after a warm-up (SQL statements; rows they returned).",
        "",
        *table(["N", "`sync_cron_schedules`", *(name for _key, name in BEAT_PAGES)], admin_rows,
               "l" + "r" * (1 + len(BEAT_PAGES))),
        "",
    ]
    if len(sizes) < 2:
        return lines
    small, large = sizes[-2], sizes[-1]
    grew_n = large / small
    before, after = ours[small], ours[large]

    def said(name: str, old: float | None, new: float | None, unit: str, expect: str) -> str:
        grew, verdict = scale_growth(old, new, grew_n)
        digits = 0 if unit == "rows" else 2
        shown = f"{fmt_number(old, digits)} {unit} to {fmt_number(new, digits)} {unit}"
        return f"- {name}: {shown}, {TIMES}{fmt_ratio(grew)}: {verdict} (should be {expect})."

    def built(figures: dict[str, Any]) -> float | None:
        memory = figures["memory"]
        if memory.get("built_mib") is None or memory.get("before_mib") is None:
            return None
        return float(memory["built_mib"]) - float(memory["before_mib"])

    lines += [f"From N = {small:,} to N = {large:,} ({TIMES}{grew_n:g}), what each figure did:", "",
              said("declaring the jobs", before.get("declare_s"), after.get("declare_s"), "s", "linear"),
              said("build, restart", before["build_restart"]["seconds"], after["build_restart"]["seconds"], "s",
                   "linear"),
              said("idle tick", before["idle"]["median_ms"], after["idle"]["median_ms"], "ms", "flat"),
              said("one edit, rows read", before["edit"]["single"]["rows_read"],
                   after["edit"]["single"]["rows_read"], "rows", "flat"),
              said("burst, all published", before["burst"]["time_to_all_s"], after["burst"]["time_to_all_s"], "s",
                   "linear"),
              memory_growth(small, large, built(before), built(after)),
              said("`sync_cron_schedules`", (before.get("sync_command") or {}).get("seconds"),
                   (after.get("sync_command") or {}).get("seconds"), "s", "linear")]
    for key, name in BEAT_PAGES:
        old, new = before["pages"].get(key), after["pages"].get(key)
        if old is None or new is None:
            continue
        grew, verdict = scale_growth(old["rows_read"], new["rows_read"], grew_n)
        took = ratio(new["median_ms"], old["median_ms"])
        lines.append(f"- {name}: {old['rows_read']:,} rows read to {new['rows_read']:,}, {TIMES}{fmt_ratio(grew)}: "
                     f"{verdict} (should be flat); {fmt_ms(old['median_ms'])} to {fmt_ms(new['median_ms'])} "
                     f"({TIMES}{fmt_ratio(took)}).")
    return [*lines, ""]


def beat_section(results: Results) -> list[str]:
    data = results.data["beat_scale"]
    settings = need(data, "beat_scale.json", "settings")
    ratios = beat_ratios(data)
    rows = []
    every = sorted(int(size) for size in data["results"])
    for size in every:
        rows.extend(beat_rows(size, data["results"][str(size)], ratios.get(size)))
    sizes = ", ".join(f"{size:,}" for size in every)
    by_itself = [f"{size:,}" for size in every if size not in ratios]
    sizes += f" ({', '.join(by_itself)}: cron_celery alone)" if by_itself else ""
    return [
        "## Beat at scale",
        "",
        "`bench/beat_scale.py` gives django-celery-beat's `DatabaseScheduler` (DBS) and",
        "`cron_celery.beat.Scheduler` the same N jobs, all due every minute, and measures one scheduler",
        "after the other in the same run:",
        "",
        *table(["phase", "what is timed"], [
            ["build", "constructing the scheduler and reading its schedule, the first time and again as on "
             "a restart (cron_celery's first build includes syncing every job to a periodic task; "
             "DatabaseScheduler's starts with its rows already inserted)"],
            ["idle tick", f"`tick()` while nothing is due ({settings['idle_ticks']} back-to-back ticks; median "
             "and p95)"],
            ["edit", "one job's crontab changed the way the admin form does it (`PeriodicTask.save()`): the "
             "tick that takes it in and the rows its statements returned"],
            ["burst", "all N slots fall due at one real minute boundary; the scheduler ticks as beat does "
             f"until every slot is published (stopped after {settings['burst_cap_s']:g} s and the rest "
             "extrapolated)"],
        ]),
        "",
        "Messages go to a queue nobody consumes (counted, then deleted); the cron_celery scheduler leads",
        "without a lock. Each scheduler waits for a minute boundary per N, so the benchmark takes a few",
        "minutes per size.",
        "",
        "### Results",
        "",
        *table(["N", "", "build, first", "build, restart", "idle tick (median)", "idle tick (p95)",
                "one edit taken in (rows read)", "burst: all N published after", "publishes/s"], rows,
               "llrrrrrrr"),
        "",
        f"N = {sizes}. Below 1 in the ratio rows means cron_celery took less time (or read fewer",
        "rows); for publishes per second, above 1 means it published faster.",
        "",
        *beat_targets(data, ratios),
        measured(results, "beat_scale", settings["date"]) + f" django-celery-beat "
        f"{settings.get('django_celery_beat', '?')}, cron_celery `BEAT_BATCH={settings.get('beat_batch', '?')}`.",
        "",
        *beat_variants_lines(data),
        *beat_scale_lines(data),
        "### Why cron_celery's tick stays flat",
        "",
        "An idle tick is django-celery-beat's own change check (one row) plus one query of two index",
        "lookups: the earliest `due_at` (the next slot plus the job's jitter), and whether any job was",
        "edited (a scalar subquery that",
        "uses a partial index). Neither grows with N. An edit bumps the job's schedule version, and the",
        "next tick reloads that job only; DatabaseScheduler re-reads every periodic task on any change.",
        "A burst is planned once per distinct schedule and due slot, recorded with one",
        "`INSERT … ON CONFLICT` per batch of executions, and published through kombu's pipelined batches.",
        "",
        "### What is left",
        "",
        "- The beat now builds a round's messages with Celery's `create_task_message` and",
        "  `send_task_message`, routing each task and declaring each queue once per round (see",
        "  [where cron_celery's publish time goes](#where-cron_celerys-publish-time-goes)); what is left of",
        "  a large burst is kombu's own publish (the message's JSON, one pipeline command each) and the",
        "  rows' insert. Publishing while the next batch is written would overlap the two.",
        "- The first tick of a burst publishes only once its first batch is recorded.",
        "- Any change to any periodic task makes django-celery-beat's part of the scheduler reload its",
        "  own (non-cron) tasks, a query over all periodic tasks: that, not cron_celery's reload, is",
        "  most of a one-job edit's time at large N.",
        "",
    ]


# ------------------------------------------------------------------------------- history

HISTORY_TARGETS = {"queries": 20, "median_ms": 100.0, "purge_rows_per_second": 50_000}


def history_figures(data: dict[str, Any]) -> dict[str, Any]:
    """Each page against the targets, and purge throughput against its target."""
    pages = need(data, "history.json", "pages")
    purge = need(data, "history.json", "purge")
    if not pages:
        raise ResultError("history.json has no pages")
    return {
        "pages": [{"page": page["page"], "queries": int(page["queries"]),
                   "median_x_target": float(page["median_ms"]) / HISTORY_TARGETS["median_ms"],
                   "within": int(page["queries"]) <= HISTORY_TARGETS["queries"]
                   and float(page["median_ms"]) <= HISTORY_TARGETS["median_ms"] and not page["seq_scans"]}
                  for page in pages],
        "slowest_ms": max(float(page["median_ms"]) for page in pages),
        "most_queries": max(int(page["queries"]) for page in pages),
        "purge_rows_per_second": float(purge["rows_per_second"]),
        "purge_x_target": float(purge["rows_per_second"]) / HISTORY_TARGETS["purge_rows_per_second"],
    }


#: Why the scrape may miss a page's target: its cost is in the text, and follows the jobs.
SCRAPE_NOTE = [
    "The metrics scrape is the one over the page target, and not for its SQL: its four statements",
    "read O(jobs) rows in a few milliseconds, and the rest is `prometheus_client` writing the",
    "exposition text, about 21 samples per job and status (each job's histogram buckets), some",
    "21,000 lines for these 1,000 jobs. It grows with the number of jobs, not with the history",
    "(below).",
]


def history_section(results: Results) -> list[str]:
    data = results.data["history"]
    settings = need(data, "history.json", "settings")
    purge = data["purge"]
    figures = history_figures(data)
    rows = [[page["page"], str(page["queries"]), fmt_ms(page["median_ms"]), fmt_ms(page["p90_ms"]),
             fmt_ratio(figure["median_x_target"]), str(len(page["seq_scans"]))]
            for page, figure in zip(data["pages"], figures["pages"], strict=True)]
    rows_seeded, jobs = int(settings["rows"]), int(settings["jobs"])
    small = "" if rows_seeded >= 1_000_000 else (
        f" This run seeded **{rows_seeded:,} rows, not a million**: its page times say little about the "
        "full size.")
    all_within = all(page["within"] for page in figures["pages"])
    return [
        "## History at a million rows",
        "",
        "`bench/history.py` fills its own database (`cron_celery_history`) with 1,000 jobs and",
        "1,000,000 finished executions (1,000 per job, one a minute; 5 % failed, 3 % skipped), plus a job",
        f"that ran every second for a week ({int(settings.get('busy_rows', 0)):,} executions, 5-50 ms each, "
        "1 % failed;",
        "it sorts first, so the dashboard's first page shows it), then",
        "requests each admin page and endpoint as a logged-in staff user through Django's test client,",
        "after one warm-up request. For each page it reports the SQL queries, the median and 90th",
        "percentile time, and whether PostgreSQL's plan for any of the warm-up's queries (`EXPLAIN`)",
        "reads the executions with a sequential scan. No other tool serves these pages, so the figures",
        f"are held against targets, at most {HISTORY_TARGETS['queries']} queries and",
        f"{HISTORY_TARGETS['median_ms']:.0f} ms (median) per page; the dashboard's figures are also read",
        "the way they were before the rollups, side by side.",
        "",
        "### Results",
        "",
        *table(["page", "queries", "median", "p90", "median ÷ target", "sequential scans of the executions"],
               rows, "lrrrrr"),
        "",
        f"{rows_seeded:,} executions of {jobs:,} jobs, {settings['repeat']} requests per page.{small} Every page "
        f"within the targets: **{'yes' if all_within else 'no'}** (slowest median "
        f"{fmt_ms(figures['slowest_ms'])}, most queries {figures['most_queries']}).",
        *(["", *SCRAPE_NOTE] if any(not page["within"] and page["page"].startswith("metrics")
                                    for page in figures["pages"]) else []),
        "",
        "### Purge throughput",
        "",
        f"Last, the script adds {purge['rows']:,} old executions and purges them in batches of 1,000, job by",
        "job, each batch a range of the `(job, slot, run_number)` index:",
        f"**{fmt_number(purge['rows_per_second'])} rows/s** ({purge['rows']:,} rows in {purge['batches']:,} "
        f"batches, {purge['seconds']:g} s), {fmt_ratio(figures['purge_x_target'])} {TIMES} the target of "
        f"{HISTORY_TARGETS['purge_rows_per_second']:,} rows/s.",
        "",
        *figures_lines(data.get("figures")),
        *scrape_lines(data.get("scrapes") or []),
        measured(results, "history", settings["date"]),
        "",
        "### How the pages stay fast",
        "",
        "The unfiltered history shows PostgreSQL's row estimate instead of counting every row, lists",
        "the newest ids first, and offers the date hierarchy only once a job is chosen. The dashboard",
        "reads each job's 7-day figures from rollups kept by triggers as executions end (at most 169",
        "hour rows and a few dozen duration buckets a job), and only a quiet job's week (at most 250",
        "executions) from its rows. What remains is, on the job-filtered history, rendering the",
        "sidebar that links every job.",
        "",
    ]


def figures_lines(figures: dict[str, Any] | None) -> list[str]:
    """The dashboard's 7-day figures read from the rollups beside the week scans they replaced."""
    if not figures:
        return []
    rollups, scan = figures["busy"]["rollups"], figures["busy"]["scan"]
    rows = [["from the rollups (the page now)", fmt_ms(figures["rollups_ms"]), "1"],
            ["scanning each job's week (the page before)", fmt_ms(figures["scan_ms"]),
             fmt_ratio(float(figures["scan_ms"]) / max(float(figures["rollups_ms"]), 0.001))]]

    def shown(week: list[Any]) -> str:
        median = "—" if week[2] is None else f"{float(week[2]) * 1000:.1f} ms"
        return f"{int(week[1]):,} of {int(week[0]):,} succeeded, median {median}"

    return [
        "### The dashboard's 7-day figures, before and after the rollups",
        "",
        f"The 7-day success rate and median of the first page's {figures['jobs']} jobs, read in the same",
        "database both ways, one after the other, after a warm-up round:",
        "",
        *table(["how", "median", f"{TIMES} the rollups"], rows, "lrr"),
        "",
        f"The every-second job's figures: from the rollups {shown(rollups)}",
        f"(the median estimated from its duration buckets); from its executions {shown(scan)}.",
        "",
    ]


def scrape_lines(scrapes: list[dict[str, Any]]) -> list[str]:
    """The metrics scrape at each history size, and how its time grew from the smallest."""
    if not scrapes:
        return []
    first = float(scrapes[0]["median_ms"]) or 1.0
    rows = [[f"{int(item['rows']):,}", str(item["queries"]), fmt_ms(item["median_ms"]), fmt_ms(item["p90_ms"]),
             fmt_ratio(float(item["median_ms"]) / first), str(len(item["seq_scans"]))] for item in scrapes]
    return [
        "### The metrics scrape as history grows",
        "",
        "The same scrape of `/cron/metrics/` again, with the history seeded to each size in turn (the",
        "same 1,000 jobs). Its counters and histogram come from per-job tallies kept as executions end,",
        "and the open executions are read job by job through the `(job, status)` index, so its cost",
        "follows the number of jobs, not of executions:",
        "",
        *table(["executions", "queries", "median", "p90", f"median {TIMES} the first", "sequential scans"],
               rows, "rrrrrr"),
        "",
    ]


SECTIONS = (overhead_section, locks_section, beat_section, latency_section, history_section)
