"""``runs list --cursor`` across several ``--db``: a store that had no more runs keeps its place.

Page 1 of a listing across stores used to mark a store with nothing more to list as done (``null``
in the cursor): runs created there later never appeared on the next pages while those created on
the other stores did, and the pages fell short of the total ("showing 3 of 8" on page 2 of 7 runs
listed in all). Now such a store resumes after the last run it showed, as its own listing would.
On independent stores and on a shard set, on both backends; in-process.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import fencepost
from fencepost.clock import ManualClock
from fencepost.shards import place

pytestmark = pytest.mark.cli_in_process


def _create(url: str, run_id: str, at_ms: int) -> None:
    """Create one run on an independent store at ``at_ms`` (its creation time)."""
    clock = ManualClock(0)
    clock.advance(at_ms)
    with fencepost.open(url, clock=clock) as store:
        store.runs.create(run_id, json.dumps({"flowName": "f"}))


def _page(run_cli: Any, db: list[str], cursor: str | None, *extra: str) -> dict[str, Any]:
    args = [*db, "runs", "list", "--limit", "4", *extra, "--json"]
    if cursor is not None:
        args += ["--cursor", cursor]
    result = run_cli(*args)
    assert result.code == 0, result
    doc: dict[str, Any] = json.loads(result.out)
    return doc


def test_runs_created_on_a_store_that_ran_out_appear_on_the_next_page(run_cli, make_db_url) -> None:
    urls = {"edge": make_db_url(), "central": make_db_url(), "spare": make_db_url()}
    _create(urls["edge"], "e1", 1000)
    for i in range(1, 6):
        _create(urls["central"], f"c{i}", 1000 + 1000 * i)
    fencepost.open(urls["spare"]).close()  # created, holding no run yet
    db = [arg for name, url in urls.items() for arg in ("--db", f"{name}={url}")]

    first = _page(run_cli, db, None)
    assert [(r["store"], r["run_id"]) for r in first["runs"]] == [
        ("edge", "e1"), ("central", "c1"), ("central", "c2"), ("central", "c3")]
    assert first["total"] == 6 and first["next_cursor"] is not None
    # Between pages: on edge (no more runs after e1), on spare (none yet) and on central.
    _create(urls["edge"], "e-late", 7000)
    _create(urls["spare"], "s-late", 7500)
    _create(urls["central"], "c-late", 8000)

    table = run_cli(*db, "runs", "list", "--limit", "4", "--cursor", first["next_cursor"])
    assert table.code == 0, table
    assert [line.split()[:2] for line in table.out.splitlines()[1:5]] == [
        ["central", "c4"], ["central", "c5"], ["edge", "e-late"], ["spare", "s-late"]]
    assert "showing 4 of 9 in 3 stores" in table.out

    second = _page(run_cli, db, first["next_cursor"])
    assert [(r["store"], r["run_id"]) for r in second["runs"]] == [
        ("central", "c4"), ("central", "c5"), ("edge", "e-late"), ("spare", "s-late")]
    third = _page(run_cli, db, second["next_cursor"])
    assert [(r["store"], r["run_id"]) for r in third["runs"]] == [("central", "c-late")]
    assert third["next_cursor"] is None and third["total"] == 9
    listed = [r["run_id"] for doc in (first, second, third) for r in doc["runs"]]
    assert len(listed) == len(set(listed)) == 9


def test_runs_created_on_a_shard_that_ran_out_appear_on_the_next_page(run_cli, make_db_url) -> None:
    urls = [make_db_url() for _ in range(3)]
    clock = ManualClock(0)
    with fencepost.open_shards(urls, clock=clock) as shards:
        names = [name for name, _ in shards.items()]

        def on(shard: str, prefix: str, n: int) -> list[str]:
            return [f"{prefix}{i}" for i in range(1000) if place(f"{prefix}{i}", names) == shard][:n]

        def create(run_ids: list[str]) -> None:
            for run_id in run_ids:
                clock.advance(10)
                shards.runs.create(run_id, "{}")

        old = on(names[2], "old-", 1) + on(names[0], "job-", 5)
        create(old)
        db = [arg for url in urls for arg in ("--db", url)]
        first = _page(run_cli, db, None)
        assert [r["run_id"] for r in first["runs"]] == old[:4]
        assert first["next_cursor"] is not None
        late = on(names[2], "late-", 1) + on(names[0], "late0-", 1)  # the repro's late-3 and late0-0
        create(late)
        second = _page(run_cli, db, first["next_cursor"])
        third = _page(run_cli, db, second["next_cursor"]) if second["next_cursor"] else {"runs": []}
    listed = [r["run_id"] for doc in (first, second, third) for r in doc["runs"]]
    assert listed == old + late  # each once, in creation order
    assert second["total"] == 8
