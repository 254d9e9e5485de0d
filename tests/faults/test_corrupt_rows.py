"""Issue 10 defect 8: one decoder, one verdict on every read path that decodes a run row.

A raw edit of a ``flows_runs`` row that breaks a durable rule (state nested 300 deep, an escaped
NUL, incomplete claim columns ...) is refused by ``runs.get`` with ``decode_failed``; the change
feed's snapshot read and the listing must refuse the same row with the same rule (``feed.read``:
``decode_failed``; ``list_runs``: ``list_failed`` whose cause is ``decode_failed``), and a
projection builder fed by the runs feed raises it without checkpointing past the row. Repairing the
row makes every path work again, on the same objects.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

import fencepost
from fencepost.journal import OwnerId
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.runstore._corrupt import disable_check_constraints

OK_STATE = json.dumps({"flowName": "flow", "n": 1})
ACK = '{"observedAtMs": 3, "owner": {"hostId": "h", "pid": 1, "nonce": "n"}}'
CORRUPTIONS = {
    "state nested 300 deep": {"state_json": '{"flowName": "flow", "deep": ' + "[" * 300 + "]" * 300 + "}"},
    "state with escaped NUL": {"state_json": '{"flowName": "flow", "note": "a\\u0000b"}'},
    "state with escaped NUL key": {"state_json": '{"flowName": "flow", "a\\u0000": 1}'},
    "state with lone surrogate escape": {"state_json": '{"flowName": "flow", "s": "\\ud800"}'},
    "state too deep without flowName": {"state_json": "[" * 200 + "]" * 200},
    "claim triple without claimed_at": {"claim_host_id": "h", "claim_pid": 1, "claim_nonce": "n"},
    "claimed_at without claimant": {"claimed_at_ms": 5},
    "parent is the run itself": {"parent_run_id": "victim"},
    "ack of another shape": {"cancel_requested_at_ms": 1, "cancel_acknowledgement_json": '{"a": 1}'},
    "ack with a string pid": {"cancel_requested_at_ms": 1,
                              "cancel_acknowledgement_json": ACK.replace('"pid": 1', '"pid": "1"')},
}


def _edit(store: fencepost.Store, run_id: str, columns: dict) -> None:
    def body(conn) -> None:
        disable_check_constraints(conn, "flows_runs")
        sets = ", ".join(f"{k} = :{k}" for k in columns)
        conn.execute(text(f"UPDATE flows_runs SET {sets} WHERE run_id = :rid"), {**columns, "rid": run_id})

    store.db.write(body)


def _repair(store: fencepost.Store, run_id: str) -> None:
    _edit(store, run_id, {"state_json": OK_STATE, "claim_host_id": None, "claim_pid": None, "claim_nonce": None,
                          "claimed_at_ms": None, "parent_run_id": None, "cancel_requested_at_ms": None,
                          "cancel_acknowledgement_json": None})


@pytest.mark.parametrize("corruption", list(CORRUPTIONS), ids=list(CORRUPTIONS))
def test_every_read_path_refuses_the_row_runs_get_refuses(store: fencepost.Store, make_db_url,
                                                          corruption: str) -> None:
    """Defect 8: get, feed.read, list_runs and a projection builder give one verdict on one row."""
    store.runs.create("before", OK_STATE)
    builder = ProjectionBuilder(store, make_db_url(), RunsByStatus(), batch_size=1)
    try:
        builder.catch_up()
        store.runs.create("victim", OK_STATE)
        store.runs.create("after", OK_STATE)
        _edit(store, "victim", CORRUPTIONS[corruption])
        victim_revision = store.feed.read(["before"]).revision  # the edit's change revision

        with pytest.raises(fencepost.RunStoreError) as got:
            store.runs.get("victim")
        assert got.value.code == "decode_failed"
        with pytest.raises(fencepost.RunStoreError) as read:
            store.feed.read(["before", "victim"])
        assert read.value.code == "decode_failed"
        assert "victim" not in str(read.value)
        with pytest.raises(fencepost.RunStoreError) as listed:
            store.feed.list_runs()
        assert listed.value.code == "list_failed" and "decode_failed" in str(listed.value)
        assert listed.value.cause["code"] == "decode_failed"
        # The same rule is named on both feed paths.
        assert read.value.detail in listed.value.detail

        with pytest.raises(fencepost.RunStoreError) as built:
            builder.catch_up()
        assert built.value.code == "decode_failed"
        status = builder.status()
        assert status.applied_revision < victim_revision  # never checkpointed past the corrupt row
        # The healthy row paged before it is applied; the corrupt one never reached the target.
        seen = builder.target.read(lambda c: {r[0] for r in c.execute(
            text("SELECT run_id FROM projection_runs_by_status"))})
        assert seen == {"before", "after"}

        _repair(store, "victim")
        assert store.runs.get("victim").status == "pending"
        assert [s.run_id for s in store.feed.read(["victim"]).snapshots] == ["victim"]
        assert {r.run_id for r in store.feed.list_runs().runs} == {"before", "victim", "after"}
        builder.catch_up()
        seen = builder.target.read(lambda c: {r[0] for r in c.execute(
            text("SELECT run_id FROM projection_runs_by_status"))})
        assert seen == {"before", "victim", "after"}
    finally:
        builder.close()


def test_a_clean_row_of_every_shape_is_accepted_on_every_path(store: fencepost.Store, clock) -> None:
    """The shared decoder accepts what the store itself writes: claimed, running, acknowledged,
    child and lineage rows read back on get, feed.read and list_runs alike."""
    a = OwnerId("host-a", 1, "nonce-a")
    store.runs.create("parent", OK_STATE)
    store.runs.create("child", OK_STATE, parent_run_id="parent")
    store.runs.claim("child", store.runs.get("child").snapshot(), a, 0)
    store.runs.claim_and_own("parent", store.runs.get("parent").snapshot(), a, 0)
    store.runs.request_cancel("parent", 0)
    assert store.runs.acknowledge_cancel("parent", a, 0)
    ids = ["parent", "child"]
    got = {i: store.runs.get(i) for i in ids}
    read = {s.run_id: s for s in store.feed.read(ids).snapshots}
    listed = {r.run_id: r for r in store.feed.list_runs().runs}
    for i in ids:
        assert read[i] == listed[i]
        assert read[i].status == got[i].status and read[i].owner == got[i].owner
    assert read["parent"].cancellation.acknowledgement.owner == a
    assert read["child"].parent_run_id == "parent"
