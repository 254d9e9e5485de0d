"""The sharded store routes every call by run id, on both backends."""

from __future__ import annotations

import threading

import pytest

import fencepost
from fencepost import Activated, Attempt, Inserted, OwnerId, RunSnapshot, Transitioned, Updated
from fencepost.clock import ManualClock
from fencepost.journal import companion_stream
from fencepost.shards import ShardError
from fencepost.worker import Worker

A = OwnerId("host-a", 101, "owner-a")
PENDING = RunSnapshot("pending", None, None)


def _ids(store: fencepost.Store) -> set[str]:
    return {r.run_id for r in store.feed.list_runs(limit=200).runs}


@pytest.fixture
def shards(shard_urls):
    s = fencepost.open_shards(shard_urls(3), clock=ManualClock(1_000))
    yield s
    s.close()


def test_runs_are_created_on_their_placed_shard_and_found_there(shards) -> None:
    ids = [f"run-{i}" for i in range(60)]
    for rid in ids:
        shards.runs.create(rid, "{}")
    for name, store in shards.items():
        assert _ids(store) == {r for r in ids if shards.place(r) == name}
    assert all(_ids(s) for _, s in shards.items()), "60 ids left a shard empty"
    for rid in ids:
        assert shards.runs.get(rid).run_id == rid


def test_the_whole_lifecycle_stays_on_the_run_shard(shards) -> None:
    """Claim, activate, journal, attempt, heartbeat and settle: every row and fact on one shard."""
    rid = "life-1"
    shards.runs.create(rid, "{}")
    home = shards.place(rid)
    now = shards.clock.now_ms()
    assert shards.runs.claim_and_own(rid, PENDING, A, now) == Activated()
    shards.journal.append(rid, "step.done", {"n": 1}, owner=A, source_id="test", source_seq=1)
    att = Attempt(rid, "d" * 64, 1, "running", now)
    assert shards.attempts.put(att, A) == Inserted()
    assert shards.attempts.get(rid, "d" * 64, 1) is not None
    assert shards.runs.heartbeat_many(A, [rid], now) == {rid: Updated(now)}
    assert isinstance(shards.runs.transition_owned(rid, A, "completed"), Transitioned)
    assert [e.event_type for e in shards.journal.entries(rid).entries] == ["step.done"]
    facts = shards.journal.entries(companion_stream(rid)).entries
    assert [f.event_type for f in facts][:2] == ["flows.consensus.claimed", "flows.consensus.activated"]
    for name, store in shards.items():
        here = name == home
        assert (store.attempts.get(rid, "d" * 64, 1) is not None) == here
        assert bool(store.journal.entries(rid).entries) == here
        assert bool(store.journal.entries(companion_stream(rid)).entries) == here


def test_lineage_and_forks_stay_on_the_root_shard(shards) -> None:
    root = "root"
    shards.runs.create(root, "{}")
    for i in range(1, 12):
        shards.runs.create(f"root-r{i}", "{}", lineage_id=root, round_ordinal=i)
        shards.runs.create(f"fork-{i}", "{}", parent_run_id=root)
    home = shards[shards.place(root)]
    assert [r.run_id for r in shards.runs.lineage(root)] == [root, *(f"root-r{i}" for i in range(1, 12))]
    assert _ids(home) == {root, *(f"root-r{i}" for i in range(1, 12)), *(f"fork-{i}" for i in range(1, 12))}
    assert shards.runs.latest_round(root).run_id == "root-r11"


def test_a_duplicate_id_is_refused_by_the_shard_that_holds_it(shards) -> None:
    shards.runs.create("dup", "{}")
    with pytest.raises(fencepost.RunStoreError) as err:
        shards.runs.create("dup", "{}")
    assert err.value.code == "constraint"


def test_an_unknown_run_is_answered_as_one_store_answers(shards) -> None:
    with pytest.raises(fencepost.RunStoreError) as err:
        shards.runs.get("nobody")
    assert err.value.code == "not_found_row"
    assert shards.runs.heartbeat("nobody", A, 1_000).__class__.__name__ == "NotFound"
    with pytest.raises(fencepost.RunStoreError) as err:
        shards.runs.get("")
    assert err.value.code == "invalid_run"
    with pytest.raises(fencepost.RunStoreError) as err:
        shards.runs.heartbeat_many(A, ["ok", ""], 1_000)
    assert "run_ids[1] must not be empty" in str(err.value)  # which id, by index, as one store says


