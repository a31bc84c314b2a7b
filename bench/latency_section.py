"""The page's section on ``bench/latency.py``: how late a slot is published, starts and ends, with
real beats and busy workers, cron_celery beside django-celery-beat's DatabaseScheduler."""

from __future__ import annotations

from typing import Any

from bench.figures import DASH, TIMES, ResultError, Results, fmt_number, fmt_ratio, measured, need, ratio, table

CRON, DBS = "cron_celery", "dbs"
#: Slot to published, p99, at most this many seconds at this many jobs (issue's targets for 2 cores).
PUBLISH_TARGETS = {1_000: 1.0, 10_000: 5.0}


def seconds(value: float | None) -> str:
    """A delay: milliseconds below a second, else seconds."""
    if value is None:
        return DASH
    return f"{value * 1000:,.0f} ms" if abs(value) < 1 else f"{value:,.2f} s"


def step(result: dict[str, Any], name: str, figure: str) -> float | None:
    value = result["delays"][name][figure]
    return None if value is None else float(value)


def in_minute(result: dict[str, Any]) -> str:
    """Slots whose final write landed before the next minute began, over the window's slots."""
    minutes = result["per_minute"]
    done = sum(int(minute["done"]) for minute in minutes)
    expected = sum(int(minute["expected"]) for minute in minutes)
    return f"{done:,} / {expected:,}" if expected else DASH


def side_row(size: int, side: str, result: dict[str, Any]) -> list[str]:
    label = "cron_celery" if side == CRON else "DatabaseScheduler"
    published = result["delays"]["published"]
    return [
        f"{size:,}" if side == CRON else "", label,
        f"{published['n']:,} / {result['expected']:,}",
        seconds(step(result, "published", "p50")), seconds(step(result, "published", "p99")),
        seconds(step(result, "published", "max")),
        seconds(step(result, "started", "p50")), seconds(step(result, "started", "p99")),
        seconds(step(result, "ended", "p99")), in_minute(result),
        fmt_number(result["throughput"]["per_s"], 0),
    ]


