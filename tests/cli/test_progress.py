"""Long commands draw a progress bar on stderr when it is a terminal, and nothing more when it is not.

Defect: ``fencepost journal verify`` on a million entries was silent for ~15 s (SQLite) to ~90 s
(PostgreSQL), as were ``journal replay --all`` and a first ``projection run``/``rebuild`` of a big
source: a user at a terminal could not tell work from a hang.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import time

import pytest

import fencepost
from fencepost.journal import NewEntry, verify
from tests.cli.conftest import fencepost_exe
from tests.journal.test_progress import _settle
from tests.projections import _runs


def _fill(url: str, entries: int, streams: int = 5) -> None:
    with fencepost.open(url) as store:
        batch = 1000
        for first in range(0, entries, batch):
            store.journal.append_many_unfenced(
                f"run-{first // batch % streams}",
                [NewEntry("step", {"i": i}) for i in range(first, min(entries, first + batch))],
                source_id=f"w{first}")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    env.update({"COLUMNS": "120", **extra})
    return env


class OnTerminal:
    """A ``fencepost`` process whose stderr is a pseudo-terminal (stdout a pipe): what it drew there."""

    def __init__(self, *args: str) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen([fencepost_exe(), *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=slave, env=_env(), text=True)
        os.close(slave)
        self.screen = b""

    def read_until(self, done, timeout: float = 60) -> bool:
        """Read what the terminal shows until ``done(screen)`` or the process closes it."""
        deadline = time.monotonic() + timeout
        while not done(self.screen):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; the terminal shows {self.screen[-400:]!r}"
            ready, _, _ = select.select([self.master], [], [], left)
            if not ready:
                continue
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                return False
            if not chunk:
                return False
            self.screen += chunk
        return True

    def finish(self, timeout: float = 60) -> tuple[int, str, str]:
        self.read_until(lambda _: False, timeout)
        out = self.proc.stdout.read() if self.proc.stdout else ""
        code = self.proc.wait(timeout)
        os.close(self.master)
        return code, out, self.screen.decode(errors="replace")


@pytest.mark.parametrize("fmt", [[], ["--json"]])
def test_verify_piped_prints_the_same_stdout_and_nothing_on_stderr(db_url: str, run_cli, fmt) -> None:
    """Written to pipes, stdout is exactly the report and stderr stays empty, even where rich would
    take the environment's word for a terminal (FORCE_COLOR, TTY_COMPATIBLE); ``--no-progress``
    changes nothing."""
    _fill(db_url, 4500)
    with fencepost.open(db_url, readonly=True) as store:
        report = verify(store)
    if fmt:
        expected = json.dumps(msgspec_builtins(report), separators=(",", ":")) + "\n"
    else:
        expected = (f"journal verified: 4500 entries in 5 streams, chains intact; "
                    f"head {report.head.position}:{report.head.entry_hash}\n")
    for extra in ([], ["--no-progress"]):
        result = run_cli("--db", db_url, "journal", "verify", *extra, *fmt,
                         env={"FORCE_COLOR": "1", "TTY_COMPATIBLE": "1"})
        assert (result.code, result.out, result.err) == (0, expected, ""), result


def msgspec_builtins(value):
    import msgspec

    return msgspec.to_builtins(value)


def _runs_and_facts(url: str, runs: int, settled: int) -> None:
    with fencepost.open(url) as store:
        store.db.write(lambda conn: _runs.create_many(conn, [f"r-{i}" for i in range(runs)]))
        for i in range(settled):
            _settle(store, f"s-{i}")


COMMANDS = {
    "replay": (["journal", "replay", "--all"], "replaying ownership histories"),
    "rebuild": (["projection", "rebuild"], "rebuilding runs_by_status"),
    "run": (["projection", "run"], "catching up runs_by_status"),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("fmt", [[], ["--json"]])
def test_other_long_commands_piped_print_the_same_stdout_and_nothing_on_stderr(db_url: str, run_cli, command,
                                                                                fmt) -> None:
    """``journal replay --all``, ``projection rebuild`` and ``projection run`` on pipes: stdout as
    with ``--no-progress``, stderr empty, whatever the environment says about colour."""
    _runs_and_facts(db_url, 1200, 3)
    args, _ = COMMANDS[command]
    quiet = run_cli("--db", db_url, *args, "--no-progress", *fmt)
    assert quiet.code == 0 and quiet.err == "" and quiet.out, quiet
    piped = run_cli("--db", db_url, *args, *fmt, env={"FORCE_COLOR": "1", "TTY_COMPATIBLE": "1"})
    if command == "run":  # the second catch-up has nothing left to apply
        assert piped.out == re.sub(r'(applied"?:? ?)\d+', r"\g<1>0", quiet.out)
    else:
        assert piped.out == quiet.out
    assert (piped.code, piped.err) == (0, ""), piped


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_other_long_commands_on_a_terminal_draw_a_progress_bar(db_url: str, command) -> None:
    _runs_and_facts(db_url, 1200, 3)
    args, label = COMMANDS[command]
    total = "3/3" if command == "replay" else "/"
    code, out, screen = OnTerminal("--db", db_url, *args).finish()
    assert code == 0 and out, (out, screen)
    assert label in screen and total in screen, screen
    code, _, screen = OnTerminal("--db", db_url, *args, "--no-progress").finish()
    assert (code, screen) == (0, "")


def test_verify_on_a_terminal_draws_a_progress_bar_on_stderr(db_url: str) -> None:
    """stderr a terminal: the bar counts the entries up to the total there; stdout keeps the report."""
    _fill(db_url, 4500)
    term = OnTerminal("--db", db_url, "journal", "verify")
    code, out, screen = term.finish()
    assert code == 0, screen
    assert out.startswith("journal verified: 4500 entries in 5 streams"), out
    assert "verifying journal entries" in screen and "4500/4500" in screen, screen
    quiet = OnTerminal("--db", db_url, "journal", "verify", "--no-progress")
    code, out_quiet, screen = quiet.finish()
    assert (code, out_quiet, screen) == (0, out, "")


def test_ctrl_c_during_a_long_verify_exits_130_without_a_word(db_url: str) -> None:
    """A real SIGINT, sent once the bar shows the verification under way: exit 130, no report, no
    traceback and no ``Error:`` line (it used to print ``Error: aborted``): Ctrl-C is the user's
    own stop, not a failure, and exits quietly as a follower, the worker and a Ctrl-C while the
    command starts do."""
    entries = 40000
    _fill(db_url, entries, streams=20)
    term = OnTerminal("--db", db_url, "journal", "verify")
    assert term.read_until(lambda screen: f"/{entries}".encode() in screen), term.screen
    term.proc.send_signal(signal.SIGINT)
    code, out, screen = term.finish()
    assert code == 130, screen
    assert out == "" and "Traceback" not in screen, (out, screen)
    assert f"{entries}/{entries}" not in screen, "the verification finished before the SIGINT"
    assert "Error" not in screen and "aborted" not in screen, screen


def _applied_revision(url: str) -> int:
    from fencepost._durable import Database
    from fencepost.projections import ProjectionBuilder, RunsByStatus

    readonly = Database(url, readonly=True)
    try:
        with fencepost.open(url, readonly=True) as store, ProjectionBuilder(store, readonly, RunsByStatus()) as reader:
            return reader.status().applied_revision
    except fencepost.FencepostError:  # the target's tables are not there yet
        return 0
    finally:
        readonly.dispose()


def _many_runs(url: str, runs: int = 30000) -> int:
    with fencepost.open(url) as store:
        for first in range(0, runs, 5000):
            store.db.write(lambda conn, first=first: _runs.create_many(
                conn, [f"r-{i}" for i in range(first, first + 5000)], first))
        return store.feed.position().revision


def test_ctrl_c_during_a_projection_run_exits_130_without_a_word(db_url: str) -> None:
    """``projection run`` on pipes, a real SIGINT once the builder has committed a page and before
    it is done: exit 130, stdout and stderr empty (they held a blank line and ``Error: aborted``),
    and the projection keeps the pages it committed."""
    head = _many_runs(db_url)
    proc = subprocess.Popen([fencepost_exe(), "--db", db_url, "projection", "run"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_env(), text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while (reached := _applied_revision(db_url)) == 0 and proc.poll() is None:
            assert time.monotonic() < deadline, "the builder committed no page in 60 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert 0 < reached < head, (reached, head)
    assert (proc.returncode, out, err) == (130, "", ""), (out, err)
    assert 0 < _applied_revision(db_url) < head


def test_ctrl_c_during_a_projection_rebuild_exits_130_without_a_word(db_url: str) -> None:
    """``projection rebuild``, a real SIGINT once its bar shows the rebuild under way (its status
    shows no progress until the rebuilt table is swapped in): exit 130, nothing on stdout, no
    ``Error:`` line on the terminal."""
    head = _many_runs(db_url)
    term = OnTerminal("--db", db_url, "projection", "rebuild")
    assert term.read_until(lambda screen: re.search(rb" [1-9]\d*/%d" % head, screen) is not None), term.screen
    term.proc.send_signal(signal.SIGINT)
    code, out, screen = term.finish()
    assert code == 130, screen
    assert out == "" and f"{head}/{head}" not in screen, (out, screen)
    assert "Error" not in screen and "aborted" not in screen and "Traceback" not in screen, screen
