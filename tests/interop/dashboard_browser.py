"""Ray's dashboard web UI opened in headless Chromium, and the facts each page shows.

Chromium and its chromedriver are Debian's (``scripts/ensure_browser.sh`` installs them
before the suite); Selenium drives them, told both binaries' paths so that nothing is
downloaded at run time.  Selenium was chosen over Playwright because Playwright's Python
package brings its own Node driver and expects a browser build of its own (which cannot be
downloaded here), while Debian ships a chromedriver of exactly its Chromium's version; over
``chromium --headless --dump-dom`` because a page must be waited on by a condition (the
dashboard's React pages fill in from polled APIs), not by a virtual-time budget.

:func:`page_tables` reads what a page renders: its visible text and every table's header
and body cells, as the user sees them.  The caller turns that into facts and compares.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from gcs.testing.ports import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1600,1000",
)
PAGE_TIMEOUT_S = 120.0
"""Bounds a hang only: a page is read as soon as its condition holds."""

T = TypeVar("T")

READ_PAGE = """
const cells = (row, tag) => Array.from(row.querySelectorAll(tag)).map(c => c.innerText.trim());
return {
  text: document.body.innerText,
  tables: Array.from(document.querySelectorAll("table")).map(t => ({
    headers: Array.from(t.querySelectorAll("thead tr")).flatMap(r => cells(r, "th")),
    rows: Array.from(t.querySelectorAll("tbody tr")).map(r => cells(r, "td")),
  })),
};
"""


@dataclass(frozen=True)
class Page:
    """What one dashboard page shows: its visible text and its tables."""

    text: str
    tables: list[dict[str, Any]]

    def table(self, header: str) -> list[dict[str, str]]:
        """The rows (header -> cell text) of the first table with a ``header`` column."""
        for table in self.tables:
            headers = table["headers"]
            if header in headers:
                return [dict(zip(headers, row, strict=False)) for row in table["rows"]]
        return []


class Browser:
    """One headless Chromium under chromedriver; :meth:`read` opens a dashboard route."""

    def __init__(self, driver: Any) -> None:
        self._driver = driver

    def read(
        self, url: str, facts: Callable[[Page], T], ready: Callable[[T], bool], what: str
    ) -> T:
        """Open ``url`` and return ``facts(page)`` once ``ready`` holds for them (the
        dashboard polls its APIs: a table fills in after the first paint)."""
        self._driver.get("about:blank")  # a new load of the app, even for the same route
        self._driver.get(url)
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        while True:
            raw = self._driver.execute_script(READ_PAGE)
            seen = facts(Page(text=raw["text"], tables=raw["tables"]))
            if ready(seen):
                return seen
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not within {PAGE_TIMEOUT_S} s at {url}: {seen}")
            time.sleep(0.5)

    def screenshot(self, path: pathlib.Path) -> None:
        """The whole page (the window grown to the document's height) as a PNG."""
        height = self._driver.execute_script("return document.body.scrollHeight")
        self._driver.set_window_size(1600, max(1000, min(int(height) + 40, 2400)))
        self._driver.save_screenshot(str(path))
        self._driver.set_window_size(1600, 1000)


def unavailable() -> str:
    """Why :func:`headless_chromium` cannot start here ("" when it can)."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    if missing:
        return f"{' and '.join(missing)} not installed: run scripts/ensure_browser.sh"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium not installed: run scripts/bootstrap.sh (the test extras)"
    return ""


@contextlib.contextmanager
def headless_chromium() -> Iterator[Browser]:
    """Chromium with a new empty profile; chromedriver and the browser it starts run in a
    process group of their own, killed at the end whatever ``quit`` managed."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = pathlib.Path(tempfile.mkdtemp(prefix="chromium", dir="/tmp"))
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    service = Service(
        executable_path=CHROMEDRIVER,
        port=free_port(),
        log_output=subprocess.DEVNULL,
        popen_kw={"start_new_session": True},
    )
    driver, group = None, None
    try:
        driver = webdriver.Chrome(options=options, service=service)
        group = service.process.pid
        driver.set_page_load_timeout(PAGE_TIMEOUT_S)
        yield Browser(driver)
    finally:
        if driver is not None:
            with contextlib.suppress(Exception):
                driver.quit()
        if group is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        shutil.rmtree(profile, ignore_errors=True)
