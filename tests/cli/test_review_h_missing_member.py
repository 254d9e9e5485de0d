"""A command over a shard set whose member's database is missing names that member."""

from __future__ import annotations

import pytest

import fencepost
from tests.cli.conftest import assert_one_line_error

pytestmark = pytest.mark.cli_in_process


def test_a_missing_member_database_is_named_by_its_line_and_to_be_restored(run_cli, make_db_url):
    """Defect (found by a review, SQLite and PostgreSQL): with member b's database missing, every
    routed command printed "database_missing: Store.open: no ... at URL; create it with fencepost
    init", naming neither the --db/--shards line nor the shard, and sending the user to init (which
    refuses). Now the one error line names --db #2 (b), says its database is missing and to restore
    it (or fix its URL), and never shows a password."""
    a, b = make_db_url(), make_db_url()
    fencepost.open_shards({"a": a, "b": b}).close()
    missing = make_db_url()
    for args in (["runs", "list"], ["runs", "show", "x1"]):
        result = run_cli("--db", f"a={a}", "--db", f"b={missing}", *args)
        assert_one_line_error(result)
        assert "--db #2 (b)" in result.err, result
        assert "restore" in result.err and "fencepost init" not in result.err, result
