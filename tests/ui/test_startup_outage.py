"""The console starts while a store's database does not answer yet, and refuses a store that can never work.

Start-up now behaves as an outage later does: a store whose open fails transiently (its server is
not running: ``cannot_connect``) is served as down, with its error code and its URL's password
hidden, and picked up once it answers. The fault is real: a private PostgreSQL server
(``started_private``), stopped before the console starts and started again. PostgreSQL only for
that case: a SQLite file has no server, so no open of it fails transiently in a way a test can
hold (a missing file is a refusal, tested here on both backends with a missing PostgreSQL
database as its counterpart).
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

import fencepost
from tests.changefeed.test_follow_server_restart import PrivateServer, private_server  # noqa: F401
from tests.cli.conftest import fencepost_exe
from tests.conftest import require_postgres

from .conftest import EventStream
from .test_cli import _env, _get_when_up, _serve, _stop
from .test_several_stores_partial_outage import DOWN_MARK

PASSWORD = "pw-of-the-late-store-never-shown"


def _with_password(url: str) -> str:
    return make_url(url).set(password=PASSWORD).render_as_string(hide_password=False)


def _seeded_then_stopped(server: PrivateServer) -> str:
    """The server's URL (with a password it ignores), one run ``late-1`` in it, the server stopped."""
    url = _with_password(server.url)
    with fencepost.open(url) as store:
        store.runs.create("late-1", '{"flowName": "f"}')
    server.stop()
    return url


def test_the_console_starts_with_its_only_store_down_and_picks_it_up(
        private_server: PrivateServer) -> None:  # noqa: F811
    """Before: ``fencepost ui`` exited 1 with ``cannot_connect`` when its one PostgreSQL server was
    not running at start-up. Now it serves: pages are a 503 naming ``cannot_connect``, ``/health.json``
    names the error and the database (password hidden), the stream says ``unavailable``; once the
    server runs, the pages list its runs and its writes arrive live."""
    url = _seeded_then_stopped(private_server)
    proc, console = _serve("ui", "--db", url, "--port", "0")
    stream = None
    try:
        down_page = _get_when_up(console + "/")
        health = httpx.get(console + "/health.json", timeout=10)
        stream = EventStream(console)
        _, unavailable, _ = stream.wait(lambda n, d: n == "unavailable", 10)
        private_server.start()
        stream.wait(lambda n, d: n == "stats", 10)
        up_page = httpx.get(console + "/", timeout=10)
        with fencepost.open(url) as writer:
            writer.runs.create("late-2", '{"flowName": "f"}')
        stream.wait(lambda n, d: n == "run" and d["run_id"] == "late-2", 10)
    finally:
        if stream is not None:
            stream.close()
        code, err = _stop(proc)
    assert down_page.status_code == 503 and '<code id="error-code">cannot_connect</code>' in down_page.text
    assert health.status_code == 503 and health.json()["error"] == "cannot_connect"
    assert health.json()["database"].startswith("postgresql") and PASSWORD not in health.text
    assert unavailable == {"error": "cannot_connect"}
    assert up_page.status_code == 200 and 'data-run-id="late-1"' in up_page.text
    assert code == 130, err
    assert "cannot_connect" in err and "Traceback" not in err and PASSWORD not in err + down_page.text


