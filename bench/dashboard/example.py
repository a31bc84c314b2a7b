"""The example project (example/) as the picture runs it, as ./scripts/demo runs it: a Celery worker
and two beats with the sample jobs, and a web process serving /cron/metrics/, on a database and a
Redis of their own; Prometheus scraping it; a timeline of events while the jobs run; then every
panel's queries. Every process it starts is stopped on the way out, also after an error or Ctrl-C."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from bench.dashboard.machine import EXAMPLE, PROMETHEUS, REDIS_SERVER, debian_tool, free_port, http, log, wait_for
from bench.dashboard.processes import Processes
from bench.dashboard.prometheus import firing_alerts, start_prometheus
from bench.dashboard.queries import query_panels
from bench.dashboard.run import RESTART_SECONDS, SCRAPE_SECONDS, Run

DEFAULT_DATABASE = "postgres://postgres@127.0.0.1:5432/cron_celery_picture"
#: Environment variables the example project reads (or Django and Celery do): not inherited.
FOREIGN = ("DJANGO_", "CELERY_", "CRON_", "ALERT_", "SLACK_", "SENTRY_", "EMAIL_", "DEFAULT_FROM_EMAIL",
           "DATABASE_URL", "REDIS_URL", "STATIC_ROOT", "TIME_ZONE")
QUEUE = "cron-celery-picture"
#: How often health-ping is sent over ``POST /cron/run/``, in seconds.
PING_EVERY = 15.0


def create_database(url: str) -> None:
    import psycopg
    from psycopg import sql

    parts = urllib.parse.urlparse(url)
    name = urllib.parse.unquote(parts.path.lstrip("/"))
    params: dict[str, Any] = {"host": parts.hostname or "127.0.0.1", "port": parts.port or 5432,
                              "user": urllib.parse.unquote(parts.username or "postgres"),
                              "password": urllib.parse.unquote(parts.password or "")}
    with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=5, **params) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            log(f"created the database {name!r}")


def example_env(work: Path, *, redis_port: int, dead_port: int, scraper: str, deploy: str) -> dict[str, str]:
    """The environment of the example's processes: its database, its own Redis, its alert channels
    and its tokens (``scraper`` for the metrics, ``deploy`` for ``POST /cron/run/``)."""
    # The example reads its settings from the environment: what this shell set for another project
    # (its database, broker, channels, settings module) stays out of the picture's run.
    env = {key: value for key, value in os.environ.items() if not key.startswith(FOREIGN)}
    env.update({
        "DATABASE_URL": os.environ.get("PICTURE_DATABASE_URL", DEFAULT_DATABASE),
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "CELERY_TASK_DEFAULT_QUEUE": QUEUE,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(EXAMPLE), os.environ.get("PYTHONPATH", "")])),
        "ALERT_EMAIL_TO": "ops@example.com",
        "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
        "EMAIL_FILE_PATH": str(work / "mail"),
        # A webhook channel that is down: its alerts are tried 5 times (2, 4, 8, 16 s apart), then FAILED.
        "ALERT_WEBHOOK_URL": f"http://127.0.0.1:{dead_port}/cron-alerts",
        "CRON_TOKEN_PROMETHEUS": scraper,  # the example's token of the metrics scope
        "CRON_TOKEN_DEPLOY": deploy,
        "CRON_CELERY_LOG_LEVEL": "INFO",
    })
    return env


@dataclass
class Example:
    """The example project's processes for the picture, started in ``work``."""

    work: Path
    processes: Processes
    env: dict[str, str]
    #: The run token, for ``POST /cron/run/``.
    deploy: str
    web_port: int

    @property
    def web(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def manage(self, *command: str) -> None:
        subprocess.run([sys.executable, "manage.py", *command], cwd=EXAMPLE, env=self.env, check=True)

    def start_redis(self, port: int) -> None:
        """Its own redis-server, which keeps nothing on disk."""
        processes = self.processes
        processes.start("redis", [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--dir", str(self.work)], env=self.env, cwd=self.work)
        wait_for("Redis", lambda: processes.log_has("redis", "Ready to accept connections"), 30, processes.check)

    def prepare(self) -> None:
        """The database, migrated, with the demo's jobs and schedules (and today's daily-report)."""
        create_database(self.env["DATABASE_URL"])
        self.manage("migrate", "--noinput", "-v", "0")
        self.manage("reset_demo")
        today = dt.datetime.now(ZoneInfo("Europe/Amsterdam")).date().isoformat()  # daily-report's timezone
        self.manage("run_cron_task", "daily-report", today)
        self.manage("sync_cron_schedules")
        self.manage("demo_schedules", "sync-partner-api", "import-partner-feed", "--every", "20")

    def start_web(self, scraper: str) -> None:
        """The web process, ready when /cron/metrics/ answers ``scraper``'s token."""
        self.processes.start("web", [sys.executable, "manage.py", "runserver", f"127.0.0.1:{self.web_port}",
                                     "--noreload"], env=self.env)
        wait_for("the web process", lambda: http(f"{self.web}/cron/metrics/", token=scraper)[0] == 200, 60,
                 self.processes.check)

    def celery(self, *arguments: str) -> list[str]:
        return [str(Path(sys.executable).parent / "celery"), "-A", "proj", *arguments]

    def start_worker(self, name: str) -> None:
        self.processes.start(name, self.celery("worker", "--loglevel", "INFO", "--concurrency", "2", "--queues",
                                               QUEUE, "--hostname", f"{name}-{os.getpid()}@%h", "--without-gossip",
                                               "--without-mingle", "--without-heartbeat"), env=self.env)
        wait_for(name, lambda: self.processes.log_has(name, "ready."), 60, self.processes.check)

    def start_beats(self) -> None:
        for name in ("beat-1", "beat-2"):  # beat-1 comes first and leads; beat-2 stands by
            self.processes.start(name, self.celery("beat", "-S", "cron_celery.beat.Scheduler", "--loglevel", "INFO"),
                                 env=self.env)
            time.sleep(1)

    def send(self, job: str, fields: str = "") -> None:
        status, _ = http(f"{self.web}/cron/run/{job}/", token=self.deploy, data=fields.encode())
        if status != 202:
            raise RuntimeError(f"POST /cron/run/{job}/ {fields} answered {status}")


def timeline(example: Example, seconds: int) -> list[tuple[float, str, Callable[[], None]]]:
    """What happens meanwhile, besides the schedules: (seconds from the start, what, how)."""
    day = dt.datetime.now(dt.UTC).date()  # sync-partner-api's timezone
    # sync-partner-api for an earlier day: the partner (simulated) fails the first call of each
    # day, so that run fails and alerts; the next scheduled one recovers and alerts again.
    # Near the middle, the worker stops (a deploy) for RESTART_SECONDS: the slots the beat
    # sends meanwhile wait PENDING until the new worker takes them.
    return [
        (seconds * 0.25, f"sync-partner-api for {day - dt.timedelta(days=1)} (it fails)",
         lambda: example.send("sync-partner-api", f"date={day - dt.timedelta(days=1)}")),
        (seconds * 0.45, f"the worker stops for {RESTART_SECONDS} s, as in a deploy",
         lambda: example.processes.stop("worker")),
        (seconds * 0.45 + RESTART_SECONDS, "a new worker starts", lambda: example.start_worker("worker-2")),
        (seconds * 0.8, f"sync-partner-api for {day - dt.timedelta(days=2)} (it fails)",
         lambda: example.send("sync-partner-api", f"date={day - dt.timedelta(days=2)}")),
    ]


def play(example: Example, seconds: int) -> None:
    """Let the jobs run for ``seconds``: the timeline's events on time, health-ping every PING_EVERY s."""
    start = time.time()
    log(f"the jobs run for {seconds} s; Prometheus scrapes {example.web}/cron/metrics/ every {SCRAPE_SECONDS} s")
    events = timeline(example, seconds)
    next_ping, next_report = 0.0, 30.0
    while (elapsed := time.time() - start) < seconds:
        example.processes.check()
        while events and elapsed >= events[0][0]:
            _, what, action = events.pop(0)
            log(what)
            action()
        if elapsed >= next_ping:
            example.send("health-ping")
            next_ping += PING_EVERY
        if elapsed >= next_report:
            log(f"{elapsed:.0f} s of {seconds}")
            next_report += 30
        time.sleep(0.5)


def stop_everything(processes: Processes) -> None:
    # Not interrupted by a second Ctrl-C or SIGTERM: each process gets at most 15 s.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    processes.stop_all()
    log("stopped every process this script started")


def run_and_query(args: argparse.Namespace, work: Path, dashboard: dict[str, Any]) -> tuple[Run, dict[str, Any]]:
    """Run the example project and Prometheus, then every panel's queries; stop them all."""
    debian_tool(PROMETHEUS, "prometheus")
    debian_tool(REDIS_SERVER, "redis-server")
    logs = work / "logs"
    logs.mkdir()
    scraper, deploy = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    redis_port, web_port, prom_port, dead_port = free_port(), free_port(), free_port(), free_port()
    env = example_env(work, redis_port=redis_port, dead_port=dead_port, scraper=scraper, deploy=deploy)
    processes = Processes(logs)
    example = Example(work, processes, env, deploy, web_port)
    try:
        example.start_redis(redis_port)
        example.prepare()
        example.start_web(scraper)
        prom, version = start_prometheus(processes, work, env, token=scraper, web_port=web_port, port=prom_port)
        scraping_since = time.time()
        example.start_worker("worker")
        example.start_beats()
        play(example, args.seconds)
        run = Run(start=scraping_since, end=time.time(), prometheus_version=version)
        results = query_panels(prom, dashboard, run, args.width)
        run.firing = firing_alerts(prom)
        return run, results
    except BaseException:
        processes.tails()
        raise
    finally:
        stop_everything(processes)
