"""The HTML page: the dashboard's panels in its 24-column grid, under Grafana's top bar and
variables, styled like its dark theme (inline SVG, nothing fetched from elsewhere), and a caption
that says what the picture is and is not."""

from __future__ import annotations

import datetime as dt
from typing import Any

from bench.dashboard.formats import esc
from bench.dashboard.layout import (
    BG,
    BORDER,
    FONT,
    GRID_GAP,
    GRID_ROW,
    LINK,
    PAGE_PAD,
    PANEL_BG,
    PANEL_HEADER,
    TEXT,
    TEXT_DIM,
    column_width,
    panel_width,
)
from bench.dashboard.panels import draw_stat, draw_table, draw_timeseries
from bench.dashboard.run import RESTART_SECONDS, SCRAPE_SECONDS, Run

INFO_ICON = ('<svg class="info" width="14" height="14" viewBox="0 0 16 16"><circle cx="8" cy="8" r="6.5" fill="none" '
             f'stroke="{TEXT_DIM}" stroke-width="1.3"/><rect x="7.3" y="7" width="1.4" height="4.6" fill="{TEXT_DIM}"/>'
             f'<rect x="7.3" y="4.4" width="1.4" height="1.5" fill="{TEXT_DIM}"/></svg>')


def panel_body(panel: dict[str, Any], data: dict[str, Any], inner_w: int, inner_h: int) -> str:
    """What a panel shows under its title, drawn for its type."""
    if panel["type"] == "stat":
        return draw_stat(panel, data, inner_w, inner_h)
    if panel["type"] == "table":
        return draw_table(panel, data, inner_h)
    if panel["type"] == "timeseries":
        return draw_timeseries(panel, data, inner_w, inner_h)
    return f'<div class="nodata">Panel type {esc(panel["type"])} is not drawn</div>'


def draw_panel(panel: dict[str, Any], results: dict[str, Any], width: int) -> tuple[str, int]:
    """A panel (or a row's heading) placed at its grid position: its HTML, and its bottom edge."""
    pos = panel["gridPos"]
    left = PAGE_PAD + pos["x"] * (column_width(width) + GRID_GAP)
    top = pos["y"] * (GRID_ROW + GRID_GAP)
    w = panel_width(pos, width)
    h = pos["h"] * GRID_ROW + (pos["h"] - 1) * GRID_GAP
    box = f"left:{left:.1f}px;top:{top}px;width:{w}px;height:{h}px"
    if panel["type"] == "row":
        return (f'<div class="row" style="{box}"><span class="chevron">&#8964;</span>'
                f'{esc(panel["title"])}</div>'), top + h
    inner_w, inner_h = w - 16, h - PANEL_HEADER - 10
    body = panel_body(panel, results[str(panel["id"])], inner_w, inner_h)
    info = INFO_ICON if panel.get("description") else ""
    return (f'<div class="panel" style="{box}"><div class="title">{esc(panel["title"])}{info}</div>'
            f'<div class="content" style="height:{inner_h}px">{body}</div></div>'), top + h


def caption(run: Run) -> str:
    """The caption above the picture: not a Grafana screenshot, and what it is instead."""
    when = dt.datetime.fromtimestamp(run.end, dt.UTC)
    minutes = round((run.end - run.start) / 60, 1)
    return (
        f"<b>Not a Grafana screenshot.</b> Every panel of <code>deploy/grafana/cron_celery.json</code>, its own "
        f"PromQL run against a real Prometheus {esc(run.prometheus_version)} that scraped the example project's "
        f"<code>/cron/metrics/</code> every {SCRAPE_SECONDS} s for {minutes:g} minutes, drawn in the dashboard's "
        f"layout by <code>scripts/dashboard_picture</code> on {when:%Y-%m-%d} (Job = All; "
        f"<code>$__rate_interval</code> as Grafana computes it for a {SCRAPE_SECONDS} s scrape interval). The "
        f"project ran its sample jobs on one worker and two beats; two runs of sync-partner-api for earlier days "
        f"failed on purpose, the worker was stopped for {RESTART_SECONDS} s, and the alert webhook pointed at a "
        f"port nobody listens on."
    )


