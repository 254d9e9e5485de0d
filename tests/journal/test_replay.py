"""Ownership replay from ``flows.consensus.*`` facts alone (SPEC 5, REFERENCE 3.5 expected sequences)."""

from __future__ import annotations

import pytest

import fencepost
from fencepost.journal import OwnerId, companion_stream, ownership_history
from tests.journal.conftest import A, B


def fact(store: fencepost.Store, run_id: str, kind: str, owner: OwnerId, grant: int | None, at_ms: int) -> None:
    """Append one consensus fact with upstream's envelope, as the run store does."""
    store.clock.set(max(at_ms, store.clock.now_ms()))  # type: ignore[attr-defined]
    payload = {"runId": run_id, "owner": owner.to_json(), "grantedAtMs": grant}
    store.db.write(lambda conn: store.journal.append_in(
        conn, companion_stream(run_id), f"flows.consensus.{kind}", payload, source_id="flows.run-store",
        meta={"runId": run_id},
    ))


def rules(history) -> list[str]:
    return [v.rule for v in history.violations]


def test_two_phase_claim_then_settle_is_one_closed_interval(store: fencepost.Store) -> None:
    """claimed(A,0), activated(A,0), heartbeats (nothing), completed -> released(A,null)."""
    fact(store, "run", "claimed", A, 0, 0)
    fact(store, "run", "activated", A, 0, 5)
    fact(store, "run", "released", A, None, 9_000)
    h = ownership_history(store, "run")
    assert h.ok and h.facts == 3 and h.stream == companion_stream("run")
    (interval,) = h.intervals
    assert (interval.owner, interval.granted_at_ms, interval.started_at_ms, interval.ended_at_ms,
            interval.ended_by) == (A, 0, 5, 9_000, "released")


def test_reown_of_own_run_gives_two_intervals(store: fencepost.Store) -> None:
    """Re-own of the caller's own run: released(A,null), claimed(A,t), activated(A,t)."""
    fact(store, "run", "claimed", A, 0, 0)
    fact(store, "run", "activated", A, 0, 0)
    fact(store, "run", "released", A, None, 40_000)
    fact(store, "run", "claimed", A, 40_000, 40_000)
    fact(store, "run", "activated", A, 40_000, 40_000)
    h = ownership_history(store, "run")
    assert h.ok
    assert [(i.owner, i.ended_by) for i in h.intervals] == [(A, "released"), (A, None)]


def test_steal_of_a_stale_owner_hands_the_run_over(store: fencepost.Store) -> None:
    """steal: stolen(B,t), then activated(B,t): A's interval ends "stolen", B's is open."""
    fact(store, "run", "claimed", A, 0, 0)
    fact(store, "run", "activated", A, 0, 0)
    fact(store, "run", "stolen", B, 30_001, 30_001)
    fact(store, "run", "activated", B, 30_001, 30_001)
    h = ownership_history(store, "run")
    assert h.ok
    assert [(i.owner, i.ended_by) for i in h.intervals] == [(A, "stolen"), (B, None)]
    assert h.intervals[0].end_position == h.intervals[1].start_position


def test_abandoned_and_recovered_claims_leave_no_interval(store: fencepost.Store) -> None:
    """abandon: released(A,0); recover: expired(A,0) after the claim went stale; then B owns."""
    fact(store, "run", "claimed", A, 0, 0)
    fact(store, "run", "released", A, 0, 10)
    fact(store, "run", "claimed", A, 20, 20)
    fact(store, "run", "expired", A, 20, 30_021)
    fact(store, "run", "claimed", B, 30_021, 30_021)
    fact(store, "run", "activated", B, 30_021, 30_021)
    h = ownership_history(store, "run")
    assert h.ok
    assert [i.owner for i in h.intervals] == [B]


