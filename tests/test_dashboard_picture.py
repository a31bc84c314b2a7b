"""scripts/dashboard_picture draws the dashboard's panels from Prometheus's answers (the picture
in docs/operations.md). Its drawing is pure: fed answers of Prometheus's shape for every panel,
the page shows each panel with its data, says "No data" where an answer is empty, names the
table's columns as the dashboard renames them, and says that it is not a Grafana screenshot."""

from __future__ import annotations

import html
import importlib.machinery
import importlib.util
import json
import re
import sys
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "dashboard_picture"
DASHBOARD = json.loads((ROOT / "deploy" / "grafana" / "cron_celery.json").read_text())
START, END = 1_764_750_000.0, 1_764_750_240.0


@pytest.fixture(scope="module")
def picture() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("dashboard_picture", str(SCRIPT))
    spec = importlib.util.spec_from_loader("dashboard_picture", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["dashboard_picture"] = module  # its dataclasses look themselves up there
    try:
        loader.exec_module(module)
    finally:
        del sys.modules["dashboard_picture"]
    return module


def answers(empty: set[int]) -> dict[str, Any]:
    """Prometheus-shaped answers to every target: two jobs, a few points; none for ``empty``."""
    results: dict[str, Any] = {}
    for panel in DASHBOARD["panels"]:
        if panel["type"] == "row":
            continue
        targets = []
        for n, target in enumerate(panel["targets"]):
            series: list[dict[str, Any]] = []
            grouped = re.search(r"\bby \(([^)]*)\)", target["expr"])
            labels = [name.strip() for name in grouped[1].split(",") if name.strip() != "le"] if grouped else []
            if panel["id"] not in empty:
                jobs = (("calc-commission", 1.0 + n), ("nightly-report", 3.0 + n))
                for job, value in jobs if labels else jobs[:1]:
                    values = {"cron_job": job, "status": "FAILED", "channel": "webhook"}
                    metric = {name: values[name] for name in labels}
                    if target.get("instant"):
                        series.append({"metric": metric, "value": [END, str(value)]})
                    else:
                        series.append({"metric": metric,
                                       "values": [[START + 15 * i, str(value * i)] for i in range(17)]})
            targets.append({"refId": target["refId"], "expr": target["expr"], "result": series})
        results[str(panel["id"])] = {"interval": 15, "start": START, "end": END, "targets": targets}
    return results


def panel_html(page: str, title: str) -> str:
    start = page.index(f">{html.escape(title)}<")
    following = [page.find(f">{html.escape(other['title'])}<", start + 1) for other in DASHBOARD["panels"]]
    end = min([found for found in following if found > start] or [len(page)])
    return page[start:end]


def test_every_panel_is_drawn_with_its_data_and_an_empty_one_says_no_data(picture: ModuleType):
    lost = next(panel for panel in DASHBOARD["panels"] if panel["title"] == "Executions lost")
    page = picture.page(DASHBOARD, answers({lost["id"]}), picture.Run(start=START, end=END), 1600)
    assert "Not a Grafana screenshot." in page
    for panel in DASHBOARD["panels"]:
        assert f">{html.escape(panel['title'])}<" in page, panel["title"]
        drawn = panel_html(page, panel["title"])
        if panel["type"] == "timeseries":
            assert ("No data" in drawn) == (panel is lost), panel["title"]
            if panel is not lost:
                assert "<polyline" in drawn, panel["title"]
                if "cron_job" in panel["targets"][0].get("legendFormat", ""):
                    assert "calc-commission" in drawn and "nightly-report" in drawn, panel["title"]
        elif panel["type"] == "stat":
            assert "No data" not in drawn and re.search(r'class="stat-value"', drawn), panel["title"]


def test_the_job_table_has_the_dashboards_column_names_and_a_row_per_job(picture: ModuleType):
    table = next(panel for panel in DASHBOARD["panels"] if panel["type"] == "table")
    page = picture.page(DASHBOARD, answers(set()), picture.Run(start=START, end=END), 1600)
    drawn = panel_html(page, table["title"])
    renames = next(step["options"]["renameByName"] for step in table["transformations"] if step["id"] == "organize")
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", drawn)
    assert headers == [renames["cron_job"], *(renames[f"Value #{target['refId']}"] for target in table["targets"])]
    assert len(re.findall(r"<tr><td>", drawn)) == 2  # calc-commission and nightly-report, joined by job


def test_a_table_with_one_answering_query_shows_grafanas_plain_value_column(picture: ModuleType):
    """Grafana calls the value column "Value #<refId>" only when two or more queries answer; with
    one, it is "Value", which the table's renames do not name. The picture draws what Grafana would."""
    table = next(panel for panel in DASHBOARD["panels"] if panel["type"] == "table")
    results = answers(set())
    for target in results[str(table["id"])]["targets"][1:]:
        target["result"] = []
    drawn = panel_html(picture.page(DASHBOARD, results, picture.Run(start=START, end=END), 1600), table["title"])
    renames = next(step["options"]["renameByName"] for step in table["transformations"] if step["id"] == "organize")
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", drawn)
    assert headers == [renames["cron_job"], "Value"], headers
