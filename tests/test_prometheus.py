"""Monitoring as users run it: the alerting rules (deploy/prometheus/rules.yml) pass ``promtool check
rules`` and their unit tests (``promtool test rules``), the real output of ``/cron/metrics/`` passes
``promtool check metrics``, and the rules and the Grafana dashboard (deploy/grafana/cron_celery.json)
use only metrics and labels the endpoint serves, in PromQL that Prometheus parses. promtool is
Debian's (package ``prometheus``), installed when missing."""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from cron_celery.beat import health
from cron_celery.decisions import leadership
from cron_celery.models import Alert, CronJob, Status
from tests.conftest import debian_tool, make_job
from tests.test_endpoints import BEARER, execution, with_token

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "rules_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "cron_celery.json"
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning" / "cron_celery.yaml"
#: A metric name of ours in an expression, once its label matchers and label lists are taken out.
METRIC = re.compile(r"\bcron_[a-z_]+\b")
MATCHERS = re.compile(r"\{([^}]*)\}")
LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")


def metric_names(expr: str) -> set[str]:
    return set(METRIC.findall(LABEL_LISTS.sub(" ", MATCHERS.sub(" ", expr))))


def label_names(expr: str) -> set[str]:
    """The labels an expression filters or groups on."""
    found = {name for inner in MATCHERS.findall(expr) for name in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", inner)}
    found |= {name.strip() for inner in LABEL_LISTS.findall(expr) for name in inner.split(",") if name.strip()}
    return found


@pytest.fixture(scope="module")
def promtool() -> str:
    return debian_tool("/usr/bin/promtool", "prometheus", "checking the alerting rules and the metrics")


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), input=stdin, capture_output=True, text=True, timeout=120, check=False)


