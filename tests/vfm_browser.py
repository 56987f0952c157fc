"""Headless Chromium for the page tests: Debian's chromium package driven by Playwright.

A machine without chromium skips those tests with the reason, except where VFM_REQUIRE_BROWSER=1
(.ci/run sets it after installing the package): there a missing browser fails the test.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager

import pytest


def chromium_path() -> str:
    path = os.environ.get("VFM_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        message = "headless Chromium is needed: apt-get install chromium (or set VFM_CHROMIUM=<binary>)"
        if os.environ.get("VFM_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


@contextmanager
def browser_page():
    """(page, console problems): every console error and page error the page logs is collected."""
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page()
            problems: list[str] = []
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            yield page, problems
        finally:
            browser.close()
