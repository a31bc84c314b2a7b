"""What the page's sections share: the loaded results and how figures and tables are written."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

from bench.common import BenchError

#: The benchmarks of one run, in the order of the page; each is ``bench/<name>.py``.
NAMES = ("overhead", "locks", "beat_scale", "latency", "history", "memory")

#: Typographic marks, spelled as escapes so that the source stays plain ASCII around them.
DASH = "\u2013"  # an unknown figure
TIMES = "\u00d7"  # "3.1 x the floor"


class ResultError(BenchError):
    """A results directory lacks a benchmark, or a results file lacks a figure."""


@dataclasses.dataclass(frozen=True)
class Results:
    """One results directory: the manifest ``bench/run.py`` writes and each script's JSON."""

    manifest: dict[str, Any]
    data: dict[str, dict[str, Any]]

    def entry(self, name: str) -> dict[str, Any]:
        """How ``name`` was run: options, quick, start, seconds, load (from the manifest)."""
        entry: dict[str, Any] = self.manifest["benchmarks"][name]
        return entry

    def quick(self, name: str) -> bool:
        return bool(self.entry(name).get("quick"))


def need(data: dict[str, Any], source: str, *path: str) -> Any:
    """``data[path[0]][path[1]]...``, or a ResultError naming the file and the missing key."""
    value: Any = data
    for depth, key in enumerate(path):
        if not isinstance(value, dict) or key not in value:
            raise ResultError(f"{source} has no {'.'.join(path[: depth + 1])}: "
                              "it was written by an older script; run that benchmark again")
        value = value[key]
    return value


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """``ours / theirs``, or None when either is unknown or ``theirs`` is zero."""
    if ours is None or theirs is None or not theirs or math.isnan(ours) or math.isnan(theirs):
        return None
    return ours / theirs


def fmt_ratio(value: float | None, bold: bool = False) -> str:
    if value is None:
        return DASH
    if value >= 10:
        text = f"{value:.1f}"
    elif value >= 0.1:
        text = f"{value:.2f}"
    else:
        text = f"{value:.3f}"
    return f"**{text}**" if bold else text


def fmt_number(value: float | None, digits: int = 0) -> str:
    """Thousands separated: 1,234 or 1,234.5."""
    if value is None or math.isnan(value):
        return DASH
    return f"{value:,.{digits}f}"


def fmt_ms(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value:,.2f} ms" if value < 100 else f"{value:,.1f} ms"


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value:,.3f} s" if value < 10 else f"{value:,.1f} s"


def fmt_duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def fmt_load(loadavg: Sequence[float] | None) -> str:
    return f"{loadavg[0]:.2f}" if loadavg else "?"


def table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str = "") -> list[str]:
    """A Markdown table; ``align`` has one letter per column, ``l`` or ``r`` (default ``l``)."""
    marks = ["---:" if (align[i:i + 1] == "r") else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(marks) + "|"]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a row of {len(row)} cells in a table of {len(header)} columns")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def measured(results: Results, name: str, date: str) -> str:
    """The line under each section's results: when, how loaded, how long and with what options."""
    entry = results.entry(name)
    options = " ".join([entry.get("script", f"bench/{name}.py"), *entry.get("options", [])])
    quick = " — a **quick run**: smaller sizes, fewer repeats" if results.quick(name) else ""
    return (f"*Measured {date}, load average {fmt_load(entry.get('loadavg_start'))} at the start, "
            f"{fmt_duration(float(entry.get('seconds', 0)))}: `{options}`{quick}.*")
