"""The locks section: cron_celery's JobLock beside pottery's Redlock, on one and three Redis masters."""

from __future__ import annotations

from typing import Any

from bench.figures import (
    TIMES,
    Results,
    fmt_number,
    fmt_ratio,
    measured,
    need,
    table,
)

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


def locks_rows(variants: dict[str, Any], summary: dict[str, Any], ratios: dict[str, float]) -> list[list[str]]:
    """The results table's rows: each variant's medians, its ratio to the floor, and cron_celery's
    to pottery's (in bold)."""
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
    return rows


def locks_section(results: Results) -> list[str]:
    data = results.data["locks"]
    settings = need(data, "locks.json", "settings")
    variants = need(data, "locks.json", "variants")
    summary = need(data, "locks.json", "summary")
    ratios = lock_ratios(data)
    per_repeat = lock_ratios_per_repeat(data)
    rows = locks_rows(variants, summary, ratios)
    met = all(ratios[key] <= LOCK_TARGET for key in LOCK_PAIRS)
    repeat = int(settings["repeat"])
    return [
        *locks_method(),
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
        *locks_explained(),
    ]


def locks_method() -> list[str]:
    """The section's opening: what one iteration of each variant does, and how it is timed."""
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
    ]


def locks_explained() -> list[str]:
    """The section's close: what the floor stands for, and where pottery spends its time."""
    return [
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
