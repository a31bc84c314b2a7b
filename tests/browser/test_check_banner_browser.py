"""What a person sees when the web process's cron_celery settings are broken: the dashboard's
banner, in headless Debian Chromium driven by Playwright against a live server on the test
database. The screenshot is saved as ``artifacts/screenshots/dashboard-check-error.png`` (and
its top, for docs/img, as ``dashboard-check-error-top.png``).

Playwright's sync API allows one instance per thread, and ``test_admin_browser`` keeps its
session-wide one open in the main thread; this test drives its own Chromium from a thread of
its own.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import override_settings
from playwright.sync_api import Page, expect

from tests.browser.test_admin_browser import CHROMIUM, PASSWORD, SHOTS, seed
from tests.browser.threaded import run_in_thread
from tests.conftest import debian_tool

pytestmark = pytest.mark.django_db(transaction=True)


def look(page: Page) -> None:
    """Open the dashboard, check the banner and take the screenshots."""
    url = page.url.split("/admin/")[0]
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


def test_the_dashboard_banner_names_the_check_errors_of_this_web_process(live_server: Any) -> None:
    debian_tool(CHROMIUM, "chromium", "the browser tests")
    SHOTS.mkdir(parents=True, exist_ok=True)
    seed()
    get_user_model().objects.create_superuser("ops", "ops@example.com", PASSWORD)
    broken = {**settings.CRON_CELERY, "LOCK": {"TTL": 120}, "LEASE_SECONDS": 60,
              "API_TOKENS": {"prometheus": {"token": "too-short-token", "scopes": ["read", "meters"]}}}
    with override_settings(CRON_CELERY=broken):
        run_in_thread(live_server.url, look, timeout=240)
    assert (SHOTS / "dashboard-check-error.png").stat().st_size > 0
