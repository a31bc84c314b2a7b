"""Values as Grafana writes them: its decimals, its units' scales and suffixes, its threshold
colours and legends; and text escaped for the HTML page."""

from __future__ import annotations

import html
import math
import re
from typing import Any

from bench.dashboard.layout import NAMED_COLORS


def auto_decimals(value: float) -> int:
    """Grafana's getDecimalsForValue."""
    if value == 0 or not math.isfinite(value):
        return 0
    magnitude = math.floor(math.log10(abs(value)))
    decimals = -magnitude + 1
    if abs(value) / 10 ** -decimals > 2.25:
        decimals += 1
    if value % 1 == 0:
        decimals = 0
    return max(0, decimals)


def to_fixed(value: float, decimals: int | None = None) -> str:
    if not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("∞" if value > 0 else "-∞")
    places = auto_decimals(value) if decimals is None else decimals
    return f"{value:.{places}f}"


def scale(value: float, unit: str) -> tuple[float, str]:
    """The value in the unit's scale for its size, and the suffix (Grafana's value formats)."""
    size = abs(value)
    if unit == "s":
        if value == 0:
            return 0.0, " s"
        for limit, factor, suffix in ((1e-6, 1e9, " ns"), (1e-3, 1e6, " µs"), (1, 1e3, " ms"), (60, 1, " s"),
                                      (3600, 1 / 60, " min"), (86400, 1 / 3600, " hour"),
                                      (604800, 1 / 86400, " day"), (31536000, 1 / 604800, " week")):
            if size < limit:
                return value * factor, suffix
        return value / 3.15569e7, " year"
    if unit in ("short", "ops"):
        prefixes = ("", " K", " Mil", " Bil", " Tri") if unit == "short" else ("", "K", "M", "B", "T")
        step = 0
        while size >= 1000 and step < len(prefixes) - 1:
            size, value, step = size / 1000, value / 1000, step + 1
        return value, prefixes[step] + (" ops/s" if unit == "ops" else "")
    return value, ""


def fmt(value: float, unit: str, decimals: int | None = None) -> str:
    if not math.isfinite(value):
        return to_fixed(value)
    scaled, suffix = scale(value, unit)
    return to_fixed(scaled, decimals) + suffix


def threshold_color(value: float, field_config: dict[str, Any]) -> str:
    steps = field_config.get("thresholds", {}).get("steps") or [{"color": "green", "value": None}]
    color = str(steps[0]["color"])
    for step in steps:
        if step["value"] is None or value >= float(step["value"]):
            color = str(step["color"])
    return NAMED_COLORS.get(color, color)


def legend(template: str | None, metric: dict[str, str]) -> str:
    if template:
        return re.sub(r"\{\{\s*(.+?)\s*\}\}", lambda m: metric.get(m.group(1), ""), template)
    labels = ", ".join(f'{key}="{value}"' for key, value in sorted(metric.items()) if key != "__name__")
    return f"{metric.get('__name__', '')}{{{labels}}}" if labels or "__name__" not in metric else metric["__name__"]


def number(text: str) -> float:
    return float(text)  # Prometheus writes NaN, +Inf and -Inf as float() reads them


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)
