"""``ProjectionBuilder.offer`` refuses a malformed snapshot or fact, whatever field is wrong.

Defect (found by a review, SQLite and PostgreSQL targets): ``offer`` checked only an item's type,
``run_id``, ``source`` and ``revision``. An ``Observed`` with a string ``owner`` or an integer
``cancellation`` failed with a bare ``AttributeError`` inside the projection's write; a
``created_at_ms`` of ``2**70`` was a bare ``OverflowError`` on SQLite and ``persistence_failed`` on
PostgreSQL; ``status=-5``, ``created_at_ms="..."`` (SQLite) and ``flow_name=b"bytes"`` were
applied, and the read model then held ``b'bytes'`` (SQLite) or its base64 text (PostgreSQL).

Now every field is checked by the rules the feed's decoder applies to a stored run, before the
target is touched: ``ProjectionError('invalid_projection')`` names the item's index and the field,
never the value, the same on both backends, and nothing is applied or counted.
"""

from __future__ import annotations

import msgspec
import pytest
from sqlalchemy import text

from fencepost import OwnerId
from fencepost._migrations import pending
from fencepost.changefeed import Missing, Observed
from fencepost.changefeed.types import Acknowledgement, Cancellation, Waiting
from fencepost.errors import ProjectionError
from fencepost.projections import ConsensusFact, OwnershipHistory, ProjectionBuilder, RunsByStatus
from fencepost.projections._feeds import ConsensusFeed
from tests.projections import _runs

OWNER = OwnerId("host-a", 1, "n1")
SECRET = "SECRET-XYZ"
DIGEST = "ab" * 32


def _running(store) -> None:
    """``r-1`` running under ``OWNER`` with an acknowledged cancel request."""
    store.runs.create("r-1", '{"flowName": "demo"}')
    store.runs.claim_and_own("r-1", store.runs.get("r-1").snapshot(), OWNER, store.clock.now_ms())
    store.runs.request_cancel("r-1", store.clock.now_ms())
    store.runs.acknowledge_cancel("r-1", OWNER, store.clock.now_ms())


def _newer(store) -> tuple[Observed, Observed]:
    """``r-1``'s snapshot with the head's revision, newer than what a caught-up projection holds, so
    it would be applied if it were well formed; and the snapshot of the run created to move the head."""
    bump = f"bump-{store.feed.position().revision}"
    store.runs.create(bump, "{}")
    r1, other = store.feed.read(["r-1", bump]).snapshots
    assert isinstance(r1, Observed) and isinstance(other, Observed)
    return msgspec.structs.replace(r1, revision=other.revision), other


def _refused(caught: pytest.ExceptionInfo, index: int, field: str) -> None:
    assert caught.value.code == "invalid_projection"
    detail = caught.value.detail
    assert detail.startswith((f"updates #{index}.{field} ", f"updates #{index}.{field}.")), detail
    assert "SECRET" not in str(caught.value) and "SECRET" not in repr(caught.value.args)


def _counts(builder: ProjectionBuilder) -> tuple[int, int]:
    st = builder.status()
    return st.applied, st.rejected


def _row(builder: ProjectionBuilder) -> tuple:
    return builder.target.read(_runs.projected_rows_fn("projection_runs_by_status"))["r-1"]


