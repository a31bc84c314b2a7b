"""The figures of ``bench/latency.py``: one sample per slot, the delays and percentiles drawn from
the samples, the minutes that finished in time, the workers' throughput, the beat's dispatch
rounds and the printed table.

Plain arithmetic on epoch seconds: nothing here starts a process, reads Redis or touches the
database, so the script's tests call it directly.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

CRON = "cron_celery"
DBS = "dbs"
SIDES = (CRON, DBS)
LABELS = {CRON: "cron_celery", DBS: "DatabaseScheduler"}
#: The steps measured, in the table's order: (key, words); the last differs by scheduler.
STEPS = (("recorded", "slot → recorded (row)"), ("handed", "slot → handed to kombu"), ("published", "slot → published"),
         ("started", "slot → body start"), ("ended", "slot → final write"))
#: Steps only cron_celery has: its row, and a publish pipeline apart from the send.
OPTIONAL_STEPS = ("recorded", "handed")
END_WORDS = {CRON: "slot → final write", DBS: "slot → body end"}
ROUND_RE = re.compile(r"dispatched (\d+) slot\(s\) of (\d+) job\(s\) in (\d+) ms")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sample:
    """One slot of one job (epoch seconds); None: that did not happen (or was not seen)."""

    slot: float
    recorded: float | None = None
    handed: float | None = None
    published: float | None = None
    started: float | None = None
    ended: float | None = None


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile (``share`` in 0..1] of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(share * len(ordered))) - 1]


def spread(values: list[float]) -> dict[str, float | int | None]:
    """Count, p50, p95, p99 and max of ``values`` (None for an empty list)."""
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
    return {"n": len(values), "p50": percentile(values, 0.50), "p95": percentile(values, 0.95),
            "p99": percentile(values, 0.99), "max": max(values)}


def delays(samples: Iterable[Sample], step: str) -> list[float]:
    """Seconds from each slot to ``step`` (a ``Sample`` field), where it happened."""
    return [moment - sample.slot for sample in samples if (moment := getattr(sample, step)) is not None]


def done_in_minute(samples: Iterable[Sample], expected: Mapping[float, int]) -> list[dict[str, Any]]:
    """Per minute of the window (``expected``: its slots by the minute's start): how many of its
    slots had their final write before the next minute began."""
    done: Counter[float] = Counter()
    for sample in samples:
        minute = math.floor(sample.slot / 60) * 60.0
        if minute in expected and sample.ended is not None and sample.ended < minute + 60:
            done[minute] += 1
    return [{"minute": utc(minute).strftime("%H:%M"), "expected": count, "done": done[minute]}
            for minute, count in sorted(expected.items())]


def throughput(ends: Iterable[float], window: int = 5) -> dict[str, float | int]:
    """Final writes per second over the seconds in which at least one landed (``busy_s``), and
    the best ``window`` consecutive seconds."""
    per_second = Counter(math.floor(moment) for moment in ends)
    if not per_second:
        return {"completions": 0, "busy_s": 0, "per_s": 0.0, "peak_per_s": 0.0}
    total = sum(per_second.values())
    first, last = min(per_second), max(per_second)
    best = max(sum(per_second.get(second + k, 0) for k in range(window)) for second in range(first, last + 1))
    return {"completions": total, "busy_s": len(per_second), "per_s": total / len(per_second),
            "peak_per_s": best / window}


def summarize(samples: list[Sample], expected: Mapping[float, int]) -> dict[str, Any]:
    """The figures of one scheduler at one size, from the window's samples."""
    return {
        "expected": sum(expected.values()),
        "seen": len(samples),
        "delays": {step: spread(delays(samples, step)) for step, _words in STEPS},
        "per_minute": done_in_minute(samples, expected),
        "throughput": throughput(sample.ended for sample in samples if sample.ended is not None),
    }


def dispatch_rounds(log_text: str) -> dict[str, Any]:
    """The cron_celery beat's dispatch rounds, from its log lines: count, largest, time per round."""
    rounds = [(int(slots), int(ms)) for slots, _jobs, ms in ROUND_RE.findall(log_text)]
    if not rounds:
        return {"rounds": 0}
    times = [float(ms) for _slots, ms in rounds]
    return {"rounds": len(rounds), "largest": max(slots for slots, _ms in rounds),
            "ms_p50": percentile(times, 0.5), "ms_max": max(times),
            "slots_per_s": sum(slots for slots, _ms in rounds) / (sum(times) / 1000) if sum(times) else None}


def seconds(value: float | int | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if abs(value) < 1 else f"{value:.2f} s"


def render(results: Mapping[str, Mapping[str, Mapping[str, Any]]], settings: Mapping[str, Any]) -> list[str]:
    """The printed table: per N, per scheduler, each step's percentiles, the minutes, the workers."""
    lines: list[str] = []
    head = f"  {'':<18} {'':<24} {'count':>13} {'p50':>9} {'p95':>9} {'p99':>9} {'max':>9}"
    for size, by_side in results.items():
        first = next(iter(by_side.values()))
        lines.append(f"N = {int(size):,} ({settings['mix']}), {settings['minutes']} minute(s) from "
                     f"{first['window'][0][11:16]} UTC, {first['expected']:,} slots; "
                     f"{settings['workers']} worker(s) x {settings['concurrency']}")
        lines.append(head)
        for side, result in by_side.items():
            label = LABELS.get(side, side)
            for step, step_words in STEPS:
                figures = result["delays"][step]
                if step in OPTIONAL_STEPS and not figures["n"]:
                    continue
                words = END_WORDS.get(side, step_words) if step == "ended" else step_words
                count = f"{figures['n']:,}/{result['expected']:,}"
                lines.append(f"  {label:<18} {words:<24} {count:>13} {seconds(figures['p50']):>9} "
                             f"{seconds(figures['p95']):>9} {seconds(figures['p99']):>9} "
                             f"{seconds(figures['max']):>9}")
                label = ""
            minutes = ", ".join(f"{m['minute']} {m['done']:,}/{m['expected']:,}" for m in result["per_minute"])
            lines.append(f"  {'':<18} done before the next minute: {minutes}")
            flow = result["throughput"]
            lines.append(f"  {'':<18} workers: {flow['completions']:,} final writes, {flow['per_s']:.1f}/s over "
                         f"{flow['busy_s']} busy s, best 5 s {flow['peak_per_s']:.1f}/s")
            rounds = result.get("dispatch")
            if rounds and rounds.get("rounds"):
                lines.append(f"  {'':<18} beat: {rounds['rounds']} dispatch round(s), largest {rounds['largest']:,} "
                             f"slots, {rounds['ms_p50']:.0f} ms median, {rounds['ms_max']:.0f} ms max")
            if not result.get("drained", True):
                lines.append(f"  {'':<18} (stopped by --drain-cap before every window slot had ended)")
        lines.append("")
    return lines


def utc(moment: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(moment, tz=dt.UTC)


def next_boundary(after: float) -> float:
    """The first whole minute strictly after ``after``."""
    return (math.floor(after / 60) + 1) * 60.0
