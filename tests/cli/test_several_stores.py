"""The CLI across several stores: ``--db`` repeated (``NAME=URL``) or ``--shards FILE``.

On SQLite files, on PostgreSQL schemas and on a mix of both; commands run in-process through
``fencepost.cli.main``, and the real console script in a subprocess for signals, stdin and workers.
Read commands (``runs list``, ``feed tail [--follow]``) work on any stores and label each record
with its store; commands about one run route through a recorded shard set; the rest refuse several
stores with a one-line usage error (exit 2) and change nothing.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import textwrap

import pytest

import fencepost
from fencepost.clock import ManualClock
from fencepost.shards import membership, place
from tests.cli.conftest import assert_one_line_error, fencepost_exe

# Each command runs through fencepost.cli.main in this interpreter (see run_cli in conftest.py).
pytestmark = pytest.mark.cli_in_process


def _db_args(named: dict[str, str] | list[str]) -> list[str]:
    if isinstance(named, dict):
        return [arg for name, url in named.items() for arg in ("--db", f"{name}={url}")]
    return [arg for url in named for arg in ("--db", url)]


def _fill(url: str, run_ids: list[str], times: list[int]) -> None:
    """Create runs on one independent store, each at the given creation time (ms)."""
    clock = ManualClock(0)
    with fencepost.open(url, clock=clock) as store:
        for run_id, at in zip(run_ids, times, strict=True):
            clock.advance(at - clock.now_ms())
            store.runs.create(run_id, json.dumps({"flowName": "f"}))


@pytest.fixture
def shard_urls(make_db_url):
    """``shard_urls(n)``: n fresh databases on the backend (stores of a set to be founded)."""
    return lambda n: [make_db_url() for _ in range(n)]


@pytest.fixture
def two_stores(make_db_url):
    """Two independent stores (no shard set): ``edge`` with a1, a2, a3 and ``central`` with b1, b2."""
    edge, central = make_db_url(), make_db_url()
    _fill(edge, ["a1", "a2", "a3"], [1000, 3000, 5000])
    _fill(central, ["b1", "b2"], [2000, 4000])
    return {"edge": edge, "central": central}


@pytest.fixture
def mixed_stores(make_db_url):
    """One SQLite file and one PostgreSQL schema, unnamed (they record no shard set)."""
    lite, pg = make_db_url("sqlite"), make_db_url("postgresql")
    _fill(lite, ["s1", "s2"], [1000, 3000])
    _fill(pg, ["p1"], [2000])
    return [lite, pg]


# --------------------------------------------------------------------------- runs list
def test_runs_list_across_stores_merges_by_creation_and_labels_every_run(run_cli, two_stores):
    db = _db_args(two_stores)
    table = run_cli(*db, "runs", "list")
    assert table.code == 0, table
    lines = table.out.splitlines()
    assert lines[0].split()[:3] == ["store", "run_id", "status"]
    assert [line.split()[:2] for line in lines[1:6]] == [
        ["edge", "a1"], ["central", "b1"], ["edge", "a2"], ["central", "b2"], ["edge", "a3"]]
    assert "showing 5 of 5 in 2 stores" in table.out

    doc = json.loads(run_cli(*db, "runs", "list", "--json").out)
    assert doc["total"] == 5 and doc["next_cursor"] is None
    assert [(r["store"], r["run_id"]) for r in doc["runs"]] == [
        ("edge", "a1"), ("central", "b1"), ("edge", "a2"), ("central", "b2"), ("edge", "a3")]
    assert next(iter(doc["runs"][0])) == "store"

    jsonl = [json.loads(line) for line in run_cli(*db, "runs", "list", "--format", "jsonl").out.splitlines()]
    assert [r["store"] for r in jsonl] == ["edge", "central", "edge", "central", "edge"]
    rows = list(csv.DictReader(io.StringIO(run_cli(*db, "runs", "list", "--format", "csv").out)))
    assert [(r["store"], r["run_id"]) for r in rows][:2] == [("edge", "a1"), ("central", "b1")]

    desc = json.loads(run_cli(*db, "runs", "list", "--desc", "--status", "pending", "--flow", "f", "--json").out)
    assert [r["run_id"] for r in desc["runs"]] == ["a3", "b2", "a2", "b1", "a1"]


@pytest.mark.parametrize("order", [[], ["--desc"]], ids=["oldest-first", "newest-first"])
def test_runs_list_across_stores_pages_with_one_cursor_never_skipping_or_repeating(run_cli, two_stores, order):
    db = _db_args(two_stores)
    seen: list[str] = []
    cursor: list[str] = []
    for _ in range(10):
        page = run_cli(*db, "runs", "list", "--limit", "2", *order, *cursor, "--json")
        assert page.code == 0, page
        doc = json.loads(page.out)
        seen += [r["run_id"] for r in doc["runs"]]
        if doc["next_cursor"] is None:
            break
        cursor = ["--cursor", doc["next_cursor"]]
    expected = ["a1", "b1", "a2", "b2", "a3"]
    assert seen == (expected[::-1] if order else expected)
    # the table prints the next page's cursor, ready to paste
    first = run_cli(*db, "runs", "list", "--limit", "2", *order)
    assert "next page: --cursor '" in first.out


def test_runs_list_across_a_cursor_of_other_stores_is_refused(run_cli, two_stores, make_db_url):
    db = _db_args(two_stores)
    doc = json.loads(run_cli(*db, "runs", "list", "--limit", "1", "--json").out)
    other = run_cli("--db", f"x={two_stores['edge']}", "--db", f"y={two_stores['central']}",
                    "runs", "list", "--cursor", doc["next_cursor"])
    assert other.code == 2 and "invalid_cursor" in other.err
    assert_one_line_error(other)
    garbage = run_cli(*db, "runs", "list", "--cursor", "not a cursor")
    assert garbage.code == 2 and "invalid_cursor" in garbage.err


@pytest.mark.parametrize("backend", ["mixed"])
def test_runs_list_and_feed_tail_across_a_sqlite_file_and_a_postgresql_schema(run_cli, mixed_stores):
    db = _db_args(mixed_stores)  # unnamed: shard-0, shard-1 by position; the PG URL has "?schema=..."
    doc = json.loads(run_cli(*db, "runs", "list", "--json").out)
    assert [(r["store"], r["run_id"]) for r in doc["runs"]] == [
        ("shard-0", "s1"), ("shard-1", "p1"), ("shard-0", "s2")]
    changes = [json.loads(line) for line in run_cli(*db, "feed", "tail", "--format", "jsonl").out.splitlines()]
    assert [(c["store"], c["run_id"], c["revision"]) for c in changes] == [
        ("shard-0", "s1", 1), ("shard-0", "s2", 2), ("shard-1", "p1", 1)]


def test_one_named_store_labels_its_records(run_cli, db_url):
    _fill(db_url, ["r1"], [1000])
    doc = json.loads(run_cli("--db", f"main={db_url}", "runs", "list", "--json").out)
    assert [(r["store"], r["run_id"]) for r in doc["runs"]] == [("main", "r1")]
    plain = json.loads(run_cli("--db", db_url, "runs", "list", "--json").out)
    assert "store" not in plain["runs"][0]


# --------------------------------------------------------------------------- feed tail
def test_feed_tail_across_stores_prints_store_by_store_with_labels(run_cli, two_stores):
    db = _db_args(two_stores)
    table = run_cli(*db, "feed", "tail")
    assert table.code == 0, table
    assert [line.split() for line in table.out.splitlines()] == [
        ["edge", "1", "changed", "a1"], ["edge", "2", "changed", "a2"], ["edge", "3", "changed", "a3"],
        ["central", "1", "changed", "b1"], ["central", "2", "changed", "b2"]]
    doc = json.loads(run_cli(*db, "feed", "tail", "--json").out)
    assert [(c["store"], c["revision"]) for c in doc] == [
        ("edge", 1), ("edge", 2), ("edge", 3), ("central", 1), ("central", 2)]
    assert {"store", "run_id", "source", "revision", "deleted"} == set(doc[0])

    later = json.loads(run_cli(*db, "feed", "tail", "--from", "1", "--from", "edge=2", "--json").out)
    assert [(c["store"], c["run_id"]) for c in later] == [("edge", "a3"), ("central", "b2")]
    rows = list(csv.DictReader(io.StringIO(run_cli(*db, "feed", "tail", "--format", "csv").out)))
    assert rows[0]["store"] == "edge" and rows[-1]["store"] == "central"


def test_feed_tail_from_a_name_is_checked(run_cli, two_stores):
    db = _db_args(two_stores)
    unknown = run_cli(*db, "feed", "tail", "--from", "nowhere=1")
    assert unknown.code == 2 and "names no given store" in unknown.err
    assert_one_line_error(unknown)
    single = run_cli("--db", two_stores["edge"], "feed", "tail", "--from", "edge=1")
    assert single.code == 2 and "several stores" in single.err
    bad = run_cli(*db, "feed", "tail", "--from", "-1")
    assert bad.code == 2
    assert_one_line_error(bad)


def _like_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["mixed"])
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)], ids=["ctrl-c", "sigterm"])
def test_feed_tail_follow_across_stores_labels_changes_as_they_come_and_stops_on_a_signal(mixed_stores, sig, code):
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    proc = subprocess.Popen([fencepost_exe(), *_db_args({"lite": mixed_stores[0], "pg": mixed_stores[1]}),
                             "feed", "tail", "--follow", "--format", "jsonl"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_like_a_terminal)
    try:
        first = [json.loads(proc.stdout.readline()) for _ in range(3)]
        assert sorted((c["store"], c["run_id"]) for c in first) == [("lite", "s1"), ("lite", "s2"), ("pg", "p1")]
        with fencepost.open(mixed_stores[1]) as store:
            store.runs.create("p2", "{}")
        assert (lambda c: (c["store"], c["run_id"], c["revision"]))(json.loads(proc.stdout.readline())) == (
            "pg", "p2", 2)
        with fencepost.open(mixed_stores[0]) as store:
            store.runs.delete("s1")
        change = json.loads(proc.stdout.readline())
        assert (change["store"], change["run_id"], change["deleted"]) == ("lite", "s1", True)
    finally:
        proc.send_signal(sig)
        try:
            _out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err


@pytest.mark.slow
def test_feed_tail_follow_across_stores_in_a_table_prints_the_store_first(two_stores):
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    proc = subprocess.Popen([fencepost_exe(), *_db_args(two_stores), "feed", "tail", "--follow"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_like_a_terminal)
    try:
        lines = sorted(tuple(proc.stdout.readline().split()) for _ in range(5))
    finally:
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    assert lines == sorted([("edge", "1", "changed", "a1"), ("edge", "2", "changed", "a2"),
                            ("edge", "3", "changed", "a3"), ("central", "1", "changed", "b1"),
                            ("central", "2", "changed", "b2")])
    assert proc.returncode == 130, err


# --------------------------------------------------------------------------- what is refused
def test_stores_that_do_not_fit_together_are_refused_with_one_line_and_no_value(run_cli, two_stores, make_db_url):
    edge, central = two_stores["edge"], two_stores["central"]
    cases = [
        (["--db", edge, "--db", edge], "same database as --db #1"),
        (["--db", f"x={edge}", "--db", f"x={central}"], "same name as --db #1"),
        (["--db", f"bad name={edge}", "--db", central], "--db #1: a store name must be"),
        (["--db", edge, "--shards", "stores.txt"], "--db and --shards are exclusive"),
        (["--shards", "missing.txt"], "--shards: cannot read the file"),
    ]
    for args, why in cases:
        result = run_cli(*args, "runs", "list")
        assert result.code == 2, (args, result)
        assert why in result.err, (args, result)
        assert_one_line_error(result)
        assert edge not in result.err and central not in result.err


def test_a_password_in_a_store_url_is_never_printed(run_cli, db_url):
    secret = "postgresql+psycopg://user:s3cret-pw@127.0.0.1:1/nowhere"
    result = run_cli("--db", db_url, "--db", f"far={secret}", "runs", "list", timeout=120)
    assert result.code == 1, result
    assert_one_line_error(result)
    assert "s3cret-pw" not in result.err


@pytest.mark.parametrize("command", [
    ["journal", "verify"], ["journal", "replay", "--all"], ["feed", "snapshot", "a1"], ["source", "show"],
    ["source", "rotate"], ["migrations", "status"], ["runs", "retry", "a1"],
], ids=lambda c: " ".join(c[:2]))
def test_commands_of_one_store_refuse_several_with_a_usage_error(run_cli, two_stores, command):
    before = {name: _state(url) for name, url in two_stores.items()}
    result = run_cli(*_db_args(two_stores), *command)
    assert result.code == 2, result
    assert "works on one store and 2 were given" in result.err
    assert_one_line_error(result)
    assert {name: _state(url) for name, url in two_stores.items()} == before


def _state(url: str) -> tuple:
    with fencepost.open(url, readonly=True) as store:
        runs = store.feed.list_runs(None, None, 200).runs
        return store.feed.position(), tuple((r.run_id, r.status) for r in runs)


def test_commands_about_one_run_need_a_recorded_shard_set(run_cli, two_stores):
    db = _db_args(two_stores)  # two independent stores with runs: no set, and never founded as one
    for command in (["runs", "cancel", "a1"], ["runs", "show", "a1"], ["runs", "delete", "a1"],
                    ["runs", "create", "n1"], ["journal", "show", "a1"], ["journal", "replay", "a1"]):
        result = run_cli(*db, *command)
        assert result.code == 2 and "record no shard set" in result.err, (command, result)
        assert_one_line_error(result)
    founding = run_cli(*db, "init")
    assert founding.code == 2 and "--db #1 holds runs and belongs to no shard set" in founding.err
    stdin = subprocess.run([fencepost_exe(), *db, "runs", "create", "-"], input='{"run_id": "z"}\n',
                           capture_output=True, text=True, timeout=60)
    assert stdin.returncode == 2 and "one transaction" in stdin.stderr
    for url in two_stores.values():
        with fencepost.open(url, readonly=True) as store:
            assert membership.read(store) is None
            assert store.runs.get("a1" if url == two_stores["edge"] else "b1").cancel_requested_at_ms is None


# --------------------------------------------------------------------------- a shard set from the CLI
def test_init_founds_a_shard_set_and_run_commands_route_by_run_id(run_cli, shard_urls):
    urls = shard_urls(3)
    db = _db_args(urls)
    init = run_cli(*db, "init")
    assert init.code == 0, init
    assert init.out.splitlines()[-1] == "shard set of 3 stores: shard-0, shard-1, shard-2"
    assert sum(line.startswith("created ") for line in init.out.splitlines()) == 3
    again = run_cli(*db, "init")
    assert again.code == 0 and again.out.count("current: ") == 3

    ids = [f"order-{i}" for i in range(6)]  # one CLI process each: enough to land on several shards
    for run_id in ids:
        made = run_cli(*db, "runs", "create", run_id, "--state", '{"n": 1}', "--json")
        assert made.code == 0, made
    with fencepost.open_shards(urls, readonly=True) as shards:  # the library opens what the CLI founded
        homes = {run_id: shards.locate(run_id) for run_id in ids}
        assert homes == {run_id: shards.place(run_id) for run_id in ids}
        assert len(set(homes.values())) > 1
        for run_id, home in homes.items():
            assert shards[home].runs.get(run_id).state_json == '{"n": 1}'
    created = json.loads(run_cli(*db, "runs", "create", "extra", "--json").out)
    assert created["run_id"] == "extra" and created["store"] in {"shard-0", "shard-1", "shard-2"}

    shown = json.loads(run_cli(*db, "runs", "show", "order-3", "--json").out)
    assert shown["run"]["run_id"] == "order-3"
    assert run_cli(*db, "runs", "cancel", "order-3").out.strip() == "order-3: cancellation requested"
    assert run_cli(*db, "runs", "delete", "order-4").out.strip() == "deleted order-4"
    missing = run_cli(*db, "runs", "show", "nope")
    assert missing.code == 1
    assert_one_line_error(missing)

    listed = json.loads(run_cli(*db, "runs", "list", "--limit", "100", "--json").out)
    assert {(r["store"], r["run_id"]) for r in listed["runs"]} == {
        (homes.get(r, created["store"]), r) for r in [*ids, "extra"] if r != "order-4"}
    with fencepost.open_shards(urls, readonly=True) as shards:
        assert shards.runs.get("order-3").cancel_requested_at_ms is not None

    # the shards in another order are the same set (their recorded names identify them)
    shuffled = _db_args([urls[2], urls[0], urls[1]])
    assert json.loads(run_cli(*shuffled, "runs", "show", "order-5", "--json").out)["run"]["run_id"] == "order-5"
    # only some shards of the set: refused, by reads too (a partial view would look complete)
    for command in (["runs", "list"], ["feed", "tail"], ["runs", "show", "order-5"]):
        part = run_cli(*_db_args(urls[:2]), *command)
        assert part.code == 2 and "give every shard of the set" in part.err, (command, part)
        assert_one_line_error(part)
    renamed = run_cli("--db", f"other={urls[0]}", *_db_args(urls[1:]), "runs", "list")
    assert renamed.code == 2 and "recorded as a shard under another name" in renamed.err


def test_journal_show_and_replay_of_a_run_route_to_its_shard(run_cli, shard_urls):
    """An auditor given a shard set (``--db`` repeated, as every other command of the set takes it)
    was told ``journal show|replay RUN_ID`` "works on one store: give one --db", without being told
    which one holds the run (``runs show`` does not say). Both now route by run id through the set as
    ``runs show`` does, and print what the run's own shard prints; the whole-journal commands
    (``verify``, ``replay --all``) stay one store at a time."""
    urls = shard_urls(3)
    db = _db_args(urls)
    assert run_cli(*db, "init").code == 0
    me = fencepost.OwnerId("host-a", 1, "nonce-1")
    ids = [f"audit-{i}" for i in range(6)]
    with fencepost.open_shards(urls) as shards:
        for run_id in ids:
            shards.runs.create(run_id, "{}")
            shards.runs.claim_and_own(run_id, fencepost.RunSnapshot("pending", None, None), me,
                                      shards.clock.now_ms())
            shards.journal.append(run_id, "step.done", {"n": 1}, owner=me, source_id="app", source_seq=0)
            shards.runs.transition_owned(run_id, me, "completed")
        homes = {run_id: urls[shards.names.index(shards.locate(run_id))] for run_id in ids}
    assert len(set(homes.values())) > 1
    for run_id in ids:
        one = _db_args([homes[run_id]])
        for command in (["journal", "show", run_id, "--json"], ["journal", "show", run_id, "--companion", "--json"],
                        ["journal", "replay", run_id, "--json"]):
            routed, alone = run_cli(*db, *command), run_cli(*one, *command)
            assert routed.code == 0, (command, routed)
            assert json.loads(routed.out) == json.loads(alone.out), command
        assert json.loads(run_cli(*db, "journal", "replay", run_id, "--json").out)["facts"] == 3
    missing = run_cli(*db, "journal", "replay", "nope")
    assert missing.code == 1 and "no run and no ownership facts" in missing.err
    assert_one_line_error(missing)
    part = run_cli(*_db_args(urls[:2]), "journal", "show", ids[0])
    assert part.code == 2 and "give every shard of the set" in part.err


def test_journal_show_of_a_companion_stream_id_routes_as_before(run_cli, shard_urls):
    """``journal show`` takes a companion stream's own id (``flows.companion/...``) as a single store
    does; through a shard set it is read on the shard holding that stream. ``shards.store_for`` now
    refuses such an id (no run can have it), and the command kept routing it as before, instead of
    failing with that refusal."""
    from fencepost.journal import companion_stream

    urls = shard_urls(3)
    db = _db_args(urls)
    assert run_cli(*db, "init").code == 0
    me = fencepost.OwnerId("host-a", 1, "nonce-1")
    with fencepost.open_shards(urls) as shards:
        shards.runs.create("audit-c", "{}")
        shards.runs.claim_and_own("audit-c", fencepost.RunSnapshot("pending", None, None), me, shards.clock.now_ms())
        home = urls[shards.names.index(shards.locate("audit-c"))]
    command = ["journal", "show", companion_stream("audit-c"), "--json"]
    routed, alone = run_cli(*db, *command), run_cli(*_db_args([home]), *command)
    assert (routed.code, alone.code) == (0, 0), (routed, alone)
    assert json.loads(routed.out) == json.loads(alone.out) and json.loads(alone.out)["entries"]


def test_commands_given_a_companion_stream_id_on_a_set_answer_as_one_store(run_cli, shard_urls):
    """The shard commands route a run id through the set's ``locate``, which takes a companion
    stream's id (``journal show`` needs it); creating goes through the set's own create. A reserved
    id (``flows.companion/...``) therefore meets the run store's own refusal on a set, as on one store
    (same exit code and words): ``runs create`` is refused and creates nothing, and ``runs show``,
    ``cancel`` and ``delete`` find no run with it. (The one store is no shard: a shard alone refuses
    ``runs create`` for another reason.)"""
    from fencepost.journal import companion_stream

    urls, lone = shard_urls(2), shard_urls(1)
    db = _db_args(urls)
    assert run_cli(*db, "init").code == 0 and run_cli(*_db_args(lone), "init").code == 0
    me = fencepost.OwnerId("host-a", 1, "nonce-1")
    with fencepost.open_shards(urls) as shards:
        shards.runs.create("audit-d", "{}")
        shards.runs.claim_and_own("audit-d", fencepost.RunSnapshot("pending", None, None), me, shards.clock.now_ms())
    for reserved in ("flows.companion/x", companion_stream("audit-d")):
        for command in (["runs", "create", reserved], ["runs", "show", reserved], ["runs", "cancel", reserved],
                        ["runs", "delete", reserved]):
            routed, alone = run_cli(*db, *command), run_cli(*_db_args(lone), *command)
            assert (routed.code, routed.err) == (alone.code, alone.err), (command, routed, alone)
            assert_one_line_error(routed)
        created = run_cli(*db, "runs", "create", reserved)
        assert "reserved companion-stream prefix" in created.err, created
    with fencepost.open_shards(urls) as shards:
        assert [r.run_id for _, s in shards.items() for r in s.feed.list_runs().runs] == ["audit-d"]


def _grown_set_with_runs_left_behind(run_cli, shard_urls, ids):
    """A set of two shards grown to three after ``ids`` were created, claimed and completed on the
    first two; returns the URLs and the ids the grown set would now place on the new shard."""
    urls = shard_urls(3)
    assert run_cli(*_db_args(urls[:2]), "init").code == 0
    me = fencepost.OwnerId("host-a", 1, "nonce-1")
    with fencepost.open_shards(urls[:2]) as shards:
        for run_id in ids:
            shards.runs.create(run_id, "{}")
            shards.runs.claim_and_own(run_id, fencepost.RunSnapshot("pending", None, None), me,
                                      shards.clock.now_ms())
            shards.runs.transition_owned(run_id, me, "completed")
    assert run_cli(*_db_args(urls), "init", "--grow").code == 0
    with fencepost.open_shards(urls, readonly=True) as shards:
        moved = [run_id for run_id in ids if shards.place(run_id) == "shard-2"]
    assert moved, "no id would now be placed on the new shard"
    return urls, moved


def test_journal_of_a_deleted_run_is_found_after_the_set_grew(run_cli, shard_urls):
    """An auditor reads the journal of a DELETED run (its row gone, its journal kept) through a set
    that grew since: the id now places on the new shard, which holds nothing of it. ``journal show``,
    ``show --companion`` and ``replay`` still find the shard that holds the run's journal."""
    urls, moved = _grown_set_with_runs_left_behind(run_cli, shard_urls, [f"gone-{i}" for i in range(12)])
    db = _db_args(urls)
    for run_id in moved:
        assert run_cli(*db, "runs", "delete", run_id).code == 0
    for run_id in moved:
        shown = run_cli(*db, "journal", "show", run_id, "--json")
        assert shown.code == 0, shown
        assert [e["event_type"] for e in json.loads(shown.out)["entries"]] == ["flows.run-store.deleted"]
        facts = run_cli(*db, "journal", "show", run_id, "--companion", "--json")
        assert facts.code == 0 and len(json.loads(facts.out)["entries"]) == 3, facts
        replayed = run_cli(*db, "journal", "replay", run_id, "--json")
        assert replayed.code == 0 and json.loads(replayed.out)["facts"] == 3, replayed


