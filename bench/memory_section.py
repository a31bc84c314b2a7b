"""The page's section on ``bench/memory.py``: a worker's resident memory over a long run of tracked
runs, beside the same number of plain tasks with django-celery-results."""

from __future__ import annotations

from typing import Any

from bench.figures import DASH, TIMES, ResultError, Results, fmt_number, fmt_ratio, measured, need, ratio, table

#: The variants in the order of the table: (key in the JSON, name on the page).
MEMORY_VARIANTS = (("tracked", "cron_task (tracked)"), ("results", "plain task + django-celery-results"))


def mib(value: float | None) -> str:
    return DASH if value is None else f"{fmt_number(value, 1)} MiB"


def signed(value: float | None) -> str:
    return DASH if value is None else f"{value:+,.1f} MiB"


def memory_variants(data: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """The variants the results have, in the page's order; a ResultError when there are none."""
    results = need(data, "memory.json", "results")
    found = [(key, name, results[key]) for key, name in MEMORY_VARIANTS if key in results]
    if not found:
        raise ResultError("memory.json has no results: run bench/memory.py again")
    for key, _name, result in found:
        need(result, "memory.json", "samples")
        need(result, "memory.json", "growth")
        if not result["samples"]:
            raise ResultError(f"memory.json has no samples for {key}")
    return found


def memory_rows(variants: list[tuple[str, str, dict[str, Any]]]) -> list[list[str]]:
    """One row per checkpoint (runs): each variant's main process, pool processes and total."""
    by_runs: dict[int, dict[str, dict[str, Any]]] = {}
    for key, _name, result in variants:
        for sample in result["samples"]:
            by_runs.setdefault(int(sample["runs"]), {})[key] = sample
    rows = []
    for runs in sorted(by_runs):
        row = [fmt_number(runs)]
        for key, _name, _result in variants:
            sample = by_runs[runs].get(key)
            if sample is None:
                row += [DASH, DASH, DASH]
                continue
            pool = " + ".join(mib(child.get("mib")) for child in sample.get("children", [])) or DASH
            row += [mib(sample.get("main_mib")), pool, mib(sample.get("total_mib"))]
        rows.append(row)
    return rows


def growth_line(name: str, growth: dict[str, Any], noise: str) -> str:
    """What one variant's worker kept from the baseline checkpoint to the last, per process."""
    each = ", ".join(
        f"{process['process']} {signed(process['change_mib'])}" + (" (replaced)" if process.get("replaced") else "")
        for process in growth["processes"])
    verdict = "within the noise" if growth["flat"] else "**grew beyond the noise**"
    return (f"- {name}: from {growth['from_runs']:,} to {growth['to_runs']:,} runs, {each}; in all "
            f"{signed(growth['total_change_mib'])} ({signed(growth['per_10k_runs_mib'])} per 10,000 runs): "
            f"{verdict} ({noise}).")


def memory_section(results: Results) -> list[str]:
    data = results.data["memory"]
    settings = need(data, "memory.json", "settings")
    variants = memory_variants(data)
    header = ["runs"]
    for _key, name, _result in variants:
        header += [f"{name}: main", "pool", "total"]
    noise = (f"a process may move by {fmt_number(settings.get('noise_mib'), 1)} MiB or "
             f"{float(settings.get('noise_share', 0)):.0%} of its size")
    last = {key: result["samples"][-1].get("total_mib") for key, _name, result in variants}
    lines = [
        "## Worker memory over a long run",
        "",
        "`bench/memory.py` runs no-op tasks through one worker per variant, one variant after the other,",
        f"each `celery worker --pool prefork --concurrency {settings.get('concurrency', 2)}`: a `cron_task` (each "
        "message a slot",
        "of its own, recorded as an execution row) and, as the peer, the same body as a plain Celery task",
        "with django-celery-results' `django-db` backend (a result row per task). Messages are published in",
        f"chunks (at most {fmt_number(settings.get('ahead'))} waiting). At each checkpoint, once every run so "
        "far has written its row,",
        "the resident memory (VmRSS) of the worker's main process and of each pool process is read from",
        "`/proc`; the first row is the worker before any run.",
        "",
        "### Results",
        "",
        *table(header, memory_rows(variants), "l" + "r" * (len(header) - 1)),
        "",
        "What each worker kept over the long run (from the checkpoint at a tenth of the run, or 10,000",
        "runs, to the last):",
        "",
        *(growth_line(name, result["growth"], noise) for _key, name, result in variants),
        "",
    ]
    if "tracked" in last and "results" in last:
        lines += [f"At the last checkpoint the tracked worker's processes hold {mib(last['tracked'])} in all, "
                  f"{TIMES}{fmt_ratio(ratio(last['tracked'], last['results']))} the peer's {mib(last['results'])}.",
                  ""]
    lines += [measured(results, "memory", settings["date"]), ""]
    return lines
