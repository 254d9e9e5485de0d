"""The ``next page: --cursor ...`` line of ``runs list`` can be pasted back, on SQLite and PostgreSQL.

The cursor is JSON text that holds the last run id shown. A table escapes what a terminal must not
show raw (``U+00A0`` as ``\\xa0``, the C1 control ``U+0085`` as ``\\x85``, the soft hyphen ...), and
``\\xNN`` is no JSON escape: the cursor printed after such a run was refused when pasted back
("cursor is not a listing cursor"), so the listing could not go on. The table now prints the
cursor with every non-ASCII character as a JSON ``\\uNNNN`` escape: the same cursor, pasteable.
"""

from __future__ import annotations

import shlex

import fencepost
from fencepost.clock import ManualClock

IDS = ["a\u00a0b", "a\u0085c", "a\u00add", "a\u3000e", "a\U0001f600f", "zz"]


def test_every_page_follows_from_the_printed_cursor(run_cli, db_url):
    with fencepost.open(db_url, clock=ManualClock(1_000_000)) as store:
        for run_id in IDS:
            store.runs.create(run_id, "{}")
    seen, args = [], []
    for _ in range(len(IDS) + 1):
        result = run_cli("--db", db_url, "runs", "list", "--limit", "1", *args)
        assert result.code == 0, result
        seen.append(result.out.splitlines()[1].split("  ")[0])
        follow = [line for line in result.out.splitlines() if line.startswith("next page: ")]
        if not follow:
            break
        assert follow[0].isascii(), follow
        args = shlex.split(follow[0].removeprefix("next page: "))
    assert seen == ["a\\x85c", "a\\xa0b", "a\\xadd", "a\\u3000e", "a\U0001f600f", "zz"], seen
