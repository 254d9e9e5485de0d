"""``journal replay --all`` prints each run as it is replayed and keeps only the totals and the runs
that break a rule, on both backends.

Defect (scale hunt): the command kept every run's history until the end, even for its one-line
summary: peak RSS 55.7 MB at 2,000 runs, 81.9 MB at 30,000 (about 0.9 KB a run, a gigabyte at a
million). Now its memory does not grow with the number of runs, in every format, and what it prints
is what it printed before (the line formats list the runs in the order of their companion streams,
as they are replayed).
"""

from __future__ import annotations

import csv
import gc
import importlib
import io
import json
import os
import sys
import tracemalloc

import msgspec
import pytest

import fencepost
from fencepost.journal import companion_stream
from tests.journal.test_replay_streaming import forge_second_owner, settle

pytestmark = pytest.mark.cli_in_process


def _replay_quietly(url: str, *args: str) -> int:
    """``fencepost --db URL journal replay --all ARGS`` in this interpreter, its output thrown away
    (a captured output would itself grow with the runs)."""
    from fencepost.cli import main

    saved = sys.stdout, sys.stderr
    with open(os.devnull, "w", encoding="utf-8") as sink:
        sys.stdout = sys.stderr = sink
        try:
            main(["--db", url, "journal", "replay", "--all", *args])
        except SystemExit as exc:
            return int(exc.code or 0)
        finally:
            sys.stdout, sys.stderr = saved
    return 0


def _peak(url: str, *args: str) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        assert _replay_quietly(url, *args) == 0
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


N = 40
FORMATS = [(), ("--format", "jsonl"), ("--format", "csv"), ("--json",)]


def test_replay_all_memory_does_not_grow_with_the_runs(db_url, monkeypatch) -> None:
    """Each format over 4N runs peaks no higher than over N, give or take 100 bytes a run (before:
    about 900 bytes a run, every history kept; the streams are listed in pages of 10 here,
    and the histories --json holds back go to disk at once)."""
    from fencepost.journal import replay as replay_module

    monkeypatch.setattr(replay_module, "_STREAM_PAGE", 10, raising=False)
    # --json: to disk at once (the module, which its click group's name hides as an attribute)
    monkeypatch.setattr(importlib.import_module("fencepost.cli.journal"), "_SPOOL_IN_MEMORY", 1, raising=False)
    with fencepost.open(db_url) as store:
        settle(store, 0, N)
    for args in FORMATS:  # warm-up: imports, compiled statements
        assert _replay_quietly(db_url, *args) == 0
    small = {args: _peak(db_url, *args) for args in FORMATS}
    with fencepost.open(db_url) as store:
        settle(store, N, 3 * N)
    large = {args: _peak(db_url, *args) for args in FORMATS}
    grown = {" ".join(args) or "table": large[args] - small[args] for args in FORMATS}
    assert all(g < 100 * 3 * N for g in grown.values()), (grown, small, large)


# What the command printed before it streamed, on the store `_store_with_a_violation` builds (the
# table carries no time, so it is the same on every run of the test and either backend).
TABLE_BEFORE = """\
6 run(s) replayed, 7 ownership interval(s), 1 violation(s)
rule                     count
activated_without_claim  1
run        violations  first
run-00002  1           activated_without_claim at seq 3
unattributed ownership facts on {orphan} name no run that hashes to it
"""


def _store_with_a_violation(url: str) -> str:
    """Six settled runs, a second owner forged on run-00002, and one companion stream whose facts
    name a run that does not hash to it."""
    with fencepost.open(url) as store:
        settle(store, 0, 6)
        forge_second_owner(store, "run-00002")
        orphan = companion_stream("nobody-hashes-here")
        store.db.write(lambda conn: store.journal.append_in(
            conn, orphan, "flows.consensus.claimed", {"runId": "someone-else", "owner": {"hostId": "h", "pid": 1,
                                                                                       "nonce": "n"},
                                                     "grantedAtMs": 0},
            source_id="flows.run-store", meta={}))
    return orphan


def test_replay_all_prints_what_it_printed_before(run_cli, db_url) -> None:
    """Same table; jsonl and csv the same lines (one per run, as each is replayed, in the order of
    the runs' companion streams); json the same document, its histories in that order too."""
    from fencepost.journal import replay_all

    orphan = _store_with_a_violation(db_url)
    with fencepost.open(db_url) as store:
        summary = replay_all(store)
    by_stream = sorted(summary.histories, key=lambda h: h.stream)
    assert [h.run_id for h in by_stream] != [h.run_id for h in summary.histories]  # the order is told apart

    table = run_cli("--db", db_url, "journal", "replay", "--all")
    assert table.code == 1, table
    assert table.out == TABLE_BEFORE.format(orphan=orphan), table.out
    assert table.err.strip() == ("Error: 1 of 6 run(s) break the ownership rules (1 violation(s)); "
                                 "1 stream(s) of ownership facts name no run"), table.err

    jsonl = run_cli("--db", db_url, "journal", "replay", "--all", "--format", "jsonl")
    assert jsonl.code == 1 and jsonl.err == table.err, jsonl
    assert jsonl.out.splitlines() == [msgspec.json.encode(h).decode() for h in by_stream]

    as_csv = run_cli("--db", db_url, "journal", "replay", "--all", "--format", "csv")
    assert as_csv.code == 1 and as_csv.err == table.err, as_csv
    rows = list(csv.reader(io.StringIO(as_csv.out)))
    assert rows[0] == ["run_id", "facts", "intervals", "violations", "first_violation", "stream"]
    assert rows[1:] == [[h.run_id, str(h.facts), str(len(h.intervals)), str(len(h.violations)),
                         f"{h.violations[0].rule} at seq {h.violations[0].seq}" if h.violations else "", h.stream]
                        for h in by_stream]

    as_json = run_cli("--db", db_url, "journal", "replay", "--all", "--json")
    assert as_json.code == 1 and as_json.err == table.err, as_json
    assert as_json.out.count("\n") == 1
    doc = json.loads(as_json.out)
    assert list(doc) == ["ok", "runs", "intervals", "violations", "unattributed_streams", "histories"]
    assert doc == {"ok": False, "runs": 6, "intervals": 7, "violations": summary.violations,
                   "unattributed_streams": [orphan], "histories": msgspec.to_builtins(by_stream)}


def test_replay_all_of_an_empty_store(run_cli, db_url) -> None:
    with fencepost.open(db_url):
        pass
    assert run_cli("--db", db_url, "journal", "replay", "--all").out == (
        "0 run(s) replayed, 0 ownership interval(s), 0 violation(s)\nevery ownership history is consistent\n")
    as_csv = run_cli("--db", db_url, "journal", "replay", "--all", "--format", "csv")
    assert as_csv.code == 0 and as_csv.out == "run_id,facts,intervals,violations,first_violation,stream\n"
    assert run_cli("--db", db_url, "journal", "replay", "--all", "--format", "jsonl").out == ""
    assert json.loads(run_cli("--db", db_url, "journal", "replay", "--all", "--json").out) == {
        "ok": True, "runs": 0, "intervals": 0, "violations": {}, "unattributed_streams": [], "histories": []}