BAD_OBSERVED = [
    pytest.param("status", {"status": -5}, id="status-int"),
    pytest.param("status", {"status": SECRET}, id="status-unknown"),
    pytest.param("flow_name", {"flow_name": b"bytes"}, id="flow_name-bytes"),
    pytest.param("flow_name", {"flow_name": SECRET + "\x00"}, id="flow_name-nul"),
    pytest.param("flow_name", {"flow_name": SECRET + "\ud800"}, id="flow_name-surrogate"),
    pytest.param("flow_name", {"flow_name": 5}, id="flow_name-int"),
    pytest.param("created_at_ms", {"created_at_ms": 2**70}, id="created_at_ms-huge"),
    pytest.param("created_at_ms", {"created_at_ms": SECRET}, id="created_at_ms-text"),
    pytest.param("created_at_ms", {"created_at_ms": True}, id="created_at_ms-bool"),
    pytest.param("created_at_ms", {"created_at_ms": -1}, id="created_at_ms-negative"),
    pytest.param("created_at_ms", {"created_at_ms": None}, id="created_at_ms-none"),
    pytest.param("started_at_ms", {"started_at_ms": SECRET}, id="started_at_ms-text"),
    pytest.param("finished_at_ms", {"finished_at_ms": 1.5}, id="finished_at_ms-float"),
    pytest.param("parent_run_id", {"parent_run_id": ""}, id="parent_run_id-empty"),
    pytest.param("parent_run_id", {"parent_run_id": 5}, id="parent_run_id-int"),
    pytest.param("parent_run_id", {"parent_run_id": "r-1"}, id="parent_run_id-itself"),
    pytest.param("lineage_id", {"lineage_id": None}, id="lineage_id-none"),
    pytest.param("lineage_id", {"lineage_id": SECRET + "\x00"}, id="lineage_id-nul"),
    pytest.param("round_ordinal", {"round_ordinal": -1}, id="round_ordinal-negative"),
    pytest.param("round_ordinal", {"round_ordinal": None}, id="round_ordinal-none"),
    pytest.param("owner", {"owner": SECRET}, id="owner-text"),
    pytest.param("owner", {"owner": OwnerId(SECRET + "\x00", 1, "n1")}, id="owner-host-nul"),
    pytest.param("owner", {"owner": OwnerId("host-a", -1, "n1")}, id="owner-pid-negative"),
    pytest.param("owner", {"owner": None}, id="owner-missing-while-running"),
    pytest.param("owner", {"status": "pending"}, id="owner-while-not-running"),
    pytest.param("cancellation", {"cancellation": 5}, id="cancellation-int"),
    pytest.param("cancellation", {"cancellation": Cancellation(2**70, None)}, id="cancellation-huge"),
    pytest.param("cancellation", {"cancellation": Cancellation(1, 5)}, id="cancellation-ack-int"),
    pytest.param("cancellation", {"cancellation": Cancellation(1, Acknowledgement(SECRET, OWNER))},
                 id="cancellation-ack-time"),
    pytest.param("cancellation", {"cancellation": Cancellation(1, Acknowledgement(1, SECRET))},
                 id="cancellation-ack-owner"),
    pytest.param("waiting", {"waiting": SECRET}, id="waiting-text"),
    pytest.param("waiting", {"waiting": Waiting(SECRET, "t", None, None)}, id="waiting-kind"),  # type: ignore[arg-type]
    pytest.param("waiting", {"waiting": Waiting("timer", "", None, None)}, id="waiting-reason-empty"),
    pytest.param("waiting", {"waiting": Waiting("timer", 5, None, None)}, id="waiting-reason-int"),  # type: ignore[arg-type]
    pytest.param("waiting", {"waiting": Waiting("timer", "t", -1, None)}, id="waiting-wake-negative"),
    pytest.param("waiting", {"waiting": Waiting("timer", "t", None, SECRET)}, id="waiting-digest"),
    pytest.param("waiting", {"waiting": Waiting("timer", "t", None, None, {1, 2})}, id="waiting-request-set"),
    pytest.param("waiting", {"waiting": Waiting("timer", "t", None, None, float("nan"))}, id="waiting-request-nan"),
    pytest.param("source", {"source": SECRET}, id="source-not-a-source-id"),
    pytest.param("revision", {"revision": 0}, id="revision-zero"),
    pytest.param("run_id", {"run_id": ""}, id="run_id-empty"),
]


@pytest.mark.parametrize(("field", "bad"), BAD_OBSERVED)
def test_a_malformed_observed_is_refused_naming_the_field_and_nothing_is_written(store, make_db_url, field, bad):
    _running(store)
    with ProjectionBuilder(store, make_db_url(), RunsByStatus()) as builder:
        builder.catch_up()
        counts, row = _counts(builder), _row(builder)
        good, other = _newer(store)
        with pytest.raises(ProjectionError) as caught:
            builder.offer([other, msgspec.structs.replace(good, **bad)])
        _refused(caught, 1, field)
        assert (_counts(builder), _row(builder)) == (counts, row)  # not even the good #0 was applied
        assert builder.offer([good, other]).applied == 2  # and the bad one took no revision


@pytest.mark.parametrize(("field", "bad"), [
    pytest.param("deleted", {"deleted": 5}, id="deleted-int"),
    pytest.param("deleted", {"deleted": None}, id="deleted-none"),
    pytest.param("deleted", {"deleted": SECRET}, id="deleted-text"),
    pytest.param("revision", {"revision": -1}, id="revision-negative"),
    pytest.param("source", {"source": 5}, id="source-int"),
])
def test_a_malformed_missing_is_refused_naming_the_field(store, make_db_url, field, bad):
    store.runs.create("r-1", "{}")
    with ProjectionBuilder(store, make_db_url(), RunsByStatus()) as builder:
        builder.catch_up()
        store.runs.delete("r-1")
        tombstone = store.feed.read(["r-1"]).snapshots[0]
        assert isinstance(tombstone, Missing) and tombstone.deleted
        counts = _counts(builder)
        with pytest.raises(ProjectionError) as caught:
            builder.offer([msgspec.structs.replace(tombstone, **bad)])
        _refused(caught, 0, field)
        assert _counts(builder) == counts
        assert builder.offer([tombstone]).applied == 1


