"""What a person sees when the web process's cron_celery settings are broken: the dashboard's
banner, in headless Debian Chromium driven by Playwright against a live server on the test
database. The screenshot is saved as ``artifacts/screenshots/dashboard-check-error.png`` (and
its top, for docs/img, as ``dashboard-check-error-top.png``).

Playwright's sync API allows one instance per thread, and ``test_admin_browser`` keeps its
session-wide one open in the main thread; this test drives its own Chromium from a thread of
its own.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import override_settings
from playwright.sync_api import expect, sync_playwright

from tests.browser.test_admin_browser import CHROMIUM, PASSWORD, SHOTS, seed
from tests.conftest import debian_tool

pytestmark = pytest.mark.django_db(transaction=True)


def look(url: str) -> None:
    """Log in, open the dashboard, check the banner and take the screenshots."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            page = browser.new_context(viewport={"width": 1500, "height": 900}).new_page()
            page.goto(f"{url}/admin/login/?next=/admin/")
            page.fill("#id_username", "ops")
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            expect(page.locator("#user-tools")).to_contain_text("ops")
            page.goto(f"{url}/admin/cron_celery/cronjob/")
            banner = page.locator(".cron-check-banner")
            expect(banner).to_be_visible()
            expect(banner).to_contain_text("found 3 errors in this web process")
            expect(banner.locator("li")).to_have_count(3)
            expect(banner).to_contain_text("cron_celery.E007")
            expect(banner).to_contain_text("cron_celery.E014")
            expect(banner).not_to_contain_text("too-short-token")
            expect(page.locator("#result_list tbody tr").first).to_be_visible()  # the dashboard is still there
            page.screenshot(path=str(SHOTS / "dashboard-check-error.png"), full_page=True)
            box = banner.bounding_box()
            assert box is not None
            page.screenshot(path=str(SHOTS / "dashboard-check-error-top.png"),
                            clip={"x": 0, "y": 0, "width": 1500, "height": box["y"] + box["height"] + 260})
        finally:
            browser.close()


def test_the_dashboard_banner_names_the_check_errors_of_this_web_process(live_server: Any) -> None:
    debian_tool(CHROMIUM, "chromium", "the browser tests")
    SHOTS.mkdir(parents=True, exist_ok=True)
    seed()
    get_user_model().objects.create_superuser("ops", "ops@example.com", PASSWORD)
    broken = {**settings.CRON_CELERY, "LOCK": {"TTL": 120}, "LEASE_SECONDS": 60,
              "API_TOKENS": {"prometheus": {"token": "too-short-token", "scopes": ["read", "metrics"]}}}
    failures: list[BaseException] = []

    def browse() -> None:
        try:
            look(live_server.url)
        except BaseException as error:  # raised again in the test's thread
            failures.append(error)

    with override_settings(CRON_CELERY=broken):
        browsing = threading.Thread(target=browse, name="banner-browser", daemon=True)
        browsing.start()
        browsing.join(timeout=240)
    assert not browsing.is_alive(), "the browser did not finish"
    if failures:
        raise failures[0]
    assert (SHOTS / "dashboard-check-error.png").stat().st_size > 0
