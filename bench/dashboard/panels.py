"""The panels, drawn as Grafana draws them: a stat (a big coloured number per series), a table
(the queries' frames joined by a field), and a time series (an SVG graph over its legend)."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

from bench.dashboard.formats import esc, fmt, legend, number, scale, threshold_color, to_fixed
from bench.dashboard.layout import FONT, GRID_LINE, PALETTE, TEXT_DIM, text_width

NO_DATA = '<div class="nodata">No data</div>'


def draw_stat(panel: dict[str, Any], data: dict[str, Any], width: int, height: int) -> str:
    config = panel.get("fieldConfig", {}).get("defaults", {})
    unit = config.get("unit", "")
    values: list[tuple[str, float]] = []
    for target, result in zip(panel["targets"], data["targets"], strict=True):
        for series in result["result"]:
            values.append((legend(target.get("legendFormat"), series["metric"]), number(series["value"][1])))
    if not values:
        return NO_DATA
    values.sort(key=lambda item: item[0])
    each = width / len(values)
    titled = len(values) > 1
    cells = []
    for name, value in values:
        scaled, suffix = scale(value, unit) if math.isfinite(value) else (value, "")
        number_text = to_fixed(scaled)
        text = number_text + suffix
        room_h = height - (22 if titled else 0)
        size = max(14, min(room_h * 0.62, (each - 16) / max(1, len(text)) * 1.75))
        title = (f'<div class="stat-name" style="font-size:{min(16, size / 2.6):.0f}px">{esc(name)}</div>'
                 if titled else "")
        cells.append(f'<div class="stat-cell">{title}<div class="stat-value" style="font-size:{size:.0f}px;'
                     f'color:{threshold_color(value, config)}">{esc(number_text)}'
                     f'<span class="unit">{esc(suffix)}</span></div></div>')
    return f'<div class="stat">{"".join(cells)}</div>'


def draw_table(panel: dict[str, Any], data: dict[str, Any], height: int) -> str:
    """The targets as Grafana's table frames (Time, the labels, "Value #<refId>"), joined by field and
    organized by the panel's transformations."""
    frames: list[tuple[list[str], list[dict[str, Any]]]] = []
    # Grafana names a frame's value "Value #<refId>" only when more than one query answered.
    several = sum(1 for result in data["targets"] if result["result"]) > 1
    for result in data["targets"]:
        value_name = f"Value #{result['refId']}" if several else "Value"
        labels = sorted({key for series in result["result"] for key in series["metric"] if key != "__name__"})
        rows = [{"Time": series["value"][0], **series["metric"], value_name: number(series["value"][1])}
                for series in result["result"]]
        frames.append((["Time", *labels, value_name], rows))
    by_field, excluded, renamed = "", {}, {}
    for transformation in panel.get("transformations", []):
        if transformation["id"] == "joinByField":
            by_field = transformation["options"]["byField"]
        elif transformation["id"] == "organize":
            excluded = transformation["options"].get("excludeByName", {})
            renamed = transformation["options"].get("renameByName", {})
    columns: list[str] = []
    joined: dict[str, dict[str, Any]] = {}
    times = 0
    for names, rows in frames:
        for named in names:
            name = named
            if named == "Time":
                times += 1
                name = f"Time {times}"
            if name not in columns:
                columns.append(name)
        for row in rows:
            key = str(row.get(by_field, ""))
            joined.setdefault(key, {by_field: key}).update({k: v for k, v in row.items() if k != "Time"})
    if not joined:
        return NO_DATA
    columns.sort(key=lambda name: 0 if name == by_field else 1)
    shown = [name for name in columns if not excluded.get(name) and not name.startswith("Time")]
    head = "".join(f"<th class=\"{'num' if name != by_field else ''}\">{esc(renamed.get(name, name))}</th>"
                   for name in shown)
    body = []
    for key in sorted(joined):
        cells = []
        for name in shown:
            value = joined[key].get(name)
            if isinstance(value, float):
                cells.append(f'<td class="num">{esc(to_fixed(value))}</td>')
            else:
                cells.append(f"<td>{esc('' if value is None else value)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    # The rows that do not fit scroll, under a header that stays: show the scrollbar's thumb, as Grafana does.
    visible, total = height - 36, 36 * len(body)
    thumb = (f'<div class="thumb" style="top:36px;height:{visible * visible / total:.0f}px"></div>'
             if total > visible else "")
    return (f'<div class="table"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'
            + thumb)


def nice_step(raw: float) -> float:
    magnitude = 10.0 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * magnitude >= raw)


def step_decimals(step: float) -> int:
    return next((d for d in range(8) if abs(round(step * 10**d) - step * 10**d) < 1e-6), 8)



#: A time series' points: (Unix time, value), the value NaN or infinite where Prometheus says so.
Points = list[tuple[float, float]]


@dataclass(frozen=True)
class Plot:
    """A graph's drawing area in the SVG's pixels, and the time and value ranges it spans."""

    left: float
    right: float
    top: float
    bottom: float
    start: float
    end: float
    low: float
    high: float

    def x_at(self, t: float) -> float:
        return self.left + (t - self.start) / (self.end - self.start) * (self.right - self.left)

    def y_at(self, v: float) -> float:
        return self.bottom - (v - self.low) / (self.high - self.low) * (self.bottom - self.top)