def test_second_owner_activated_without_a_steal_is_two_owners(store: fencepost.Store) -> None:
    fact(store, "run", "claimed", A, 0, 0)
    fact(store, "run", "activated", A, 0, 0)
    fact(store, "run", "claimed", B, 5, 5)
    fact(store, "run", "activated", B, 5, 5)
    h = ownership_history(store, "run")
    assert rules(h) == ["claim_while_owned", "two_owners"]
    assert [(i.owner, i.ended_by) for i in h.intervals] == [(A, "displaced"), (B, None)]
    assert h.violations[1].seq == 3


def test_activation_without_its_claim_is_reported(store: fencepost.Store) -> None:
    fact(store, "run", "activated", A, 0, 0)
    fact(store, "run", "claimed", B, 5, 5)
    fact(store, "run", "activated", B, 6, 6)  # grant differs from the claim's
    assert rules(ownership_history(store, "run")) == ["activated_without_claim", "claim_while_owned",
                                                      "activated_without_claim", "two_owners"]


def test_activation_after_release_without_a_new_claim_is_reported(store: fencepost.Store) -> None:
    fact(store, "run", "claimed", A, 0, 0)
    fact(store, "run", "activated", A, 0, 0)
    fact(store, "run", "released", A, None, 10)
    fact(store, "run", "activated", A, 0, 20)
    assert rules(ownership_history(store, "run")) == ["activated_without_claim"]


@pytest.mark.parametrize(("steal_at", "expected"), [(20_000, ["stolen_while_fresh"]), (20_001, [])])
def test_facts_without_evidence_fields_judge_a_steal_against_the_grant_less_the_skew_allowance(
        store: fencepost.Store, steal_at: int, expected: list[str]) -> None:
    """Facts of an older store carry no heartbeat readings. An activation then proves the owner's
    heartbeat only down to its grant minus the 10 s skew allowance (the grant may be a caller's
    reading up to 10 s ahead of the clock that stamped the heartbeat), so a steal is flagged only
    when that bound is not strictly older than the steal's reading minus 30 s."""
    fact(store, "run", "claimed", A, 0, 0)
    fact(store, "run", "activated", A, 0, 0)
    fact(store, "run", "stolen", B, steal_at, steal_at)
    assert rules(ownership_history(store, "run")) == expected


def steal_fact(store: fencepost.Store, run_id: str, thief: OwnerId, now: int, holder: OwnerId, reading: int,
               cutoff: int, evidence: str = "lease-expired") -> None:
    store.clock.set(max(now, store.clock.now_ms()))  # type: ignore[attr-defined]
    payload = {"runId": run_id, "owner": thief.to_json(), "grantedAtMs": now, "holder": holder.to_json(),
               "holderHeartbeatAtMs": reading, "cutoffMs": cutoff, "evidence": evidence}
    store.db.write(lambda conn: store.journal.append_in(
        conn, companion_stream(run_id), "flows.consensus.stolen", payload, source_id="flows.run-store",
        meta={"runId": run_id}))


def activated_fact(store: fencepost.Store, run_id: str, owner: OwnerId, grant: int, heartbeat: int) -> None:
    store.clock.set(max(heartbeat, store.clock.now_ms()))  # type: ignore[attr-defined]
    payload = {"runId": run_id, "owner": owner.to_json(), "grantedAtMs": grant, "heartbeatAtMs": heartbeat}
    store.db.write(lambda conn: store.journal.append_in(
        conn, companion_stream(run_id), "flows.consensus.activated", payload, source_id="flows.run-store",
        meta={"runId": run_id}))


@pytest.mark.parametrize(("reading", "expected"), [(0, []), (1, ["stolen_while_fresh"])])
def test_a_steal_is_judged_against_the_reading_and_cutoff_it_records(
        store: fencepost.Store, reading: int, expected: list[str]) -> None:
    """Issue 11 (2b): claimed with a reading 8 s ahead of the clock, activated at clock 0 (heartbeat
    0), stolen at 30 001: legitimate, because the recorded heartbeat (0) is strictly older than the
    recorded cutoff (1). A reading equal to the cutoff is fresh."""
    fact(store, "run", "claimed", A, 8_000, 0)
    activated_fact(store, "run", A, 8_000, 0)
    steal_fact(store, "run", B, 30_001, A, reading, 1)
    assert rules(ownership_history(store, "run")) == expected


