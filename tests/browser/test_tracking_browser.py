"""Tracking one periodic task, as a person does it in the admin: the periodic task's page offers the
choice, saving it links a job that the dashboard lists with its schedule, and the job's page names
its periodic task. Screenshots under ``artifacts/screenshots``. A Chromium of a thread of its own
(``threaded``), beside the session's browser fixture."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django_celery_beat.models import IntervalSchedule, PeriodicTask
from playwright.sync_api import Page, expect

from cron_celery.beat import schedule_sync
from cron_celery.models import CronJob, TrackedPeriodicTask
from tests.browser.test_admin_browser import CHROMIUM, PASSWORD, SHOTS
from tests.browser.threaded import run_in_thread
from tests.conftest import debian_tool

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_person_tracks_one_periodic_task_from_its_page_and_sees_its_job_on_the_dashboard(
        live_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    debian_tool(CHROMIUM, "chromium", "the browser tests")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # the ORM between page actions, in the browsing thread
    SHOTS.mkdir(parents=True, exist_ok=True)
    get_user_model().objects.create_superuser("ops", "ops@example.com", PASSWORD)
    every_5m, _ = IntervalSchedule.objects.get_or_create(every=300, period=IntervalSchedule.SECONDS)
    task = PeriodicTask.objects.create(name="Send the weekly digest", task="tests.jobsapp.tasks.plain_mark",
                                       args='["digest"]', interval=every_5m)

    def steps(page: Page) -> None:
        url = live_server.url
        page.goto(f"{url}/admin/django_celery_beat/periodictask/{task.id}/change/")
        choice = page.locator("#id_cron_tracking-0-track")
        choice.scroll_into_view_if_needed()
        expect(page.locator(".field-now").first).to_contain_text("not tracked")
        page.screenshot(path=str(SHOTS / "tracking-choice.png"), full_page=True)
        choice.select_option(label="Yes")
        page.locator("#id_cron_tracking-0-catch_up").select_option("latest")
        page.click("input[name=_save]")
        expect(page.locator(".messagelist")).to_contain_text("was changed successfully")
        assert TrackedPeriodicTask.objects.filter(periodic_task=task, track=True, catch_up="latest").exists()
        schedule_sync.sync()  # what the running beat does at its next tick (the save told it so)
        job = CronJob.objects.get(periodic_task=task)
        assert (job.name, job.code, job.catch_up) == ("send-the-weekly-digest", f"PT{task.id}", "latest")
        page.goto(f"{url}/admin/django_celery_beat/periodictask/{task.id}/change/")
        expect(page.locator(".field-now").first).to_contain_text(
            f"tracked as the job send-the-weekly-digest (PT{task.id})")
        page.goto(f"{url}/admin/cron_celery/cronjob/")
        row = page.locator("#result_list tbody tr").filter(has_text="send-the-weekly-digest")
        expect(row).to_contain_text("every 5 minutes")
        page.screenshot(path=str(SHOTS / "tracking-dashboard.png"), full_page=True)
        row.locator("a").first.click()
        expect(page.locator("#content")).to_contain_text("Send the weekly digest")
        page.screenshot(path=str(SHOTS / "tracking-job.png"), full_page=True)

    run_in_thread(live_server.url, steps)
