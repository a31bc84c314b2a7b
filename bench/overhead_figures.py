"""What ``bench/overhead.py`` computes from its measurements, without touching anything: pg_test_fsync's
output read, the medians and ratios of a tracked run to its peers, the per-run gaps, and the lines the
script prints. Importing it changes nothing (``overhead.py`` sets its environment at import)."""

from __future__ import annotations

import re
import statistics
from typing import Any

#: The section of pg_test_fsync's output that a commit's WAL flush matches: one 8kB write, then the sync.
FSYNC_SECTION = "one 8kB write"
_FSYNC_HEADING = re.compile(r"^Compare file sync methods using (.+?):\s*$")
_FSYNC_LINE = re.compile(r"^\s+(\w+)\s+(?:([\d.]+) ops/sec\s+(\d+) usecs/op|n/a\S*)")


def parse_pg_test_fsync(text: str) -> dict[str, dict[str, float | None]]:
    """pg_test_fsync's "Compare file sync methods using one 8kB write" table: each method's µs per
    operation (computed from its operations per second; None where it says n/a)."""
    found: dict[str, float | None] = {}
    inside = False
    for line in text.splitlines():
        heading = _FSYNC_HEADING.match(line)
        if heading:
            inside = heading.group(1) == FSYNC_SECTION
            continue
        if not inside:
            continue
        if not line.strip():
            if found:
                break
            continue
        row = _FSYNC_LINE.match(line)
        if row:
            ops = float(row.group(2)) if row.group(2) else None
            found[row.group(1)] = 1e6 / ops if ops else None
    return {"usecs_per_op": found}


#: The ratios a tracked run is judged by, keyed: (iii), (iii*) or (v) over a peer, when both ran.
RATIO_PAIRS = {"bare": ("tracked", "bare"), "results": ("tracked", "results"), "once": ("tracked", "once"),
               "results-commit-off": ("tracked-commit-off", "results-commit-off"),
               "plain-bare": ("plain-tracked", "bare"), "plain-results": ("plain-tracked", "results")}


def summarise(rates: dict[str, list[float]], concurrency: int) -> dict[str, Any]:
    """Medians, the ratios of a tracked run to its peers (of the medians, and per repeat, keyed by
    the peer), and the per-run gaps between (iii) and (ii) in µs: how much longer a tracked run
    holds its pool process than a django-celery-results task, ``concurrency / rate`` each (every
    pool process is busy all along), durable and with synchronous_commit off."""
    medians = {key: statistics.median(values) for key, values in rates.items() if values}
    ratios: dict[str, float] = {}
    per_repeat: dict[str, list[float]] = {}
    for key, (ours, peer) in RATIO_PAIRS.items():
        if medians.get(ours) and medians.get(peer):
            ratios[key] = medians[ours] / medians[peer]
            per_repeat[key] = [a / b for a, b in zip(rates[ours], rates[peer], strict=False)]

    def gap(ours: str, peer: str) -> float | None:
        if not (medians.get(ours) and medians.get(peer)):
            return None
        return concurrency * (1 / medians[ours] - 1 / medians[peer]) * 1e6

    gaps = {"durable": gap("tracked", "results"), "commit_off": gap("tracked-commit-off", "results-commit-off")}
    return {"medians": medians, "ratios": ratios, "per_repeat": per_repeat, "gap_us": gaps}


def summary_lines(summary: dict[str, Any], fsync: dict[str, Any] | None) -> list[str]:
    """The ratios, ratios first, then the gaps against one fsync, as the script prints them."""
    names = {"bare": "(iii)/(i)  ", "results": "(iii)/(ii) ", "once": "(iii)/(iv) ",
             "results-commit-off": "(iii*)/(ii*)", "plain-bare": "(v)/(i)    ", "plain-results": "(v)/(ii)   "}
    lines = []
    for peer, name in names.items():
        if peer in summary["ratios"]:
            each = ", ".join(f"{r:.2f}" for r in summary["per_repeat"][peer])
            lines.append(f"{name} = {summary['ratios'][peer]:.2f}   (each repeat: {each})")
    gaps = summary["gap_us"]
    if gaps["durable"] is not None:
        line = f"a tracked run holds its pool process {gaps['durable']:+.0f} µs more than (ii)'s task"
        if gaps["commit_off"] is not None:
            line += f"; {gaps['commit_off']:+.0f} µs with synchronous_commit off"
        lines.append(line)
    if fsync and fsync.get("measured"):
        lines.append(f"one WAL flush here ({fsync['method']}, pg_test_fsync): {fsync['usecs']:.0f} µs")
    elif fsync:
        lines.append(f"one WAL flush here: not measured ({fsync.get('why', '?')})")
    return lines