def test_ownership_facts_of_a_run_without_row_or_stream_are_found_after_the_set_grew(run_cli, shard_urls):
    """A run whose row was removed outside fencepost (a store restored without its runs, a hand
    cleanup) keeps only its ownership facts: its companion stream, which is not named by the run id.
    After the set grew and the id places on the new shard, the lookup found nothing of the run on
    any shard and answered from the new, empty one: "no run and no ownership facts". The facts are
    found on the shard that holds them."""
    urls, moved = _grown_set_with_runs_left_behind(run_cli, shard_urls, [f"bare-{i}" for i in range(12)])
    db = _db_args(urls)
    with fencepost.open_shards(urls) as shards:
        for run_id in moved:
            conn = shards.store_for(run_id).db.connect()
            try:
                conn.exec_driver_sql("DELETE FROM flows_runs WHERE run_id = %s" if conn.dialect.name == "postgresql"
                                     else "DELETE FROM flows_runs WHERE run_id = ?", (run_id,))
                conn.commit()
            finally:
                conn.close()
    for run_id in moved:
        replayed = run_cli(*db, "journal", "replay", run_id, "--json")
        assert replayed.code == 0, replayed
        assert json.loads(replayed.out)["facts"] == 3, replayed
        facts = run_cli(*db, "journal", "show", run_id, "--companion", "--json")
        assert facts.code == 0 and len(json.loads(facts.out)["entries"]) == 3, facts


