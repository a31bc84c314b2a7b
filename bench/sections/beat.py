"""The beat section: the scheduler beside django-celery-beat's DatabaseScheduler at each size, its memory
and the admin's pages at scale."""

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


def scheduler_row(size: int, figures: dict[str, Any]) -> list[str]:
    """The scheduler's own figures at one size: declaring, builds, idle tick, edits, burst, memory."""
    edit = figures["edit"]
    return [
        f"{size:,}", fmt_seconds(figures.get("declare_s")), fmt_seconds(figures["build_first"]["seconds"]),
        fmt_seconds(figures["build_restart"]["seconds"]), fmt_ms(figures["idle"]["median_ms"]),
        f"{fmt_ms(edit['single']['ms'])} ({edit['single']['rows_read']:,})",
        f"{fmt_ms(edit['shared_row']['ms'])} ({edit['shared_row']['rows_read']:,})",
        burst_cell(figures["burst"]), *memory_cells(figures["memory"], size),
    ]


def admin_row(size: int, figures: dict[str, Any]) -> list[str]:
    """The sync command and the admin's pages at one size."""
    sync = figures.get("sync_command") or {}
    return [
        f"{size:,}", f"{fmt_seconds(sync.get('seconds'))} ({fmt_number(sync.get('statements'))}; "
                     f"{fmt_number(sync.get('rows_read'))})",
        *(page_cell(figures["pages"].get(key)) for key, _name in BEAT_PAGES),
    ]


def growth_line(name: str, old: float | None, new: float | None, unit: str, expect: str, grew_n: float) -> str:
    """One figure from the smaller size to the larger (N grew ``grew_n`` times), and what it should do."""
    grew, verdict = scale_growth(old, new, grew_n)
    digits = 0 if unit == "rows" else 2
    shown = f"{fmt_number(old, digits)} {unit} to {fmt_number(new, digits)} {unit}"
    return f"- {name}: {shown}, {TIMES}{fmt_ratio(grew)}: {verdict} (should be {expect})."


def built_mib(figures: dict[str, Any]) -> float | None:
    """Resident memory added by the time the scheduler was built (None: not measured)."""
    memory = figures["memory"]
    if memory.get("built_mib") is None or memory.get("before_mib") is None:
        return None
    return float(memory["built_mib"]) - float(memory["before_mib"])


def page_growth_lines(before: dict[str, Any], after: dict[str, Any], grew_n: float) -> list[str]:
    """How the rows each admin page read, and its time, grew between the two sizes."""
    lines = []
    for key, name in BEAT_PAGES:
        old, new = before["pages"].get(key), after["pages"].get(key)
        if old is None or new is None:
            continue
        grew, verdict = scale_growth(old["rows_read"], new["rows_read"], grew_n)
        took = ratio(new["median_ms"], old["median_ms"])
        lines.append(f"- {name}: {old['rows_read']:,} rows read to {new['rows_read']:,}, {TIMES}{fmt_ratio(grew)}: "
                     f"{verdict} (should be flat); {fmt_ms(old['median_ms'])} to {fmt_ms(new['median_ms'])} "
                     f"({TIMES}{fmt_ratio(took)}).")
    return lines


def growth_lines(small: int, large: int, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What each of cron_celery's figures did from the second largest N to the largest."""
    grew_n = large / small
    return [f"From N = {small:,} to N = {large:,} ({TIMES}{grew_n:g}), what each figure did:", "",
            growth_line("declaring the jobs", before.get("declare_s"), after.get("declare_s"), "s", "linear",
                        grew_n),
            growth_line("build, restart", before["build_restart"]["seconds"], after["build_restart"]["seconds"],
                        "s", "linear", grew_n),
            growth_line("idle tick", before["idle"]["median_ms"], after["idle"]["median_ms"], "ms", "flat",
                        grew_n),
            growth_line("one edit, rows read", before["edit"]["single"]["rows_read"],
                        after["edit"]["single"]["rows_read"], "rows", "flat", grew_n),
            growth_line("burst, all published", before["burst"]["time_to_all_s"],
                        after["burst"]["time_to_all_s"], "s", "linear", grew_n),
            memory_growth(small, large, built_mib(before), built_mib(after)),
            growth_line("`sync_cron_schedules`", (before.get("sync_command") or {}).get("seconds"),
                        (after.get("sync_command") or {}).get("seconds"), "s", "linear", grew_n),
            *page_growth_lines(before, after, grew_n), ""]


def beat_scale_lines(data: dict[str, Any]) -> list[str]:
    """cron_celery at every size (100,000 in the full run): declaring the jobs, resident memory,
    ``sync_cron_schedules`` and the admin's pages, and how each grew with N."""
    sizes = sorted(int(size) for size, pair in data["results"].items()
                   if "memory" in pair.get("cron_celery", {}) and "pages" in pair["cron_celery"])
    if not sizes:
        return []  # results from before these figures
    ours = {size: data["results"][str(size)]["cron_celery"] for size in sizes}
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
                "built", "after the burst", "per job"], [scheduler_row(size, ours[size]) for size in sizes],
               "lrrrrrrrrrrr"),
        "",
        "`manage.py sync_cron_schedules` with every job already in place, then the admin's pages as a",
        "logged-in superuser, the burst's N executions in the history and the tables analyzed (as autovacuum",
        "would have by then): median of five requests after a warm-up (SQL statements; rows they returned).",
        "",
        *table(["N", "`sync_cron_schedules`", *(name for _key, name in BEAT_PAGES)],
               [admin_row(size, ours[size]) for size in sizes], "l" + "r" * (1 + len(BEAT_PAGES))),
        "",
    ]
    if len(sizes) < 2:
        return lines
    small, large = sizes[-2], sizes[-1]
    return [*lines, *growth_lines(small, large, ours[small], ours[large])]


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
