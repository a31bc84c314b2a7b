"""Jobs declared the way users declare them; found by autodiscovery of ``tasks`` modules."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
from typing import Any

from celery import shared_task
from celery.signals import task_postrun

from cron_celery import ExecutionPattern, JobFailed, Run, TrackedTask, cron_task, register_task
from cron_celery.schedules import at, daily, every


def mark(run: Run, label: str) -> None:
    """Append a line to the file named by CRON_TEST_MARKER: proof that a body ran."""
    path = os.environ.get("CRON_TEST_MARKER")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(f"{label} {run.key} {run.fence} {os.getpid()}\n")


@cron_task(name="calc-commission", code="A001", pattern="rerun_on_failure")
def calc_commission(run: Run) -> str:
    """Calculates the day's commissions."""
    mark(run, "calc-commission")
    return "Processed 120 records"


@register_task("sync-external-api", "A002", execution_pattern=ExecutionPattern.RERUN_ON_FAILURE)
class SyncExternalAPI(TrackedTask):
    """Pulls the partner API."""

    def execute(self, date: dt.date) -> dict[str, object]:
        if os.environ.get("CRON_TEST_SYNC_FAILS"):
            return {"error": True, "message": "partner API returned 503", "error_code": "HTTP_503"}
        return {"error": False, "message": f"Sync completed for {date.isoformat()}"}


@cron_task(name="slow-standard", code="T100")
def slow_standard(run: Run) -> str:
    """Sleeps a little so that concurrent callers overlap, then marks that it ran."""
    time.sleep(float(os.environ.get("CRON_TEST_SLEEP", "0.5")))
    mark(run, "slow-standard")
    return f"ran in {os.getpid()}"


@cron_task(name="async-job", code="T101", pattern="always")
async def async_job(run: Run) -> dict[str, object]:
    await asyncio.sleep(0.01)
    return {"error": False, "message": f"async ok {run.key}"}


@cron_task(name="boom", code="T102", pattern=ExecutionPattern.ALWAYS)
def boom(run: Run) -> None:
    size = int(os.environ.get("CRON_TEST_BOOM_SIZE", "20"))
    raise RuntimeError("x" * size)


@cron_task(name="not-json", code="T103", pattern="always")
def not_json(run: Run) -> object:
    return {"when": dt.datetime(2026, 11, 29)}


@cron_task(name="unicode-job", code="T104", pattern="always")
def unicode_job(run: Run) -> str:
    raise JobFailed("Überweisung fehlgeschlagen — 送金失敗 🚫", error_code="ÜBER")


@cron_task(name="fast-always", code="T105", pattern="always", overlap="allow")
def fast_always(run: Run) -> str:
    mark(run, "fast-always")
    return "ok"


@cron_task(name="exclusive", code="T106", pattern="always", overlap="skip", max_retries=1)
def exclusive(run: Run) -> str:
    """Overlap SKIP without a slot check: only the locks keep two runs apart."""
    time.sleep(float(os.environ.get("CRON_TEST_SLEEP", "0.2")))
    mark(run, "exclusive")
    return f"pid={os.getpid()} fence={run.fence} cancelled={run.cancelled.is_set()}"


@cron_task(name="nightly-report", code="T107", schedule=daily(at(2).am()), timezone="Europe/Amsterdam",
           catch_up="all")
def nightly_report(run: Run) -> str:
    return f"report for {run.execution_date} at {run.slot:%H:%M}Z"


@cron_task(name="tick-1s", code="T108", schedule=every(seconds=1), pattern="always", overlap="allow",
           catch_up="all")
def tick_1s(run: Run) -> str:
    mark(run, "tick-1s")
    return "tick"


@cron_task(name="tick-2s", code="T109", schedule=every(seconds=2), pattern="standard", catch_up="all")
def tick_2s(run: Run) -> str:
    mark(run, "tick-2s")
    return "tick"


def _plain_line(text: str) -> None:
    """Append ``text``, the time and the pid to the file named by CRON_TEST_MARKER: a plain body ran."""
    path = os.environ.get("CRON_TEST_MARKER")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(f"{text} {time.time():.3f} {os.getpid()}\n")


@shared_task(name="tests.jobsapp.tasks.plain_ping")
def plain_ping() -> None:
    """A plain Celery task (not a cron job) that a django-celery-beat periodic task sends."""
    _plain_line("plain-ping")


@shared_task(name="tests.jobsapp.tasks.plain_mark")
def plain_mark(label: str) -> None:
    """A plain Celery task that marks each body with its ``label`` (a periodic task's argument)."""
    _plain_line(f"plain-mark {label}")


@shared_task(name="tests.jobsapp.tasks.plain_fail")
def plain_fail(label: str) -> None:
    """A plain Celery task that marks its body, then fails."""
    _plain_line(f"plain-fail {label}")
    raise ValueError(f"{label} went wrong")


@shared_task(bind=True, name="tests.jobsapp.tasks.plain_retry", max_retries=3)
def plain_retry(self: Any, label: str, *, fail_times: int = 2) -> str:
    """A plain bound task that retries itself ``fail_times`` times (a second apart), then succeeds."""
    _plain_line(f"plain-retry {label} {self.request.retries}")
    if self.request.retries < fail_times:
        raise self.retry(countdown=1, exc=ConnectionError(f"{label}: try {self.request.retries}"))
    return f"{label} done after {self.request.retries} retries"


@shared_task(name="tests.jobsapp.tasks.plain_autoretry", autoretry_for=(KeyError,), retry_kwargs={"countdown": 1},
             max_retries=1)
def plain_autoretry(label: str) -> None:
    """A plain task with ``autoretry_for`` that always fails: one retry, then a final failure."""
    _plain_line(f"plain-autoretry {label}")
    raise KeyError(label)


@shared_task(name="tests.jobsapp.tasks.plain_sleep", time_limit=1)
def plain_sleep(label: str, seconds: float) -> None:
    """A plain task that sleeps past its hard time limit: the worker kills its process."""
    _plain_line(f"plain-sleep {label}")
    time.sleep(seconds)


@shared_task(name="tests.jobsapp.tasks.plain_nap")
def plain_nap(label: str, seconds: float) -> str:
    """A plain task that marks its start, sleeps, and marks its end."""
    _plain_line(f"plain-nap {label} start")
    time.sleep(seconds)
    _plain_line(f"plain-nap {label} end")
    return f"{label} rested"


@shared_task(name="tests.jobsapp.tasks.plain_commit_then_die")
def plain_commit_then_die(label: str) -> str:
    """A plain task that succeeds; a task_postrun hook then kills the worker before it acknowledges."""
    _plain_line(f"plain-commit-then-die {label}")
    return "ok"


def _ticker(name: str, code: str, seconds: int, **options: object) -> None:
    """A job that marks each run, every ``seconds``, named ``name`` (task ``tests.jobsapp.tasks.<name>``)."""

    def body(run: Run) -> str:
        mark(run, name)
        return "tick"

    body.__name__ = body.__qualname__ = name.replace("-", "_")
    cron_task(name=name, code=code, task_name=f"tests.jobsapp.tasks.{body.__name__}",
              schedule=every(seconds=seconds), **options)(body)  # type: ignore[arg-type]


# One two-second job per catch-up policy (tests/faults/test_beat.py stops a beat under them).
for _code, _policy in (("T110", "none"), ("T111", "latest"), ("T112", "all")):
    _ticker(f"catch-up-{_policy}", _code, 2, pattern="always", overlap="allow", catch_up=_policy)

# Twenty jobs on one- and two-second intervals, declared when CRON_TEST_FLEET is set.
if os.environ.get("CRON_TEST_FLEET") == "1":
    for _index in range(20):
        _ticker(f"fleet-{_index:02d}", f"F{_index:02d}", 1 + _index % 2, catch_up="all",
                pattern="always" if _index % 2 == 0 else "standard", overlap="allow" if _index % 2 == 0 else "skip")

# Four five-second jobs, each sent a fixed offset below 4.5 s after its slots (jitter), declared
# when CRON_TEST_JITTER is set (tests/faults/test_beat.py runs two beats under them).
if os.environ.get("CRON_TEST_JITTER") == "1":
    for _index in range(4):
        _ticker(f"jittered-{_index}", f"J{_index:02d}", 5, jitter=4.5, pattern="always", overlap="allow",
                catch_up="all")


# Retries, time limits and dying workers (tests/test_retries.py, tests/faults/test_retries.py).
def _stamp(run: Run, label: str) -> None:
    mark(run, f"{label} attempt={run.attempt} t={time.time():.3f}")


@cron_task(name="flaky-twice", code="T120", pattern="rerun_on_failure", max_retries=3, retry_backoff=1,
           retry_jitter=False, retry_on=(ConnectionError,))
def flaky_twice(run: Run) -> str:
    """Fails its first two attempts with a retryable error, then succeeds."""
    _stamp(run, "flaky-twice")
    if run.attempt <= 2:
        raise ConnectionError(f"partner API unreachable (attempt {run.attempt})")
    return f"synced on attempt {run.attempt}"


@cron_task(name="dies-once", code="T121", max_retries=2, retry_backoff=1, retry_jitter=False)
def dies_once(run: Run) -> str:
    """Waits to be killed on its first attempt (the test SIGKILLs the process); then succeeds."""
    _stamp(run, "dies-once")
    if run.attempt == 1:
        time.sleep(60)
    return f"done on attempt {run.attempt}"


@cron_task(name="poison", code="T122", max_retries=2)
def poison(run: Run) -> None:
    """Kills its own process every time."""
    _stamp(run, "poison")
    os.kill(os.getpid(), 9)


@cron_task(name="soft-limited", code="T123", pattern="always", max_retries=1, retry_backoff=1,
           retry_jitter=False, soft_time_limit=1, time_limit=5)
def soft_limited(run: Run) -> str:
    """Sleeps past its soft time limit on every attempt."""
    _stamp(run, "soft-limited")
    time.sleep(4)
    return "never"


