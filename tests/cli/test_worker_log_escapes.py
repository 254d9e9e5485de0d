"""``fencepost worker``'s log lines show a run id as tables do, on SQLite and PostgreSQL.

The worker logs ``run <id> settled failed: ...`` to stderr, the operator's terminal, with the run id
raw: whoever could create a run could put ``ESC ] 0 ; ... BEL`` (set the window title) or a newline
and a forged log line (``... INFO run paid-99 settled completed``) into the operator's log. A log
line now shows the run id as an identifier cell (``\\x1b``, ``\\x0a``) and the rest of the line with
control characters escaped (a traceback keeps its line ends).
"""

from __future__ import annotations

import fencepost

FORGED = "forged 2026-01-01 00:00:00,000 worker 1 INFO run paid-99 settled completed"
EVIL = "evil\x1b]0;PWNED\x07\n" + FORGED


def test_a_run_id_reaches_the_worker_log_escaped(run_cli, db_url, tmp_path):
    (tmp_path / "failing.py").write_text("def work(ctx):\n    raise ValueError('boom \\x1b[2J')\n")
    with fencepost.open(db_url) as store:
        store.runs.create(EVIL, "{}")
    result = run_cli("--db", db_url, "worker", "-n", "1", "--task", "failing:work", "--until-idle",
                     cwd=tmp_path, timeout=90)
    assert result.code == 0, result
    with fencepost.open(db_url, readonly=True) as store:
        assert store.runs.get(EVIL).status == "failed"
    assert "settled failed" in result.err, result
    assert "\x1b" not in result.err and "\x07" not in result.err, result
    assert not any(line.startswith("forged") for line in result.err.splitlines()), result
    assert "evil\\x1b]0;PWNED\\x07\\x0aforged" in result.err, result
    assert "boom \\x1b[2J" in result.err, result
