"""Audit commands fail loudly: ``journal verify`` on a tampered journal, ``journal replay`` on a forged history."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import update

import fencepost
from fencepost._schema import flows_journal_events as events
from fencepost.journal import companion_stream
from fencepost.journal.owner import OwnerId
from fencepost.runstore.outcomes import Activated, Claimed
from tests.cli.conftest import assert_one_line_error

A = OwnerId("host-a", 101, "owner-a")
B = OwnerId("host-a", 202, "owner-b")


# Each command runs through fencepost.cli.main in this interpreter (see run_cli in conftest.py).
pytestmark = pytest.mark.cli_in_process


@pytest.fixture
def settled(db_url):
    with fencepost.open(db_url) as store:
        store.runs.create("r1", "{}")
        row = store.runs.get("r1")
        claimed = store.runs.claim("r1", row.snapshot(), A, store.clock.now_ms())
        assert isinstance(claimed, Claimed)
        store.runs.activate("r1", A, claimed.claimed_at_ms, row)
        store.runs.transition_owned("r1", A, "completed")
    return db_url


def _drop_append_only_guard(store, conn) -> None:
    """What a tamperer with database access does first: the triggers only stop honest mistakes."""
    for trigger in ("flows_journal_events_no_update_v1", "flows_journal_events_no_delete_v1"):
        if store.db.name == "sqlite":
            conn.exec_driver_sql(f"DROP TRIGGER {trigger}")
        else:
            conn.exec_driver_sql(f'DROP TRIGGER {trigger} ON "{store.db.schema}".flows_journal_events')


def test_verify_passes_then_a_tampered_payload_exits_1(run_cli, settled):
    ok = run_cli("--db", settled, "journal", "verify", "--json")
    assert ok.code == 0 and json.loads(ok.out)["ok"] is True
    with fencepost.open(settled) as store, store.db.connect() as conn:
        _drop_append_only_guard(store, conn)
        conn.execute(update(events).where(events.c.run_id == companion_stream("r1"), events.c.seq == 1)
                     .values(payload_json='{"runId":"r1","owner":{"hostId":"evil","pid":1,"nonce":"x"},'
                                          '"grantedAtMs":0}'))
        conn.commit()
    broken = run_cli("--db", settled, "journal", "verify")
    assert broken.code == 1, broken
    assert "journal broken" in broken.out and "Traceback" not in broken.err
    as_json = run_cli("--db", settled, "journal", "verify", "--json")
    assert as_json.code == 1 and json.loads(as_json.out)["ok"] is False


def test_a_removed_entry_breaks_the_chain(run_cli, settled):
    with fencepost.open(settled) as store, store.db.connect() as conn:
        _drop_append_only_guard(store, conn)
        conn.execute(events.delete().where(events.c.run_id == companion_stream("r1"), events.c.seq == 1))
        conn.commit()
    assert run_cli("--db", settled, "journal", "verify").code == 1


def test_replay_of_a_run_whose_facts_were_all_removed_exits_1(run_cli, settled):
    """A settled run's every fact deleted: replay names the run and says it has no facts left
    (it used to say "ownership history is consistent", and ``--all`` did not list the run)."""
    with fencepost.open(settled) as store, store.db.connect() as conn:
        _drop_append_only_guard(store, conn)
        conn.execute(events.delete().where(events.c.run_id == companion_stream("r1")))
        conn.commit()
    one = run_cli("--db", settled, "journal", "replay", "r1")
    assert one.code == 1, one
    assert "violation row_disagrees with no facts: the run row was claimed or started" in one.out
    every = run_cli("--db", settled, "journal", "replay", "--all")
    assert every.code == 1, every
    assert "1 run(s) replayed, 0 ownership interval(s), 1 violation(s)" in every.out
    assert "r1" in every.out and "row_disagrees with no facts" in every.out
    assert every.err.strip() == "Error: 1 of 1 run(s) break the ownership rules (1 violation(s))"


def test_replay_of_a_consistent_history_exits_0(run_cli, settled):
    result = run_cli("--db", settled, "journal", "replay", "r1", "--json")
    assert result.code == 0, result
    history = json.loads(result.out)
    assert history["violations"] == [] and len(history["intervals"]) == 1


def test_replay_exits_1_when_a_forged_fact_gives_the_run_a_second_owner(run_cli, settled):
    with fencepost.open(settled) as store:
        # A fact no store operation would write: B activated after the run was released, unclaimed.
        store.db.write(lambda conn: store.journal.append_in(
            conn, companion_stream("r1"), "flows.consensus.activated",
            {"runId": "r1", "owner": B.to_json(), "grantedAtMs": 5}, source_id="flows.run-store",
            meta={"runId": "r1"}))
    result = run_cli("--db", settled, "journal", "replay", "r1")
    assert result.code == 1, result
    assert "violation" in result.out


# ---------------------------------------------------------------------------- issue 11
def _forge_second_owner(db_url: str, run_id: str) -> None:
    with fencepost.open(db_url) as store:
        store.db.write(lambda conn: store.journal.append_in(
            conn, companion_stream(run_id), "flows.consensus.activated",
            {"runId": run_id, "owner": B.to_json(), "grantedAtMs": 5}, source_id="flows.run-store",
            meta={"runId": run_id}))


def test_replay_of_an_unknown_run_is_an_error(run_cli, settled):
    """Issue 11 (4): no run and no facts with this id: exit 1, one line on stderr, nothing on stdout."""
    result = run_cli("--db", settled, "journal", "replay", "no-such-run")
    assert_one_line_error(result)
    assert result.code == 1 and result.out == "" and "no run" in result.err
    # A run that exists but was never claimed has an empty, consistent history.
    with fencepost.open(settled) as store:
        store.runs.create("never-claimed", "{}")
    assert run_cli("--db", settled, "journal", "replay", "never-claimed").code == 0


def test_replay_wants_a_run_id_or_all(run_cli, settled):
    for args in ((), ("r1", "--all")):
        result = run_cli("--db", settled, "journal", "replay", *args)
        assert_one_line_error(result)
        assert result.code == 2


def test_replay_all_summarises_every_run_and_exits_1_on_any_violation(run_cli, settled):
    """Issue 11 (4): runs, intervals, violations by kind; --json; exit 1 once one run is broken."""
    with fencepost.open(settled) as store:
        store.runs.create("r2", "{}")
        assert isinstance(store.runs.claim_and_own("r2", store.runs.get("r2"), A, store.clock.now_ms()),
                          Activated)
    ok = run_cli("--db", settled, "journal", "replay", "--all")
    assert ok.code == 0, ok
    assert "2 run(s) replayed, 2 ownership interval(s), 0 violation(s)" in ok.out
    summary = json.loads(run_cli("--db", settled, "journal", "replay", "--all", "--json").out)
    assert (summary["ok"], summary["runs"], summary["intervals"], summary["violations"]) == (True, 2, 2, {})
    assert sorted(h["run_id"] for h in summary["histories"]) == ["r1", "r2"]

    _forge_second_owner(settled, "r2")
    broken = run_cli("--db", settled, "journal", "replay", "--all")
    assert broken.code == 1, broken
    # The forged fact breaks two rules, and leaves the facts ending with another owner than the row's.
    assert "2 run(s) replayed, 3 ownership interval(s), 3 violation(s)" in broken.out
    assert "activated_without_claim" in broken.out and "two_owners" in broken.out and "r2" in broken.out
    assert "row_disagrees" in broken.out
    as_json = run_cli("--db", settled, "journal", "replay", "--all", "--json")
    assert as_json.code == 1
    assert json.loads(as_json.out)["violations"] == {"activated_without_claim": 1, "row_disagrees": 1,
                                                     "two_owners": 1}
    # Like `replay RUN_ID` and `verify`, a failing replay says so on stderr (it used to exit 1 with
    # nothing there, so a script checking only stderr saw no reason).
    for result in (broken, as_json):
        assert result.err.strip() == "Error: 1 of 2 run(s) break the ownership rules (3 violation(s))", result


def test_verify_names_the_run_of_a_broken_companion_entry(run_cli, settled):
    """Issue 11 (4): the break names run r1, not only the hashed companion stream."""
    with fencepost.open(settled) as store, store.db.connect() as conn:
        _drop_append_only_guard(store, conn)
        conn.execute(update(events).where(events.c.run_id == companion_stream("r1"), events.c.seq == 1)
                     .values(payload_json='{"runId":"r1","owner":{"hostId":"evil","pid":1,"nonce":"x"},'
                                          '"grantedAtMs":0}'))
        conn.commit()
    broken = run_cli("--db", settled, "journal", "verify")
    assert broken.code == 1 and "first at run r1 (its companion stream) seq 1" in broken.out, broken
    report = json.loads(run_cli("--db", settled, "journal", "verify", "--json").out)
    assert report["first_break"]["run_id"] == "r1"
    assert report["first_break"]["stream"] == companion_stream("r1")


def test_verify_anchor_proves_the_newest_entries_were_not_removed(run_cli, settled):
    """Issue 11 (4): ``--anchor POSITION:HASH`` from an earlier report catches a removed newest entry."""
    ok = run_cli("--db", settled, "journal", "verify", "--json")
    head = json.loads(ok.out)["head"]
    anchor = f"{head['position']}:{head['entry_hash']}"
    assert f"head {anchor}" in run_cli("--db", settled, "journal", "verify").out
    assert run_cli("--db", settled, "journal", "verify", "--anchor", anchor).code == 0
    with fencepost.open(settled) as store, store.db.connect() as conn:
        _drop_append_only_guard(store, conn)
        conn.execute(events.delete().where(events.c.position == head["position"]))
        conn.commit()
    # The chain alone cannot see a removed newest entry ...
    assert run_cli("--db", settled, "journal", "verify").code == 0
    # ... the anchor does.
    anchored = run_cli("--db", settled, "journal", "verify", "--anchor", anchor)
    assert anchored.code == 1 and "first at the anchor" in anchored.out, anchored
    # Positions no entry can have (0, beyond 2**53-1) and digits other than ASCII ("²" made int()
    # raise: a ValueError line instead of a usage error) are mistakes in the argument, not breaks.
    for bad in ("12", "x:" + "0" * 64, "3:abc", "3:" + "G" * 64, "3:" + "0" * 63, "0:" + "0" * 64,
                f"{2**53}:" + "0" * 64, "\u00b2:" + "0" * 64, "\u0661\u0662:" + "0" * 64):
        result = run_cli("--db", settled, "journal", "verify", "--anchor", bad)
        assert_one_line_error(result)
        assert result.code == 2 and "--anchor" in result.err


def test_verify_anchor_with_a_mistyped_hash_names_the_anchor_not_a_seq(run_cli, settled):
    """A hash that is not the entry's reads as a changed anchor (no made-up "seq -1"); the hash
    printed in lower case is also accepted upper-cased, as copied from elsewhere."""
    head = json.loads(run_cli("--db", settled, "journal", "verify", "--json").out)["head"]
    upper = run_cli("--db", settled, "journal", "verify", "--anchor",
                    f"{head['position']}:{head['entry_hash'].upper()}")
    assert upper.code == 0, upper
    wrong = "0" * 64 if head["entry_hash"] != "0" * 64 else "1" * 64
    mistyped = run_cli("--db", settled, "journal", "verify", "--anchor", f"{head['position']}:{wrong}")
    assert mistyped.code == 1
    assert f"first at the anchor (position {head['position']}): the anchored entry has another hash" \
        in mistyped.out, mistyped
    assert "seq" not in mistyped.out


def test_an_undecodable_stored_entry_is_named_by_position_on_every_read(run_cli, settled, tmp_path):
    """Defect: a stored entry that passes the table's JSON check but cannot be decoded (a number
    out of range, written by someone with database access) made ``journal show``, ``journal replay``
    and ``journal replay --all`` fail with "stored payload or meta is not valid JSON" and no hint of
    which entry: the auditor could not find it. The error names its position (as verify does), and
    never the stored value. Replay reports the fact as ``malformed_fact`` naming its position (exit
    1, like any broken history) and goes on with the other facts and runs."""
    with fencepost.open(settled) as store, store.db.connect() as conn:
        _drop_append_only_guard(store, conn)
        conn.execute(update(events).where(events.c.run_id == companion_stream("r1"), events.c.seq == 1)
                     .values(payload_json='{"password":"hunter2-LEAK","n":1e400}'))
        conn.commit()
        position = conn.execute(events.select().with_only_columns(events.c.position)
                                .where(events.c.run_id == companion_stream("r1"), events.c.seq == 1)).scalar()
    result = run_cli("--db", settled, "journal", "show", "r1", "--companion")
    assert_one_line_error(result)
    assert result.code == 1 and "decode_failed" in result.err, result
    assert f"position {position}" in result.err, result
    assert "hunter2-LEAK" not in result.err + result.out
    for args in (("journal", "replay", "r1"), ("journal", "replay", "--all", "--json")):
        result = run_cli("--db", settled, *args)
        assert result.code == 1 and "Traceback" not in result.err, result
        assert "malformed_fact" in result.out and f"position {position}" in result.out, result
        assert "hunter2-LEAK" not in result.err + result.out
    broken = run_cli("--db", settled, "journal", "verify")
    assert broken.code == 1 and f"(position {position})" in broken.out and "hunter2-LEAK" not in broken.out
    # The ownership-history projection reads the same facts: it stopped with only the decoder's
    # "ValidationError: Number out of range", naming no entry.
    built = run_cli("--db", settled, "projection", "run", "--name", "ownership_history",
                    "--target", f"sqlite:///{tmp_path / 'history.db'}")
    assert_one_line_error(built)
    assert built.code == 1 and "decode_failed" in built.err and f"position {position}" in built.err, built
    assert "hunter2-LEAK" not in built.err + built.out


def test_journal_show_of_an_id_with_no_run_and_no_entries_is_an_error(run_cli, settled):
    """Defect: a mistyped run id given to ``journal show`` printed an empty table and exited 0 (on a
    pipe not even the title), so an auditor read "no entries" for a run that has them under
    another id. As ``journal replay`` does: an id that names neither a run nor any entries is an
    error (exit 1, one line). A run without entries, and a deleted run's kept stream, still show."""
    for args in (("journal", "show", "r-1"), ("journal", "show", "r-1", "--companion"),
                 ("journal", "show", "r-1", "--json")):
        result = run_cli("--db", settled, *args)
        assert_one_line_error(result)
        assert result.code == 1 and result.out == "" and "no run" in result.err, result
    with fencepost.open(settled) as store:
        store.runs.create("never-claimed", "{}")
        store.runs.create("gone", "{}")
        store.runs.delete("gone")
    empty = run_cli("--db", settled, "journal", "show", "never-claimed", "--json")
    assert empty.code == 0 and json.loads(empty.out)["entries"] == [], empty
    kept = run_cli("--db", settled, "journal", "show", "gone", "--json")
    assert kept.code == 0 and [e["event_type"] for e in json.loads(kept.out)["entries"]] == [
        "flows.run-store.deleted"], kept
    past_the_end = run_cli("--db", settled, "journal", "show", "r1", "--companion", "--after", "50")
    assert past_the_end.code == 0, past_the_end


