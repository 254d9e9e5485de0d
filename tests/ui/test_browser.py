"""A real browser on the console: headless Chromium driven by Selenium.

Where Chromium or its driver is missing the test skips with the reason, except under
``FENCEPOST_REQUIRE_BROWSER=1`` (set by CI), where it fails with the reason: CI never skips it silently.
Screenshots of every page are saved under the test's tmp folder.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from .conftest import PENDING, TESTER, fact_owners, new_run, screenshot_dir, taken_over

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1100")
# A ceiling for polling, not a speed claim: a loaded 2-core machine needs more than a quiet one.
WAIT_S = 15.0


def _found(*candidates: str | None) -> str | None:
    return next((c for c in candidates if c and os.path.exists(c)), None)


@pytest.fixture
def browser(tmp_path: Path) -> Any:
    chromium = _found("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser"))
    driver = _found("/usr/bin/chromedriver", shutil.which("chromedriver"))
    why = None
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        why = "selenium is not installed (pip install -e '.[test]')"
    if why is None and (chromium is None or driver is None):
        why = ("no headless browser: install Debian's chromium and chromium-driver "
               "(apt-get install -y chromium chromium-driver)")
    if why is not None:
        if os.environ.get("FENCEPOST_REQUIRE_BROWSER") == "1":
            pytest.fail(f"a browser is required (FENCEPOST_REQUIRE_BROWSER=1): {why}")
        pytest.skip(why)
    options = Options()
    options.binary_location = chromium
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=driver, log_output=str(tmp_path / "chromedriver.log"))
    drv = webdriver.Chrome(options=options, service=service)
    drv.set_page_load_timeout(20)
    try:
        yield drv
    finally:
        drv.quit()


def _until(driver: Any, what: str, condition: Any) -> Any:
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.05).until(condition)
    except TimeoutException:
        raise AssertionError(f"within {WAIT_S} s: {what}") from None


def _status_of(driver: Any, run_id: str) -> str | None:
    return driver.execute_script(
        "for (const tr of document.querySelectorAll('#runs tr[data-run-id]')) {"
        "  if (tr.dataset.runId === arguments[0]) return tr.querySelector('.status').textContent.trim(); }"
        "return null;", run_id)


def _shot(driver: Any, folder: Path, name: str) -> Path:
    path = folder / f"{name}.png"
    assert driver.save_screenshot(str(path)), name
    assert path.stat().st_size > 5_000, name  # a rendered page, not an empty frame
    return path


def test_the_console_in_a_real_browser(console, writer, browser, tmp_path):
    """Runs page updates live after a write; a run's timeline SVG has one lane per owner; every page renders."""
    from selenium.webdriver.common.by import By

    shots = screenshot_dir(tmp_path)
    rid = new_run(writer, "ui-browser")
    browser.get(console.url + "/")
    _until(browser, "the live indicator says live", lambda d: d.find_element(By.ID, "live").text == "live")
    assert _status_of(browser, rid) == "pending"
    browser.execute_script("window.__notReloaded = true;")
    _shot(browser, shots, "runs")

    writer.runs.claim_and_own(rid, PENDING, TESTER, writer.clock.now_ms())
    _until(browser, "the row shows running", lambda d: _status_of(d, rid) == "running")
    writer.runs.transition_owned(rid, TESTER, "completed")
    _until(browser, "the row shows completed", lambda d: _status_of(d, rid) == "completed")
    appeared = new_run(writer, "ui-browser-new")
    _until(browser, "a new run appears at the top", lambda d: _status_of(d, appeared) == "pending")
    assert browser.execute_script("return window.__notReloaded === true;")  # live, not a reload
    first = browser.find_element(By.CSS_SELECTOR, "#runs tbody tr").get_attribute("data-run-id")
    assert first == appeared
    _shot(browser, shots, "runs-live")

    stolen = taken_over(writer)
    owners = fact_owners(writer, stolen)
    browser.get(console.url + "/runs/" + stolen)
    _until(browser, "the run page is live", lambda d: d.find_element(By.ID, "live").text == "live")
    svg = browser.find_element(By.CSS_SELECTOR, "svg.timeline")
    assert svg.is_displayed() and svg.size["width"] > 500
    lanes = browser.find_elements(By.CSS_SELECTOR, "svg.timeline g.lane")
    assert len(lanes) == len(owners) >= 2
    assert {lane.get_attribute("data-owner") for lane in lanes} == owners
    assert "replay: consistent" in browser.find_element(By.ID, "verdict").text
    _shot(browser, shots, "run")

    fresh = new_run(writer, "ui-browser-run")
    browser.get(console.url + "/runs/" + fresh)
    _until(browser, "the new run's page is live", lambda d: d.find_element(By.ID, "live").text == "live")
    assert browser.find_element(By.CSS_SELECTOR, "svg.timeline").get_attribute("data-lanes") == "0"
    browser.execute_script("window.__notReloaded = true;")
    writer.runs.claim_and_own(fresh, PENDING, TESTER, writer.clock.now_ms())
    # Read in one script: the live refresh swaps these elements, so a found element can go stale.
    _until(browser, "the run page shows running with one owner lane", lambda d: d.execute_script(
        "const s = document.getElementById('run-status');"
        "return s !== null && s.textContent.trim() === 'running'"
        " && document.querySelectorAll('svg.timeline g.lane').length === 1;"))
    assert browser.execute_script("return window.__notReloaded === true;")
    _shot(browser, shots, "run-live")

    for path, name, marker in (("/journal", "journal", "verify"), ("/projections", "projections", "projections"),
                               ("/health", "health", "health")):
        browser.get(console.url + path)
        assert browser.find_element(By.ID, marker).is_displayed()
        _until(browser, f"the {name} page is live", lambda d: d.find_element(By.ID, "live").text == "live")
        _shot(browser, shots, name)
    before = browser.find_element(By.CSS_SELECTOR, '[data-field="revision"]').text
    new_run(writer, "ui-browser-health")
    _until(browser, "the feed position moves on the health page",
           lambda d: d.find_element(By.CSS_SELECTOR, '[data-field="revision"]').text != before)

    browser.get(console.url + "/runs/no-such-run")
    assert "not_found_row" in browser.find_element(By.ID, "error-code").text
    _shot(browser, shots, "not-found")
    severe = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"
              and "/runs/no-such-run" not in e.get("message", "")]
    assert severe == []  # no script error, no blocked (CSP) resource
    assert len(list(shots.glob("*.png"))) == 8
