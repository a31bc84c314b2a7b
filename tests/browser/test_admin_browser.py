"""The admin as a person sees it: headless Debian Chromium driven by Playwright against a
live server on the test database. Screenshots are saved under ``artifacts/screenshots``.

Chromium comes from Debian's ``chromium`` package; the session fixture installs it (with
``chromium-driver``) when it is missing, and fails — never skips — when it cannot.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Iterator
from typing import Any, Literal

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import Browser, Page, ViewportSize, expect, sync_playwright

from cron_celery.beat import schedule_sync
from cron_celery.decisions import dispatch, finishes
from cron_celery.decisions import jobs as job_rows
from cron_celery.models import CronExecution, CronJob, Status, Trigger
from tests.conftest import ROOT, debian_tool
from tests.jobsapp import tasks as jobs
from tests.test_admin import history

pytestmark = pytest.mark.django_db(transaction=True)
CHROMIUM = "/usr/bin/chromium"
SHOTS = ROOT / "artifacts" / "screenshots"
PASSWORD = "a-long-browser-test-password"


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    debian_tool(CHROMIUM, "chromium", "the browser tests")
    debian_tool("/usr/bin/chromedriver", "chromium-driver", "the browser tests")
    SHOTS.mkdir(parents=True, exist_ok=True)
    # Playwright's sync API keeps an event loop in this thread; the ORM calls the tests make
    # between page actions are ordinary blocking calls, which Django would otherwise refuse.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser, live_server: Any) -> Iterator[Page]:
    get_user_model().objects.create_superuser("ops", "ops@example.com", PASSWORD)
    context = browser.new_context(viewport={"width": 1500, "height": 900}, accept_downloads=True)
    tab = context.new_page()
    tab.goto(f"{live_server.url}/admin/login/?next=/admin/")
    tab.fill("#id_username", "ops")
    tab.fill("#id_password", PASSWORD)
    tab.click("input[type=submit]")
    expect(tab.locator("#user-tools")).to_contain_text("ops")
    yield tab
    context.close()


def seed() -> dict[str, int]:
    """Jobs with some history: a healthy ticker, a failing report, a job never run."""
    schedule_sync.sync()
    declared = (("tick-2s", jobs.tick_2s), ("nightly-report", jobs.nightly_report),
                ("calc-commission", jobs.calc_commission))
    ids = {name: job_rows.job_id(task.job) for name, task in declared}
    history(ids["tick-2s"], 30)
    history(ids["nightly-report"], 3, Status.FAILED)  # the newest three
    history(ids["nightly-report"], 6, start=4)
    CronJob.objects.filter(id__in=[ids["tick-2s"], ids["nightly-report"]]).update(
        last_success_at=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1))
    CronJob.objects.filter(id=ids["tick-2s"]).update(last_status=Status.SUCCEEDED)
    CronJob.objects.filter(id=ids["nightly-report"]).update(last_status=Status.FAILED, consecutive_failures=3)
    return ids


def test_the_dashboard_shows_badges_charts_and_schedules(page: Page, live_server: Any) -> None:
    seed()
    page.goto(f"{live_server.url}/admin/cron_celery/cronjob/")
    page.click("#toggle-nav-sidebar")  # more room for the table, as a person would
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(CronJob.objects.count())
    report = rows.filter(has_text="nightly-report")
    report.locator("svg.cron-chart").scroll_into_view_if_needed()  # a person scrolls down; nothing sideways
    expect(report.locator("svg.cron-chart")).to_be_in_viewport()
    expect(report.locator(".cron-badge")).to_have_text("failed")
    expect(report).to_contain_text("every day at 02:00")
    expect(report.locator("svg.cron-chart rect")).to_have_count(9)
    ticker = rows.filter(has_text="tick-2s")
    expect(ticker.locator(".cron-badge")).to_have_text("succeeded")
    expect(ticker).to_contain_text("100 % of 30")
    expect(rows.filter(has_text="calc-commission")).to_contain_text("no runs yet")
    page.screenshot(path=str(SHOTS / "dashboard.png"), full_page=True)


#: The window the dashboard must fit with the admin's navigation sidebar open (its default).
NARROW: ViewportSize = {"width": 1280, "height": 800}
FITS = """() => [document.documentElement, document.querySelector('#changelist .results')]
    .filter(Boolean).map(box => [box.scrollWidth, box.clientWidth])"""


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_dashboard_fits_1280_pixels_with_the_sidebar_open(browser: Browser, live_server: Any,
                                                              theme: Literal["light", "dark"]) -> None:
    """No horizontal scrolling, the whole chart column in view, in the light and the dark theme."""
    get_user_model().objects.create_superuser("narrow", "ops@example.com", PASSWORD)
    seed()
    CronJob.objects.filter(name="nightly-report").update(
        schedule_problem="Invalid schedule '* * 30 2 *': it never fires")  # the longest schedule cell there is
    context = browser.new_context(viewport=NARROW, color_scheme=theme)
    page = context.new_page()
    page.goto(f"{live_server.url}/admin/login/?next=/admin/cron_celery/cronjob/")
    page.fill("#id_username", "narrow")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    expect(page.locator("#nav-sidebar")).to_be_visible()
    expect(page.locator("#result_list tbody tr")).to_have_count(CronJob.objects.count())
    page.screenshot(path=str(SHOTS / f"dashboard-1280-{theme}.png"))
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert (background == "rgb(255, 255, 255)") == (theme == "light"), f"{theme}: the page's background {background}"
    for scrolled, shown in page.evaluate(FITS):
        assert scrolled <= shown, f"{theme}: {scrolled} px of content in {shown} px: a horizontal scrollbar"
    charts = page.locator("svg.cron-chart").all()
    assert charts, "no chart on the page"
    for chart in charts:  # every chart's whole width inside the window (the rows run on below it)
        box = chart.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= NARROW["width"], (theme, box)
    header = page.locator("#result_list thead th", has_text="last 30 runs")
    expect(header).to_be_in_viewport(ratio=1)
    context.close()


def test_editing_a_crontab_in_django_celery_beat_moves_the_next_slot(page: Page, live_server: Any) -> None:
    ids = seed()
    job = CronJob.objects.get(id=ids["nightly-report"])
    assert job.periodic_task is not None and job.periodic_task.crontab is not None
    page.goto(f"{live_server.url}/admin/cron_celery/cronjob/")
    row = page.locator("#result_list tbody tr", has_text="nightly-report")
    row.get_by_role("link", name="every day at 02:00").click()
    expect(page).to_have_url(f"{live_server.url}/admin/django_celery_beat/periodictask/{job.periodic_task.id}/change/")
    page.goto(f"{live_server.url}/admin/django_celery_beat/crontabschedule/{job.periodic_task.crontab.id}/change/")
    page.fill("#id_hour", "5")
    page.fill("#id_minute", "45")
    page.click("input[name=_save]")
    expect(page.locator(".messagelist")).to_contain_text("was changed successfully")
    schedule_sync.apply_edits()  # what the running beat does within a second of the edit
    page.goto(f"{live_server.url}/admin/cron_celery/cronjob/")
    row = page.locator("#result_list tbody tr", has_text="nightly-report")
    expect(row).to_contain_text("every day at 05:45")
    moved = CronJob.objects.get(id=job.id).next_run_at
    assert moved is not None and moved.astimezone(jobs.nightly_report.job.tzinfo).time() == dt.time(5, 45)
    expect(row).to_contain_text(moved.strftime("%Y-%m-%d %H:%M UTC"))
    page.screenshot(path=str(SHOTS / "dashboard-after-edit.png"), full_page=True)


def test_the_history_filters_reruns_and_exports(page: Page, live_server: Any) -> None:
    ids = seed()
    page.goto(f"{live_server.url}/admin/cron_celery/cronexecution/")
    page.locator("#changelist-filter").get_by_role("link", name="Failed").first.click()
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.first.locator(".cron-badge")).to_have_text("failed")
    page.screenshot(path=str(SHOTS / "history-failed.png"), full_page=True)
    rows.first.locator("input.action-select").check()
    page.select_option("select[name=action]", "rerun")
    page.click("button[name=index]")
    expect(page.locator(".messagelist")).to_contain_text("sent again")
    rerun = CronExecution.objects.get(job_id=ids["nightly-report"], trigger=Trigger.ADMIN)
    assert rerun.forced and rerun.status == Status.PENDING
    page.locator("#action-toggle").check()
    page.select_option("select[name=action]", "export_csv")
    with page.expect_download() as download_info:
        page.click("button[name=index]")
    download = download_info.value
    target = SHOTS.parent / "failed-executions.csv"
    download.save_as(str(target))
    lines = target.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("id,task_name,task_code") and len(lines) == 1 + 3
    page.goto(f"{live_server.url}/admin/cron_celery/cronexecution/{rerun.id}/change/")
    expect(page.locator("body")).to_contain_text("Every attempt")
    page.screenshot(path=str(SHOTS / "execution-detail.png"), full_page=True)


def test_waiting_revoked_and_refused_edits_are_visible(page: Page, live_server: Any) -> None:
    """What the issue's new states look like: a backfilled slot waiting for the live run, a revoked
    run, and a job whose admin edit could not be applied."""
    from cron_celery.decisions import claims

    ids = seed()
    job = jobs.nightly_report.job
    job_id = ids["nightly-report"]
    slot = dt.datetime(2026, 11, 20, 1, 0, tzinfo=dt.UTC)
    live = claims.begin(job=job, job_id=job_id, slot=slot + dt.timedelta(days=1), execution_date=slot.date(),
                        trigger=Trigger.MANUAL, force=True)
    waiting_id, _ = dispatch.enqueue(job=job, job_id=job_id, slot=slot, execution_date=slot.date(),
                                   trigger=Trigger.BACKFILL, forced=True)
    assert claims.begin(job=job, job_id=job_id, slot=slot, execution_date=slot.date(), trigger=Trigger.BACKFILL,
                        execution_id=waiting_id).outcome == claims.WAITING
    revoked_id, _ = dispatch.enqueue(job=job, job_id=job_id, slot=slot - dt.timedelta(days=1),
                                   execution_date=slot.date(), trigger=Trigger.ENQUEUE)
    assert finishes.revoke(execution_id=revoked_id, job_id=job_id, message="Revoked before it started.") is not None
    CronJob.objects.filter(id=ids["tick-2s"]).update(
        schedule_problem="Invalid schedule '* * 30 2 *': it never fires")
    page.goto(f"{live_server.url}/admin/cron_celery/cronexecution/?task_code__exact={job.code}")
    page.click("#toggle-nav-sidebar")  # room for the messages, as a person would
    rows = page.locator("#result_list tbody tr")
    waiting = rows.filter(has_text="Waiting: execution")
    expect(waiting).to_contain_text(f"execution {live.execution_id}")
    expect(waiting.locator(".cron-badge")).to_have_text("pending, waiting")
    expect(rows.filter(has_text="Revoked before it started").locator(".cron-badge")).to_have_text("revoked")
    page.screenshot(path=str(SHOTS / "history-waiting-revoked.png"), full_page=True)
    page.goto(f"{live_server.url}/admin/cron_celery/cronjob/")
    expect(page.locator("#result_list tbody tr").filter(has_text="tick-2s")).to_contain_text("it never fires")
    page.screenshot(path=str(SHOTS / "dashboard-schedule-problem.png"), full_page=True)


def test_the_upcoming_page_from_the_dashboard(page: Page, live_server: Any) -> None:
    """The dashboard's link opens the next hour of slots; a job's name leads to its history."""
    seed()
    page.goto(f"{live_server.url}/admin/cron_celery/cronjob/")
    page.get_by_role("link", name="Upcoming: the next hour of slots →").click()
    rows = page.locator("#upcoming tbody tr")
    expect(rows.first).to_contain_text("UTC")
    expect(page.locator("body")).to_contain_text("more slots")  # the every-2-seconds jobs, folded
    page.screenshot(path=str(SHOTS / "upcoming.png"), full_page=True)
    rows.filter(has_text="tick-2s").first.get_by_role("link", name="tick-2s").click()
    expect(page).to_have_url(re.compile(r"/admin/cron_celery/cronexecution/\?job=\d+$"))


def test_a_one_off_run_scheduled_shown_and_cancelled_in_the_admin(page: Page, live_server: Any) -> None:
    """The dashboard's action records a one-off run at a time typed in; the next-slot column and
    the Upcoming page show it; the history's action cancels it. A job whose window has ended says so."""
    ids = seed()
    CronJob.objects.filter(id=ids["tick-2s"]).update(active_until=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5))
    at = (dt.datetime.now(dt.UTC) + dt.timedelta(minutes=20)).replace(second=30, microsecond=0)
    page.goto(f"{live_server.url}/admin/cron_celery/cronjob/")
    page.locator(f"input[name=_selected_action][value='{ids['calc-commission']}']").check()
    page.select_option("select[name=action]", "schedule_one_off")
    page.click("button[name=index]")
    page.fill("#id_at", at.strftime("%Y-%m-%d %H:%M:%S"))
    page.screenshot(path=str(SHOTS / "one-off-form.png"), full_page=True)
    page.click("input[name=apply]")
    expect(page.locator(".messagelist")).to_contain_text("one-off run at")
    row = page.locator("#result_list tbody tr", has_text="calc-commission")
    expect(row).to_contain_text("one-off")
    expect(row).to_contain_text(at.strftime("%H:%M:%S UTC"))
    expect(page.locator("#result_list tbody tr", has_text="tick-2s")).to_contain_text("window ended")
    page.screenshot(path=str(SHOTS / "dashboard-one-off.png"), full_page=True)
    execution = CronExecution.objects.get(job_id=ids["calc-commission"], trigger=Trigger.ONE_OFF)
    page.goto(f"{live_server.url}/admin/cron_celery/cronjob/upcoming/")
    expect(page.locator("#upcoming")).to_contain_text(f"one-off run (execution {execution.id})")
    expect(page.locator("#upcoming")).not_to_contain_text("tick-2s")  # no slots once its window ended
    page.screenshot(path=str(SHOTS / "upcoming-one-off.png"), full_page=True)
    page.goto(f"{live_server.url}/admin/cron_celery/cronexecution/?trigger__exact=ONE_OFF")
    page.locator(f"input[name=_selected_action][value='{execution.id}']").check()
    page.select_option("select[name=action]", "cancel_one_off")
    page.click("button[name=index]")
    expect(page.locator(".messagelist")).to_contain_text("1 one-off run(s) cancelled")
    execution.refresh_from_db()
    assert (execution.status, execution.skip_reason) == (Status.SKIPPED, "CANCELLED")
    page.screenshot(path=str(SHOTS / "history-one-off-cancelled.png"), full_page=True)