def test_verify_names_every_break_not_only_the_first(run_cli, settled):
    """Defect (audit): two tampers (an edited fact of r1, a deleted fact of r2) printed "journal
    broken: N break(s); first at run r1 ..." and nothing about r2: the table names every break, one
    line each, and --json lists them (``first_breaks``); no payload value is printed."""
    with fencepost.open(settled) as store:
        store.runs.create("r2", "{}")
        assert isinstance(store.runs.claim_and_own("r2", store.runs.get("r2"), A, store.clock.now_ms()), Activated)
        store.runs.transition_owned("r2", A, "completed")
    with fencepost.open(settled) as store, store.db.connect() as conn:
        _drop_append_only_guard(store, conn)
        conn.execute(update(events).where(events.c.run_id == companion_stream("r1"), events.c.seq == 1)
                     .values(payload_json='{"runId":"r1","owner":{"hostId":"evil","pid":1,"nonce":"x"},'
                                          '"grantedAtMs":0,"password":"hunter2-secret"}'))
        conn.execute(events.delete().where(events.c.run_id == companion_stream("r2"), events.c.seq == 1))
        conn.commit()
    broken = run_cli("--db", settled, "journal", "verify")
    assert broken.code == 1, broken
    assert "first at run r1 (its companion stream) seq 1" in broken.out, broken
    assert "run r2 (its companion stream) seq 2" in broken.out, broken
    assert "hunter2" not in broken.out + broken.err
    report = json.loads(run_cli("--db", settled, "journal", "verify", "--json").out)
    assert {b["run_id"] for b in report["first_breaks"]} == {"r1", "r2"}
    assert len(report["first_breaks"]) == report["breaks"]