def test_creating_a_run_on_one_shard_given_alone_is_refused(run_cli, shard_urls):
    """One --db naming a single shard of a set created a run id the set already held on another
    shard (two runs named o1 in one set). Creating goes through the whole set; the other run
    commands still act on the one store given."""
    urls = shard_urls(2)
    db = _db_args(urls)
    assert run_cli(*db, "init").code == 0
    assert run_cli(*db, "runs", "create", "o1").code == 0
    with fencepost.open_shards(urls, readonly=True) as shards:
        home = shards.locate("o1")
        other = next(u for name, u in zip(shards.names, urls, strict=True) if name != home)
    for args in (["runs", "create", "o1"], ["runs", "create", "o2"]):
        alone = run_cli("--db", other, *args)
        assert alone.code == 2 and "give every shard of the set" in alone.err, alone
        assert_one_line_error(alone)
    piped = subprocess.run([fencepost_exe(), "--db", other, "runs", "create", "-"], input='{"run_id": "o3"}\n',
                           capture_output=True, text=True, timeout=60)
    assert piped.returncode == 2 and "give every shard of the set" in piped.stderr, piped
    listed = json.loads(run_cli(*db, "runs", "list", "--json").out)
    assert [r["run_id"] for r in listed["runs"]] == ["o1"]  # nothing was created
    assert run_cli("--db", other, "runs", "list").code == 0  # reading one shard alone still works


