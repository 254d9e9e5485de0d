"""``fencepost worker`` reports a worker process that ended abnormally as its ``Error:`` line on stderr.

Defect: when a process died (a task calling ``os._exit``, a crash, a kill), the command exited 1
with the reason on *stdout* ("worker process N exited abnormally (exit code 3)", after the table)
and nothing on stderr, unlike every other failure (one ``Error:`` line on stderr, data on stdout):
a script that reads stderr for the reason found it empty. Both backends run: any store shows it.
"""

from __future__ import annotations

import pytest

import fencepost

pytestmark = pytest.mark.slow


def test_a_process_exiting_abnormally_is_one_error_line_on_stderr(run_cli, db_url, tmp_path):
    (tmp_path / "exittasks.py").write_text("import os\ndef work(ctx):\n    os._exit(3)\n")
    with fencepost.open(db_url) as store:
        store.runs.create("x0", "{}")
    result = run_cli("--db", db_url, "worker", "-n", "1", "--task", "exittasks:work", "--until-idle", cwd=tmp_path)
    assert result.code == 1, result
    lines = result.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: worker process "), result
    assert lines[0].endswith("exited abnormally (exit code 3)"), result
    pid = lines[0].split()[3]
    # The table on stdout still has the process's row; the sentence is not repeated there.
    row = next(line.split() for line in result.out.splitlines() if line.split()[:1] == [pid])
    assert row[-1] == "exit-code-3", result
    assert "abnormally" not in result.out, result