def test_replay_all_prints_one_row_per_run_in_csv_and_jsonl(run_cli, settled):
    """Defect (audit): ``replay --all --format csv`` printed one row whose ``histories`` cell held
    every run's history as JSON text (jsonl one line holding the whole summary), so a spreadsheet or
    ``jq`` per line saw one record. Now csv is one row per run (run_id, facts, intervals,
    violations, first_violation, stream) and jsonl one history per line, as ``replay RUN_ID``
    prints it; json keeps the summary."""
    import csv
    import io

    with fencepost.open(settled) as store:
        store.runs.create("r2", "{}")
        assert isinstance(store.runs.claim_and_own("r2", store.runs.get("r2"), A, store.clock.now_ms()), Activated)
    _forge_second_owner(settled, "r2")
    as_csv = run_cli("--db", settled, "journal", "replay", "--all", "--format", "csv")
    assert as_csv.code == 1, as_csv
    rows = list(csv.DictReader(io.StringIO(as_csv.out)))
    assert [(r["run_id"], r["intervals"], r["violations"]) for r in rows] == [("r1", "1", "0"), ("r2", "2", "3")]
    assert rows[0]["first_violation"] == "" and rows[1]["first_violation"].startswith("activated_without_claim at seq")
    assert rows[1]["stream"] == companion_stream("r2") and rows[1]["facts"] == "3"
    as_jsonl = run_cli("--db", settled, "journal", "replay", "--all", "--format", "jsonl")
    assert as_jsonl.code == 1, as_jsonl
    lines = [json.loads(line) for line in as_jsonl.out.splitlines()]
    one = json.loads(run_cli("--db", settled, "journal", "replay", "r1", "--format", "jsonl").out)
    assert [h["run_id"] for h in lines] == ["r1", "r2"] and lines[0] == one
    assert "histories" in json.loads(run_cli("--db", settled, "journal", "replay", "--all", "--json").out)