def test_a_steal_whose_evidence_contradicts_the_facts_is_reported(store: fencepost.Store) -> None:
    """A recorded reading older than the activation's heartbeat, a cutoff not derived from the
    steal's own reading, a holder that is not the owner, a host rule that does not hold."""
    fact(store, "run", "claimed", A, 100, 100)
    activated_fact(store, "run", A, 100, 100)
    steal_fact(store, "run", B, 40_000, A, 50, 10_000)
    h = ownership_history(store, "run")
    assert rules(h) == ["stolen_while_fresh"] and "older than one" in h.violations[0].detail
    for args, rule in (((B, 40_001, A, 100, 9_000), "stolen_while_fresh"),
                       ((B, 40_002, B, 100, 10_002), "stolen_wrong_holder"),
                       ((B, 40_003, A, 100, 10_003, "same-host-pid-dead"), "evidence_invalid")):
        run_id = f"run-{rule}-{args[1]}"
        fact(store, run_id, "claimed", A, 100, 100)
        activated_fact(store, run_id, A, 100, 100)
        steal_fact(store, run_id, *args)
        assert rules(ownership_history(store, run_id)) == [rule], rule


def test_steal_of_an_unowned_run_is_reported(store: fencepost.Store) -> None:
    fact(store, "run", "stolen", B, 40_000, 40_000)
    assert rules(ownership_history(store, "run")) == ["stolen_without_owner"]


def test_expiry_of_a_fresh_claim_is_reported(store: fencepost.Store) -> None:
    fact(store, "run", "claimed", A, 0, 0)
    fact(store, "run", "expired", A, 0, 1_000)
    assert rules(ownership_history(store, "run")) == ["expired_while_fresh"]


def test_release_by_a_stranger_and_malformed_or_unknown_facts_are_reported(store: fencepost.Store) -> None:
    fact(store, "run", "released", B, None, 0)
    fact(store, "run", "teleported", A, 0, 0)
    store.db.write(lambda conn: store.journal.append_in(
        conn, companion_stream("run"), "flows.consensus.claimed", {"runId": "run", "owner": {"hostId": "h"}},
        source_id="flows.run-store"))
    store.db.write(lambda conn: store.journal.append_in(
        conn, companion_stream("run"), "flows.consensus.claimed",
        {"runId": "other", "owner": A.to_json(), "grantedAtMs": 0}, source_id="flows.run-store"))
    assert rules(ownership_history(store, "run")) == ["released_without_hold", "unknown_fact", "malformed_fact",
                                                      "wrong_run"]


def test_other_entries_and_other_runs_do_not_mix_in(store: fencepost.Store) -> None:
    fact(store, "run", "claimed", A, 0, 0)
    store.db.write(lambda conn: store.journal.append_in(
        conn, companion_stream("run"), "flows.engine.run-decision", {"decision": "x"}, source_id="engine"))
    fact(store, "other", "claimed", B, 0, 0)
    fact(store, "other", "activated", B, 0, 0)
    fact(store, "run", "activated", A, 0, 0)
    h = ownership_history(store, "run")
    assert h.ok and h.facts == 2 and [i.owner for i in h.intervals] == [A]


def test_a_run_without_facts_has_an_empty_history(store: fencepost.Store) -> None:
    h = ownership_history(store, "never-claimed")
    assert h.ok and h.facts == 0 and h.intervals == []


def test_public_appends_refuse_the_run_stores_companion_stream(store: fencepost.Store) -> None:
    """Only the run store writes ``flows.companion/run-store/...``: a public append there is invalid_event."""
    forged = {"runId": "run", "owner": A.to_json(), "grantedAtMs": 0}
    with pytest.raises(fencepost.JournalError) as err:
        store.journal.append_unfenced(companion_stream("run"), "flows.consensus.claimed", forged,
                                      source_id="flows.run-store")
    assert err.value.code == "invalid_event"
    assert store.journal.entries(companion_stream("run")).entries == []
    # Another producer's companion stream stays open to public appends.
    store.journal.append_unfenced(companion_stream("run", "engine"), "flows.engine.note", {}, source_id="engine")