def test_a_shard_file_names_the_stores(run_cli, shard_urls, tmp_path):
    urls = shard_urls(2)
    (tmp_path / "stores.txt").write_text(textwrap.dedent(f"""\
        # the shards of the order service
        east={urls[0]}

        west={urls[1]}
        """))
    init = run_cli("--shards", "stores.txt", "init")
    assert init.code == 0 and init.out.splitlines()[-1] == "shard set of 2 stores: east, west", init
    assert run_cli("--shards", "stores.txt", "runs", "create", "r1").code == 0
    doc = json.loads(run_cli("--shards", "stores.txt", "runs", "list", "--json").out)
    assert [r["store"] for r in doc["runs"]] == [place("r1", ["east", "west"])]
    # plain --db of the same stores take the names the set recorded
    plain = json.loads(run_cli(*_db_args(urls), "feed", "tail", "--json").out)
    assert [(c["store"], c["run_id"]) for c in plain] == [(place("r1", ["east", "west"]), "r1")]
    (tmp_path / "bad.txt").write_text("# nothing but a comment\n")
    empty = run_cli("--shards", "bad.txt", "runs", "list")
    assert empty.code == 2 and "names no store" in empty.err
    (tmp_path / "worse.txt").write_text(f"ok={urls[0]}\nno good={urls[1]}\n")
    worse = run_cli("--shards", "worse.txt", "runs", "list")
    assert worse.code == 2 and "--shards line 2" in worse.err and urls[1] not in worse.err
    # Stores that do not fit together are named by their line in the file, not a --db they never were.
    (tmp_path / "twice.txt").write_text(f"# the same store twice\n{urls[0]}\n\n{urls[0]}\n")
    twice = run_cli("--shards", "twice.txt", "runs", "list")
    assert twice.code == 2 and "--shards line 4 is the same database as --shards line 2" in twice.err, twice
    assert "--db" not in twice.err and urls[0] not in twice.err
    (tmp_path / "named.txt").write_text(f"east={urls[0]}\n# another\neast={urls[1]}\n")
    named = run_cli("--shards", "named.txt", "runs", "list")
    assert named.code == 2 and "--shards line 3 is recorded as a shard under another name" in named.err, named


