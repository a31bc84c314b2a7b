"""docs/benchmarks.md from one results directory: ``load`` it, then ``render`` the page.

The page depends on the results only (no clock, no machine look-ups here), so rendering
the same directory twice gives the same page.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from bench.figures import NAMES, ResultError, Results, fmt_duration, need, table
from bench.memory_section import memory_section
from bench.sections import SECTIONS

MANIFEST = "manifest.json"

#: Version figures the scripts record, and how the page names them.
SOFTWARE = (
    ("python", "Python"), ("django", "Django"), ("celery", "Celery"), ("kombu", "kombu"),
    ("django_celery_beat", "django-celery-beat"), ("django_celery_results", "django-celery-results"),
    ("celery_once", "celery-once"), ("pottery", "pottery"), ("redis_py", "redis-py"), ("psycopg", "psycopg"),
)


def missing(directory: Path) -> list[str]:
    """The benchmarks whose results ``directory`` lacks (all of them without a manifest)."""
    path = directory / MANIFEST
    if not path.exists():
        return list(NAMES)
    recorded = json.loads(path.read_text(encoding="utf-8")).get("benchmarks", {})
    return [name for name in NAMES
            if name not in recorded or not (directory / recorded[name].get("file", f"{name}.json")).exists()]


def load(directory: Path) -> Results:
    """Read a results directory; a ResultError says what is missing and how to get it."""
    if not (directory / MANIFEST).exists():
        raise ResultError(f"{directory} has no {MANIFEST}: it is not a results directory of ./scripts/bench")
    absent = missing(directory)
    if absent:
        raise ResultError(f"no results for {', '.join(absent)} in {directory}: run "
                          f"./scripts/bench --only {','.join(absent)} --results {directory}")
    manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    data = {}
    for name in NAMES:
        file = directory / manifest["benchmarks"][name].get("file", f"{name}.json")
        try:
            data[name] = json.loads(file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ResultError(f"{file} is not valid JSON ({exc})") from exc
    return Results(manifest=manifest, data=data)


def software(results: Results) -> list[tuple[str, str]]:
    """Each version the results record, with all the values seen if they differ."""
    found: list[tuple[str, str]] = []
    for key, label in SOFTWARE:
        values = {str(data["settings"][key]) for data in results.data.values() if key in data.get("settings", {})}
        if values:
            found.append((label, " / ".join(sorted(values))))
    return found


def servers(results: Results) -> list[tuple[str, str]]:
    overhead = results.data["overhead"].get("settings", {})
    postgres = {str((overhead.get("postgresql") or {}).get("server_version", ""))}
    for name in ("beat_scale", "history"):
        postgres.add(str(results.data[name].get("settings", {}).get("postgresql", "")))
    postgres.discard("")
    broker = overhead.get("redis_server")
    masters = results.data["locks"].get("settings", {}).get("redis_server")
    rows = []
    if postgres:
        rows.append(("PostgreSQL", " / ".join(sorted(postgres)) + ", on the same machine"))
    if broker or masters:
        rows.append(("Redis", f"{broker or '?'} (the machine's, for the broker and celery-once), "
                              f"{masters or '?'} (the lock benchmark's own masters)"))
    return rows


def commits_and_commands(results: Results, runs: list[int]) -> tuple[list[str], list[str]]:
    """The commits the runs ``runs`` of the manifest measured (each once, marked where the tree had
    changes), and the command of each run."""
    commits, commands = [], []
    for index in runs:
        run = results.manifest["runs"][index]
        mark = f"`{run.get('commit', 'unknown')}`" + (
            " with uncommitted changes to `cron_celery/`, `bench/` or `pyproject.toml`" if run.get("dirty") else "")
        if mark not in commits:
            commits.append(mark)
        commands.append(f"`{run['command']}`")
    return commits, commands


def quick_note(results: Results) -> list[str]:
    """The warning that some or all of the figures come from a quick run; none after a full run."""
    quick = [name for name in NAMES if results.quick(name)]
    if not quick:
        return []
    which = "All the figures below" if len(quick) == len(NAMES) else (
        "The figures of " + ", ".join(f"`{name}`" for name in quick))
    return [
        f"> **Quick run.** {which} come from a quick run (`--quick`): smaller sizes and fewer repeats,",
        "> meant to show that every benchmark runs and the page is written. They are not the figures",
        "> to quote; `./scripts/bench` without `--quick` measures those.",
        "",
    ]


def header(results: Results) -> list[str]:
    runs = sorted({int(results.entry(name)["run"]) for name in NAMES})
    first = results.manifest["runs"][runs[0]]
    started = dt.datetime.fromisoformat(first["started_at"]).astimezone(dt.UTC)
    date = f"{started:%Y-%m-%d %H:%M} UTC"
    host = first.get("machine", {})
    cpu = host.get("cpu_model") or "CPU model unknown"
    memory = f", {host['memory_gib']:g} GiB of memory" if host.get("memory_gib") else ""
    loadavg = host.get("loadavg") or []
    load = " / ".join(f"{value:.2f}" for value in loadavg) if loadavg else "?"
    took = sum(float(results.entry(name).get("seconds", 0)) for name in NAMES)
    commits, commands = commits_and_commands(results, runs)
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `./scripts/bench` on {date}; do not edit by hand.",
        "",
        *quick_note(results),
    ]
    lines += [
        "The benchmarks, each run side by side with the tools it replaces or is built on:",
        "",
        "- [the cost of tracking a run](#the-cost-of-tracking-a-run): tasks per second of a tracked",
        "  run against bare Celery, django-celery-results and celery-once;",
        "- [locks](#locks): one job lock against pottery's Redlock and the raw Redis floor;",
        "- [beat at scale](#beat-at-scale): the scheduler's tick, edits and bursts against",
        "  django-celery-beat's `DatabaseScheduler`;",
        "- [slot to start under load](#slot-to-start-under-load): how long after its slot a job is",
        "  published, starts and ends with real beats and busy workers, against `DatabaseScheduler`;",
        "- [history at a million rows](#history-at-a-million-rows): the admin pages and endpoints over a",
        "  large execution table, and purge throughput;",
        "- [worker memory over a long run](#worker-memory-over-a-long-run): a worker's resident memory",
        "  after 10,000 and 100,000 tracked runs, against plain tasks with django-celery-results.",
        "",
        "Absolute numbers drift on shared machines: the same command on the same virtual machine can",
        "differ by tens of percent from one hour to the next. Compare the **ratios within one run**, where",
        "every tool met the same machine at the same moment, not absolute figures from different runs.",
        "",
        "## This run",
        "",
        *table(["", "this run"], [
            ["date", f"{date}; the benchmarks took {fmt_duration(took)} in all"],
            ["machine", f"{host.get('cpus', '?')} CPUs ({cpu}){memory}; load average {load} at the start"],
            ["software", ", ".join(f"{label} {version}" for label, version in software(results))],
            *[[label, text] for label, text in servers(results)],
            ["commit", "; ".join(commits)],
            ["command", "; ".join(commands)],
        ]),
        "",
        "PostgreSQL, Redis, the workers and the scripts all share the machine. Each section below says",
        "when it was measured and what the load average was as it started.",
        "",
        "## Running the benchmarks",
        "",
        "```sh",
        "./scripts/bench                           # every benchmark, then this page (about an hour)",
        "./scripts/bench --quick --out /tmp/b.md   # small sizes, a few minutes: checks the pipeline",
        "./scripts/bench --only locks --results bench/results/run-<time>   # run one again into a run",
        "./scripts/bench --from-results bench/results/run-<time>           # render only",
        "```",
        "",
        "Each benchmark runs as its own process and writes its figures as JSON to the results",
        "directory (`bench/results/run-<time>/`, ignored by git), with its output beside it; the page is",
        "rendered from those files and is written only when every benchmark has succeeded. The scripts",
        "also run alone, for example `./.venv-dj52/bin/python bench/locks.py --profile`; each takes",
        "`--json PATH` and describes its options with `--help`. They use their own databases",
        "(`cron_celery_bench`, `cron_celery_history`) and Redis keys named with a per-run tag.",
        "",
    ]
    return lines


def render(results: Results) -> str:
    for name in NAMES:
        need(results.manifest, MANIFEST, "benchmarks", name)
        need(results.data[name], f"{name}.json", "settings")
    lines = header(results)
    for section in (*SECTIONS, memory_section):
        lines.extend(section(results))
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"