def test_a_fact_edited_or_removed_after_it_was_written_is_reported_not_replayed_as_consistent(
        store: fencepost.Store, raw) -> None:
    """Defect (audit): replay read the facts as stored and judged them alone, so an edited fact
    (the owner's pid rewritten in every fact, by hand) replayed as a
    consistent history with the forged owner: an auditor who ran ``journal replay`` without
    ``journal verify`` was told all was well. Replay also checks the companion stream's own hash
    chain and reports ``chain_broken`` at each fact whose links or hashes do not hold."""
    from sqlalchemy import text

    fact(store, "run", "claimed", A, 0, 0)
    fact(store, "run", "activated", A, 0, 5)
    fact(store, "run", "released", A, None, 9_000)
    fact(store, "other", "claimed", B, 0, 9_500)
    assert ownership_history(store, "run").ok
    on = " ON flows_journal_events" if store.db.name == "postgresql" else ""
    for name in ("flows_journal_events_no_update_v1", "flows_journal_events_no_delete_v1"):
        raw.execute(text(f"DROP TRIGGER {name}{on}"))
    raw.execute(text("UPDATE flows_journal_events SET payload_json = REPLACE(payload_json, :a, :b) "
                     "WHERE run_id = :s"),
                {"a": f'"pid":{A.pid}', "b": '"pid":4242', "s": companion_stream("run")})
    raw.commit()
    edited = ownership_history(store, "run")
    assert [(v.rule, v.seq) for v in edited.violations] == [("chain_broken", s) for s in range(3)], edited
    assert edited.intervals[0].owner.pid == 4242  # replayed as stored, and reported
    assert "payload" in edited.violations[0].detail and "4242" not in edited.violations[0].detail
    # A removed middle fact: the next one no longer follows its predecessor.
    raw.execute(text("DELETE FROM flows_journal_events WHERE run_id = :s AND seq = 1"), {"s": companion_stream("run")})
    raw.commit()
    removed = ownership_history(store, "run")
    assert [v.seq for v in removed.violations if v.rule == "chain_broken"] == [0, 2], removed
    assert ownership_history(store, "other").ok  # an intact stream beside it replays clean


def test_a_runs_last_facts_removed_by_hand_are_reported_not_replayed_as_consistent(
        store: fencepost.Store, raw) -> None:
    """Defect (review): replay checks the companion stream's own chain, which cannot see its last
    entries removed (the entries left still link to each other): deleting a steal's facts from the
    end of a run's stream replayed as the first owner's clean, open interval (ok, exit 0). The
    global log can see it: the entry after the stream's last one no longer links to it. Replay now
    reports ``chain_broken`` at the stream's last remaining fact then; a stream whose last fact is
    the journal's very last entry is, as in ``verify``, only caught with an anchor."""
    from sqlalchemy import text

    fact(store, "run", "claimed", A, 0, 0)
    fact(store, "run", "activated", A, 0, 5)
    fact(store, "run", "stolen", B, 30_001, 30_001)
    fact(store, "run", "activated", B, 30_001, 30_001)
    fact(store, "other", "claimed", B, 0, 30_500)  # the journal goes on after the run's facts
    assert ownership_history(store, "run").ok
    on = " ON flows_journal_events" if store.db.name == "postgresql" else ""
    raw.execute(text(f"DROP TRIGGER flows_journal_events_no_delete_v1{on}"))
    raw.execute(text("DELETE FROM flows_journal_events WHERE run_id = :s AND seq >= 2"),
                {"s": companion_stream("run")})
    raw.commit()
    cut = ownership_history(store, "run")
    assert [i.owner for i in cut.intervals] == [A]  # replayed as stored, and reported
    assert [(v.rule, v.seq) for v in cut.violations] == [("chain_broken", 1)], cut
    assert "log" in cut.violations[0].detail
    assert ownership_history(store, "other").ok  # the stream after it is intact on its own


