"""Headless Chromium for page tests: Debian's ``chromium`` driven by Selenium through ``chromedriver``.

Owns starting the browser offline (no Selenium Manager download, no background networking, a fresh
profile) and small helpers to read the page. The binaries come from the ``chromium`` and
``chromium-driver`` packages, which ``scripts/test`` installs when missing.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

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
    "--window-size=1280,1000",
)


def chromium() -> Iterator[webdriver.Chrome]:
    """A headless Chromium with its own throw-away profile; quit and removed when the generator closes."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        raise RuntimeError(
            f"{', '.join(missing)} missing: apt-get install chromium chromium-driver (scripts/test does)"
        )
    profile = tempfile.mkdtemp(prefix="crossway-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console errors, CSP violations included
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(check: Callable[[], Any], timeout_s: float = 20.0, what: str = "condition") -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def datasets(driver: webdriver.Chrome, selector: str) -> list[dict[str, str]]:
    """The ``data-*`` attributes of every element matching ``selector`` (camelCase keys, as in ``dataset``)."""
    script = "return [...document.querySelectorAll(arguments[0])].map((e) => Object.assign({}, e.dataset));"
    result: list[dict[str, str]] = driver.execute_script(script, selector)
    return result


def table(driver: webdriver.Chrome, selector: str, row_key: str) -> dict[str, dict[str, str]]:
    """A data table's body as ``{row's data-<row_key>: {field: data-value}}``."""
    script = """
        const out = {};
        for (const tr of document.querySelectorAll(arguments[0] + ' tbody tr')) {
            if (tr.dataset[arguments[1]] === undefined) continue;
            const row = {};
            for (const td of tr.cells) row[td.dataset.field] = td.dataset.value;
            out[tr.dataset[arguments[1]]] = row;
        }
        return out;
    """
    result: dict[str, dict[str, str]] = driver.execute_script(script, selector, row_key)
    return result


def console_errors(driver: webdriver.Chrome) -> list[str]:
    """The page's console errors since the last call (the browser log is drained by reading it)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
