"""Plain-text tables for the demo's commands."""

from __future__ import annotations

from collections.abc import Sequence


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Aligned columns, the first row a header underlined with dashes."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines
