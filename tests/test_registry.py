"""Declaring jobs: both styles, validation, duplicates, discovery."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from celery import current_app

from cron_celery import ExecutionPattern, TrackedTask, cron_task, exceptions, register_task
from cron_celery.declaring import registry
from cron_celery.schedules import every


def test_both_declaration_styles_are_celery_tasks_based_on_tracked_task():
    from tests.jobsapp import tasks

    for task in (tasks.calc_commission, tasks.SyncExternalAPI, tasks.async_job):
        assert isinstance(task, TrackedTask)
        assert current_app.tasks[task.name] is task._get_current_object()
    assert registry.get("calc-commission").pattern == ExecutionPattern.RERUN_ON_FAILURE
    assert registry.get("A002").name == "sync-external-api"
    assert registry.get("sync-external-api").task_name == "tests.jobsapp.tasks.SyncExternalAPI"


def test_jobs_in_installed_apps_tasks_modules_are_discovered():
    names = {job.name for job in registry.all_jobs()}
    assert {"calc-commission", "sync-external-api", "slow-standard", "async-job"} <= names


@pytest.mark.parametrize("value", ["rerun_on_failure", "RERUN_ON_FAILURE", ExecutionPattern.RERUN_ON_FAILURE])
def test_pattern_accepts_the_enum_or_its_name(value):
    job = registry.declare(name="p", code="P1", task_name="x", pattern=value)
    assert job.pattern is ExecutionPattern.RERUN_ON_FAILURE


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"name": "Bad Name", "code": "C1"}, "lower-case slug"),
        ({"name": "ok", "code": "has space"}, "code must be"),
        ({"name": "ok", "code": "C1", "pattern": "sometimes"}, "pattern must be one of"),
        ({"name": "ok", "code": "C1", "overlap": "maybe"}, "overlap must be one of"),
        ({"name": "ok", "code": "C1", "timezone": "Mars/Olympus"}, "unknown timezone"),
    ],
)
def test_invalid_declarations_name_the_job_and_the_problem(kwargs, fragment):
    with pytest.raises(exceptions.ImproperlyDeclared) as info:
        registry.declare(task_name="x", **kwargs)
    assert fragment in str(info.value) and repr(kwargs["name"]) in str(info.value)


def test_a_duplicate_name_or_code_is_refused():
    with pytest.raises(exceptions.DuplicateJob, match="name 'calc-commission'"):
        @cron_task(name="calc-commission", code="Z900")
        def impostor(run):
            return None

    with pytest.raises(exceptions.DuplicateJob, match="code 'A001'"):
        @register_task("another-name", "A001")
        class Impostor(TrackedTask):
            def execute(self, date):
                return {}


def test_declaring_the_same_task_again_replaces_it():
    def body(run):
        return "v1"

    body.__module__ = "tests.dynamic"
    try:
        cron_task(name="redeclared", code="RD1")(body)
        cron_task(name="redeclared", code="RD1", pattern="always")(body)
        assert registry.get("redeclared").pattern == ExecutionPattern.ALWAYS
    finally:
        registry.unregister("redeclared")


def test_a_job_needs_a_code():
    with pytest.raises(exceptions.ImproperlyDeclared, match="code"):
        cron_task(name="codeless")(lambda run: None)


def test_register_task_only_decorates_tracked_task_subclasses():
    with pytest.raises(exceptions.ImproperlyDeclared, match="TrackedTask"):
        register_task("plain", "PL1")(object)  # type: ignore[arg-type]


def test_unknown_job_lists_the_known_ones(monkeypatch):
    monkeypatch.setattr(registry, "_loader", None)  # no tracked periodic tasks: no database to ask
    with pytest.raises(exceptions.UnknownJob) as info:
        registry.get("does-not-exist")
    assert "calc-commission" in str(info.value) and "list_cron_tasks" in str(info.value)


def test_a_job_no_code_declares_is_asked_of_the_loader_by_name_or_code_and_kept_a_moment(monkeypatch):
    asked: list[str] = []
    tracked = registry.Job(name="nightly-export", code="PT7", task_name="cron_celery.tracked:PT7",
                           pattern=ExecutionPattern.STANDARD, overlap="allow", timezone="UTC",  # type: ignore[arg-type]
                           tracked=True)

    def loader(name_or_code: str) -> registry.Job | None:
        asked.append(name_or_code)
        return tracked if name_or_code in ("nightly-export", "PT7") else None

    monkeypatch.setattr(registry, "_loaded", {})
    monkeypatch.setattr(registry, "_loader", loader)
    assert registry.get("PT7") is tracked and registry.get("PT7") is tracked and asked == ["PT7"]
    assert registry.get("nightly-export") is tracked
    assert registry.loaded("PT7", fresh=True) is tracked and asked == ["PT7", "nightly-export", "PT7"]
    with pytest.raises(exceptions.UnknownJob):
        registry.get("neither")
    assert registry.get("calc-commission").code == "A001" and "calc-commission" not in asked  # code first


def test_a_duplicate_stops_django_start_up(tmp_path):
    """A project whose tasks.py files declare the same code twice does not start."""
    import subprocess
    import sys

    app = tmp_path / "dupapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "tasks.py").write_text(
        "from cron_celery import cron_task\n"
        "@cron_task(name='one', code='DUP')\ndef one(run): pass\n"
        "@cron_task(name='two', code='DUP')\ndef two(run): pass\n"
    )
    (tmp_path / "dupsettings.py").write_text(
        "from tests.settings import *\nINSTALLED_APPS = [*INSTALLED_APPS, 'dupapp']\n"
    )
    from tests.conftest import ROOT

    result = subprocess.run(
        [sys.executable, "-m", "django", "check"], cwd=tmp_path, capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path}:{ROOT}",
             "DJANGO_SETTINGS_MODULE": "dupsettings"}, timeout=60, check=False,
    )
    assert result.returncode != 0
    assert "Two jobs share the code 'DUP'" in result.stderr


def test_a_schedule_is_normalised_in_the_jobs_timezone():
    from celery.schedules import crontab

    from cron_celery import models, schedules

    job = registry.declare(name="s", code="S1", task_name="x", timezone="Europe/Amsterdam",
                           schedule=crontab(minute=0, hour=1), catch_up="none")
    assert job.schedule == schedules.Cron("0", "1", timezone="Europe/Amsterdam")
    assert job.catch_up is models.CatchUp.NONE
    import datetime as dt

    assert job.first_slot_on(dt.date(2026, 7, 1)) == dt.datetime(2026, 6, 30, 23, 0, tzinfo=dt.UTC)
    every = registry.declare(name="e", code="E1", task_name="y", schedule=schedules.every(hours=2))
    assert every.next_slot(dt.datetime(2026, 7, 1, 1, tzinfo=dt.UTC)) == dt.datetime(2026, 7, 1, 2, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"schedule": "61 * * * *"}, "schedule is invalid"),
        ({"schedule": "0 0 31 2 *"}, "never fires"),
        ({"schedule": 42}, "schedule is invalid"),
        ({"catch_up": "sometimes"}, "catch_up must be one of"),
    ],
)
def test_an_invalid_schedule_or_catch_up_names_the_job(kwargs, fragment):
    with pytest.raises(exceptions.ImproperlyDeclared, match=fragment) as info:
        registry.declare(name="bad-sched", code="BS1", task_name="x", **kwargs)
    assert "'bad-sched'" in str(info.value)


@pytest.mark.parametrize(("kwargs", "problem"), [
    ({"catch_up_window": 0}, "catch_up_window must be a timedelta or a number of seconds greater than 0"),
    ({"catch_up_window": -dt.timedelta(hours=1)}, "catch_up_window must be a timedelta or a number of seconds"),
    ({"catch_up_window": "6h"}, "not '6h'"),
    ({"catch_up_window": True}, "not True"),
    ({"catch_up_window": float("nan")}, "not nan"),
    ({"catch_up_window": 1e9}, "at most 1e+08 s"),
    ({"catch_up_window": 3600, "catch_up": "none"}, "catch_up_window has no effect with catch_up='none'"),
    ({"catch_up_window": 3600, "schedule": None}, "catch_up_window is for a job with a schedule of its own"),
    ({"catch_up_window": 30}, "catch_up_window (30 s) must be at least 60 s"),
    ({"catch_up_window": 4, "schedule": every(seconds=10)}, "catch_up_window (4 s) must be at least 5 s"),
])
def test_a_bad_catch_up_window_names_the_job_and_the_value(kwargs, problem):
    options = {"schedule": "0 * * * *", "catch_up": "all", **kwargs}
    with pytest.raises(exceptions.ImproperlyDeclared, match=re.escape(problem)) as info:
        registry.declare(name="bad-window", code="BW1", task_name="x", **options)
    assert "'bad-window'" in str(info.value)


def test_a_catch_up_window_is_a_timedelta_or_seconds():
    hours = registry.declare(name="w", code="W1", task_name="x", schedule="0 * * * *", catch_up="all",
                             catch_up_window=dt.timedelta(hours=6))
    seconds = registry.declare(name="w2", code="W2", task_name="x", schedule=every(seconds=10), catch_up_window=5)
    plain = registry.declare(name="w3", code="W3", task_name="x", schedule="0 * * * *")
    assert (hours.catch_up_window, seconds.catch_up_window, plain.catch_up_window) == (21600.0, 5.0, None)


@pytest.mark.parametrize(("value", "problem"), [
    (0, "pause_after_failures must be an integer greater than 0, not 0."),
    (-2, "not -2"), (2.5, "not 2.5"), ("3", "not '3'"), (True, "not True"),
])
def test_a_bad_pause_after_failures_names_the_job_and_the_value(value, problem):
    with pytest.raises(exceptions.ImproperlyDeclared, match=re.escape(problem)) as info:
        registry.declare(name="bad-pause", code="BP1", task_name="x", pause_after_failures=value)
    assert "'bad-pause'" in str(info.value)


def test_pause_after_failures_is_declared():
    job = registry.declare(name="p", code="P1", task_name="x", schedule="0 * * * *", pause_after_failures=5)
    assert (job.pause_after_failures, registry.declare(name="q", code="Q1", task_name="y").pause_after_failures) == (
        5, None)


@pytest.mark.parametrize(
    ("option", "suggestion"),
    [("max_retry", "max_retries"), ("timout", "time_limit"), ("timeout", "time_limit"),
     ("soft_timelimit", "soft_time_limit"), ("retry_backof", "retry_backoff"), ("queu", "queue"),
     ("catchup", "catch_up"), ("colour", None), ("retry_delay", "retry_backoff")],
)
def test_a_misspelt_option_is_refused_at_declaration_naming_the_closest(option, suggestion):
    """Before, Celery kept any unknown keyword as a task attribute: ``max_retry=3`` declared a
    job that never retried, and nothing said so."""
    def body(run: object) -> None:
        return None

    given: dict[str, Any] = {option: 3}
    for declare in (lambda: cron_task(name=f"typo-{option}", code=f"TY-{option}", **given)(body),
                    lambda: register_task(f"typo-c-{option}", f"TC-{option}", **given)(
                        type("Typo", (TrackedTask,), {"execute": lambda self, date: None}))):
        with pytest.raises(exceptions.ImproperlyDeclared) as info:
            declare()
        text = str(info.value)
        assert f"{option}= is neither a cron job option nor a Celery task option" in text
        assert (f"did you mean {suggestion}=?" in text) if suggestion else "the job options are" in text
        assert not {f"typo-{option}", f"typo-c-{option}"} & {job.name for job in registry.all_jobs()}


def test_cron_task_given_register_tasks_execution_pattern_is_pointed_to_pattern():
    with pytest.raises(exceptions.ImproperlyDeclared, match=r"execution_pattern= .*did you mean pattern=\?"):
        cron_task(name="ep-typo", code="EP1", execution_pattern="always")(lambda run: None)


def test_celerys_real_task_options_still_reach_the_task():
    def with_celery_options(run: object) -> None:
        return None

    task = cron_task(name="with-celery-options", code="WCO1", queue="billing", priority=3, rate_limit="10/m",
                     ignore_result=True, throws=(KeyError,), expires=60)(with_celery_options)
    assert (task.queue, task.priority, task.rate_limit, task.ignore_result, task.throws, task.expires) == (
        "billing", 3, "10/m", True, (KeyError,), 60)
    registry.unregister("with-celery-options")


@pytest.mark.parametrize(("options", "problem"), [
    ({"overlap": "skip", "max_concurrency": 3}, "overlap='skip' already runs one at a time"),
    ({"pattern": "rate_limited", "overlap": "allow", "max_concurrency": 2}, "rate_limited pattern already runs one"),
    ({"overlap": "allow", "max_concurrency": 0}, "max_concurrency must be an integer greater than 0"),
    ({"overlap": "allow", "max_concurrency": "3"}, "max_concurrency must be an integer greater than 0"),
    ({"overlap": "allow", "max_concurrency": 2.5}, "max_concurrency must be an integer greater than 0"),
])
def test_max_concurrency_is_for_overlap_allow_jobs_and_a_whole_number(options, problem):
    def limited(run: object) -> None:
        return None

    with pytest.raises(exceptions.ImproperlyDeclared, match=re.escape(problem)):
        cron_task(name="limited", code="LIM1", pattern=options.pop("pattern", "always"), **options)(limited)


@pytest.mark.django_db
def test_max_concurrency_is_the_jobs_limit_and_its_rows():
    """The claim and the waiting queue read the limit from the job's row: 1 for an exclusive job,
    max_concurrency when declared, empty otherwise."""
    from cron_celery.decisions import jobs as job_rows
    from cron_celery.models import CronJob

    def limited_ok(run: object) -> None:
        return None

    limited = cron_task(name="limited-ok", code="LIM2", pattern="always", overlap="allow", max_concurrency=4)(
        limited_ok).job
    try:
        exclusive = registry.declare(name="x-skip", code="X1", task_name="x.skip", overlap="skip")
        unlimited = registry.declare(name="x-any", code="X2", task_name="x.any", overlap="allow")
        assert [(job.max_concurrency, job.limit) for job in (limited, exclusive, unlimited)] == [
            (4, 4), (None, 1), (None, None)]
        for job, stored in ((limited, 4), (exclusive, 1), (unlimited, None)):
            assert CronJob.objects.get(id=job_rows.job_id(job)).max_concurrency == stored
    finally:
        registry.unregister("limited-ok")


def test_cron_tasks_docstring_lists_every_option_it_takes():
    """A new option without its line in ``cron_task``'s docstring (the API reference) fails here."""
    import re

    from cron_celery.run import decorators as tasks_module

    doc = tasks_module.cron_task.__doc__ or ""
    documented = set(re.findall(r"^    - ``(\w+)=``(?:, ``(\w+)=``)?", doc, re.MULTILINE))
    names = {name for pair in documented for name in pair if name}
    taken = ((set(tasks_module.DECLARATION_OPTIONS) - {"execution_pattern"}) | {"task_name"}
             | set(tasks_module.JOB_OPTIONS))
    assert names == taken, (sorted(taken - names), sorted(names - taken))