TASK = """
def work(ctx):
    return {"done": True}
"""


@pytest.mark.slow
def test_worker_sweeps_every_shard_of_the_set(run_cli_subprocess, shard_urls, tmp_path):
    run_cli = run_cli_subprocess  # worker processes: started from a process of their own
    urls = shard_urls(2)
    (tmp_path / "shardtask.py").write_text(TASK)
    db = _db_args(urls)
    with fencepost.open_shards(urls) as shards:
        for i in range(8):
            shards.runs.create(f"job-{i}", "{}")
        assert {shards.locate(f"job-{i}") for i in range(8)} == {"shard-0", "shard-1"}
    result = run_cli(*db, "worker", "-n", "2", "--task", "shardtask:work", "--until-idle", timeout=180)
    assert result.code == 0, result
    doc = json.loads(run_cli(*db, "runs", "list", "--json").out)
    assert len(doc["runs"]) == 8
    assert {r["status"] for r in doc["runs"]} == {"completed"}
    assert {r["store"] for r in doc["runs"]} == {"shard-0", "shard-1"}


def test_worker_refuses_stores_that_hold_runs_but_no_shard_set(run_cli, two_stores, tmp_path):
    (tmp_path / "shardtask.py").write_text(TASK)
    result = run_cli(*_db_args(two_stores), "worker", "--task", "shardtask:work", "--until-idle")
    assert result.code == 2 and "belongs to no shard set" in result.err, result
    assert_one_line_error(result)