def timeseries(panel: dict[str, Any], data: dict[str, Any]) -> list[tuple[str, Points]]:
    """Every series the panel's targets answered, with its legend."""
    series: list[tuple[str, Points]] = []
    for target, result in zip(panel["targets"], data["targets"], strict=True):
        for found in result["result"]:
            points = [(float(t), number(v)) for t, v in found["values"]]
            series.append((legend(target.get("legendFormat"), found["metric"]), points))
    return series


def legend_list(series: list[tuple[str, Points]], width: int) -> tuple[str, int]:
    """The legend (a list under the graph), wrapped at the panel's width: its items and its height."""
    lines, used = 1, 0.0
    items = []
    for index, (name, _) in enumerate(series):
        item = 20 + text_width(name) + 16
        if used and used + item > width:
            lines, used = lines + 1, 0.0
        used += item
        items.append(f'<span class="item"><i style="background:{PALETTE[index % len(PALETTE)]}"></i>{esc(name)}</span>')
    return "".join(items), lines * 20 + 6


def y_ticks(finite: list[float], plot_h: int, unit: str) -> tuple[float, float, list[float], list[str]]:
    """The value axis: its range (from zero or below, up to the highest value rounded up to a whole
    step), its ticks (a nice step apart) and their labels."""
    low, high = min(0.0, *finite), max(finite)
    if high <= low:
        high = low + 1
    y_step = nice_step((high - low) / max(2, plot_h // 45))
    high = math.ceil(high / y_step - 1e-9) * y_step
    ticks = [low + i * y_step for i in range(round((high - low) / y_step) + 1)]
    scaled_step = scale(ticks[-1] or 1, unit)[0] / (ticks[-1] or 1) * y_step
    labels = [fmt(tick, unit, step_decimals(scaled_step)) if tick else fmt(0, unit, 0) for tick in ticks]
    return low, high, ticks, labels


def y_axis(plot: Plot, ticks: list[float], labels: list[str]) -> list[str]:
    """A grid line and a label for each value tick."""
    out = []
    for tick, label in zip(ticks, labels, strict=True):
        y = plot.y_at(tick)
        out.append(f'<line x1="{plot.left}" x2="{plot.right}" y1="{y:.1f}" y2="{y:.1f}" stroke="{GRID_LINE}"/>')
        out.append(f'<text x="{plot.left - 8}" y="{y + 4:.1f}" text-anchor="end" fill="{TEXT_DIM}">{esc(label)}</text>')
    return out


def x_axis(plot: Plot, width: int) -> list[str]:
    """A grid line for each time tick (at least 90 px apart), labelled where the label fits."""
    out = []
    start, end, left, top, bottom = plot.start, plot.end, plot.left, plot.top, plot.bottom
    x_step = next((s for s in (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200)
                   if (plot.right - left) * s / (end - start) >= 90), 21600)
    tick = math.ceil(start / x_step) * x_step
    while tick <= end:
        x = plot.x_at(tick)
        stamp = dt.datetime.fromtimestamp(tick, dt.UTC).strftime("%H:%M:%S" if x_step < 60 else "%H:%M")
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{bottom}" stroke="{GRID_LINE}"/>')
        if left + 4 <= x - text_width(stamp) / 2 and x + text_width(stamp) / 2 <= width:
            out.append(f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle" fill="{TEXT_DIM}">{stamp}</text>')
        tick += x_step
    return out


def stretches(points: Points, step: float) -> list[Points]:
    """The series' finite points, cut where a value is missing or not finite."""
    runs: list[Points] = []
    previous = None
    for t, v in points:
        if not math.isfinite(v):
            previous = None
            continue
        if previous is None or t - previous > step * 1.5:
            runs.append([])
        runs[-1].append((t, v))
        previous = t
    return runs


def series_lines(plot: Plot, series: list[tuple[str, Points]], step: float) -> list[str]:
    """Each series in its palette colour: a line through each stretch, a dot for a lone point."""
    out = []
    for index, (_, points) in enumerate(series):
        color = PALETTE[index % len(PALETTE)]
        for run in stretches(points, step):
            if len(run) == 1:
                t, v = run[0]
                out.append(f'<circle cx="{plot.x_at(t):.1f}" cy="{plot.y_at(v):.1f}" r="2.5" fill="{color}"/>')
            else:
                path = " ".join(f"{plot.x_at(t):.1f},{plot.y_at(v):.1f}" for t, v in run)
                out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5" '
                           f'stroke-linejoin="round"/>')
    return out


def draw_timeseries(panel: dict[str, Any], data: dict[str, Any], width: int, height: int) -> str:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
    series = timeseries(panel, data)
    finite = [v for _, points in series for _, v in points if math.isfinite(v)]
    if not finite:
        return NO_DATA
    items, legend_h = legend_list(series, width)
    plot_h = height - legend_h
    low, high, ticks, labels = y_ticks(finite, plot_h, unit)
    axis_w = max(text_width(label) for label in labels) + 14
    plot = Plot(left=axis_w, right=width - 8, top=6, bottom=plot_h - 22, start=float(data["start"]),
                end=float(data["end"]), low=low, high=high)
    out = [f'<svg width="{width}" height="{plot_h}" xmlns="http://www.w3.org/2000/svg" '
           f'font-family="{esc(FONT)}" font-size="12">']
    out += y_axis(plot, ticks, labels)
    out += x_axis(plot, width)
    out += series_lines(plot, series, float(data["interval"]))
    out.append("</svg>")
    return "".join(out) + f'<div class="legend" style="height:{legend_h}px">{items}</div>'