def test_delete_is_routed_to_the_run_shard(shards) -> None:
    """``shards.runs`` had no ``delete`` (AttributeError), though the shard set's ``runs`` are
    documented to offer a single store's calls; ``fencepost runs delete`` reached the shard by hand.
    It is routed by run id now, and refuses what one store refuses."""
    ids = [f"del-{i}" for i in range(12)]
    for rid in ids:
        shards.runs.create(rid, "{}")
    homes = {rid: shards.locate(rid) for rid in ids}
    shards.runs.delete(ids[0])
    assert ids[0] not in _ids(shards[homes[ids[0]]])
    assert {r for _, s in shards.items() for r in _ids(s)} == set(ids[1:])
    shards.runs.claim_and_own(ids[1], PENDING, A, 1_000)
    with pytest.raises(fencepost.RunStoreError) as err:
        shards.runs.delete(ids[1])
    assert err.value.code == "refused"
    shards.runs.delete(ids[1], force=True)
    assert ids[1] not in _ids(shards[homes[ids[1]]])
    with pytest.raises(fencepost.RunStoreError) as err:
        shards.runs.delete("nobody")
    assert err.value.code == "not_found_row"


def test_attempts_of_a_run_are_read_on_the_run_shard(shards) -> None:
    """``shards.attempts`` had no ``of_run`` (AttributeError): a run's attempts are read where they are."""
    rids = [f"att-{i}" for i in range(6)]
    for rid in rids:
        shards.runs.create(rid, "{}")
        shards.runs.claim_and_own(rid, PENDING, A, 1_000)
        shards.attempts.put(Attempt(rid, "d" * 64, 1, "running", 1_000), A)
    assert len({shards.locate(r) for r in rids}) > 1
    for rid in rids:
        assert [(a.run_id, a.attempt) for a in shards.attempts.of_run(rid)] == [(rid, 1)]
    assert shards.attempts.of_run("nobody") == []


def test_existing_runs_stay_where_they_were_created_after_the_set_grows(shard_urls) -> None:
    urls = shard_urls(3)
    ids = [f"old-{i}" for i in range(90)]
    with fencepost.open_shards(urls[:2], clock=ManualClock(0)) as two:
        for rid in ids:
            two.runs.create(rid, "{}")
        where = {rid: two.locate(rid) for rid in ids}
    with fencepost.open_shards(urls, grow=True, clock=ManualClock(0)) as three:
        moved = [rid for rid in ids if three.place(rid) == "shard-2"]
        assert moved, "no id would now be placed on the new shard"
        for rid in ids:  # found where they are, the moved ones included, and never copied
            assert three.locate(rid) == where[rid]
            assert isinstance(three.runs.claim_and_own(rid, PENDING, A, 0), Activated)
        assert _ids(three["shard-2"]) == set()
        new = [f"new-{i}" for i in range(90)]
        for rid in new:
            three.runs.create(rid, "{}")
        share = len(_ids(three["shard-2"])) / len(new)
        assert 0.15 < share < 0.55, share  # about a third of NEW placements


def test_heartbeat_many_spans_shards_in_request_order(shards) -> None:
    ids = [f"hb-{i}" for i in range(12)]
    for rid in ids:
        shards.runs.create(rid, "{}")
        assert shards.runs.claim_and_own(rid, PENDING, A, 1_000) == Activated()
    assert len({shards.place(r) for r in ids}) > 1
    out = shards.runs.heartbeat_many(A, [*reversed(ids), "absent"], 1_500)
    assert list(out) == [*reversed(ids), "absent"]
    assert all(out[r] == Updated(1_500) for r in ids)
    assert out["absent"].__class__.__name__ == "NotFound"


