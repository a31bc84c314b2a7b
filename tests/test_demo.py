"""The README's demo command, run as a newcomer runs it: ``./scripts/demo``.

It starts a real worker and two real beats for the example project, lets them run a
minute, stops the leading beat half way, and must leave the database in the state it
promises (every beat slot once, a failure, a retry, the failure and recovery alerts
delivered as mail) and no process behind, also when it is interrupted with Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from django.conf import settings

from tests.conftest import ROOT

DEMO = ROOT / "scripts" / "demo"
#: The demo's own database, one per test database (the Django lines of ``scripts/test`` run side by
#: side, each with its own databases, and the demo's Redis keys are named after its database).
DATABASE = f"{os.environ.get('CRON_TEST_DATABASE_PREFIX', 'cron_celery')}_demo_test"


#: The demo as a terminal starts it, with Ctrl-C's SIGINT at its default: a test run started in the background
#: by a shell without job control inherits SIGINT ignored, and bash cannot trap a signal ignored at its start.
AS_FROM_A_TERMINAL = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL);"
                      " os.execvp('bash', ['bash', sys.argv[1]])", str(DEMO)]


def demo_env(logs: Path) -> dict[str, str]:
    db: dict[str, Any] = settings.DATABASES["default"]
    auth = quote(db["USER"], safe="") + (f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else "")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("CRON_", "DJANGO_"))}
    env.update(
        DATABASE_URL=f"postgres://{auth}@{db['HOST']}:{db['PORT']}/{DATABASE}",
        DEMO_LOGS=str(logs),  # not the checkout's .demo, which may hold a person's own run
        CELERY_TASK_DEFAULT_QUEUE=f"cron-celery-demo-test-{os.getpid()}",
        DEMO_VENV=sys.prefix,  # the demo runs on this test run's Python and Django
        PYTHONPATH="",
    )
    return env


def demo_rows(sql: str) -> list[tuple[Any, ...]]:
    db: dict[str, Any] = settings.DATABASES["default"]
    with psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], password=db.get("PASSWORD") or None,
                         dbname=DATABASE) as conn:
        return conn.execute(sql).fetchall()


def started_pids(output: str) -> dict[str, int]:
    """The processes the demo says it started: ``worker: pid 123 (log: ...)``."""
    return {name: int(pid) for name, pid in re.findall(r"^([\w-]+): pid (\d+)", output, flags=re.M)}


def leftovers(pids: dict[str, int]) -> list[str]:
    """Those whose process or process group still exists (the worker's pool included)."""
    left = []
    for name, pid in pids.items():
        for probe in (os.kill, os.killpg):
            try:
                probe(pid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass
            left.append(f"{name} ({probe.__name__} {pid})")
    return left


class Launched(list):  # type: ignore[type-arg]
    """The demos a test started, and the processes each said it started (``pids``)."""

    pids: dict[str, int]


@pytest.fixture(autouse=True)
def _no_stray_processes() -> Any:
    """Whatever a test leaves running is stopped: the demo by Ctrl-C, else killed; then every process
    group the demo said it started (its worker and beats run in groups of their own, so a demo that
    could not clean up would leave them behind: beats still holding the leader lock of the demo's
    database, which the next run of the test then cannot take)."""
    procs = Launched()
    procs.pids = {}
    yield procs
    for proc in procs:  # only if an assertion failed half way
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
    for pid in procs.pids.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def test_the_demo_runs_two_beats_for_a_minute_and_leaves_nothing_behind(_no_stray_processes: list[Any],
                                                                        tmp_path: Path):
    proc = subprocess.Popen(["bash", str(DEMO)], cwd=ROOT, env=demo_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    _no_stray_processes.append(proc)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-4000:]
    assert "Every slot the beats dispatched ran once" in output

    # Both beats ran, the leader was stopped, the standby took over.
    pids = started_pids(output)
    assert set(pids) == {"worker", "beat-1", "beat-2"}, output
    took_over = re.search(r"stopping the leading beat, (beat-\d).*\n\s+(beat-\d) took over", output)
    assert took_over and took_over.group(1) != took_over.group(2), output
    assert not leftovers(pids), leftovers(pids)

    # The database says what the demo printed.
    twice = demo_rows("SELECT job_id, slot FROM cron_celery_cronexecution WHERE trigger = 'BEAT' "
                      "GROUP BY job_id, slot HAVING count(*) > 1")
    assert twice == []
    runs = demo_rows("SELECT task_name, status, retry_count FROM cron_celery_cronexecution "
                     "WHERE trigger = 'BEAT' ORDER BY slot, id")
    sync = [status for name, status, _ in runs if name == "sync-partner-api"]
    assert sync[0] == "FAILED" and set(sync[1:]) == {"SUCCEEDED"}, runs
    assert any(name == "import-partner-feed" and status == "SUCCEEDED" and retries >= 1
               for name, status, retries in runs), runs
    assert sum(1 for name, status, _ in runs if name == "cache-warmer" and status == "SUCCEEDED") >= 3, runs
    assert not [row for row in runs if row[1] in ("PENDING", "RUNNING", "RETRYING")], runs
    alerts = demo_rows("SELECT j.name, a.event, a.channel, a.status FROM cron_celery_alert a "
                       "JOIN cron_celery_cronjob j ON j.id = a.job_id ORDER BY a.id")
    # A machine too busy to send a slot in time records it MISSED and says so once (a loaded CI run
    # did, for cache-warmer's first slot): allowed, for slots recorded MISSED only; nothing else.
    assert [alert for alert in alerts if alert[1] != "MISSED"] == [("sync-partner-api", "FAILED", "email", "SENT"),
                                                                   ("sync-partner-api", "RECOVERED", "email", "SENT")]
    missed = {name for name, status, _ in runs if status == "MISSED"}
    assert all(alert[0] in missed and alert[3] == "SENT" for alert in alerts if alert[1] == "MISSED"), (alerts, runs)
    mail = "\n".join(path.read_text(encoding="utf-8") for path in (tmp_path / "mail").iterdir())
    assert "Subject: [cron] sync-partner-api (S001) failed" in mail
    assert "Subject: [cron] sync-partner-api (S001) recovered" in mail
    assert "To: ops@example.com" in mail


def test_ctrl_c_stops_the_demo_and_every_process_it_started(_no_stray_processes: list[Any], tmp_path: Path):
    proc = subprocess.Popen(AS_FROM_A_TERMINAL, cwd=ROOT, env={**demo_env(tmp_path), "DEMO_SECONDS": "600"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    _no_stray_processes.append(proc)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "leader beat-" in line:  # the beats and the worker are running and reporting
            break
    else:
        pytest.fail("".join(seen))
    pids = started_pids("".join(seen))
    _no_stray_processes.pids.update(pids)
    assert set(pids) == {"worker", "beat-1", "beat-2"}
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the foreground group
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen) + rest
    assert not leftovers(pids), leftovers(pids)
    assert "the demo failed" in rest
    # The worker was stopped warm: what it had started, it finished.
    assert demo_rows("SELECT id FROM cron_celery_cronexecution WHERE status = 'RUNNING'") == []