@cron_task(name="hard-limited", code="T124", pattern="always", time_limit=2)
def hard_limited(run: Run) -> str:
    """Ignores time at 01:00 (the hard limit kills it); returns at once for other slots."""
    _stamp(run, "hard-limited")
    if run.slot.minute == 0:
        time.sleep(30)
    return "quick"


@cron_task(name="cooperative", code="T125", pattern="always", max_retries=1, retry_backoff=1, retry_jitter=False)
def cooperative(run: Run) -> str:
    """A long job that stops early when its worker shuts down (and is tried again later)."""
    _stamp(run, "cooperative")
    if run.attempt > 1:
        return "finished on the second attempt"
    for _ in range(600):
        if run.shutdown_requested():
            _stamp(run, "cooperative-saw-shutdown")
        run.check()
        time.sleep(0.1)
    return "ran to the end"


@cron_task(name="commit-then-die", code="T126", pattern="always")
def commit_then_die(run: Run) -> str:
    """Succeeds; a task_postrun hook then kills the worker before it acknowledges the message."""
    _stamp(run, "commit-then-die")
    return "ok"


@task_postrun.connect
def _die_after_commit(sender: object = None, **kwargs: object) -> None:
    dying = (commit_then_die.name, "tests.jobsapp.tasks.plain_commit_then_die")
    if getattr(sender, "name", "") in dying and os.environ.get("CRON_TEST_DIE_AFTER_COMMIT"):
        os.killpg(os.getpgid(0), 9)  # the whole worker: the outcome is committed, the ack never sent


# Jobs of the other test modules, grouped by topic (each module declares its own).
from tests.jobsapp import (  # noqa: E402
    jobs_buffer,
    jobs_chain,
    jobs_database,
    jobs_deps,
    jobs_edits,
    jobs_ident,
    jobs_leader,
    jobs_leases,
    jobs_params,
    jobs_results,
    jobs_routing,
)

__all__ = ["jobs_buffer", "jobs_chain", "jobs_database", "jobs_deps", "jobs_edits", "jobs_ident", "jobs_leader",
           "jobs_leases", "jobs_params", "jobs_results", "jobs_routing"]


# Active windows and one_off (tests/faults/test_windows.py): a one-second job whose window is
# CRON_TEST_WINDOW's two epoch seconds, and a two-second job the test makes one_off in the admin.
if os.environ.get("CRON_TEST_WINDOW"):
    _opens, _closes = (dt.datetime.fromtimestamp(float(value), dt.UTC)
                       for value in os.environ["CRON_TEST_WINDOW"].split(","))
    _ticker("windowed", "W01", 1, pattern="always", overlap="allow", catch_up="all", active_from=_opens,
            active_until=_closes)
    _ticker("once-only", "W02", 2, pattern="always", overlap="allow")


# Timing alerts (tests/faults/test_timing.py): a job sent to a queue no worker consumes, with a
# two-second start_deadline, and one that runs six seconds against a two-second max_runtime.
if os.environ.get("CRON_TEST_TIMING") == "1":
    _unconsumed = f"{os.environ.get('CRON_CELERY_TEST_QUEUE', 'cron-celery-test')}-q-nobody"
    _ticker("unconsumed", "TT1", 3, queue=_unconsumed, start_deadline=2, catch_up="none")

    @cron_task(name="overruns", code="TT2", schedule=every(seconds=3), max_runtime=2, catch_up="none")
    def overruns(run: Run) -> str:
        """Runs six seconds against a two-second max_runtime (not stopped: it finishes)."""
        mark(run, "overruns")
        time.sleep(6)
        return "finished, late"


if os.environ.get("CRON_TEST_MISSPELT") == "1":  # a newcomer's typo: max_retry= for max_retries=
    @cron_task(name="misspelt", code="T199", schedule="*/5 * * * *", max_retry=2)  # type: ignore[misc]
    def misspelt(run: Run) -> str:
        return "never declared"


# pause_after_failures (tests/faults/test_pause_ends.py): a job that fails every slot until a file
# says it is fixed, and pauses itself after three failures in a row.
if os.environ.get("CRON_TEST_PAUSE_AFTER") == "1":

    @cron_task(name="fails-until-fixed", code="PF1", schedule=every(seconds=2), pattern="always", overlap="allow",
               catch_up="none", pause_after_failures=3)
    def fails_until_fixed(run: Run) -> str:
        """Fails until the file named by CRON_TEST_FIXED exists."""
        mark(run, "fails-until-fixed")
        if not os.path.exists(os.environ.get("CRON_TEST_FIXED", "/nonexistent")):
            raise ConnectionError("the warehouse is unreachable")
        return "fixed"


# overlap="buffer_one" (tests/faults/test_buffer_one.py): a 5 s body every 2 s — one slot waits for the
# live run, the others are skipped.
if os.environ.get("CRON_TEST_BUFFER_ONE") == "1":

    @cron_task(name="buffers-one", code="BO1", schedule=every(seconds=2), pattern="always", overlap="buffer_one",
               catch_up="none")
    def buffers_one(run: Run) -> str:
        mark(run, "buffers-one")
        time.sleep(5)
        return "done"