def ratio_row(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    def of(name: str, figure: str) -> str:
        return fmt_ratio(ratio(step(ours, name, figure), step(theirs, name, figure)), bold=figure == "p99")

    return ["", "**cron_celery ÷ DBS**", "", of("published", "p50"), of("published", "p99"), of("published", "max"),
            of("started", "p50"), of("started", "p99"), of("ended", "p99"), "", ""]


def targets(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for size, limit in PUBLISH_TARGETS.items():
        ours = results.get(str(size), {}).get(CRON)
        if ours is None:
            lines.append(f"- {size:,} jobs: slot → published p99 at most {limit:g} s — not measured in this run.")
            continue
        p99 = step(ours, "published", "p99")
        complete = ours["delays"]["published"]["n"] >= ours["expected"]
        met = p99 is not None and p99 <= limit and complete
        lines.append(f"- {size:,} jobs: slot → published p99 {seconds(p99)} (target at most {limit:g} s: "
                     f"{'met' if met else '**not met**'}).")
    return lines


def capacity(size: int, result: dict[str, Any], workers: int, concurrency: int) -> str:
    """Whether the workers kept up with a minute's slots: what bounds slot → final write."""
    flow = result["throughput"]
    busy, rate = int(flow["busy_s"]), float(flow["per_s"])
    if not busy:
        return f"- {size:,} jobs: no final write was seen."
    head = (f"- {size:,} jobs: the final writes of {workers} {TIMES} {concurrency} pool processes landed over "
            f"{busy:,} s, {rate:,.0f}/s (best 5 s: {float(flow['peak_per_s']):,.0f}/s)")
    if busy >= 50:
        return (f"{head}: a minute's {size:,} slots are about {size / rate:,.0f} s of work for them, so their "
                "capacity, not the beat, sets slot → final write.")
    return f"{head}: they kept up, and finished the minute's slots well within it."


def steps_rows(results: dict[str, dict[str, Any]]) -> list[list[str]]:
    rows = []
    for size in sorted(results, key=int):
        ours = results[size].get(CRON)
        if ours is None:
            continue
        dispatch = ours.get("dispatch") or {}
        rounds = (f"{dispatch['rounds']} of up to {dispatch['largest']:,} slots, {dispatch['ms_p50']:,.0f} ms "
                  f"median, {dispatch['ms_max']:,.0f} ms max" if dispatch.get("rounds") else DASH)
        rows.append([f"{int(size):,}", *(seconds(step(ours, name, "p50")) + " / " + seconds(step(ours, name, "p99"))
                                         for name in ("recorded", "handed", "published")), rounds])
    return rows


def latency_section(results: Results) -> list[str]:
    data = results.data["latency"]
    settings = need(data, "latency.json", "settings")
    by_size = need(data, "latency.json", "results")
    rows: list[list[str]] = []
    for size in sorted(by_size, key=int):
        pair = by_size[size]
        if CRON not in pair:
            raise ResultError(f"latency.json has N = {size} without cron_celery")
        rows.append(side_row(int(size), CRON, pair[CRON]))
        if DBS in pair:
            rows.append(side_row(int(size), DBS, pair[DBS]))
            rows.append(ratio_row(pair[CRON], pair[DBS]))
    workers, concurrency = int(settings["workers"]), int(settings["concurrency"])
    minutes = int(settings["minutes"])
    return [
        "## Slot to start under load",
        "",
        "`bench/latency.py` measures what a user feels: how long after its slot a job is published,",
        "starts and ends, with real processes on this machine. For each N, one scheduler after the other:",
        "",
        *table(["scheduler", "what runs"], [
            ["cron_celery", "two `celery beat -S cron_celery.beat.Scheduler` (a leader and its standby) with "
             "three lock masters of their own (`redis-server`); N jobs every minute, each recording an "
             "execution row and taking its job lock"],
            ["DatabaseScheduler (DBS)", "one `celery beat` with django-celery-beat's scheduler (it has no "
             "leader election, so a second would send every task twice) and N periodic tasks of a plain "
             "task that notes when it began and ended"],
        ]),
        "",
        f"Both send to the same {workers} prefork workers ({concurrency} processes each) on a queue of the "
        f"run's own, for {minutes} whole minute{'s' if minutes != 1 else ''} from a minute boundary. "
        "Every delay is measured from the slot's instant: *published* when the Redis pipeline carrying "
        "the message was executed (DBS: when its publish returned), *start* from the body's first line, "
        "*end* the execution row's `ended` (DBS: the body's last line). The beats, workers, PostgreSQL "
        "and Redis share the machine's CPUs: at large N the workers' pool processes compete with the beat.",
        "",
        "### Results",
        "",
        *table(["N", "scheduler", "published", "→ published p50", "p99", "max", "→ start p50", "p99",
                "→ end p99", "ended within the minute", "runs/s"], rows, "llrrrrrrrrr"),
        "",
        "Below 1 in the ratio rows means cron_celery was sooner. *published* counts the window's slots",
        "that reached the broker before the run stopped waiting. Between *published* and *start*, a",
        "cron_celery run is taken by a worker, takes its job lock (three masters) and commits its claim",
        "before its first line; a plain task starts at once. That step is the tracked run's cost, measured",
        "alone in [the cost of tracking a run](#the-cost-of-tracking-a-run).",
        "",
        "Against the targets for this 2-core machine:",
        "",
        *targets(by_size),
        "",
        "What bounds the rest is the workers' throughput:",
        "",
        *(capacity(int(size), by_size[size][CRON], workers, concurrency) for size in sorted(by_size, key=int)),
        "",
        measured(results, "latency", settings["date"]),
        "",
        "### Where cron_celery's publish time goes",
        "",
        "Each slot is first recorded (its execution row, inserted with the round's others in one",
        "statement), then its message is built and handed to kombu's publish batch, then the batch",
        "reaches Redis in one pipeline. p50 / p99 of each, after the slot, and the beat's dispatch",
        "rounds (`BEAT_BATCH` slots at most each):",
        "",
        *table(["N", "→ recorded", "→ handed to kombu", "→ published", "dispatch rounds"], steps_rows(by_size),
               "lrrrl"),
        "",
        *cost_lines(settings.get("publish_cost")),
    ]


def cost_lines(cost: dict[str, Any] | None) -> list[str]:
    """What building and sending one message of a round costs the beat, against ``send_task``."""
    if not cost:
        return []
    return [
        "The beat builds each message with Celery's own `create_task_message` and sends it with",
        "`send_task_message` (`cron_celery/beat/publishing.py`): the same message, signals and events as",
        "`app.send_task`, but each task routed, Celery's settings read and each queue declared once per",
        "round instead of once per message. Measured in the same run, a round of "
        f"{int(cost['messages']):,} messages of as many tasks into kombu's batch (median of {cost['repeats']}):",
        "",
        *table(["way", "per message", "ratio"], [
            ["`app.send_task` per message", f"{float(cost['send_task_us']):,.0f} µs", "1"],
            ["`RoundSender` (the beat)", f"{float(cost['round_us']):,.0f} µs", fmt_ratio(float(cost["ratio"]),
                                                                                   bold=True)],
        ], "lrr"),
        "",
    ]
