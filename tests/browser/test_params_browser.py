"""Runs with parameters as a person does them in the admin, in headless Debian Chromium: the form made
from the job's signature sends a run that a real Celery worker (in-thread, on the Redis broker) runs
with the right Python types, and the history shows it; the periodic task's form refuses kwargs its job
cannot run with. Screenshots go to ``artifacts/screenshots`` (docs/operations.md shows copies of them).

Playwright's sync API allows one instance per thread, and ``test_admin_browser`` keeps its session-wide
one open in the main thread: these tests drive a Chromium of their own from a thread of their own, and
check the database from the test's thread between the pages.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest
from celery.contrib.testing.worker import start_worker
from django.contrib.auth import get_user_model
from django_celery_beat.models import PeriodicTask
from playwright.sync_api import Page, expect

from cron_celery.beat import schedule_sync
from cron_celery.decisions import jobs as job_rows
from cron_celery.declaring import params
from cron_celery.models import CronExecution, CronJob, Status, Trigger
from cron_celery.run.runs import Run
from cron_celery.schedules import at, daily
from tests.browser.test_admin_browser import CHROMIUM, PASSWORD, SHOTS
from tests.browser.threaded import run_in_thread
from tests.celery_app import app
from tests.conftest import debian_tool, wait_for
from tests.jobsapp import jobs_params

pytestmark = pytest.mark.django_db(transaction=True)
REPORT = jobs_params.param_report.job
Browse = Callable[[Callable[[Page], None]], None]


@pytest.fixture
def browse(live_server: Any, monkeypatch: pytest.MonkeyPatch) -> Browse:
    """``browse(steps)``: log in as ``ops`` in a Chromium of a thread of its own, run ``steps(page)``
    there, close it; a failure in the steps fails the test."""
    debian_tool(CHROMIUM, "chromium", "the browser tests")
    # Playwright's sync API keeps an event loop in the browsing thread; the ORM calls made there are
    # ordinary blocking calls, which Django would otherwise refuse.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    SHOTS.mkdir(parents=True, exist_ok=True)
    get_user_model().objects.create_superuser("ops", "ops@example.com", PASSWORD)

    def run(steps: Callable[[Page], None]) -> None:
        run_in_thread(live_server.url, steps)

    return run


def test_a_run_with_parameters_from_the_admin_form_reaches_a_real_worker_with_their_types(
        browse: Browse, live_server: Any, marker: Path) -> None:
    schedule_sync.sync()
    job_id = job_rows.job_id(REPORT)
    CronJob.objects.filter(id=job_id).update(params={"limit": 9})  # its scheduled value (the periodic task's kwargs)

    def send(page: Page) -> None:
        page.goto(f"{live_server.url}/admin/cron_celery/cronjob/")
        page.locator(f"input[name=_selected_action][value='{job_id}']").check()
        page.select_option("select[name=action]", "run_with_params")
        page.click("button[name=index]")
        expect(page.locator("#content h1")).to_have_text("Run param-report with parameters")
        expect(page.locator("#id_param_region")).to_have_value("eu")  # its default
        expect(page.locator("#id_param_limit")).to_have_value("9")  # its scheduled value, over the default 100
        page.select_option("#id_param_region", "us")
        page.fill("#id_param_day", "2026-11-30")
        page.check("#id_param_dry_run")
        page.fill("#id_param_ratio", "0.25")
        page.fill("#id_param_since", "2026-12-01 18:00")
        page.fill("#id_param_note", "from the browser")
        page.fill("#id_date", "2026-11-29")
        page.screenshot(path=str(SHOTS / "run-with-parameters-form.png"), full_page=True)
        page.click("input[name=apply]")
        expect(page.locator(".messagelist")).to_contain_text(
            "sent for 2026-11-29 00:00 UTC with region=us, day=2026-11-30, dry_run=true, limit=9")

    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False, loglevel="WARNING",
                      shutdown_timeout=30):
        browse(send)
        row = CronExecution.objects.get(task_code=REPORT.code)
        wait_for(lambda: CronExecution.objects.filter(id=row.id, completed=True).exists(), what="the worker's run")
    row.refresh_from_db()
    assert (row.status, row.trigger, row.params_given) == (Status.SUCCEEDED, Trigger.ADMIN, True)
    assert row.params == {"region": "us", "day": "2026-11-30", "dry_run": True, "limit": 9, "ratio": 0.25,
                          "since": "2026-12-01T18:00:00+00:00", "note": "from the browser"}
    [line] = [json.loads(text) for text in marker.read_text(encoding="utf-8").splitlines()]
    assert line["execution"] == row.id
    assert line["kwargs"] == {"region": ["str", "us"], "day": ["date", "2026-11-30"], "dry_run": ["bool", True],
                              "limit": ["int", 9], "ratio": ["float", 0.25],
                              "since": ["datetime", "2026-12-01T18:00:00+00:00"], "note": ["str", "from the browser"]}

    def look(page: Page) -> None:
        page.goto(f"{live_server.url}/admin/cron_celery/cronexecution/?job={job_id}")
        page.click("#toggle-nav-sidebar")  # room for the columns, as a person would
        listed = page.locator("#result_list tbody tr").first
        expect(listed).to_contain_text("region=us, day=2026-11-30, dry_run=true")
        expect(listed).to_contain_text("given")
        page.screenshot(path=str(SHOTS / "history-with-parameters.png"), full_page=True)
        page.goto(f"{live_server.url}/admin/cron_celery/cronexecution/{row.id}/change/")
        table = page.locator("fieldset", has_text="Parameters").first
        expect(table).to_contain_text("from the browser")
        expect(table).to_contain_text("given by hand")
        table.screenshot(path=str(SHOTS / "execution-parameters.png"))

    browse(look)


def _nightly(run: Run, *, region: Literal["eu", "us"] = "eu", limit: int = 10) -> None:
    """A scheduled job's body (declared on the fly)."""


def test_the_periodic_task_form_refuses_kwargs_its_job_cannot_run_with(browse: Browse, live_server: Any,
                                                                       declare: Any) -> None:
    declare("regional-report", "PB01", schedule=daily(at(6).am()),
            parameters=params.from_signature(_nightly, skip=1, job="regional-report"))
    schedule_sync.sync()
    task = PeriodicTask.objects.get(cron_job__code="PB01")
    refused: list[str] = []

    def edit(page: Page) -> None:
        page.goto(f"{live_server.url}/admin/django_celery_beat/periodictask/{task.id}/change/")
        page.locator("details:has(#id_kwargs) > summary").click()  # django-celery-beat folds its Arguments away
        page.fill("#id_kwargs", '{"region": "asia", "limit": 5}')
        page.click("input[name=_save]")
        expect(page.locator(".field-kwargs .errorlist")).to_contain_text(
            "Job 'regional-report' cannot take these parameters: region: expected one of 'eu', 'us', not 'asia'.")
        if not page.locator("#id_kwargs").is_visible():
            page.locator("details:has(#id_kwargs) > summary").click()
        page.locator("fieldset:has(#id_kwargs)").screenshot(path=str(SHOTS / "periodic-task-kwargs-refused.png"))
        refused.append(str(PeriodicTask.objects.get(id=task.id).kwargs))
        page.fill("#id_kwargs", '{"region": "us", "limit": 5}')
        page.click("input[name=_save]")
        expect(page.locator(".messagelist")).to_contain_text("was changed successfully")

    browse(edit)
    assert refused == ["{}"]  # nothing was saved of the refused form
    schedule_sync.apply_edits()  # what the running beat does within a second of the edit
    assert CronJob.objects.get(code="PB01").params == {"region": "us", "limit": 5}
