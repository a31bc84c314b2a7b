"""The run the picture shows: how often Prometheus scrapes, how long the worker is away, and what
the picture's caption says about the run (kept with the query results by ``--data``)."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Prometheus's scrape and rule evaluation interval, and the data source's "Scrape interval" in
#: Grafana, from which it computes $__interval's lower bound and $__rate_interval.
SCRAPE_SECONDS = 5
#: How long the worker is stopped near the middle of the run, as a deploy would stop it.
RESTART_SECONDS = 30


@dataclass
class Run:
    """What the picture's caption says about the run."""

    start: float
    end: float
    prometheus_version: str = ""
    firing: list[str] = field(default_factory=list)
