"""``fencepost demo`` writing into a pipe: a reader that closes early stops the demo and every worker
process it started (exit 1, as any command whose output pipe closes); piped lines are never
hard-wrapped and the closing hints name the ``--db`` the demo used; a second demo on the same
database says in one line that the projection is busy, never with a thread's traceback.

Each demo runs in its own session, so every process it leaves behind (its workers and their
multiprocessing helper) is found in ``/proc`` by session id, and killed when a test fails.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

import fencepost
from tests.cli.conftest import fencepost_exe

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    env["COLUMNS"] = "60"  # what rich would hard-wrap a pipe at, were it allowed to (its default is 80)
    return env


def _like_a_terminal() -> None:
    # Started from a shell's background job SIGINT would be ignored; a terminal starts it at default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _session(sid: int) -> list[int]:
    """Live processes (zombies excluded) of session ``sid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, session = fields[0], int(fields[3])
        if session == sid and state != "Z":
            found.append(int(entry))
    return found


def _left_behind(sid: int, within: float = 10.0) -> list[int]:
    """The session's processes still alive after ``within`` seconds (the demo's helpers exit on EOF)."""
    deadline = time.monotonic() + within
    while True:
        left = _session(sid)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def _end(proc: subprocess.Popen) -> None:
    """Kill whatever the test's session still runs (a failing test must not leave workers behind)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _start(args: list[str], cwd: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([fencepost_exe(), *args], cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs)


def _read_until(proc: subprocess.Popen, marker: str, within: float = 60.0) -> list[str]:
    lines = []
    deadline = time.monotonic() + within
    for line in proc.stdout:  # type: ignore[union-attr]
        lines.append(line)
        if line.startswith(marker):
            return lines
        assert time.monotonic() < deadline, f"no line starting {marker!r} within {within} s: {lines}"
    raise AssertionError(f"the demo's output ended before a line starting {marker!r}: {lines}")


# ---------------------------------------------------------------------- a reader that closes early
# How long the test waits for the demo to exit once the pipe closed: a guard against a hang only,
# far above what a loaded machine takes. Whether the demo stopped at once is read from what it left.
EXIT_GUARD_S = 90


def _settled(db_url: str, prefix: str) -> tuple[int, int]:
    """(runs of the demo, how many of them settled)."""
    with fencepost.open(db_url, readonly=True) as store:
        statuses = [r.status for r in store.feed.iter_runs() if r.run_id.startswith(prefix)]
    return len(statuses), sum(s in ("completed", "failed", "cancelled") for s in statuses)


def test_demo_piped_into_head_exits_and_leaves_no_worker_behind(db_url, tmp_path):
    """The reported command, as a shell runs it: ``fencepost demo ... | head -2``. The demo stops at
    its next line that finds the pipe closed (the third, or, should head be slow to exit, the one
    once a fifth of the runs settled): most of its runs never settle, where a demo that went on
    settles them all in seconds."""
    demo = shlex.join([fencepost_exe(), "--db", db_url, "demo", "--runs", "30", "--workers", "2", "--timeout", "10"])
    proc = subprocess.Popen(["bash", "-c", f"{demo} | head -2; exit ${{PIPESTATUS[0]}}"], cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        try:
            out, err = proc.communicate(timeout=EXIT_GUARD_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the demo did not exit within {EXIT_GUARD_S} s once head had closed the pipe")
        left = _left_behind(proc.pid)
    finally:
        _end(proc)
    assert proc.returncode == 1, (out, err)  # what every command exits with on a closed output pipe
    assert out.splitlines()[0].startswith("fencepost demo on ")
    assert "Traceback" not in err and "Exception" not in err, err
    assert "timed out" not in err, err
    assert left == [], f"processes left behind: {left}"
    prefix = re.search(r"\(runs (demo-[0-9a-f]+-)\*\)", out).group(1)
    created, settled = _settled(db_url, prefix)
    assert created == 30 and settled < created // 2, f"the demo went on after head closed the pipe: {settled} settled"


@pytest.mark.parametrize("after", ["fencepost demo on", "demo time runs", "started 2 worker processes"],
                         ids=["before-runs", "before-workers", "while-working"])
def test_a_reader_that_closes_early_stops_the_demo_and_its_workers(db_url, tmp_path, after):
    """The pipe closes at three points: before any run exists, just before the workers start (the
    next line says they started), and while they work. Each time the demo stops them and exits 1
    at its next line, rather than going on with the runs: most of the 200 never settle (the demo
    next writes once a fifth of them settled), and no ``--timeout`` passes. A demo that went on
    would settle nearly all of them within seconds (all but the killed worker's, whose lease takes
    30 s at --speed 1), so no wall-clock bound is needed to tell the two apart."""
    n_runs = 200
    proc = _start(["--db", db_url, "demo", "--runs", str(n_runs), "--workers", "2", "--speed", "1",
                   "--timeout", "120"], tmp_path)
    pids: list[int] = []
    try:
        lines = _read_until(proc, after)
        prefix = re.search(r"\(runs (demo-[0-9a-f]+-)\*\)", lines[0]).group(1)
        m = re.search(r"pids ([\d, ]+)", lines[-1])
        pids = [int(p) for p in m.group(1).split(",")] if m else []
        proc.stdout.close()  # type: ignore[union-attr]
        closed = time.monotonic()
        try:
            code = proc.wait(timeout=EXIT_GUARD_S)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - closed
        left = _left_behind(proc.pid)
    finally:
        _end(proc)
    err = proc.stderr.read()  # type: ignore[union-attr]
    assert code == 1, f"exit {code} {took:.1f} s after the pipe closed; stderr: {err}"
    assert "Traceback" not in err and "Exception" not in err, err
    assert "timed out" not in err, err
    assert left == [], f"processes left behind: {left} (worker pids {pids})"
    created, settled = _settled(db_url, prefix)
    assert settled < n_runs // 2, (f"the demo went on after the pipe closed: {settled} of {created} runs "
                                   f"settled, exit {took:.1f} s later")


# ---------------------------------------------------------------------- two demos, one database
def test_a_second_demo_on_a_busy_projection_fails_in_one_line_and_starts_nothing(db_url, tmp_path):
    first = _start(["--db", db_url, "demo", "--runs", "200", "--workers", "2", "--speed", "1", "--timeout", "120"],
                   tmp_path, preexec_fn=_like_a_terminal)
    second = None
    try:
        _read_until(first, "started 2 worker processes")
        second = _start(["--db", db_url, "demo", "--runs", "10", "--workers", "2", "--speed", "20", "--timeout", "60"],
                        tmp_path)
        try:
            out, err = second.communicate(timeout=25)
        except subprocess.TimeoutExpired:
            pytest.fail("the second demo did not exit within 25 s")
        left = _left_behind(second.pid)
        assert first.poll() is None, "the first demo must be unaffected"
        os.killpg(first.pid, signal.SIGINT)  # stop the first one as Ctrl-C does
        first.wait(timeout=30)
    finally:
        _end(first)
        if second is not None:
            _end(second)
    assert second.returncode == 1, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err and "Exception" not in err, err
    assert lines[0].startswith("Error: ") and "runs_by_status" in lines[0] and "--db" in lines[0], lines
    assert "started" not in out, out  # refused before creating runs or starting a worker
    assert left == []
    assert first.returncode == 130


# ---------------------------------------------------------------------- what a pipe receives
def _hints(lines: list[str]) -> list[str]:
    """The commands listed after the closing ``Explore:``."""
    at = next(i for i, line in enumerate(lines) if line.endswith("Explore:"))
    return [line.strip() for line in lines[at + 1:] if line.strip()]


def _masked_password_url(db_url: str) -> tuple[str, str | None]:
    """A PostgreSQL URL given with a password (a trust server ignores it): (url, the secret)."""
    if not db_url.startswith("postgresql"):
        return db_url, None
    url = make_url(db_url)
    if url.password is None:
        url = url.set(password="demo-secret-" + uuid.uuid4().hex[:6])
    return url.render_as_string(hide_password=False), str(url.password)


def test_piped_demo_output_is_never_hard_wrapped_and_its_hints_carry_the_db(db_url, tmp_path):
    from fencepost._durable import redact_url

    url, secret = _masked_password_url(db_url)
    proc = subprocess.run([fencepost_exe(), "--db", url, "demo", "--runs", "40", "--workers", "2", "--speed", "20"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc
    lines = proc.stdout.splitlines()
    shown = redact_url(url)
    assert lines[0].startswith(f"fencepost demo on {shown}  (runs demo-"), lines[:3]
    prefix = re.search(r"\(runs (demo-[0-9a-f]+-)\*\)", lines[0]).group(1)
    killed = [line for line in lines if line.startswith("SIGKILLed worker")]
    assert len(killed) == 1 and killed[0].endswith("once the lease expires"), lines
    assert not [line for line in lines if line.startswith(prefix)], "a list of run ids was folded"
    # No progress bar in a pipe (rich wrote each once as it ended, after the lines printed meanwhile);
    # a line says the runs were created, in its place in the story.
    assert "━" not in proc.stdout and "creating runs" not in proc.stdout, proc.stdout
    assert lines.index("created 40 runs") < next(i for i, line in enumerate(lines) if line.startswith("started "))
    hints = _hints(lines)
    assert len(hints) == 6, lines
    assert all(h.startswith(f"fencepost --db {shlex.quote(shown)} ") for h in hints), hints
    if secret is not None:
        assert secret not in proc.stdout and secret not in proc.stderr
        assert "***" in shown
        return
    # Following a hint from anywhere reads the demo's database, not the default one.
    show = next(h for h in hints if " runs show " in h)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    followed = subprocess.run(["bash", "-c", show.replace("fencepost", shlex.quote(fencepost_exe()), 1)],
                              cwd=elsewhere, env=_env(), capture_output=True, text=True, timeout=60)
    assert followed.returncode == 0, followed
    assert f"{prefix}0000" in followed.stdout
    assert not (elsewhere / ".flows").exists()


def test_demo_on_the_default_database_hints_without_db(tmp_path):
    proc = subprocess.run([fencepost_exe(), "demo", "--runs", "40", "--workers", "2", "--speed", "20"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("fencepost demo on sqlite:///.flows/flows.db  (runs demo-"), lines[:2]
    assert lines[1].endswith("stamps are demo time"), lines[:3]
    hints = _hints(lines)
    assert len(hints) == 6 and all(h.startswith("fencepost ") and "--db" not in h for h in hints), hints
    assert any(h.startswith("fencepost runs show demo-") for h in hints), hints