def test_a_pause_with_a_note_and_an_end_from_the_dashboard(page: Page, live_server: Any) -> None:
    """The dashboard's Pause… asks why and until when; the job's status cell says both, and who; an
    end in the past is refused and pauses nothing."""
    ids = seed()
    until = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).replace(hour=8, minute=0, second=0, microsecond=0)
    page.goto(f"{live_server.url}/admin/cron_celery/cronjob/")
    page.locator(f"input[name=_selected_action][value='{ids['nightly-report']}']").check()
    page.select_option("select[name=action]", "pause")
    page.click("button[name=index]")
    page.fill("#id_note", "the warehouse is migrating")
    page.fill("#id_until", "2020-01-01 08:00")
    page.click("input[name=apply]")
    expect(page.locator(".messagelist")).to_contain_text("is not after now")
    assert not CronJob.objects.get(id=ids["nightly-report"]).paused
    page.locator(f"input[name=_selected_action][value='{ids['nightly-report']}']").check()
    page.select_option("select[name=action]", "pause")
    page.click("button[name=index]")
    page.fill("#id_note", "the warehouse is migrating")
    page.fill("#id_until", until.strftime("%Y-%m-%d %H:%MZ"))
    page.screenshot(path=str(SHOTS / "pause-form.png"), full_page=True)
    page.click("input[name=apply]")
    expect(page.locator(".messagelist")).to_contain_text("1 job(s) paused.")
    row = page.locator("#result_list tbody tr", has_text="nightly-report")
    expect(row).to_contain_text("paused")
    expect(row).to_contain_text(f"until {until:%Y-%m-%d %H:%M} UTC")
    expect(row).to_contain_text("by ops: the warehouse is migrating")
    page.screenshot(path=str(SHOTS / "dashboard-paused-until.png"), full_page=True)
    page.goto(f"{live_server.url}/admin/cron_celery/cronjob/{ids['nightly-report']}/change/")
    expect(page.locator("body")).to_contain_text("the warehouse is migrating")
    page.screenshot(path=str(SHOTS / "job-page-paused.png"), full_page=True)