def test_the_console_over_several_starts_with_one_store_down_and_picks_it_up(
        tmp_path: Path, private_server: PrivateServer) -> None:  # noqa: F811
    """Before: one store of several unreachable at start-up (its server stopped) made ``fencepost
    ui`` refuse to start. Now the other store is served, the late one is marked down with
    ``cannot_connect`` and its database (password hidden) on every overview page and in
    ``/health.json``, and once its server runs its runs are listed and its writes arrive live."""
    urls = {"a": f"sqlite:///{tmp_path / 'a.db'}", "b": _seeded_then_stopped(private_server)}
    with fencepost.open(urls["a"]) as store:
        store.runs.create("a-1", '{"flowName": "f"}')
    proc, console = _serve(*[x for name, url in urls.items() for x in ("--db", f"{name}={url}")], "ui", "--port", "0")
    stream = None
    try:
        pages = {path: _get_when_up(console + path) for path in ("/", "/journal", "/projections", "/health")}
        health = httpx.get(console + "/health.json", timeout=10)
        stream = EventStream(console)
        private_server.start()
        stream.wait(lambda n, d: n == "stats" and "health" in d["stores"]["b"], 10)
        up_page = httpx.get(console + "/", timeout=10)
        with fencepost.open(urls["b"]) as writer:
            writer.runs.create("b-2", '{"flowName": "f"}')
        stream.wait(lambda n, d: n == "run" and d["run_id"] == "b-2" and d["store"] == "b", 10)
    finally:
        if stream is not None:
            stream.close()
        code, err = _stop(proc)
    for path, page in pages.items():
        assert page.status_code == 200, (path, page.status_code)
        mark = DOWN_MARK.search(page.text)
        assert mark and mark.group(1) == "cannot_connect", (path, page.text[-2000:])
        assert PASSWORD not in page.text
    assert 'data-run-id="a-1" data-store="a"' in pages["/"].text
    assert health.status_code == 200 and health.json()["stores"]["b"]["error"] == "cannot_connect"
    assert health.json()["stores"]["b"]["database"].startswith("postgresql") and PASSWORD not in health.text
    assert 'data-run-id="late-1" data-store="b"' in up_page.text and not DOWN_MARK.search(up_page.text)
    assert code == 130, err
    assert "Traceback" not in err and PASSWORD not in err


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@pytest.mark.parametrize("several", [False, True], ids=["one-store", "beside-another"])
def test_a_store_that_can_never_open_still_refuses_the_start(tmp_path: Path, backend: str, several: bool) -> None:
    """A missing SQLite file (read-only: never created) or a PostgreSQL database that does not exist
    is no outage to wait out: the console exits 1 with one line naming ``database_missing``, alone
    or beside a store that opens."""
    if backend == "sqlite":
        missing = f"sqlite:///{tmp_path / 'absent.db'}"
    else:
        missing = make_url(require_postgres()).set(database="absent_" + uuid.uuid4().hex[:12]).render_as_string(
            hide_password=False)
    args = ["--db", f"bad={missing}"]
    if several:
        good = f"sqlite:///{tmp_path / 'good.db'}"
        fencepost.open(good).close()
        args = ["--db", f"good={good}", *args]
    proc = subprocess.run([fencepost_exe(), *args, "ui", "--port", "0"], capture_output=True, text=True,
                          env=_env(), timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("Error: ") and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "database_missing" in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "absent.db").exists()


def test_create_app_waits_for_a_store_that_does_not_answer(
        tmp_path: Path, private_server: PrivateServer) -> None:  # noqa: F811
    """``create_app(url)`` and ``create_app({name: url})`` start as the command does (the server
    stopped: its store is served as down) and refuse a URL that cannot open (``ValueError``, an
    ``OpenError`` that is no outage)."""
    from fencepost.errors import OpenError
    from fencepost.ui import create_app
    from fencepost.ui.server import UiServer

    url = _seeded_then_stopped(private_server)
    answering = f"sqlite:///{tmp_path / 'a.db'}"
    fencepost.open(answering).close()
    for served in (url, {"late": url, "a": answering}):
        app = create_app(served, tick=0.2, poll_interval=0.3)
        with UiServer(app) as console:
            health = httpx.get(console.url + "/health.json", timeout=10).json()
        part = health if isinstance(served, str) else health["stores"]["late"]
        assert part["error"] == "cannot_connect" and PASSWORD not in str(health)
    with pytest.raises(OpenError) as refused:
        create_app({"late": url, "gone": f"sqlite:///{private_server.root / 'absent.db'}"})
    assert refused.value.code == "database_missing"
    with pytest.raises(ValueError):
        create_app("mysql://nowhere/db")


