"""``fencepost ui`` over several stores through the real console script, a shard set in Python, and a
real browser watching a run of the second store change status live."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from html import unescape
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

import fencepost
from fencepost.ui import create_app
from fencepost.ui.server import UiServer
from tests.cli.conftest import fencepost_exe
from tests.conftest import drop_schema, require_postgres

from .conftest import PENDING, TESTER, screenshot_dir
from .test_browser import _shot, _status_of, _until, browser  # noqa: F401  (the browser fixture)
from .test_cli import _get_when_up, _serve, _stop

ROW = re.compile(r'<tr data-run-id="([^"]+)" data-store="([^"]+)"')
PASSWORD = "sekret-cli-pw"


@pytest.fixture
def mixed(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A SQLite file and a PostgreSQL schema (its URL with a password the server ignores), one run each."""
    schema = "t_" + uuid.uuid4().hex[:16]
    pg = make_url(require_postgres()).set(password=PASSWORD).render_as_string(hide_password=False)
    urls = {"edge": f"sqlite:///{tmp_path / 'edge.db'}", "central": f"{pg}?schema={schema}"}
    for name, url in urls.items():
        with fencepost.open(url) as store:
            store.runs.create(f"{name}-run", '{"flowName": "cli"}')
    yield urls
    drop_schema(require_postgres(), schema)


def test_ui_serves_one_console_over_several_db_and_hides_passwords(mixed):
    args = [a for name, url in mixed.items() for a in ("--db", f"{name}={url}")]
    proc, url = _serve(*args, "ui", "--port", "0")
    try:
        r = _get_when_up(url + "/")
        assert r.status_code == 200
        assert set(ROW.findall(r.text)) == {("edge-run", "edge"), ("central-run", "central")}
        assert httpx.get(url + "/runs/central/central-run", timeout=10).status_code == 200
        pages = [httpx.get(url + p, timeout=10).text for p in ("/health", "/journal", "/projections")]
    finally:
        code, err = _stop(proc)
    assert code == 130, err
    assert all(PASSWORD not in text for text in pages)
    assert PASSWORD not in err


def test_ui_serves_a_shard_set_given_with_shards_file(tmp_path):
    import subprocess

    from .test_cli import _env

    urls = [f"sqlite:///{tmp_path / f's{i}.db'}" for i in range(3)]
    shards = tmp_path / "shards.txt"
    shards.write_text("# a shard set of three\n" + "\n".join(urls) + "\n")
    init = subprocess.run([fencepost_exe(), "--shards", str(shards), "init"], capture_output=True, text=True,
                          env=_env(), timeout=60)
    assert init.returncode == 0, init.stderr
    with fencepost.open_shards(urls) as shard_set:
        ids = [f"run-{i}" for i in range(9)]
        for rid in ids:
            shard_set.runs.create(rid, "{}")
        homes = {rid: shard_set.locate(rid) for rid in ids}
    assert len(set(homes.values())) >= 2
    proc, url = _serve("--shards", str(shards), "ui", "--port", "0")
    try:
        r = _get_when_up(url + "/")
        assert sorted(ROW.findall(r.text)) == sorted(homes.items())
        rid = ids[0]
        assert httpx.get(f"{url}/runs/{homes[rid]}/{rid}", timeout=10).status_code == 200
        moved = httpx.get(f"{url}/runs/{rid}", timeout=10, follow_redirects=False)
        assert moved.status_code == 307 and moved.headers["location"] == f"/runs/{homes[rid]}/{rid}"
    finally:
        code, err = _stop(proc)
    assert code == 130, err
    # Only some shards of the set: refused before anything is served.
    partial = tmp_path / "partial.txt"
    partial.write_text("\n".join(urls[:2]) + "\n")
    proc2 = subprocess.run([fencepost_exe(), "--shards", str(partial), "ui", "--port", "0"], capture_output=True,
                           text=True, env=_env(), timeout=60)
    assert proc2.returncode == 2 and "give every shard of the set" in proc2.stderr


def test_create_app_serves_a_shard_set_opened_read_only(tmp_path):
    urls = {f"s{i}": f"sqlite:///{tmp_path / f's{i}.db'}" for i in range(2)}
    with fencepost.open_shards(urls) as writable:
        for i in range(6):
            writable.runs.create(f"r-{i}", "{}")
        homes = {f"r-{i}": writable.locate(f"r-{i}") for i in range(6)}
    with fencepost.open_shards(urls, readonly=True) as shard_set, UiServer(create_app(stores=shard_set)) as console:
        text = httpx.get(console.url + "/", timeout=10).text
        assert sorted((unescape(r), s) for r, s in ROW.findall(text)) == sorted(homes.items())
        assert "merged across 2 stores (s0, s1)" in text