# --------------------------------------------------------------------------- projections
@pytest.mark.parametrize("command", [["projection", "status"], ["projection", "run"], ["projection", "rebuild"]],
                         ids=lambda c: c[1])
def test_projection_commands_across_stores_need_a_target(run_cli, two_stores, command):
    """A read model of several stores lives in a database of its own: without --target, a usage error."""
    before = {name: _state(url) for name, url in two_stores.items()}
    result = run_cli(*_db_args(two_stores), *command)
    assert result.code == 2, result
    assert "--target" in result.err
    assert_one_line_error(result)
    assert {name: _state(url) for name, url in two_stores.items()} == before


@pytest.mark.parametrize("backend", ["mixed"])
def test_projection_run_status_rebuild_across_a_sqlite_file_and_a_postgresql_schema(run_cli, mixed_stores,
                                                                                    tmp_path):
    """One read model fed by both stores: a checkpoint and a status row per store, labelled; a rebuild
    of one store's share leaves the other's alone; an unknown --source changes nothing."""
    db = _db_args({"lite": mixed_stores[0], "pg": mixed_stores[1]})
    model = tmp_path / "read-model.db"
    target = f"sqlite:///{model}"

    bad = run_cli(*db, "projection", "rebuild", "--target", target, "--source", "nope")
    assert bad.code == 2 and "--source" in bad.err, bad
    assert_one_line_error(bad)
    assert not model.exists()

    ran = run_cli(*db, "projection", "run", "--target", target, "--format", "jsonl")
    assert ran.code == 0, ran
    assert {json.loads(line)["store"]: json.loads(line)["applied"] for line in ran.out.splitlines()} == {
        "lite": 2, "pg": 1}
    table = run_cli(*db, "projection", "run", "--target", target)
    assert sorted(table.out.splitlines()) == ["lite: applied 0, rejected 0, at revision 2",
                                              "pg: applied 0, rejected 0, at revision 1"], table

    status = json.loads(run_cli(*db, "projection", "status", "--target", target, "--json").out)
    assert [(s["store"], s["applied_revision"], s["lag"], s["rebuilds"]) for s in status] == [
        ("lite", 2, 0, 0), ("pg", 1, 0, 0)]
    shown = run_cli(*db, "projection", "status", "--target", target)
    assert [line.split()[0] for line in shown.out.splitlines()] == ["store", "lite", "pg"], shown

    rebuilt = json.loads(run_cli(*db, "projection", "rebuild", "--target", target, "--source", "pg", "--json").out)
    assert [(r["store"], r["applied"], r["rebuilt"]) for r in rebuilt] == [("pg", 1, True)]
    status = json.loads(run_cli(*db, "projection", "status", "--target", target, "--json").out)
    assert {s["store"]: s["rebuilds"] for s in status} == {"lite": 0, "pg": 1}
    import sqlite3

    with sqlite3.connect(model) as conn:
        rows = sorted(conn.execute("SELECT source_name, run_id FROM projection_runs_by_status").fetchall())
    assert rows == [("lite", "s1"), ("lite", "s2"), ("pg", "p1")]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["mixed"])