def test_replay_csv_of_one_run_prints_its_violations_as_rows(run_cli, settled):
    """``journal replay RUN_ID --format csv`` printed the intervals alone: an auditor piping csv saw
    a broken history only as exit 1 and a count on stderr, never which fact broke which rule (json
    lists them under ``violations``, the table under the intervals). Every row now starts with
    ``kind``: ``interval`` rows carry the interval's fields, then ``violation`` rows the violation's
    (``seq``, ``position``, ``event_type``, ``rule``, ``detail``), the other kind's cells empty; the
    header is the same whether or not a violation follows."""
    import csv
    import io

    clean = run_cli("--db", settled, "journal", "replay", "r1", "--format", "csv")
    assert clean.code == 0, clean
    header = clean.out.splitlines()[0]
    assert [r["kind"] for r in csv.DictReader(io.StringIO(clean.out))] == ["interval"]
    _forge_second_owner(settled, "r1")
    broken = run_cli("--db", settled, "journal", "replay", "r1", "--format", "csv")
    assert broken.code == 1, broken
    assert broken.out.splitlines()[0] == header
    rows = list(csv.DictReader(io.StringIO(broken.out)))
    as_json = json.loads(run_cli("--db", settled, "journal", "replay", "r1", "--json").out)
    assert [r["kind"] for r in rows] == ["interval"] * len(as_json["intervals"]) + \
        ["violation"] * len(as_json["violations"])
    assert as_json["violations"], as_json
    violations = [r for r in rows if r["kind"] == "violation"]
    for row, v in zip(violations, as_json["violations"], strict=True):
        assert (row["rule"], row["seq"], row["position"], row["event_type"], row["detail"]) == (
            v["rule"], str(v["seq"]), str(v["position"]), v["event_type"], v["detail"])
        assert row["owner"] == row["start_seq"] == ""
    intervals = [r for r in rows if r["kind"] == "interval"]
    assert [json.loads(r["owner"]) for r in intervals] == [i["owner"] for i in as_json["intervals"]]
    assert all(r["rule"] == "" for r in intervals)


