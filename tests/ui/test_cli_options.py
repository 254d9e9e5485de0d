"""``fencepost ui`` refuses a bad ``--db`` or a blank ``--host`` as the usage errors they are, and its
exposure warning stays one line when stderr is a pipe."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest

import fencepost
from tests.cli.conftest import fencepost_exe

from .test_cli import _get_when_up, _serve, _stop

PASSWORD = "sekret-ui-pw-7"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FENCEPOST_DB", "COLUMNS", "LINES")}
    env.update(extra)
    return env


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``fencepost *args``; one that starts serving (the defect) is stopped and reported."""
    proc = subprocess.Popen([fencepost_exe(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(COLUMNS="200"), cwd=cwd)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"fencepost {' '.join(args)!r} served instead of refusing: {out!r} {err!r}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _with_option(url: str, option: str) -> str:
    return url + ("&" if "?" in url else "?") + option


def _with_password(url: str) -> str:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return url
    return parsed.set(password=PASSWORD).render_as_string(hide_password=False)


def test_ui_db_is_checked_as_the_global_db_is(db_url, tmp_path):
    """A URL that cannot be opened is a usage error (exit 2) naming --db and the rule, as the global
    --db is, before anything opens or is created; the password is never printed."""
    bad = [
        "garbage",
        "",
        _with_password(_with_option(db_url, "foo=1")),
        f"postgresql+psycopg://u:{PASSWORD}@h/d?foo=1",
    ]
    for value in bad:
        ui = _run("ui", "--db", value, "--port", "0", cwd=tmp_path)
        group = _run("--db", value, "runs", "list", cwd=tmp_path)
        assert group.returncode == 2, (value, group.stderr)
        assert ui.returncode == 2, (value, ui.stderr)
        assert ui.stdout == ""
        lines = ui.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: --db: "), (value, ui.stderr)
        assert ui.stderr == group.stderr, value  # the same words as the global --db
        assert PASSWORD not in ui.stderr
    assert list(tmp_path.iterdir()) == []  # nothing created (no .flows/, no database file)


def test_ui_db_still_serves_a_good_url(db_url, tmp_path):
    fencepost.open(db_url).close()
    proc, url = _serve("ui", "--db", db_url, "--port", "0")
    try:
        assert _get_when_up(url + "/health").status_code == 200
    finally:
        code, err = _stop(proc)
    assert code == 130, err


@pytest.mark.parametrize("host", ["", " ", "\t"])
def test_ui_refuses_an_empty_or_blank_host(db_url, tmp_path, host):
    """``--host "$HOST"`` with HOST unset must not listen on every interface."""
    fencepost.open(db_url).close()
    proc = _run("--db", db_url, "ui", "--host", host, "--port", "0", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "--host" in lines[0], proc.stderr


@pytest.mark.parametrize("columns", [None, "40"])
def test_the_exposure_warning_is_one_line_on_a_pipe(db_url, columns):
    """Written to a pipe, the warning is never hard-wrapped (at 80 columns, or $COLUMNS)."""
    fencepost.open(db_url).close()
    extra = {} if columns is None else {"COLUMNS": columns}
    proc = subprocess.Popen([fencepost_exe(), "--db", db_url, "ui", "--host", "0.0.0.0", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(**extra))
    assert proc.stdout is not None
    line = proc.stdout.readline()
    try:
        port = line.rsplit(":", 1)[1].split()[0]
        assert _get_when_up(f"http://127.0.0.1:{port}/health").status_code == 200
    finally:
        code, err = _stop(proc)
    assert code == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("warning: listening on a non-loopback address") and lines[0].endswith("no login)")


@pytest.mark.parametrize("host", ["127.0.0.2", "127.1.2.3", "LOCALHOST"])
def test_the_announced_url_answers_on_every_loopback_address(db_url, host):
    """The URL ``fencepost ui`` prints is the one an operator opens: bound to another loopback
    address than 127.0.0.1 (``--host 127.0.0.2``), its own address must not be ``400 invalid_host``
    (an IP literal in ``Host`` cannot be a rebinding page's name), and ``LOCALHOST`` is loopback,
    not an exposed address with a warning."""
    fencepost.open(db_url).close()
    proc, url = _serve("--db", db_url, "ui", "--host", host, "--port", "0")
    try:
        r = _get_when_up(url + "/health.json")
        assert r.status_code == 200, (url, r.status_code, r.text[:300])
        port = url.rsplit(":", 1)[1]
        # Another loopback literal answers too; a name that is not loopback still does not.
        assert httpx.get(url + "/health.json", headers={"host": f"127.0.0.9:{port}"}, timeout=10).status_code == 200
        assert httpx.get(url + "/health.json", headers={"host": "evil.example"}, timeout=10).status_code == 400
    finally:
        code, err = _stop(proc)
    assert code == 130, err
    assert "warning" not in err, err


def test_a_port_in_use_or_a_host_that_is_no_address_names_what_to_change(db_url, tmp_path):
    """``--port`` taken (another console running) or a ``--host`` that resolves to nothing (a stray
    space, a URL given as a host): one line that says which address could not be listened on and
    which option to change, exit 1, nothing served. It said "the given host and port" only."""
    import socket

    fencepost.open(db_url).close()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        proc = _run("--db", db_url, "ui", "--port", str(port), cwd=tmp_path)
    finally:
        taken.close()
    assert proc.returncode == 1 and proc.stdout == "", proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "--port" in lines[0], proc.stderr
    for host in ("127.0.0.1 ", "http://127.0.0.1"):
        proc = _run("--db", db_url, "ui", "--host", host, "--port", "0", cwd=tmp_path)
        assert proc.returncode == 1 and proc.stdout == "", proc
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "--host" in lines[0] and repr(host) in lines[0], proc.stderr


def test_open_without_a_browser_says_so(db_url, tmp_path):
    """``--open`` where no web browser can be started (a server, an SSH session) did nothing,
    silently: the operator waited for a window. It says so on stderr, in one line naming the URL
    to open, and serves on."""
    fencepost.open(db_url).close()
    env = {k: v for k, v in _env(COLUMNS="200").items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["BROWSER"] = str(tmp_path / "no-such-browser")
    proc = subprocess.Popen([fencepost_exe(), "--db", db_url, "ui", "--open", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    url = line.split(" at ", 1)[1].split()[0]
    try:
        assert _get_when_up(url + "/health.json").status_code == 200
    finally:
        code, err = _stop(proc)
    assert code == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ") and url in lines[0], err
