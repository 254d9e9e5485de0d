"""``feed tail --from SOURCE:REVISION`` past the store's newest revision of that same source: the
position was printed by this source, so the database went back in time (an older copy restored
with its source id). It was refused as a typo (exit 2, "usage", the source dropped from the
message, no advice), so a tailer resuming after a restore looked as if it had been called wrongly.
It now exits 1 saying the database went back and how to start again, as a rewind met while
tailing does. A bare ``--from REVISION`` past the head is still a usage error (exit 2)."""

from __future__ import annotations

import pytest

import fencepost

pytestmark = pytest.mark.cli_in_process


def _store_with_runs(url: str, n: int) -> str:
    with fencepost.open(url) as store:
        for i in range(n):
            store.runs.create(f"r{i}", "{}")
        return store.feed.position().source


def test_a_position_of_this_source_past_its_head_says_the_database_went_back(run_cli, db_url):
    source = _store_with_runs(db_url, 2)
    result = run_cli("--db", db_url, "feed", "tail", "--from", f"{source}:50")
    assert result.code == 1, result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert f"--from {source}:50 is ahead of the newest revision" in lines[0], lines[0]
    assert "went back to an earlier revision" in lines[0] and "--from 0" in lines[0], lines[0]
    assert result.out == ""
    bare = run_cli("--db", db_url, "feed", "tail", "--from", "50")
    assert bare.code == 2 and "--from 50 is ahead of the newest revision" in bare.err, bare


def test_across_stores_the_store_whose_position_is_ahead_is_named(run_cli, make_db_url):
    first, second = make_db_url(), make_db_url()
    _store_with_runs(first, 1)
    source = _store_with_runs(second, 2)
    result = run_cli("--db", f"a={first}", "--db", f"b={second}", "feed", "tail", "--from", f"b={source}:9")
    assert result.code == 1, result
    assert "store b: its database went back to an earlier revision" in result.err, result.err
    assert "--from b=0" in result.err and result.out == "", result
