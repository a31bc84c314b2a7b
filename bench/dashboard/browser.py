"""The picture itself: the HTML page screenshotted whole by headless Chromium (Debian's, driven
by Playwright)."""

from __future__ import annotations

from pathlib import Path

from bench.dashboard.machine import CHROMIUM, debian_tool


def screenshot(html_path: Path, out: Path, width: int) -> None:
    from playwright.sync_api import sync_playwright

    debian_tool(CHROMIUM, "chromium")
    out.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            tab = browser.new_page(viewport={"width": width, "height": 900}, device_scale_factor=1)
            tab.goto(html_path.as_uri())
            tab.screenshot(path=str(out), full_page=True)
        finally:
            browser.close()