def test_one_named_store_keeps_the_single_store_console(tmp_path):
    url = f"sqlite:///{tmp_path / 'one.db'}"
    with fencepost.open(url) as store:
        store.runs.create("only", "{}")
    proc, served = _serve("--db", f"solo={url}", "ui", "--port", "0")
    try:
        r = _get_when_up(served + "/")
        assert '<tr data-run-id="only" data-revision=' in r.text and "<th>store</th>" not in r.text
        assert httpx.get(served + "/runs/only", timeout=10).status_code == 200
    finally:
        code, err = _stop(proc)
    assert code == 130, err


def test_a_page_over_two_stores_sees_a_run_of_the_second_change_live(mixed, browser, tmp_path):  # noqa: F811
    """The runs page and a run's page over a SQLite store and a PostgreSQL store, in a real browser."""
    from selenium.webdriver.common.by import By

    shots = screenshot_dir(tmp_path)
    names = list(mixed)
    second = names[1]

    def status_in(driver: Any, store: str, run_id: str) -> str | None:
        return driver.execute_script(
            "for (const tr of document.querySelectorAll('#runs tr[data-run-id]')) {"
            "  if (tr.dataset.runId === arguments[0] && tr.dataset.store === arguments[1])"
            "    return tr.querySelector('.status').textContent.trim(); }"
            "return null;", run_id, store)

    with fencepost.open(mixed[second]) as writer, \
            UiServer(create_app(mixed, tick=0.2, poll_interval=0.5)) as console:
        rid = f"live-{uuid.uuid4().hex[:8]}"
        writer.runs.create(rid, '{"flowName": "browser"}')
        browser.get(console.url + "/")
        _until(browser, "the live indicator says live", lambda d: d.find_element(By.ID, "live").text == "live")
        assert status_in(browser, second, rid) == "pending"
        assert status_in(browser, names[0], f"{names[0]}-run") == "pending"
        browser.execute_script("window.__notReloaded = true;")
        writer.runs.claim_and_own(rid, PENDING, TESTER, writer.clock.now_ms())
        _until(browser, "the second store's row shows running", lambda d: status_in(d, second, rid) == "running")
        appeared = f"new-{uuid.uuid4().hex[:8]}"
        writer.runs.create(appeared, "{}")
        _until(browser, "a new run of the second store appears", lambda d: status_in(d, second, appeared) == "pending")
        first = browser.find_element(By.CSS_SELECTOR, "#runs tbody tr")
        assert (first.get_attribute("data-run-id"), first.get_attribute("data-store")) == (appeared, second)
        assert first.find_element(By.CSS_SELECTOR, "a").get_attribute("href").endswith(f"/runs/{second}/{appeared}")
        assert browser.execute_script("return window.__notReloaded === true;")
        _shot(browser, shots, "runs-two-stores")

        browser.get(f"{console.url}/runs/{second}/{rid}")
        _until(browser, "the run page is live", lambda d: d.find_element(By.ID, "live").text == "live")
        assert browser.find_element(By.ID, "run-store").text == second
        browser.execute_script("window.__notReloaded = true;")
        writer.runs.transition_owned(rid, TESTER, "completed")
        _until(browser, "the run page shows completed", lambda d: d.execute_script(
            "const s = document.getElementById('run-status');"
            "return s !== null && s.textContent.trim() === 'completed';"))
        assert browser.execute_script("return window.__notReloaded === true;")
        _shot(browser, shots, "run-second-store")

        browser.get(console.url + "/health")
        _until(browser, "the health page is live", lambda d: d.find_element(By.ID, "live").text == "live")
        cell = f'section[data-store="{second}"] [data-field="revision"]'
        before = browser.find_element(By.CSS_SELECTOR, cell).text
        writer.runs.create(f"h-{uuid.uuid4().hex[:8]}", "{}")
        _until(browser, "the second store's feed position moves",
               lambda d: d.find_element(By.CSS_SELECTOR, cell).text != before)
        _shot(browser, shots, "health-two-stores")
        severe = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
        assert severe == []
