"""``fencepost projection run --follow`` says when the builder rebuilds, a dropped live table too.

Defect: the status lines said ``rebuilding (<reason>)`` only while a rebuild was pending when they
were sampled. A live table dropped on the target was built again from revision 0 with nothing
saying so: at best one line, sampled between the drop and the builder's next pass, showed it; then
``position -:0`` and a lag, as if the projection were new. A rebuild that began and ended between
two status lines (a rotated source, a small projection) was not named at all. Now each rebuild the
builder begins prints ``rebuild started (<reason>)``, the dropped table's with ``table_missing``.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
from sqlalchemy import text

import fencepost
from fencepost._durable import Database
from tests.cli.test_followers import _start

BOUND_S = 30


class _Lines:
    """The command's stdout lines (or its stderr's, ``stream="stderr"``), read by a thread so a wait
    never blocks on a silent pipe."""

    def __init__(self, proc, stream: str = "stdout") -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(getattr(proc, stream),), daemon=True)
        self._thread.start()

    def stop(self, proc, errors: _Lines | None = None) -> tuple[int, str]:
        """SIGTERM, then the exit code and stderr: read here, or, when a reader ``errors`` has it,
        all of that reader's lines."""
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=BOUND_S)
        finally:
            if proc.poll() is None:
                proc.kill()
        self._thread.join(timeout=BOUND_S)
        if errors is None:
            return code, proc.stderr.read()
        errors._thread.join(timeout=BOUND_S)
        return code, "".join(line + "\n" for line in errors.lines)

    def _read(self, pipe) -> None:
        for line in pipe:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait_for(self, found, start: int = 0) -> int:
        """The index of the first line from ``start`` on for which ``found(line)``; fails after BOUND_S."""
        deadline = time.monotonic() + BOUND_S
        with self._cond:
            while True:
                for i in range(start, len(self.lines)):
                    if found(self.lines[i]):
                        return i
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"no such line within {BOUND_S} s: {self.lines[start:]}")
                self._cond.wait(left)


def _drop(url: str, table: str) -> None:
    db = Database(url)
    try:
        db.write(lambda conn: conn.execute(text(f"DROP TABLE {table}")))
    finally:
        db.dispose()


@pytest.mark.slow
def test_follow_says_when_a_dropped_live_table_is_rebuilt(three_runs):
    proc = _start("--db", three_runs, "projection", "run", "--follow", "--interval", "0.2")
    try:
        lines = _Lines(proc)
        at = lines.wait_for(lambda line: " lag 0 " in line and ":3 " in line)
        _drop(three_runs, "projection_runs_by_status")
        at = lines.wait_for(lambda line: "rebuild started (table_missing)" in line, at + 1)
        assert "a table of the projection was missing" in lines.lines[at]
        lines.wait_for(lambda line: ":3  lag 0 " in line, at + 1)
    finally:
        code, err = lines.stop(proc)
    assert code == 0, err
    with fencepost.open(three_runs) as store:
        rows = store.db.read(lambda conn: conn.execute(text("SELECT count(*) FROM projection_runs_by_status")).scalar())
    assert rows == 3


@pytest.mark.slow
def test_follow_says_when_a_rotation_rebuilt_the_projection_between_two_lines(three_runs):
    proc = _start("--db", three_runs, "projection", "run", "--follow", "--interval", "0.2")
    try:
        lines = _Lines(proc)
        at = lines.wait_for(lambda line: " lag 0 " in line and ":3 " in line)
        with fencepost.open(three_runs) as store:
            store.feed.rotate_source()
        lines.wait_for(lambda line: "rebuild started (source_changed)" in line, at + 1)
    finally:
        code, err = lines.stop(proc)
    assert code == 0, err