def test_changes_and_follow_label_each_change_with_its_shard(shards) -> None:
    ids = [f"feed-{i}" for i in range(20)]
    for rid in ids:
        shards.runs.create(rid, "{}")
    seen = list(shards.changes())
    assert sorted(c.change.run_id for c in seen) == sorted(ids)
    assert all(shards.place(c.change.run_id) == c.shard for c in seen)
    for name in shards.names:  # per shard, revision order
        revs = [c.change.revision for c in seen if c.shard == name]
        assert revs == sorted(revs)
    stop = threading.Event()
    got = []
    start = shards.positions()  # taken before the writes below, so none of them can be missed

    def consume() -> None:
        for item in shards.follow(start, stop=stop, poll_interval=0.1):
            got.append(item)
            if len(got) == 6:
                stop.set()

    th = threading.Thread(target=consume, daemon=True)
    th.start()
    later = [f"late-{i}" for i in range(6)]
    try:
        for rid in later:
            shards.runs.create(rid, "{}")
        th.join(timeout=30)
        assert not th.is_alive(), f"follow saw {len(got)} of 6 changes in 30 s"
    finally:
        stop.set()
        th.join(timeout=10)
    assert sorted(c.change.run_id for c in got) == sorted(later)
    assert all(shards.place(c.change.run_id) == c.shard for c in got)


def test_follow_raises_a_shard_source_change(shards) -> None:
    positions = shards.positions()
    shards[shards.names[1]].feed.rotate_source()
    with pytest.raises(fencepost.SourceChanged):
        for _ in shards.follow(positions, poll_interval=0.1):
            pass


def test_a_worker_sweeps_every_shard(shard_urls) -> None:
    with fencepost.open_shards(shard_urls(3)) as shards:
        ids = [f"work-{i}" for i in range(24)]
        for rid in ids:
            shards.runs.create(rid, '{"n": 0}')
        assert len({shards.place(r) for r in ids}) == 3
        stats = Worker(shards, lambda ctx: {"done": ctx.run_id}, concurrency=3).run(until_idle=True)
        assert stats.completed == len(ids)
        for rid in ids:
            row = shards.runs.get(rid)
            assert row.status == "completed" and row.state_json == f'{{"done":"{rid}"}}'


@pytest.mark.parametrize("call", [
    lambda s: s.place(None),
    lambda s: s.locate(5),
    lambda s: s.store_for(""),
    lambda s: s.locate("a\x00b"),
])
def test_lookups_refuse_a_bad_run_id(shards, call) -> None:
    with pytest.raises(ShardError) as err:
        call(shards)
    assert err.value.code == "invalid_run" and "run_id" in str(err.value)


@pytest.mark.parametrize("positions", ["S3CR3T", 5, {"zz": 5}, {"S3CR3T": None}, {"shard-0": 5}, {"shard-0": "S3CR3T"},
                                       [("shard-0", None)]])
@pytest.mark.parametrize("method", ["changes", "follow"])
def test_merged_feeds_refuse_bad_positions_before_reading(shards, positions, method) -> None:
    with pytest.raises(ShardError) as err:
        getattr(shards, method)(positions)  # refused at the call, before the first change is read
    assert err.value.code == "invalid_shards" and "positions" in str(err.value)
    assert "S3CR3T" not in str(err.value) and "zz" not in str(err.value)


def test_merged_changes_take_a_position_per_named_shard(shards) -> None:
    shards.runs.create("p-1", "{}")
    home = shards.locate("p-1")
    after = shards.positions()
    shards.runs.create("p-2", "{}")
    seen = [(c.shard, c.change.run_id) for c in shards.changes(after)]
    assert seen == [(shards.locate("p-2"), "p-2")]
    assert [c.change.run_id for c in shards.changes({home: None})] != []


@pytest.mark.parametrize("method", ["changes", "follow"])
def test_a_rotated_source_is_raised_with_the_name_of_its_shard(shards, method) -> None:
    """Across shards, a position of a rotated source raised ``SourceChanged`` with nothing saying
    which shard rotated; its ``store`` now names the shard (merged_changes and merged_follow)."""
    from fencepost.errors import SourceChanged

    shards.runs.create("q-1", "{}")
    home = shards.locate("q-1")
    before = shards.positions()
    shards[home].feed.rotate_source()
    stop = threading.Event()
    calls = {"changes": lambda: shards.changes(before), "follow": lambda: shards.follow(before, stop=stop)}
    with pytest.raises(SourceChanged) as err:
        for _ in calls[method]():
            pass
    assert err.value.store == home