def test_a_misspelt_option_stops_django_in_three_lines_naming_the_fix_and_the_line():
    """The newcomer's typo (max_retry= for max_retries=) in a tasks module: ``manage.py`` (and so a
    worker or beat, which start Django the same way) stops with the error and where it is, not a
    traceback through django.setup()."""
    from tests.conftest import manage, subprocess_env

    done = manage("check", env=subprocess_env(CRON_TEST_MISSPELT="1"))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and len(lines) == 3, done.stderr
    assert lines[0] == "cron_celery: a job is declared wrongly, so this process does not start:"
    assert "Job 'misspelt' is declared incorrectly: max_retry= is neither" in lines[1]
    assert "(did you mean max_retries=?)" in lines[1]
    assert lines[2].startswith("  in ") and "tests/jobsapp/tasks.py, line " in lines[2] and "max_retry=2" in lines[2]


def test_of_several_bad_options_the_first_in_the_declarations_order_is_named():
    """The checks run in one order (alert_on_upstream, jitter, notify, retry_on, catch_up), so the same
    mistakes always give the same error, whatever the code that builds the job looks like."""
    with pytest.raises(exceptions.ImproperlyDeclared) as refused:
        registry.declare(name="order-job", code="ORD1", task_name="t.order", schedule="*/5 * * * *",
                         notify="nope", retry_on="nope", catch_up="sometimes")
    assert "notify" in str(refused.value) and "catch_up" not in str(refused.value), str(refused.value)
