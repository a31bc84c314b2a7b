"""The history section: the pages and the metrics scrape at a million rows, and purge throughput."""

from __future__ import annotations

from typing import Any

from bench.figures import (
    TIMES,
    ResultError,
    Results,
    fmt_ms,
    fmt_number,
    fmt_ratio,
    measured,
    need,
    table,
)

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
