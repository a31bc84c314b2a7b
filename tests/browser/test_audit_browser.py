"""The audit log of schedule changes as a person makes and reads it: an edit through the periodic
task's admin form in headless Debian Chromium (Playwright) against a live server on the test
database leaves one row naming the admin user; the job's page shows it beside its runs, with what
the code declares beside the edit and the deploy warning; the dashboard's schedule column and the
audit log's list say the same. Screenshots are saved under ``artifacts/screenshots`` (and copied
into docs/img for docs/operations.md).

Playwright's sync API allows one instance per thread, and ``test_admin_browser`` keeps its
session-wide one open in the main thread; this test drives its own Chromium from a thread of its
own (as ``test_check_banner_browser`` does), and checks the database from there too.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django_celery_beat.models import CrontabSchedule
from playwright.sync_api import Page, expect

from cron_celery.beat import schedule_sync
from cron_celery.decisions import audit
from cron_celery.models import CronJob, ScheduleChange
from tests.browser.test_admin_browser import CHROMIUM, FITS, NARROW, PASSWORD, SHOTS, seed
from tests.browser.threaded import run_in_thread
from tests.conftest import debian_tool

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_edit_in_the_periodic_task_form_is_one_row_by_the_admin_user_shown_on_the_jobs_page(
        live_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    debian_tool(CHROMIUM, "chromium", "the browser tests")
    # Playwright's sync API keeps an event loop in the browsing thread; the ORM calls made there
    # between page actions are ordinary blocking calls, which Django would otherwise refuse.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    SHOTS.mkdir(parents=True, exist_ok=True)
    ids = seed()
    get_user_model().objects.create_superuser("ops", "ops@example.com", PASSWORD)
    job = CronJob.objects.get(id=ids["nightly-report"])
    other = CrontabSchedule.objects.create(minute="30", hour="4", timezone="Europe/Amsterdam")
    before = list(ScheduleChange.objects.filter(job_id=job.id).values_list("id", flat=True))
    assert len(before) == 1  # the deploy's sync linked its schedule

    def steps(page: Page) -> None:
        url = live_server.url
        page.goto(f"{url}/admin/django_celery_beat/periodictask/{job.periodic_task_id}/change/")
        expect(page.locator("body")).to_contain_text("in effect: 0 2 * * * (Europe/Amsterdam)")  # its job, named
        page.select_option("#id_crontab", str(other.id))
        page.click("input[name=_save]")
        expect(page.locator(".messagelist")).to_contain_text("was changed successfully")
        schedule_sync.apply_edits()  # what the running beat does within a second of the edit
        made = list(ScheduleChange.objects.filter(job_id=job.id).exclude(id__in=before))
        assert len(made) == 1, [(row.source, row.changes) for row in made]
        (edit,) = made
        assert (edit.actor, edit.source) == ("ops", audit.ADMIN_FORM)
        assert edit.changes == {"schedule": ["0 2 * * *", "30 4 * * *"]}

        page.goto(f"{url}/admin/cron_celery/cronjob/{job.id}/change/")
        changes = page.locator("table.cron-job-changes > tbody > tr")
        expect(changes).to_have_count(2)  # the edit, then the deploy's link
        expect(changes.first).to_contain_text("ops")
        expect(changes.first).to_contain_text("admin: change form")
        expect(changes.first).to_contain_text("0 2 * * *")
        expect(changes.first).to_contain_text("30 4 * * *")
        expect(page.locator("table.cron-job-runs > tbody > tr")).to_have_count(9)  # its runs, beside them
        declared = page.locator(".cron-declared").first
        expect(declared).to_contain_text("declared in code: 0 2 * * * (Europe/Amsterdam)")
        expect(declared).to_contain_text("replaces this admin edit with the code's schedule")
        page.screenshot(path=str(SHOTS / "job-page-audit.png"), full_page=True)
        box = page.locator("table.cron-job-changes").bounding_box()
        assert box is not None
        page.screenshot(path=str(SHOTS / "job-page-audit-top.png"), full_page=True,
                        clip={"x": 0, "y": 0, "width": 1500, "height": box["y"] + box["height"] + 60})

        page.set_viewport_size(NARROW)  # the dashboard still fits 1280 px with the sidebar open
        page.goto(f"{url}/admin/cron_celery/cronjob/")
        expect(page.locator("#nav-sidebar")).to_be_visible()
        row = page.locator("#result_list tbody tr", has_text="nightly-report")
        expect(row).to_contain_text("every day at 04:30")
        expect(row.locator(".cron-declared")).to_contain_text("declared in code: 0 2 * * *")
        for scrolled, shown in page.evaluate(FITS):
            assert scrolled <= shown, f"{scrolled} px of content in {shown} px: a horizontal scrollbar"
        row.scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / "dashboard-declared-in-code.png"))
        page.set_viewport_size({"width": 1500, "height": 900})

        page.goto(f"{url}/admin/cron_celery/schedulechange/?job={job.id}")
        rows = page.locator("#result_list > tbody > tr")
        expect(rows).to_have_count(2)
        expect(rows.first).to_contain_text("ops")
        page.screenshot(path=str(SHOTS / "schedule-changes.png"), full_page=True)

        page.goto(f"{url}/admin/django_celery_beat/periodictask/{job.periodic_task_id}/change/")
        expect(page.locator(".cron-declared").first).to_contain_text("declared in code: 0 2 * * *")
        page.screenshot(path=str(SHOTS / "periodic-task-declared-in-code.png"))

    run_in_thread(live_server.url, steps)
    assert ScheduleChange.objects.filter(job_id=job.id).count() == 2