def test_journal_show_of_an_empty_own_stream_points_at_the_ownership_facts(run_cli, settled):
    """A run a worker claimed and settled has its ownership facts on its companion stream and,
    unless the function journaled something, nothing on its own: ``journal show ID`` printed a bare
    table header (on a pipe, one line of column names) and exit 0, and a new user concluded the run
    had no history. The table now says where the facts are (``--companion``); json keeps the page
    alone, and a run whose companion stream is empty too gets no such line."""
    table = run_cli("--db", settled, "journal", "show", "r1")
    assert table.code == 0, table
    assert ("no entries on the run's own stream; its ownership facts are on its companion stream: "
            "fencepost journal show r1 --companion") in table.out, table
    as_json = run_cli("--db", settled, "journal", "show", "r1", "--json")
    assert json.loads(as_json.out) == {"entries": [], "has_more": False}, as_json
    with fencepost.open(settled) as store:
        store.runs.create("never-claimed", "{}")
    bare = run_cli("--db", settled, "journal", "show", "never-claimed")
    assert bare.code == 0 and "--companion" not in bare.out, bare
    companion = run_cli("--db", settled, "journal", "show", "r1", "--companion")
    assert "no entries" not in companion.out, companion


def test_a_dropped_journal_table_is_named_as_a_missing_table(run_cli, settled):
    """An auditor handed a store whose journal table was dropped got ``journal read persistence
    failed [42P01]`` (PostgreSQL) or ``[SQLITE_ERROR]`` (SQLite): a driver code to look up. The
    error now says a table fencepost needs is missing, and points at ``migrations status``."""
    with fencepost.open(settled) as store:
        conn = store.db.connect()
        try:
            if store.db.name == "sqlite":
                conn.exec_driver_sql("DROP TABLE flows_journal_events")
            else:
                conn.exec_driver_sql(f'DROP TABLE "{store.db.schema}".flows_journal_events CASCADE')
            conn.commit()
        finally:
            conn.close()
    for args in (("journal", "verify"), ("journal", "replay", "--all"), ("journal", "show", "r1")):
        result = run_cli("--db", settled, *args)
        assert_one_line_error(result)
        assert result.code == 1, result
        assert "a table or column fencepost needs is missing" in result.err, result