def test_late_and_long_runs_show_as_badges_on_the_dashboard(page: Page, live_server: Any) -> None:
    """A run waiting past its job's start_deadline reads "late 4 min" beside the job's status, one
    running past its max_runtime "running 2 h"; a job within its bounds shows neither."""
    ids = seed()
    now = dt.datetime.now(dt.UTC)
    CronJob.objects.filter(id=ids["calc-commission"]).update(start_deadline=60)
    CronJob.objects.filter(id=ids["nightly-report"]).update(max_runtime=3600)
    CronJob.objects.filter(id=ids["tick-2s"]).update(start_deadline=3600, max_runtime=3 * 3600)
    for name, status, since in (("calc-commission", Status.PENDING, now - dt.timedelta(minutes=4, seconds=20)),
                                ("nightly-report", Status.RUNNING, now - dt.timedelta(hours=2, minutes=5)),
                                ("tick-2s", Status.RUNNING, now - dt.timedelta(hours=2, minutes=5))):
        job = CronJob.objects.get(id=ids[name])
        row = CronExecution.objects.create(
            job=job, task_code=job.code, task_name=job.name, slot=since.replace(second=0, microsecond=0),
            execution_date=since.date(), run_number=7, status=status, trigger=Trigger.BEAT, due_at=since,
            started=since if status == Status.RUNNING else None,
            lease_until=now + dt.timedelta(minutes=5) if status == Status.RUNNING else None)  # a live run
        CronExecution.objects.filter(id=row.id).update(created_at=since)  # the beat records a slot when due
    page.goto(f"{live_server.url}/admin/cron_celery/cronjob/")
    rows = page.locator("#result_list tbody tr")
    expect(rows.filter(has_text="calc-commission").locator(".cron-badge")).to_have_text(["never run", "late 4 min"])
    expect(rows.filter(has_text="nightly-report").locator(".cron-badge").first).to_have_text("failed")
    expect(rows.filter(has_text="nightly-report").locator(".cron-badge").nth(1)).to_have_text("running 2 h")
    expect(rows.filter(has_text="tick-2s").locator(".cron-badge")).to_have_text(["succeeded"])  # within bounds
    page.locator("#result_list").screenshot(path=str(SHOTS / "dashboard-timing.png"))