def test_the_rules_pass_promtool_check_rules(promtool: str) -> None:
    done = run(promtool, "check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_the_rules_pass_their_unit_tests(promtool: str) -> None:
    done = run(promtool, "test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_every_alert_is_tested_both_firing_and_quiet() -> None:
    alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    cases = [case for test in yaml.safe_load(RULE_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    firing = {case["alertname"] for case in cases if case.get("exp_alerts")}
    quiet = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    assert alerts == firing, f"never seen firing: {sorted(alerts - firing)}"
    assert alerts == quiet, f"never seen quiet: {sorted(alerts - quiet)}"


def scraped(client: Client) -> str:
    with with_token:
        response = client.get("/cron/metrics/", headers=BEARER)
    assert response.status_code == 200
    return response.content.decode()


def busy_system() -> None:
    """Rows for every metric family to have samples: runs of each ending, an overdue job, a beat,
    a reconciler pass, alerts pending and failed."""
    slot = dt.datetime(2026, 11, 29, tzinfo=dt.UTC)
    job, job_id = make_job()
    ok = execution(job, job_id, slot, Status.SUCCEEDED, seconds=2.0)
    bad = execution(job, job_id, slot + dt.timedelta(hours=1), Status.FAILED, seconds=0.3)
    execution(job, job_id, slot + dt.timedelta(hours=2), Status.LOST)
    execution(job, job_id, slot + dt.timedelta(hours=3), Status.RUNNING, seconds=None)
    Alert.objects.create(execution=bad, job_id=job_id, event="FAILED", channel="slack", status="PENDING")
    Alert.objects.create(execution=bad, job_id=job_id, event="FAILED", channel="email", status="FAILED")
    Alert.objects.create(execution=ok, job_id=job_id, event="RECOVERED", channel="slack", status="SENT")
    CronJob.objects.filter(id=job_id).update(last_success_at=slot + dt.timedelta(seconds=2), consecutive_failures=1)
    health.beat_seen("host-a:1", True)
    leadership.mark(leadership.RECONCILED, "host-a:2")  # a reconciler pass finished
    leadership.mark(leadership.BROKER_UNANSWERED, "host-a:2")  # and one could not ask the broker


@pytest.mark.django_db
def test_the_endpoints_output_passes_promtool_check_metrics(client: Client, promtool: str) -> None:
    busy_system()
    text = scraped(client)
    names = {family.name for family in text_string_to_metric_families(text)}
    assert {"cron_alerts_undelivered", "cron_reconciler_last_pass_age_seconds", "cron_executions"} <= names
    assert "\ncron_reconciler_last_pass_age_seconds " in text  # a sample, checked below like the rest
    done = run(promtool, "check", "metrics", stdin=text)
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr


def served(client: Client) -> dict[str, set[str]]:
    """Each sample name the endpoint serves (a busy system), with its labels."""
    busy_system()
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(scraped(client)):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
        found.setdefault(family.name, set())
    return found


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every rule and every dashboard target."""
    found = [(f"rule {rule['alert']}", rule["expr"])
             for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    dashboard = json.loads(DASHBOARD.read_text())
    found += [(f"panel {panel['title']!r}", target["expr"])
              for panel in dashboard["panels"] for target in panel.get("targets", [])]
    return found


@pytest.mark.django_db
def test_the_rules_and_the_dashboard_use_only_what_the_endpoint_serves(client: Client) -> None:
    samples = served(client)
    for where, expr in expressions():
        if expr.startswith("up{"):  # Prometheus's own series of the scrape (CronMetricsDown)
            assert expr.startswith('up{job="cron_celery"}'), expr
            continue
        names = metric_names(expr)
        assert names, f"{where} reads none of our metrics"
        for name in names:
            assert name in samples, f"{where} reads {name}, which /cron/metrics/ does not serve"
        carried = set().union(*(samples[name] for name in names))
        for label in label_names(expr):
            assert label in carried, f"{where} uses the label {label!r}, which none of {sorted(names)} carries"
        assert "job" not in label_names(expr), f"{where}: a job is cron_job (job is Prometheus's own label)"


def test_the_expression_reader_finds_metrics_and_labels() -> None:
    expr = 'sum by (le, cron_job) (rate(cron_execution_duration_seconds_bucket{cron_job=~"$cron_job"}[5m]))'
    assert metric_names(expr) == {"cron_execution_duration_seconds_bucket"}
    assert label_names(expr) == {"le", "cron_job"}
    assert label_names('cron_alerts_undelivered{status="FAILED",channel!="x"}') == {"status", "channel"}


def test_the_dashboards_queries_parse_as_promql(promtool: str, tmp_path: Path) -> None:
    """Each target as a recording rule (Grafana's variables given values), checked by promtool."""
    rules = [{"record": f"dashboard:target_{n}", "expr": expr.replace("$__rate_interval", "5m")
              .replace("$cron_job", ".*")} for n, (_, expr) in enumerate(expressions())]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = run(promtool, "check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_is_what_grafanas_provisioning_loads() -> None:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    assert {"uid", "title", "panels", "schemaVersion", "templating", "time"} <= set(dashboard)
    assert "id" not in dashboard or dashboard["id"] is None  # provisioning gives the id
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    variables = {item["name"]: item for item in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["cron_job"]["includeAll"] and variables["cron_job"]["multi"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
    provider = yaml.safe_load(PROVISIONING.read_text())
    assert provider["apiVersion"] == 1 and provider["providers"][0]["type"] == "file"
    assert provider["providers"][0]["options"]["path"]


@pytest.mark.django_db
def test_the_job_tables_columns_keep_their_names_for_a_job_that_never_ran(client: Client) -> None:
    """Grafana calls a table query's value column ``Value #<refId>`` only when more than one of
    the panel's queries answers; a lone answer is ``Value``, which the panel's renames would
    miss. The table reads at least two gauges served for every job, even one that never ran."""
    job, _ = make_job()
    never_ran = {sample.name for family in text_string_to_metric_families(scraped(client))
                 for sample in family.samples if sample.labels.get("cron_job") == job.name}
    table = next(panel for panel in json.loads(DASHBOARD.read_text())["panels"] if panel["type"] == "table")
    answering = [target["refId"] for target in table["targets"] if metric_names(target["expr"]) <= never_ran]
    assert len(answering) >= 2, (answering, sorted(never_ran))
    renames = next(step["options"]["renameByName"] for step in table["transformations"] if step["id"] == "organize")
    assert {f"Value #{target['refId']}" for target in table["targets"]} <= set(renames)


def panel_targets(title: str) -> dict[str, str]:
    """refId -> expression of one dashboard panel, Grafana's variables given values."""
    panel = next(panel for panel in json.loads(DASHBOARD.read_text())["panels"] if panel["title"] == title)
    return {target["refId"]: target["expr"].replace("$__rate_interval", "5m").replace("$cron_job", ".*")
            for target in panel["targets"]}


def expression_test(promtool: str, tmp_path: Path, tests: list[dict[str, Any]]) -> None:
    """``tests`` in promtool's unit-test format (input series, ``promql_expr_test``), run."""
    path = tmp_path / "dashboard_test.yml"
    path.write_text(yaml.safe_dump({"evaluation_interval": "1m", "tests": tests}, sort_keys=False))
    done = run(promtool, "test", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_alerts_stat_reads_zero_when_all_was_delivered_and_nothing_when_not_scraped(
        promtool: str, tmp_path: Path) -> None:
    """'Alerts not delivered' is 0 while cron_celery is scraped and nothing is undelivered, the
    count when some is, and no value (not a reassuring 0) when the endpoint is not scraped."""
    stat = panel_targets("Alerts not delivered")
    scraped_alive = {"series": "cron_reconciler_interval_seconds", "values": "30x10"}
    tests = [
        {"interval": "1m", "input_series": [scraped_alive],
         "promql_expr_test": [{"expr": stat[ref], "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": 0}]}
                              for ref in ("A", "B")]},
        {"interval": "1m", "input_series": [
            scraped_alive,
            {"series": 'cron_alerts_undelivered{channel="slack",status="FAILED"}', "values": "2x10"},
            {"series": 'cron_alerts_undelivered{channel="email",status="FAILED"}', "values": "1x10"},
            {"series": 'cron_alerts_undelivered{channel="email",status="PENDING"}', "values": "4x10"}],
         "promql_expr_test": [{"expr": stat["A"], "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": 3}]},
                              {"expr": stat["B"], "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": 4}]}]},
        {"interval": "1m", "input_series": [{"series": 'up{job="cron_celery"}', "values": "0x10"}],
         "promql_expr_test": [{"expr": stat[ref], "eval_time": "5m", "exp_samples": []} for ref in ("A", "B")]},
    ]
    expression_test(promtool, tmp_path, tests)


def test_a_jobs_first_failure_shows_on_the_failure_panels(promtool: str, tmp_path: Path) -> None:
    """cron_executions_total is served at 0 for each status before its first count (metrics.py:
    ZERO_STATUSES), so the first failure is an increase: the total line and the job's own line
    rise while the other job, which only succeeded, draws no line of its own."""
    failures = panel_targets("Failures, by job")
    lost = panel_targets("Executions lost")
    series = [
        {"series": 'cron_executions_total{cron_job="nightly",status="FAILED"}', "values": "0 0 0 1 1 1 1"},
        {"series": 'cron_executions_total{cron_job="nightly",status="SUCCEEDED"}', "values": "0 1 2 2 2 2 2"},
        {"series": 'cron_executions_total{cron_job="hourly",status="FAILED"}', "values": "0x6"},
        {"series": 'cron_executions_total{cron_job="hourly",status="SUCCEEDED"}', "values": "0 1 2 3 4 5 6"},
        {"series": 'cron_lost_total{cron_job="nightly"}', "values": "0x6"},
        {"series": 'cron_lost_total{cron_job="hourly"}', "values": "0 0 0 0 1 1 1"},
    ]
    risen = [{"labels": "{}", "value": 1}]
    tests = [{"interval": "1m", "input_series": series, "promql_expr_test": [
        {"expr": f"({failures['A']}) > bool 0", "eval_time": "2m", "exp_samples": [{"labels": "{}", "value": 0}]},
        {"expr": f"({failures['A']}) > bool 0", "eval_time": "5m", "exp_samples": risen},
        {"expr": f"({failures['B']}) > bool 0", "eval_time": "2m", "exp_samples": []},
        {"expr": f"({failures['B']}) > bool 0", "eval_time": "5m",
         "exp_samples": [{"labels": '{cron_job="nightly"}', "value": 1}]},
        {"expr": f"({lost['A']}) > bool 0", "eval_time": "6m", "exp_samples": risen},
        {"expr": f"({lost['B']}) > bool 0", "eval_time": "6m",
         "exp_samples": [{"labels": '{cron_job="hourly"}', "value": 1}]},
    ]}]
    expression_test(promtool, tmp_path, tests)


def test_every_replica_scraped_shows_the_same_numbers_as_one(promtool: str, tmp_path: Path) -> None:
    """Where every web replica is a target (a ServiceMonitor over a Deployment), each serves the
    whole system's numbers: the panels take one replica's (max or min by the metric's own labels),
    so two targets show what one shows, not twice as much."""
    replicas = ('instance="web-a:8000",job="cron_celery"', 'instance="web-b:8000",job="cron_celery"')
    per_replica = [
        ('cron_executions_total{cron_job="nightly",status="SUCCEEDED",%s}', "0+60x10"),  # 1 a second
        ('cron_executions_total{cron_job="nightly",status="FAILED",%s}', "0+60x10"),
        ('cron_lost_total{cron_job="nightly",%s}', "0+60x10"),
        ('cron_fenced_total{cron_job="nightly",%s}', "0+60x10"),
        ('cron_executions_open{cron_job="nightly",status="RUNNING",%s}', "2x10"),
        ('cron_overdue{cron_job="nightly",%s}', "1x10"),
        ('cron_paused{cron_job="nightly",%s}', "0x10"),
        ('cron_alerts_undelivered{channel="slack",status="FAILED",%s}', "2x10"),
        ('cron_reconciler_interval_seconds{%s}', "30x10"),
        ('cron_execution_duration_seconds_bucket{cron_job="nightly",le="0.5",%s}', "0x10"),
        ('cron_execution_duration_seconds_bucket{cron_job="nightly",le="1.0",%s}', "0+60x10"),
        ('cron_execution_duration_seconds_bucket{cron_job="nightly",le="+Inf",%s}', "0+60x10"),
    ]
    series = [{"series": (name % replica).replace(",}", "}"), "values": values}
              for name, values in per_replica for replica in replicas]
    series += [{"series": f"cron_beat_heartbeat_age_seconds{{{replica}}}", "values": f"{age}x10"}
               for replica, age in zip(replicas, (7, 9), strict=True)]
    nightly = '{cron_job="nightly"}'
    expected = [  # (panel, refId, labels, value), one replica's numbers
        ("Beat leader last seen", "A", "{}", 7), ("Jobs overdue", "A", "{}", 1),
        ("Alerts not delivered", "A", "{}", 2), ("Alerts not delivered", "B", "{}", 0),
        ("Per job", "E", nightly, 2),
        ("Executions ended, by status", "A", '{status="FAILED"}', 1),
        ("Executions ended, by status", "A", '{status="SUCCEEDED"}', 1),
        ("Failures, by job", "A", "{}", 300), ("Failures, by job", "B", nightly, 300),
        ("Duration p50 and p95, by job", "A", nightly, 0.75),
        ("Open executions, by status", "A", '{status="RUNNING"}', 2),
        ("Outcomes refused by their fence", "A", "{}", 300), ("Outcomes refused by their fence", "B", nightly, 300),
        ("Executions lost", "A", "{}", 300), ("Executions lost", "B", nightly, 300),
        ("Alerts not delivered, by channel", "A", '{channel="slack", status="FAILED"}', 2),
    ]
    by_expr: dict[str, list[dict[str, Any]]] = {}
    for title, ref, labels, value in expected:
        by_expr.setdefault(f"round({panel_targets(title)[ref]}, 0.001)", []).append({"labels": labels, "value": value})
    tests = [{"interval": "1m", "input_series": series, "promql_expr_test": [
        {"expr": expr, "eval_time": "8m", "exp_samples": samples} for expr, samples in by_expr.items()]}]
    expression_test(promtool, tmp_path, tests)