def _corrupted_fact(settled: str, seq: int, payload_sql: str | None = None) -> tuple[int, int]:
    """The companion stream's entry ``seq`` of ``r1`` made undecodable by hand: a number out of
    range (both backends), or ``payload_sql`` (a SQL expression); its position and the stream's length."""
    stream = companion_stream("r1")
    with fencepost.open(settled) as store, store.db.connect() as conn:
        _drop_append_only_guard(store, conn)
        where = (events.c.run_id == stream) & (events.c.seq == seq)
        total = len(conn.execute(events.select().where(events.c.run_id == stream)).all())
        if payload_sql is None:
            conn.execute(update(events).where(where).values(payload_json='{"password":"hunter2-LEAK","n":1e400}'))
        else:
            conn.exec_driver_sql(f"UPDATE flows_journal_events SET payload_json = {payload_sql} "
                                 f"WHERE run_id = '{stream}' AND seq = {seq}")
        conn.commit()
        position = conn.execute(events.select().with_only_columns(events.c.position).where(where)).scalar()
    return int(position), total


def _check_shown_in_place(result, fmt: str, seq: int, position: int, total: int, what: str) -> None:
    assert_one_line_error(result)
    assert result.code == 1 and "decode_failed" in result.err and f"position {position} " in result.err, result
    assert "hunter2-LEAK" not in result.out + result.err and "\ufffd" not in result.out + result.err
    marker = {"seq": seq, "position": position, "undecodable": what}
    if fmt == "json":
        entries = json.loads(result.out)["entries"]
    elif fmt == "jsonl":
        entries = [json.loads(line) for line in result.out.splitlines()]
    elif fmt == "csv":
        import csv
        import io

        rows = list(csv.DictReader(io.StringIO(result.out)))
        assert [r["seq"] for r in rows] == [str(i) for i in range(total)], rows
        bad = [r for r in rows if r["undecodable"]]
        assert [(r["seq"], r["position"], r["undecodable"], r["payload"]) for r in bad] == [
            (str(seq), str(position), what, "")], bad
        return
    else:
        lines = [line.split()[:2] for line in result.out.splitlines()[1:] if line.strip()]
        assert [int(s) for s, _ in lines] == list(range(total)), result.out
        assert f"(cannot be decoded: {what})" in result.out, result.out
        return
    assert [e["seq"] for e in entries] == list(range(total)), entries
    assert entries[seq] == marker, entries[seq]
    assert all("payload" in e for i, e in enumerate(entries) if i != seq)


