"""The overhead section: a tracked run beside bare Celery, django-celery-results and celery-once; the
statements, commits and WAL a run costs; the profile."""

from __future__ import annotations

from typing import Any

from bench.figures import (
    DASH,
    TIMES,
    ResultError,
    Results,
    fmt_number,
    fmt_ratio,
    measured,
    need,
    ratio,
    table,
)
from bench.sections.overhead_method import overhead_method

OVERHEAD_VARIANTS = (
    ("bare", "(i) bare Celery"),
    ("results", "(ii) django-celery-results"),
    ("tracked", "(iii) cron_celery `cron_task`"),
    ("once", "(iv) celery-once `QueueOnce`"),
)
PEERS = ("bare", "results", "once")  # what a tracked run (iii) is compared with
#: (v), a plain task tracked as a periodic task: shown where the results have it (runs before it did not).
PLAIN_TRACKED = ("plain-tracked", "(v) a plain task, tracked (`TRACK_PERIODIC_TASKS`)")


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
    shown = (*OVERHEAD_VARIANTS, PLAIN_TRACKED) if PLAIN_TRACKED[0] in medians else OVERHEAD_VARIANTS
    lines = [
        "## The cost of tracking a run",
        "",
        *overhead_method(settings),
        "### Results",
        "",
        *table(
            ["variant", *(f"run {i}" for i in range(1, repeat + 1)), "**median** (tasks/s)", "÷ bare Celery"],
            [[label, *(fmt_number(rate) for rate in rates.get(key, [])),
              f"**{fmt_number(medians[key])}**", fmt_ratio(ratio(medians[key], medians["bare"]))]
             for key, label in shown],
            "l" + "r" * (repeat + 2),
        ),
        "",
        *plain_tracked_ratios(medians, rates),
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


def plain_tracked_ratios(medians: dict[str, float], rates: dict[str, list[float]]) -> list[str]:
    """(v) over (ii) and (i), where the results have (v): a plain task the team already has, tracked
    with no change to its code, against the same task with django-celery-results and bare."""
    key, label = PLAIN_TRACKED
    if key not in medians:
        return []
    rows = []
    for peer in ("results", "bare"):
        each = [ours / theirs for ours, theirs in zip(rates[key], rates[peer], strict=True)]
        rows.append([dict(OVERHEAD_VARIANTS)[peer], fmt_ratio(medians[key] / medians[peer], bold=True),
                     ", ".join(fmt_ratio(r) for r in each)])
    return [
        *table([f"{label} against", "ratio of the medians", "ratio in each repeat"], rows, "lrr"),
        "",
        "(v) is the bare task (i) of a periodic task that `TRACK_PERIODIC_TASKS` tracks: each message",
        "carries the headers the beat puts on a tracked task's message, and the worker's wrapper claims",
        "its slot before the body and finishes its `CronExecution` row after it, as (iii) does.",
        "",
    ]


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
        "A message from the beat or `--enqueue` claims its `PENDING` execution, and a job with the slot",
        "check (patterns `standard`, `rerun_on_failure`) or overlap `skip` its new run, in one round trip",
        "too: two prepared statements sent as one query, the job's row locked and its fence taken, then the",
        "checks and the `UPDATE … SET status = 'RUNNING'` (or the insert) with a snapshot taken under that",
        "lock (`quick_claims`). When something stands in the way, and for jobs with `max_concurrency`, a",
        "concurrency group or the `rate_limited` pattern, the full claim decides: three statements in",
        "one transaction (lock and fence the job's row, read the slot's executions and the job's live",
        "runs, insert, update or skip the execution). The lease thread adds",
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
