"""A Chromium of a thread of its own, for browser tests that run beside the session's browser
fixture (Playwright's sync API refuses a second one in the fixture's thread, whose event loop runs):
log in as ``ops``, run the test's steps, close everything, and raise a failure of the steps in the
test's thread."""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import connection
from playwright.sync_api import Page, expect, sync_playwright

from tests.browser.test_admin_browser import CHROMIUM, PASSWORD


def in_browser(url: str, steps: Callable[[Page], None]) -> None:
    """Log in as ``ops`` in a Chromium of this thread's own, run ``steps(page)``, close everything."""
    try:
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
                steps(page)
            finally:
                browser.close()
    finally:
        connection.close()  # this thread's own connection to the test database


def run_in_thread(url: str, steps: Callable[[Page], None], *, timeout: float = 300) -> None:
    """``in_browser`` in a thread of its own; a failure of the steps is raised here."""
    failures: list[BaseException] = []

    def browse() -> None:
        try:
            in_browser(url, steps)
        except BaseException as error:  # raised again in the test's thread
            failures.append(error)

    browsing = threading.Thread(target=browse, name="browser", daemon=True)
    browsing.start()
    browsing.join(timeout=timeout)
    assert not browsing.is_alive(), "the browser did not finish"
    if failures:
        raise failures[0]
