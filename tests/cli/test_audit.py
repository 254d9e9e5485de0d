"""Audit commands fail loudly: ``journal verify`` on a tampered journal, ``journal replay`` on a forged history."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import update

import fencepost
from fencepost._schema import flows_journal_events as events
from fencepost.journal import companion_stream
from fencepost.journal.owner import OwnerId
from fencepost.runstore.outcomes import Claimed

A = OwnerId("host-a", 101, "owner-a")
B = OwnerId("host-a", 202, "owner-b")


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