def test_snapshots_as_the_feed_gives_them_are_accepted(store, make_db_url):
    """Every shape the feed delivers passes: owner, acknowledged cancellation, waiting with a request,
    a child with its lineage, a tombstone and a never-seen id."""
    _running(store)
    store.runs.create("child", "{}", parent_run_id="r-1", lineage_id="line", round_ordinal=2)
    store.runs.create("gone", "{}")
    store.runs.create("parked", "{}")

    def park(conn):
        conn.execute(text("UPDATE flows_runs SET waiting_reason = 'event', waiting_token = 'tok', "
                          "waiting_wake_at_ms = 7, waiting_request = :r WHERE run_id = 'parked'"),
                     {"r": '{"ask": [1, "two", null]}'})

    with ProjectionBuilder(store, make_db_url(), RunsByStatus()) as builder:
        builder.catch_up()
        store.db.write(park)
        store.runs.delete("gone")
        batch = store.feed.read(["r-1", "child", "parked", "gone", "never"])
        assert batch.snapshots[2].waiting is not None and batch.snapshots[0].cancellation.acknowledgement
        assert builder.offer(batch).applied == 3  # parked, gone (deleted) and never (never seen)
        by_hand = msgspec.structs.replace(
            _newer(store)[0], waiting=Waiting("timer", "sleep", 5, DIGEST, {"k": [1.5, None]}))
        assert builder.offer([by_hand]).applied == 1


def test_a_malformed_snapshot_is_refused_before_the_target_is_touched(store, make_db_url):
    _running(store)
    good = store.feed.read(["r-1"]).snapshots[0]
    builder = ProjectionBuilder(store, make_db_url(), RunsByStatus())
    try:
        for bad in ({"owner": SECRET}, {"created_at_ms": 2**70}, {"flow_name": b"bytes"}):
            with pytest.raises(ProjectionError) as caught:
                builder.offer([msgspec.structs.replace(good, **bad)])
            _refused(caught, 0, next(iter(bad)))
        assert not builder._lock.held
        assert pending(builder.target, ("projections",))  # nothing migrated or created
    finally:
        builder.close()


def _facts(store, builder: ProjectionBuilder) -> list[ConsensusFact]:
    return ConsensusFeed(store).page(builder.status().source, 0, 100).updates


OWNER_JSON = {"hostId": "host-a", "pid": 1, "nonce": "n1"}


@pytest.mark.parametrize(("field", "bad"), [
    pytest.param("kind", {"kind": 5}, id="kind-int"),
    pytest.param("kind", {"kind": SECRET + "\x00"}, id="kind-nul"),
    pytest.param("owner", {"owner": SECRET}, id="owner-text"),
    pytest.param("owner", {"owner": None}, id="owner-none"),
    pytest.param("owner", {"owner": {**OWNER_JSON, "pid": SECRET}}, id="owner-pid-text"),
    pytest.param("owner", {"owner": {**OWNER_JSON, "hostId": SECRET + "\x00"}}, id="owner-host-nul"),
    pytest.param("owner", {"owner": {"hostId": "host-a"}}, id="owner-incomplete"),
    pytest.param("granted_at_ms", {"granted_at_ms": SECRET}, id="granted_at_ms-text"),
    pytest.param("emitted_at_ms", {"emitted_at_ms": 2**70}, id="emitted_at_ms-huge"),
    pytest.param("emitted_at_ms", {"emitted_at_ms": None}, id="emitted_at_ms-none"),
    pytest.param("revision", {"revision": 0}, id="revision-zero"),
    pytest.param("source", {"source": SECRET}, id="source-not-a-source-id"),
])
def test_a_malformed_consensus_fact_is_refused_naming_the_field(store, make_db_url, field, bad):
    _running(store)
    with ProjectionBuilder(store, make_db_url(), OwnershipHistory()) as builder:
        builder.catch_up()
        facts = _facts(store, builder)
        assert facts and builder.offer(facts).rejected == len(facts)  # as the feed gives them: accepted, stale
        counts = _counts(builder)
        with pytest.raises(ProjectionError) as caught:
            builder.offer([facts[0], msgspec.structs.replace(facts[-1], **bad)])
        _refused(caught, 1, field)
        assert _counts(builder) == counts


def test_a_well_formed_consensus_fact_ahead_of_the_journal_is_still_refused_as_ahead(store, make_db_url):
    """``test_offer_refuses_a_consensus_fact_ahead_of_the_journal_and_writes_nothing`` offers a fact
    without an owner, which the field checks now refuse first; this keeps the "ahead" rule proven for
    a fact that is well formed in every other field."""
    _running(store)
    with ProjectionBuilder(store, make_db_url(), OwnershipHistory()) as builder:
        builder.catch_up()
        fact = _facts(store, builder)[-1]
        counts = _counts(builder)
        forged = msgspec.structs.replace(fact, revision=builder.status().source_revision + 5)
        with pytest.raises(ProjectionError) as caught:
            builder.offer([forged])
        assert caught.value.code == "invalid_projection" and "ahead" in caught.value.detail
        assert _counts(builder) == counts