@pytest.mark.parametrize("fmt", ["table", "json", "jsonl", "csv"])
def test_journal_show_marks_an_undecodable_entry_in_place_and_shows_the_others(run_cli, settled, fmt):
    """Defect: one entry of the stream that cannot be decoded (edited by hand in the database) made
    ``journal show`` print nothing but a ``decode_failed`` error, while ``journal replay`` and
    ``journal verify`` report such an entry and go on: an auditor could read none of the stream.
    Now every readable entry is shown, the undecodable one in its place by seq and position with
    what cannot be decoded (never its stored values), in every format, and the command exits 1
    naming its position, so a script notices."""
    position, total = _corrupted_fact(settled, 1)
    result = run_cli("--db", settled, "journal", "show", "r1", "--companion", "--format", fmt)
    _check_shown_in_place(result, fmt, 1, position, total, "stored payload or meta cannot be decoded as JSON")


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("fmt", ["table", "json"])
def test_journal_show_marks_an_entry_whose_text_is_not_utf8_in_place(run_cli, settled, fmt):
    """An entry whose stored text is not UTF-8 failed the whole page's read (the driver cannot
    decode the row): shown in place now, as ``journal verify`` reports it. SQLite only: PostgreSQL
    refuses text that is not UTF-8 on input in a UTF8 database."""
    position, total = _corrupted_fact(settled, 1, "CAST(x'7b2270223a2268756e746572322dff4c45414b227d' AS TEXT)")
    result = run_cli("--db", settled, "journal", "show", "r1", "--companion", "--format", fmt)
    _check_shown_in_place(result, fmt, 1, position, total, "stored payload_json is not valid UTF-8")
