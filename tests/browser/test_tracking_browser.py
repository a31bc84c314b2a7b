"""Tracking one periodic task, as a person does it in the admin: the periodic task's page offers the
choice, saving it links a job that the dashboard lists with its schedule, and the job's page names
its periodic task. Screenshots under ``artifacts/screenshots``."""

from __future__ import annotations

from typing import Any

import pytest
from django_celery_beat.models import IntervalSchedule, PeriodicTask
from playwright.sync_api import Page, expect

from cron_celery.beat import schedule_sync
from cron_celery.models import CronJob, TrackedPeriodicTask
from tests.browser.test_admin_browser import SHOTS, browser, page  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_person_tracks_one_periodic_task_from_its_page_and_sees_its_job_on_the_dashboard(
        page: Page, live_server: Any) -> None:  # noqa: F811
    every_5m, _ = IntervalSchedule.objects.get_or_create(every=300, period=IntervalSchedule.SECONDS)
    task = PeriodicTask.objects.create(name="Send the weekly digest", task="tests.jobsapp.tasks.plain_mark",
                                       args='["digest"]', interval=every_5m)
    page.goto(f"{live_server.url}/admin/django_celery_beat/periodictask/{task.id}/change/")
    choice = page.locator("#id_cron_tracking-0-track")
    choice.scroll_into_view_if_needed()
    expect(choice).to_be_visible()
    page.screenshot(path=str(SHOTS / "tracking-choice.png"), full_page=True)
    choice.select_option(label="Yes")
    page.locator("#id_cron_tracking-0-catch_up").select_option("latest")
    page.click("input[name=_save]")
    expect(page.locator(".messagelist")).to_contain_text("was changed successfully")
    assert TrackedPeriodicTask.objects.filter(periodic_task=task, track=True, catch_up="latest").exists()
    schedule_sync.sync()  # what the running beat does at its next tick (the save told it so)
    job = CronJob.objects.get(periodic_task=task)
    assert (job.name, job.code, job.catch_up) == ("send-the-weekly-digest", f"PT{task.id}", "latest")
    page.goto(f"{live_server.url}/admin/django_celery_beat/periodictask/{task.id}/change/")
    expect(page.locator(".field-now").first).to_contain_text(f"tracked as the job send-the-weekly-digest (PT{task.id})")
    page.goto(f"{live_server.url}/admin/cron_celery/cronjob/")
    row = page.locator("#result_list tbody tr").filter(has_text="send-the-weekly-digest")
    expect(row).to_contain_text("every 5 minutes")
    page.screenshot(path=str(SHOTS / "tracking-dashboard.png"), full_page=True)
    row.locator("a").first.click()
    expect(page.locator("#content")).to_contain_text("Send the weekly digest")
    page.screenshot(path=str(SHOTS / "tracking-job.png"), full_page=True)
