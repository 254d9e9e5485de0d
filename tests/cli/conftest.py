"""Run the real ``fencepost`` executable in a subprocess, as a user would; or, where the process
itself is not what a test is about, the same command line in-process (``run_cli_in_process``)."""

from __future__ import annotations

import io
import os
import pty
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import fencepost


def fencepost_exe() -> str:
    """The console script installed beside this interpreter (else the one on PATH)."""
    here = Path(sys.executable).parent / "fencepost"
    if here.exists():
        return str(here)
    found = shutil.which("fencepost")
    if found is None:
        pytest.fail("the fencepost console script is not installed (pip install -e .)")
    return found


class Result:
    def __init__(self, proc: subprocess.CompletedProcess) -> None:
        self.code = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def __repr__(self) -> str:
        return f"Result(code={self.code}, out={self.out[-2000:]!r}, err={self.err[-2000:]!r})"


def on_a_terminal(*args: str, columns: str = "250") -> str:
    """What ``fencepost *args`` prints on a real terminal (a pty) ``columns`` wide; it must exit 0."""
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": columns, "LINES": "50"}
    env.pop("FENCEPOST_DB", None)
    proc = subprocess.Popen([fencepost_exe(), *args], stdin=follower, stdout=follower, stderr=subprocess.PIPE,
                            env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    return b"".join(chunks).decode()


@pytest.fixture
def three_runs(db_url: str) -> str:
    """``db_url`` holding runs r1, r2 and r3 (pending)."""
    with fencepost.open(db_url) as store:
        for run_id in ("r1", "r2", "r3"):
            store.runs.create(run_id, "{}")
    return db_url


def owned_runs_with_a_damaged_fact(tmp_path: Path, assignment: str, *, ignore_checks: bool = False) -> str:
    """A SQLite store (its URL) with runs r1 and r2, each claimed and owned (facts ``claimed`` seq 0,
    ``activated`` seq 1), where r1's ``activated`` fact was rewritten by hand with the SQL
    ``assignment`` (``payload_json = ...``): past the no-update trigger, and past the CHECK
    constraints too with ``ignore_checks``."""
    from fencepost.journal import OwnerId, companion_stream

    url = f"sqlite:///{tmp_path / 'facts.db'}"
    with fencepost.open(url) as store:
        for run in ("r1", "r2"):
            store.runs.create(run, "{}")
            store.runs.claim_and_own(run, store.runs.get(run), OwnerId("h", 1, "n"), store.clock.now_ms())
        conn = store.db.connect()
        try:
            if ignore_checks:
                conn.exec_driver_sql("PRAGMA ignore_check_constraints=ON")
            conn.exec_driver_sql("DROP TRIGGER flows_journal_events_no_update_v1")
            conn.exec_driver_sql(f"UPDATE flows_journal_events SET {assignment} "
                                 f"WHERE run_id = '{companion_stream('r1')}' AND seq = 1")
            conn.commit()
        finally:
            conn.close()
    return url


def _subprocess_runner(tmp_path: Path) -> Callable[..., Result]:
    def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 60) -> Result:
        full_env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
        full_env["COLUMNS"] = "200"
        full_env.update(env or {})
        proc = subprocess.run([fencepost_exe(), *args], capture_output=True, text=True, cwd=cwd or tmp_path,
                              env=full_env, timeout=timeout)
        return Result(proc)

    return run


@pytest.fixture
def run_cli(request, tmp_path):
    """``run_cli(*args, cwd=None, env=None, timeout=60) -> Result`` with FENCEPOST_DB unset: the
    console script in a subprocess, or ``run_cli_in_process`` for a test marked ``cli_in_process``
    (a file whose tests check output and exit codes sets ``pytestmark = pytest.mark.cli_in_process``)."""
    if request.node.get_closest_marker("cli_in_process") is not None:
        return request.getfixturevalue("run_cli_in_process")
    return _subprocess_runner(tmp_path)


