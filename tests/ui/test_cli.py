"""``fencepost ui`` through the real console script: serve, warn when exposed, say which extra is missing."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.cli.conftest import fencepost_exe


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    env["COLUMNS"] = "200"
    return env


def _serve(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([fencepost_exe(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())
    assert proc.stdout is not None
    line = proc.stdout.readline()  # printed before serving starts; bounded by the child exiting on error
    m = re.search(r"at (http://\S+)", line)
    if m is None:
        proc.kill()
        raise AssertionError(f"no URL announced: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    return proc, m.group(1)


def _get_when_up(url: str) -> httpx.Response:
    deadline = time.monotonic() + 10
    while True:
        try:
            return httpx.get(url, timeout=5)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _stop(proc: subprocess.Popen, sig: int = signal.SIGINT) -> tuple[int, str]:
    proc.send_signal(sig)
    try:
        code = proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"fencepost ui did not stop on signal {sig} within 15 s") from None
    return code, proc.stderr.read() if proc.stderr else ""


def test_ui_serves_the_console_on_loopback_and_stops_on_sigint(demo_url):
    proc, url = _serve("ui", "--db", demo_url, "--port", "0")
    try:
        assert url.startswith("http://127.0.0.1:")
        r = _get_when_up(url + "/")
        assert r.status_code == 200 and "demo-" in r.text
    finally:
        code, err = _stop(proc)
    assert code == 130, err  # stopped with Ctrl-C, as every other command
    assert "warning" not in err


def test_ui_stops_on_sigterm_with_exit_0(demo_url):
    proc, url = _serve("ui", "--db", demo_url, "--port", "0")
    try:
        assert _get_when_up(url + "/health").status_code == 200
    finally:
        code, err = _stop(proc, signal.SIGTERM)
    assert code == 0, err


def test_ui_warns_when_listening_beyond_loopback(demo_url):
    proc, url = _serve("--db", demo_url, "ui", "--host", "0.0.0.0", "--port", "0")
    try:
        port = url.rsplit(":", 1)[1]
        assert _get_when_up(f"http://127.0.0.1:{port}/health").status_code == 200
    finally:
        _, err = _stop(proc)
    assert "warning" in err and "non-loopback" in err


def test_ui_refuses_a_database_that_is_not_there(tmp_path):
    proc = subprocess.run([fencepost_exe(), "ui", "--db", f"sqlite:///{tmp_path / 'absent.db'}", "--port", "0"],
                          capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.startswith("Error: ") and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "absent.db").exists()  # read-only: never created


def test_ui_without_the_extra_names_the_extra_to_install(tmp_path):
    code = ("import sys\n"
            "sys.modules['starlette'] = None\n"  # as if the ui extra were not installed
            "from fencepost.cli import main\n"
            f"main(['--db', 'sqlite:///{tmp_path / 'x.db'}', 'ui'])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 1
    assert "pip install 'fencepost[ui]'" in proc.stderr and "starlette" in proc.stderr


@pytest.mark.parametrize("sig, expected", [(signal.SIGINT, 130), (signal.SIGTERM, 0)], ids=["SIGINT", "SIGTERM"])
def test_ui_stops_at_once_without_a_traceback_while_a_page_follows_its_events(demo_url, sig, expected):
    """With a browser tab open (its /events stream connected), SIGTERM or Ctrl-C waited out
    uvicorn's graceful period, then cancelled the stream and printed "Exception in ASGI
    application" with a traceback (CancelledError) on stderr. The signal now ends every event
    stream first: the command exits with its usual code and nothing on stderr."""
    import threading

    proc, url = _serve("ui", "--db", demo_url, "--port", "0")
    opened = threading.Event()
    try:
        assert _get_when_up(url + "/health").status_code == 200

        def follow() -> None:
            try:
                with httpx.stream("GET", url + "/events", timeout=30) as r:
                    for _ in r.iter_bytes():
                        opened.set()
            except httpx.HTTPError:
                pass

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        assert opened.wait(10), "the event stream sent nothing"
        started = time.monotonic()
    finally:
        code, err = _stop(proc, sig)
    took = time.monotonic() - started
    reader.join(10)
    assert code == expected, err
    assert "Traceback" not in err and "ERROR" not in err, err
    assert took < 10, took