def style(width: int, bottom_edge: int) -> str:
    """The page's style sheet: Grafana's dark theme, for a page ``width`` pixels wide whose grid
    ends at ``bottom_edge``."""
    return f"""* {{ box-sizing: border-box; }}
body {{ margin: 0; width: {width}px; background: {BG}; color: {TEXT}; font: 14px/1.4 {FONT}; }}
code {{ font: 12.5px 'DejaVu Sans Mono', monospace; color: #e0e0ec; }}
.caption {{ margin: 0; padding: 10px {PAGE_PAD}px; background: #22252b; border-bottom: 1px solid {BORDER};
  color: {TEXT}; font-size: 13px; }}
.caption b {{ color: #ffb357; }}
.topbar {{ display: flex; align-items: center; height: 48px; padding: 0 {PAGE_PAD}px; background: {PANEL_BG};
  border-bottom: 1px solid {BORDER}; gap: 8px; }}
.crumbs {{ color: {TEXT_DIM}; }} .crumbs b {{ color: {TEXT}; font-weight: 500; }}
.spacer {{ flex: 1; }}
.button {{ border: 1px solid {BORDER}; border-radius: 2px; padding: 4px 10px; background: #22252b; font-size: 12.5px; }}
.vars {{ display: flex; gap: 8px; padding: 12px {PAGE_PAD}px 14px; }}
.var {{ display: flex; font-size: 12.5px; }}
.var .label {{ background: #22252b; border: 1px solid {BORDER}; padding: 5px 10px; color: {LINK}; font-weight: 500; }}
.var .value {{ border: 1px solid {BORDER}; border-left: 0; padding: 5px 10px; min-width: 90px; background: {BG}; }}
.grid {{ position: relative; height: {bottom_edge + PAGE_PAD}px; }}
.panel {{ position: absolute; background: {PANEL_BG}; border: 1px solid {BORDER}; border-radius: 2px;
  overflow: hidden; }}
.title {{ height: {PANEL_HEADER}px; line-height: {PANEL_HEADER}px; padding: 0 8px; font-weight: 500;
  white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }}
.info {{ vertical-align: -2px; margin-left: 6px; }}
.content {{ margin: 0 8px; position: relative; }}
.row {{ position: absolute; display: flex; align-items: center; font-size: 16px; font-weight: 500; }}
.chevron {{ color: {TEXT_DIM}; margin-right: 8px; font-size: 15px; position: relative; top: -4px; }}
.nodata {{ position: absolute; inset: 0; display: flex; align-items: center; justify-content: center;
  color: {TEXT_DIM}; }}
.stat {{ display: flex; height: 100%; }}
.stat-cell {{ flex: 1; display: flex; flex-direction: column; align-items: center; justify-content: center; }}
.stat-name {{ color: {TEXT}; }}
.stat-value {{ font-weight: 500; line-height: 1.1; }}
.stat-value .unit {{ font-size: 70%; }}
.legend {{ display: flex; flex-wrap: wrap; align-content: flex-start; column-gap: 16px; overflow: hidden;
  font-size: 12px; padding-left: 4px; }}
.legend .item {{ height: 20px; line-height: 20px; white-space: nowrap; }}
.legend i {{ display: inline-block; width: 14px; height: 4px; border-radius: 2px; margin-right: 6px;
  vertical-align: 3px; }}
.table {{ height: 100%; overflow: hidden; }}
.thumb {{ position: absolute; right: -4px; width: 6px; border-radius: 3px; background: rgba(204,204,220,0.3); }}
table {{ width: 100%; border-collapse: collapse; font-size: 14px; }}
th {{ position: sticky; top: 0; background: {PANEL_BG}; color: {LINK}; font-weight: 500; text-align: left;
  height: 36px; padding: 0 8px; border-bottom: 1px solid {BORDER}; }}
td {{ height: 36px; padding: 0 8px; border-bottom: 1px solid {BORDER}; }}
.num {{ text-align: right; }}"""


def page(dashboard: dict[str, Any], results: dict[str, Any], run: Run, width: int) -> str:
    """The whole page, ``width`` pixels wide: the caption, Grafana's top bar and variables, the panels."""
    panels = []
    bottom_edge = 0
    for panel in dashboard["panels"]:
        drawn, bottom = draw_panel(panel, results, width)
        panels.append(drawn)
        bottom_edge = max(bottom_edge, bottom)
    when = dt.datetime.fromtimestamp(run.end, dt.UTC)
    began = dt.datetime.fromtimestamp(run.start, dt.UTC)
    time_range = f"{began:%Y-%m-%d %H:%M:%S} to {when:%Y-%m-%d %H:%M:%S} UTC"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{esc(dashboard["title"])}: the dashboard's queries, drawn</title>
<style>
{style(width, bottom_edge)}
</style></head>
<body>
<p class="caption">{caption(run)}</p>
<div class="topbar"><span class="crumbs">Dashboards / <b>{esc(dashboard["title"])}</b></span>
<span class="spacer"></span><span class="button">{esc(time_range)}</span>
<span class="button">&#8635; {esc(dashboard.get("refresh", ""))}</span></div>
<div class="vars"><span class="var"><span class="label">Prometheus</span><span class="value">prometheus</span></span>
<span class="var"><span class="label">Job</span><span class="value">All</span></span></div>
<div class="grid">{"".join(panels)}</div>
</body></html>
"""