def test_store_for_refuses_a_reserved_run_id_as_the_run_store_does(shards) -> None:
    """``store_for`` answers which store holds or WOULD hold a run; an id in the journal's reserved
    companion-stream namespace (``flows.companion/``) can be no run (``runs.create`` refuses it),
    yet ``store_for`` placed it and returned a store, so a caller went on to write there. It now
    refuses it with the run store's code and words, nothing written. Routed journal reads of a
    companion stream (``shards.journal.entries(companion_stream(rid))``) still find its shard."""
    shards.runs.create("held", "{}")
    assert shards.runs.claim_and_own("held", PENDING, A, shards.clock.now_ms()) == Activated()  # facts written
    with pytest.raises(fencepost.RunStoreError) as alone:
        shards[shards.names[0]].runs.create("flows.companion/x", "{}")
    for reserved in ("flows.companion/x", companion_stream("held")):
        with pytest.raises(ShardError) as err:
            shards.store_for(reserved)
        assert (err.value.code, err.value.method, err.value.detail) == (
            alone.value.code, "store_for", alone.value.detail), err.value
        assert err.value.cause == alone.value.cause  # type: ignore[attr-defined]
    assert {r for _, s in shards.items() for r in _ids(s)} == {"held"}
    assert shards.journal.entries(companion_stream("held")).entries  # found on the run's shard


def test_place_refuses_a_reserved_run_id_as_store_for_does(shards) -> None:
    """``place`` answers where a NEW run with this id would be created; an id in the journal's reserved
    companion-stream namespace can be no run (``runs.create`` refuses it), yet ``place`` hashed it and
    named a shard. It now refuses it as ``store_for`` does: ``invalid_run``, the run store's words and
    cause, its own method name. Creating such a run through the set is still refused by the run
    store itself (``create``), as on one store, and nothing is written."""
    shards.runs.create("held", "{}")
    assert shards.runs.claim_and_own("held", PENDING, A, shards.clock.now_ms()) == Activated()
    with pytest.raises(fencepost.RunStoreError) as alone:
        shards[shards.names[0]].runs.create("flows.companion/x", "{}")
    for reserved in ("flows.companion/x", companion_stream("held")):
        with pytest.raises(ShardError) as err:
            shards.place(reserved)
        assert (err.value.code, err.value.method, err.value.detail) == (
            alone.value.code, "place", alone.value.detail), err.value
        assert err.value.cause == alone.value.cause  # type: ignore[attr-defined]
        with pytest.raises(fencepost.RunStoreError) as routed:
            shards.runs.create(reserved, "{}")
        assert (routed.value.code, routed.value.method, routed.value.detail) == (
            alone.value.code, alone.value.method, alone.value.detail)
    assert {r for _, s in shards.items() for r in _ids(s)} == {"held"}


def test_locate_finds_the_shard_of_a_companion_stream(shard_urls) -> None:
    """``locate`` keeps taking a companion stream's own id (``fencepost journal show`` routes such an id
    with it): it answers the shard holding that stream, the run's shard, even where placement of the
    companion id points at another shard, and in a process that never touched the run."""
    from fencepost.shards.placement import place

    urls = shard_urls(3)
    with fencepost.open_shards(urls, clock=ManualClock(1_000)) as shards:
        rid = next(f"c-{i}" for i in range(200) if place(f"c-{i}", shards.names) != place(
            companion_stream(f"c-{i}"), shards.names))
        shards.runs.create(rid, "{}")
        assert shards.runs.claim_and_own(rid, PENDING, A, shards.clock.now_ms()) == Activated()
        home = shards.locate(rid)
    with fencepost.open_shards(urls, clock=ManualClock(1_000)) as fresh:  # nothing remembered yet
        assert fresh.locate(companion_stream(rid)) == home
        assert fresh[home].journal.entries(companion_stream(rid)).entries
