"""Prometheus as the picture runs it: a process of its own on a free port (not the system
service), scraping the example's /cron/metrics/ with a ``metrics`` token and loading the
project's alert rules; and its HTTP API."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path
from typing import Any

from bench.dashboard.machine import PROMETHEUS, ROOT, http, log, wait_for
from bench.dashboard.processes import Processes
from bench.dashboard.run import SCRAPE_SECONDS

RULES = ROOT / "deploy" / "prometheus" / "rules.yml"


def prometheus_config(work: Path, web_port: int) -> dict[str, Any]:
    """The scrape of the web process (its token read from ``work``/token) and the rules."""
    return {
        "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{
            "job_name": "cron_celery",  # the name CronMetricsDown expects
            "metrics_path": "/cron/metrics/",
            "authorization": {"credentials_file": str(work / "token")},
            "static_configs": [{"targets": [f"127.0.0.1:{web_port}"]}],
        }],
    }


def start_prometheus(processes: Processes, work: Path, env: dict[str, str], *, token: str, web_port: int,
                     port: int) -> tuple[str, str]:
    """Start Prometheus on ``port`` and wait until it is ready: its address and its version."""
    (work / "token").write_text(token)
    (work / "prometheus.yml").write_text(json.dumps(prometheus_config(work, web_port), indent=2))  # JSON is YAML
    processes.start("prometheus", [PROMETHEUS, f"--config.file={work / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={work / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{port}"], env=env, cwd=work)
    prom = f"http://127.0.0.1:{port}"
    wait_for("Prometheus", lambda: http(f"{prom}/-/ready")[0] == 200, 60, processes.check)
    version = json.loads(http(f"{prom}/api/v1/status/buildinfo")[1])["data"]["version"]
    return prom, str(version)


def prom_get(base: str, path: str, params: dict[str, str]) -> dict[str, Any]:
    status, body = http(f"{base}{path}?{urllib.parse.urlencode(params)}", timeout=30)
    answer = json.loads(body)
    if status != 200 or answer.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {params.get('query', path)!r}: {answer.get('error', status)}")
    data: dict[str, Any] = answer["data"]
    return data


def firing_alerts(prom: str) -> list[str]:
    """The names of the alerts firing in Prometheus now, sorted (and logged)."""
    alerts = prom_get(prom, "/api/v1/alerts", {})
    firing = sorted({str(a["labels"]["alertname"]) for a in alerts.get("alerts", []) if a["state"] == "firing"})
    log(f"alerts firing in Prometheus: {', '.join(firing) or 'none'}")
    return firing
