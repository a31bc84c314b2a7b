"""The panels' queries as Grafana would send them: ``$__interval`` for the panel's width,
``$__rate_interval`` for the data source's scrape interval, the ``Job`` variable set to "All"."""

from __future__ import annotations

import math
import re
from typing import Any

from bench.dashboard.layout import panel_width
from bench.dashboard.machine import log
from bench.dashboard.prometheus import prom_get
from bench.dashboard.run import SCRAPE_SECONDS, Run

#: Grafana's interval rounding (rangeutil.roundInterval), in seconds: (below this, use that).
ROUNDING = ((0.015, 0.01), (0.035, 0.02), (0.075, 0.05), (0.15, 0.1), (0.35, 0.2), (0.75, 0.5), (1.5, 1),
            (3.5, 2), (7.5, 5), (12.5, 10), (17.5, 15), (25, 20), (45, 30), (90, 60), (210, 120), (450, 300),
            (750, 600), (1050, 900), (1500, 1200), (2700, 1800), (5400, 3600), (9000, 7200), (16200, 10800),
            (32400, 21600), (86400, 43200))


def grafana_interval(range_seconds: float, max_points: int) -> int:
    """$__interval: the range over the panel's width in pixels, rounded, at least the scrape interval."""
    raw = range_seconds / max(1, max_points)
    rounded = next((value for below, value in ROUNDING if raw < below), 86400)
    return max(SCRAPE_SECONDS, math.ceil(rounded))


def expression(expr: str, interval: int) -> str:
    """The dashboard's variables as Grafana substitutes them: Job = All (its allValue, ``.*``)."""
    rate_interval = max(interval + SCRAPE_SECONDS, 4 * SCRAPE_SECONDS)
    values = {"cron_job": ".*", "datasource": "prometheus", "__rate_interval": f"{rate_interval}s",
              "__interval": f"{interval}s"}

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, match.group(0))

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", substitute, expr)


def query_panels(prom: str, dashboard: dict[str, Any], run: Run, page_width: int) -> dict[str, Any]:
    """Every target of every panel: {panel id: {"interval": s, "targets": [{refId, expr, result}]}}."""
    results: dict[str, Any] = {}
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        interval = grafana_interval(run.end - run.start, panel_width(panel["gridPos"], page_width))
        step = interval
        start, end = math.floor(run.start / step) * step, math.floor(run.end / step) * step
        done = []
        for target in panel.get("targets", []):
            expr = expression(target["expr"], interval)
            if target.get("instant"):
                data = prom_get(prom, "/api/v1/query", {"query": expr, "time": f"{run.end:.3f}"})
            else:
                data = prom_get(prom, "/api/v1/query_range", {"query": expr, "start": str(start), "end": str(end),
                                                               "step": str(step)})
            done.append({"refId": target["refId"], "expr": expr, "result": data["result"]})
            log(f"panel {panel['id']} {panel['title']!r} {target['refId']}: {len(data['result'])} series  {expr}")
        results[str(panel["id"])] = {"interval": interval, "start": start, "end": end, "targets": done}
    return results