@pytest.fixture
def run_cli_subprocess(tmp_path):
    """``run_cli`` under a name a file that rebinds ``run_cli`` to ``run_cli_in_process`` can
    still use where the process matters."""
    return _subprocess_runner(tmp_path)


@pytest.fixture
def run_cli_in_process(tmp_path, monkeypatch):
    """``run_cli`` without the process: ``fencepost.cli.main(args)`` in this interpreter, with the
    same environment (FENCEPOST_DB unset, COLUMNS=200, ``env`` added), working directory, empty
    stdin and separate captured stdout and stderr (pipes: no terminal), and the exit code main's
    ``sys.exit`` gave. ~0.5 s cheaper a command (no interpreter start, no imports). Not for what
    only a process shows: the console-script entry point, signals, a terminal, what is read at
    import time, or a command that must not share this interpreter's state. ``timeout`` is ignored
    (pytest-timeout bounds the test)."""
    from fencepost.cli import main

    def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 60) -> Result:
        out, err = io.BytesIO(), io.BytesIO()
        # Kept referenced: a text wrapper that is collected closes its buffer.
        stdin, stdout, stderr = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8"),
                                 io.TextIOWrapper(out, encoding="utf-8", write_through=True),
                                 io.TextIOWrapper(err, encoding="utf-8", write_through=True))
        with monkeypatch.context() as m:
            m.delenv("FENCEPOST_DB", raising=False)
            m.setenv("COLUMNS", "200")
            for name, value in (env or {}).items():
                m.setenv(name, value)
            m.chdir(cwd or tmp_path)
            m.setattr(sys, "stdin", stdin)
            m.setattr(sys, "stdout", stdout)
            m.setattr(sys, "stderr", stderr)
            try:
                main(list(args))
                code: int = 0
            except SystemExit as exc:
                if exc.code is None or isinstance(exc.code, int):
                    code = exc.code or 0
                else:  # what the interpreter does with sys.exit("text")
                    print(exc.code, file=sys.stderr)
                    code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()

        def text(buffer: io.BytesIO) -> str:  # as subprocess.run(text=True) decodes a pipe
            return buffer.getvalue().decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")

        return Result(subprocess.CompletedProcess(list(args), code, text(out), text(err)))

    return run


def assert_one_line_error(result: Result) -> None:
    """Non-zero exit, exactly one line on stderr, never a traceback."""
    assert result.code != 0, result
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1, result
    assert "Traceback" not in result.err and "Traceback" not in result.out, result


# A task that checkpoints ``{"started": true}``, then works (checking for a stop) until stopped.
HOLDING_TASK = (
    "import time\n"
    "def work(ctx):\n"
    "    ctx.checkpoint({'started': True})\n"
    "    while True:\n"
    "        ctx.check()\n"
    "        time.sleep(0.01)\n"
)


@contextmanager
def worker_holding_runs(db_url: str, cwd: Path, run_ids: list[str], *options: str,
                        preexec_fn: Callable[[], None] | None = None) -> Iterator[subprocess.Popen]:
    """Create ``run_ids``, start ``fencepost worker *options`` on a task that holds each run until
    stopped (in its own session, from ``cwd``), and yield the process once every run has started
    (within 30 s). Whatever of its session still runs at the end is killed."""
    (cwd / "holdingtasks.py").write_text(HOLDING_TASK)
    with fencepost.open(db_url) as store:
        for run_id in run_ids:
            store.runs.create(run_id, "{}")
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    proc = subprocess.Popen([fencepost_exe(), "--db", db_url, "worker", *options, "--task", "holdingtasks:work"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            start_new_session=True, preexec_fn=preexec_fn)
    try:
        deadline = time.monotonic() + 30
        with fencepost.open(db_url, readonly=True) as store:
            while {store.runs.get(r).state_json for r in run_ids} != {'{"started":true}'}:
                assert time.monotonic() < deadline, "the worker never started the runs"
                time.sleep(0.05)
        yield proc
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