def _journal_statements(store: fencepost.Store, call) -> tuple[object, list[str]]:
    """``call()``'s result and every statement it sent that reads the journal table."""
    from sqlalchemy import event

    seen: list[str] = []

    def on_before(_conn, _cursor, statement, parameters, _context, _many):
        if "flows_journal_events" in statement:
            seen.append(statement)
        return statement, parameters

    event.listen(store.db.engine, "before_cursor_execute", on_before, retval=True)
    try:
        result = call()
    finally:
        event.remove(store.db.engine, "before_cursor_execute", on_before)
    return result, seen


def test_replay_reads_each_companion_stream_once(store: fencepost.Store) -> None:
    """Replay reads a run's facts once and judges them, names their run and checks their chain from
    that one read: one statement for the stream's rows and one for the log entry after its last
    (the check that the stream's newest facts were not removed). It used to read each stream three
    times (``replay --all``: to find its run, to judge its facts, to check its chain)."""
    from fencepost.journal import replay_all

    for run in ("r1", "r2", "r3"):
        fact(store, run, "claimed", A, 0, 0)
        fact(store, run, "activated", A, 0, 5)
        fact(store, run, "released", A, None, 9_000)
    history, seen = _journal_statements(store, lambda: ownership_history(store, "r2"))
    assert history.ok and history.facts == 3
    assert len(seen) == 2, seen
    summary, seen = _journal_statements(store, lambda: replay_all(store))
    assert summary.ok and summary.runs == 3 and summary.intervals == 3
    # The listing of the companion streams, then two statements per run.
    assert len(seen) == 1 + 2 * 3, seen


def test_a_fact_that_cannot_be_decoded_is_reported_and_the_other_runs_still_replay(
        store: fencepost.Store, raw) -> None:
    """Defect: a fact the journal's own decoder refuses ended the whole replay with
    ``decode_failed``, ``replay --all`` included: one bad row hid every other run's history. Each
    backend gets the corruption it can hold once its guards are removed by hand: on SQLite a NUL in
    the event type (the CHECK constraints allow it), on PostgreSQL (where text can hold neither NUL
    nor bytes that are not UTF-8) a payload that is not JSON once its CHECK constraint is dropped.
    Replay reports the fact (``malformed_fact``, naming what cannot be decoded and where, never the
    value; ``chain_broken`` too, as the edit breaks the hash), does not apply it, and goes on."""
    from sqlalchemy import text

    from fencepost.journal import replay_all

    for run in ("run", "other"):
        fact(store, run, "claimed", A, 0, 0)
        fact(store, run, "activated", A, 0, 5)
        fact(store, run, "released", A, None, 9_000)
    where = {"s": companion_stream("run")}
    if store.db.name == "postgresql":
        raw.execute(text("DROP TRIGGER flows_journal_events_no_update_v1 ON flows_journal_events"))
        raw.execute(text("ALTER TABLE flows_journal_events DROP CONSTRAINT flows_journal_events_payload_json_check"))
        raw.execute(text("UPDATE flows_journal_events SET payload_json = 'secret-ish' WHERE run_id = :s AND seq = 1"),
                    where)
        field = "payload"
    else:
        raw.execute(text("DROP TRIGGER flows_journal_events_no_update_v1"))
        raw.execute(text("UPDATE flows_journal_events SET event_type = event_type || CAST(x'00' AS TEXT) "
                         "WHERE run_id = :s AND seq = 1"), where)
        field = "event_type"
    raw.commit()
    history = ownership_history(store, "run")
    assert [(v.rule, v.seq) for v in history.violations] == [("chain_broken", 1), ("malformed_fact", 1)], history
    malformed = history.violations[1]
    assert field in malformed.detail and "position 2" in malformed.detail, malformed
    assert "secret-ish" not in malformed.detail and "\x00" not in malformed.detail + malformed.event_type
    assert history.facts == 3 and history.intervals == []  # reported, not applied
    summary = replay_all(store)
    assert summary.runs == 2 and summary.violations == {"chain_broken": 1, "malformed_fact": 1}
    assert [h.run_id for h in summary.histories if h.ok] == ["other"]