def test_projection_run_follow_across_stores_prints_a_status_line_per_store(mixed_stores, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    proc = subprocess.Popen([fencepost_exe(), *_db_args({"lite": mixed_stores[0], "pg": mixed_stores[1]}),
                             "projection", "run", "--target", f"sqlite:///{tmp_path / 'm.db'}", "--follow",
                             "--interval", "0.2", "--format", "jsonl"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_like_a_terminal)
    try:
        seen: dict[str, dict] = {}
        while not (len(seen) == 2 and all(s["lag"] == 0 and s["applied_revision"] > 0 for s in seen.values())):
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            record = json.loads(line)
            seen[record["store"]] = record
        assert {name: s["applied_revision"] for name, s in seen.items()} == {"lite": 2, "pg": 1}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, err


@pytest.mark.slow
def test_feed_tail_follow_across_stores_names_the_store_whose_source_rotated(two_stores):
    """Across stores, a rotated source ended the tailer with the store's internal words and no
    store name. It now says which store's source rotated and how to start again; exit 1."""
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    proc = subprocess.Popen([fencepost_exe(), *_db_args(two_stores), "feed", "tail", "--follow", "--format", "jsonl"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_like_a_terminal)
    try:
        assert len([json.loads(proc.stdout.readline()) for _ in range(5)]) == 5
        with fencepost.open(two_stores["central"]) as store:
            rotated = store.feed.rotate_source()
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "central" in lines[0] and "source rotated" in lines[0] and rotated.source in lines[0], err
    assert "--from central=0" in lines[0], err
    assert "invalid_run" not in err and "Traceback" not in err


def test_a_refused_init_of_a_shard_set_creates_no_database(run_cli, shard_urls, tmp_path):
    """``init`` of several stores created and migrated every given store before checking that they
    form the set they record: a new store given beside a founded set (an extra store, or one in
    place of a member), refused with exit 2, was left behind as a new empty database. Now the
    stores are looked at read-only first and a refused init creates nothing. The refusal also
    named the store "shard #2" (its 0-based position in the set) beside messages that say "--db #3":
    it now names the --db as given."""
    from tests.conftest import store_exists

    a, b, new = shard_urls(3)
    assert run_cli(*_db_args([a, b]), "init").code == 0
    before = [_state(a), _state(b)]
    for given in ([a, b, new], [a, new]):
        refused = run_cli(*_db_args(given), "init")
        assert refused.code == 2, refused
        assert_one_line_error(refused)
        assert not store_exists(new), given
        # named as given: the new store is the last --db, not "shard #<its 0-based member position>"
        assert f"--db #{len(given)} is not a member" in refused.err and "shard #" not in refused.err, refused
    assert [_state(a), _state(b)] == before
    with fencepost.open_shards([a, b], readonly=True) as shards:
        assert shards.names == ("shard-0", "shard-1")


def test_init_of_one_new_store_given_twice_creates_nothing(run_cli, shard_urls):
    """``init`` with the same new store twice created and migrated it, and only then saw one source
    id twice. It is refused before anything is created now."""
    from tests.conftest import store_exists

    (new,) = shard_urls(1)
    refused = run_cli("--db", new, "--db", f"again={new}", "init")
    assert refused.code == 2 and "--db #2 is the same database as --db #1" in refused.err, refused
    assert_one_line_error(refused)
    assert not store_exists(new)


def test_init_grow_adds_a_shard_to_a_set_that_holds_runs(run_cli, shard_urls):
    """Adding a store to a set had no command: ``init`` refused the new store with "grow the set to
    add a store", which only the library could do (``open_shards(..., grow=True)``). ``init --grow``
    appends the new stores; the old runs stay where they are and are still found."""
    from tests.conftest import store_exists

    a, b, new = shard_urls(3)
    assert run_cli(*_db_args([a, b]), "init").code == 0
    ids = [f"g-{i}" for i in range(4)]
    for run_id in ids:
        assert run_cli(*_db_args([a, b]), "runs", "create", run_id).code == 0
    refused = run_cli(*_db_args([a, b, new]), "init")
    assert refused.code == 2 and "fencepost init --grow" in refused.err, refused
    assert_one_line_error(refused)
    assert not store_exists(new)

    grown = run_cli(*_db_args([b, new, a]), "init", "--grow")  # any order: recorded names identify members
    assert grown.code == 0, grown
    assert grown.out.splitlines()[-1] == "shard set of 3 stores: shard-0, shard-1, shard-2", grown
    assert grown.out.splitlines()[1].startswith("created "), grown  # the new store, second as given
    with fencepost.open_shards([a, b, new], readonly=True) as shards:
        assert shards.membership.generation == 2
        assert all(shards.runs.get(run_id).run_id == run_id for run_id in ids)
    again = run_cli(*_db_args([a, b, new]), "init", "--grow")
    assert again.code == 0 and again.out.count("current: ") == 3, again
    for run_id in ids:
        shown = run_cli(*_db_args([a, b, new]), "runs", "show", run_id, "--json")
        assert shown.code == 0 and json.loads(shown.out)["run"]["run_id"] == run_id, shown
    old = run_cli(*_db_args([a, b]), "runs", "list")
    assert old.code == 2 and "give every shard of the set" in old.err, old


def test_init_grow_of_one_store_is_refused(run_cli, db_url):
    alone = run_cli("--db", db_url, "init", "--grow")
    assert alone.code == 2 and "--grow" in alone.err, alone
    assert_one_line_error(alone)


def test_a_shard_file_with_a_bom_crlf_and_comments_after_urls(run_cli, shard_urls, tmp_path):
    """A shard file saved by a Windows editor (a UTF-8 byte order mark, CRLF line ends) refused its
    first line as a bad store name, and a comment after a URL (``URL  # the east shard``) became
    part of the URL: init created a SQLite file named ``east.db  # the east shard``. Both now read
    as written: the mark is skipped, and a ``#`` after whitespace starts a comment."""
    east, west = shard_urls(2)
    (tmp_path / "stores.txt").write_bytes(
        b"\xef\xbb\xbf" + f"east={east}   # the east shard\r\n\r\nwest={west}\t# the west one\r\n".encode())
    init = run_cli("--shards", "stores.txt", "init")
    assert init.code == 0 and init.out.splitlines()[-1] == "shard set of 2 stores: east, west", init
    assert sorted(p.name for p in tmp_path.iterdir() if "#" in p.name) == []
    assert run_cli("--shards", "stores.txt", "runs", "create", "r1").code == 0
    with fencepost.open_shards({"east": east, "west": west}, readonly=True) as shards:
        assert shards.runs.get("r1").run_id == "r1"


def test_init_refuses_a_blank_store_in_place_of_a_member_of_a_founded_set(run_cli, shard_urls):
    """``init --db a --db blank`` after ``init --db a --db b`` founded a set that held no run yet:
    the blank store was recorded as shard-1 too, and two stores claimed one member. Refused now,
    naming the --db as given, and nothing is written to the blank store."""
    from fencepost.shards import membership

    a, b, blank = shard_urls(3)
    assert run_cli(*_db_args([a, b]), "init").code == 0
    assert run_cli("--db", blank, "init").code == 0
    before = [_state(a), _state(b), _state(blank)]
    refused = run_cli(*_db_args([a, blank]), "init")
    assert refused.code == 2, refused
    assert_one_line_error(refused)
    assert "--db #2 is not a member" in refused.err and blank.split("?")[0] not in refused.err, refused
    assert [_state(a), _state(b), _state(blank)] == before
    with fencepost.open(blank) as store:
        assert membership.read(store) is None


def test_feed_tail_from_a_named_store_source_and_revision(run_cli, two_stores):
    """``--from NAME=SOURCE:REVISION`` resumes one store on its own source; another store's source
    (a cursor kept for the wrong store, or a rotated one) exits 1 naming the store, printing nothing."""
    db = _db_args(two_stores)
    doc = json.loads(run_cli(*db, "feed", "tail", "--json").out)
    source = {c["store"]: c["source"] for c in doc}
    later = run_cli(*db, "feed", "tail", "--from", f"edge={source['edge']}:2", "--from", "central=2", "--json")
    assert later.code == 0, later
    assert [(c["store"], c["run_id"]) for c in json.loads(later.out)] == [("edge", "a3")]
    wrong = run_cli(*db, "feed", "tail", "--from", f"edge={source['central']}:2")
    assert_one_line_error(wrong)
    assert wrong.code == 1 and wrong.out == "" and "store edge" in wrong.err and "--from edge=0" in wrong.err, wrong
