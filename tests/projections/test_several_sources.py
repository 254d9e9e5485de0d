"""A read model fed by several named stores: two SQLite files and one PostgreSQL schema, any target.

``backend`` is the target's backend; the sources are always the same three stores of both backends.
"""

from __future__ import annotations

import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

import fencepost
from fencepost import OwnerId, RunSnapshot, _gauges
from fencepost.clock import ManualClock
from fencepost.errors import ProjectionError, RunStoreError
from fencepost.projections import OwnershipHistory, ProjectionBuilder, RunsByStatus, checkpoints
from tests.projections import _runs
from tests.projections._several import KINDS, Writers, projected_by_source, seed, store_rows

TABLE = "projection_runs_by_status"


def _share_rows(target) -> list[tuple]:
    return target.read(lambda conn: [tuple(r) for r in conn.execute(text(
        "SELECT name, projection, source_name FROM projection_checkpoints ORDER BY name"))])


def test_each_source_is_applied_under_its_own_checkpoint_and_keyed_by_its_name(sources, make_db_url):
    """One checkpoint per source in the target; the same run id in two stores is two rows; the
    sources' revisions differ and are never compared (each share reaches its own head)."""
    ids = {name: [] for name in sources}
    for n, (name, store) in enumerate(sources.items()):
        seed(store, ids[name], "r", 20 + 7 * n)
    sources["central"].db.write(lambda conn: _runs.start(conn, "r-0003", 5))
    sources["edge-2"].db.write(lambda conn: _runs.delete(conn, "r-0001"))
    with ProjectionBuilder(sources, make_db_url(), RunsByStatus(), batch_size=9) as builder:
        assert [c.name for c in builder.projection.table.primary_key.columns] == ["source_name", "run_id"]
        result = builder.catch_up()
        assert list(result) == list(KINDS)
        heads = {name: store.feed.position() for name, store in sources.items()}
        assert len({p.revision for p in heads.values()}) == 3
        for name, done in result.items():
            assert (done.revision, done.rebuilt, done.rejected) == (heads[name].revision, False, 0)
        assert projected_by_source(builder.target, TABLE, list(sources)) == store_rows(sources)

        status = builder.status()
        assert list(status) == list(KINDS)
        for name, st in status.items():
            assert (st.name, st.source, st.applied_revision, st.lag, st.pending_rebuild) == (
                "runs_by_status", heads[name].source, heads[name].revision, 0, None)
        assert _share_rows(builder.target) == sorted(
            (f"runs_by_status@{name}", "runs_by_status", name) for name in sources)
        assert all(done.applied == 0 for done in builder.catch_up().values())
        lag = _gauges.projection_lag.current()
        assert all(lag[(("projection", "runs_by_status"), ("source", name))] == 0 for name in sources)
    assert not any(dict(key).get("projection") == "runs_by_status" for key in _gauges.projection_lag.current())


def test_rotating_one_source_rebuilds_only_its_rows_while_the_others_keep_flowing(sources, make_db_url):
    """``run`` follows three stores while writers mutate all three; ``edge-1`` rotates. Its share is
    rebuilt into the shadow (slowed down here) while the other shares' checkpoints keep moving, a
    reader never sees edge-1's rows half built (one source id at a time), and at the end every
    share equals its store; only edge-1 was rebuilt."""
    ids = {name: [] for name in sources}
    for name, store in sources.items():
        seed(store, ids[name], "s", 60)
    builder = ProjectionBuilder(sources, make_db_url(), RunsByStatus(), batch_size=10, poll_interval=0.05)
    target = builder.target
    others = [n for n in sources if n != "edge-1"]
    during: list[dict[str, int]] = []
    mixed: list[set[str]] = []

    def positions() -> dict[str, int]:
        return target.read(lambda conn: {
            n: checkpoints.load(conn, f"runs_by_status@{n}").revision for n in others})

    def slow_shadow(shadow: bool, page) -> None:
        if shadow:
            during.append(positions())
            time.sleep(0.08)

    reading = threading.Event()

    def reader() -> None:
        while not reading.is_set():
            seen = target.read(lambda conn: {r[0] for r in conn.execute(text(
                f"SELECT DISTINCT source FROM {TABLE} WHERE source_name = 'edge-1'"))})
            if len(seen) > 1:
                mixed.append(seen)
            time.sleep(0.005)

    stop = threading.Event()
    runner = threading.Thread(target=builder.run, args=(stop,), name="builder")
    check = threading.Thread(target=reader, name="reader")
    try:
        with Writers(sources, ids, pause=0.02) as writers:
            runner.start()
            deadline = time.monotonic() + 30
            while any(st.applied_revision == 0 for st in builder.status().values()):
                assert time.monotonic() < deadline, "the builder applied nothing in 30 s"
                time.sleep(0.05)
            check.start()
            builder._after_page = slow_shadow
            rotated = sources["edge-1"].feed.rotate_source()
            deadline = time.monotonic() + 60
            while builder.status()["edge-1"].rebuilds == 0:
                assert time.monotonic() < deadline, "edge-1 was not rebuilt in 60 s"
                time.sleep(0.05)
            builder._after_page = None
            time.sleep(0.2)
        assert all(count > 10 for count in writers.counts.values())
        deadline = time.monotonic() + 30
        while any(st.lag for st in builder.status().values()):
            assert time.monotonic() < deadline, "the builder did not catch up in 30 s"
            time.sleep(0.05)
    finally:
        stop.set()
        reading.set()
        runner.join()
        if check.is_alive() or check.ident is not None:
            check.join()
    try:
        assert len(during) >= 3, "the rebuild took fewer shadow pages than expected"
        for name in others:  # the other sources were applied while edge-1's share was rebuilt
            assert during[-1][name] > during[0][name], name
        assert mixed == []
        status = builder.status()
        assert status["edge-1"].source == rotated.source
        assert {n: st.rebuilds for n, st in status.items()} == {"edge-1": 1, "edge-2": 0, "central": 0}
        record = builder.rebuilds()["edge-1"][0]
        assert (record.reason, record.to_source) == ("source_changed", rotated.source)
        assert projected_by_source(target, TABLE, list(sources)) == store_rows(sources)
    finally:
        builder.close()


def _backup(src: Path, dest: Path) -> None:
    with sqlite3.connect(src) as live, sqlite3.connect(dest) as copy:
        live.backup(copy)
    live.close()
    copy.close()


def test_a_restored_older_copy_of_one_source_rebuilds_only_that_share(tmp_path, backend, make_db_url):
    """edge-1 is a SQLite file restored from a backup (same source id, lower revision): its share
    is rebuilt as ``source_rewound``; the share of the PostgreSQL store is neither rebuilt nor touched."""
    path = tmp_path / "edge-1.db"
    urls = {"edge-1": f"sqlite:///{path}", "central": make_db_url("postgresql")}
    stores = {name: fencepost.open(url, clock=ManualClock(0)) for name, url in urls.items()}
    target_url = make_db_url()
    ids: dict[str, list[str]] = {name: [] for name in stores}
    try:
        for name, store in stores.items():
            seed(store, ids[name], "k", 15)
        _backup(path, tmp_path / "backup.db")
        seed(stores["edge-1"], ids["edge-1"], "lost", 8, 100)
        with ProjectionBuilder(stores, target_url, RunsByStatus()) as builder:
            builder.catch_up()
        stores["edge-1"].close()
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        shutil.copyfile(tmp_path / "backup.db", path)
        stores["edge-1"] = fencepost.open(urls["edge-1"], clock=ManualClock(0))
        stores["central"].db.write(lambda conn: _runs.settle(conn, "k-0002", "failed", 7))

        with ProjectionBuilder(stores, target_url, RunsByStatus()) as builder:
            assert builder.status()["edge-1"].pending_rebuild == "source_rewound"
            assert builder.status()["central"].pending_rebuild is None
            result = builder.catch_up()
            assert (result["edge-1"].rebuilt, result["central"].rebuilt) == (True, False)
            assert result["central"].applied == 1  # only the settle: nothing of central was re-applied
            assert [r.reason for r in builder.rebuilds()["edge-1"]] == ["source_rewound"]
            assert builder.rebuilds()["central"] == []
            projected = projected_by_source(builder.target, TABLE, list(stores))
            assert projected == store_rows(stores)
            assert not any(run_id.startswith("lost-") for run_id in projected["edge-1"])
    finally:
        for store in stores.values():
            store.close()


def test_rebuild_and_offer_address_one_named_source(sources, make_db_url):
    ids = {name: [] for name in sources}
    for name, store in sources.items():
        seed(store, ids[name], "o", 12)
    with ProjectionBuilder(sources, make_db_url(), RunsByStatus()) as builder:
        builder.catch_up()
        one = builder.rebuild("edge-2")
        assert list(one) == ["edge-2"] and one["edge-2"].rebuilt and one["edge-2"].applied == 12
        assert {n: st.rebuilds for n, st in builder.status().items()} == {"edge-1": 0, "edge-2": 1, "central": 0}
        every = builder.rebuild()
        assert list(every) == list(KINDS) and all(r.rebuilt for r in every.values())

        store = sources["central"]
        store.db.write(lambda conn: _runs.settle(conn, "o-0004", "completed", 50))
        snapshot = store.feed.read(["o-0004"]).snapshots
        offered = builder.offer(snapshot, source_name="central")
        assert (offered.applied, offered.rejected) == (1, 0)
        # The same snapshot offered as another source's is not newer there (another source id).
        assert builder.offer(snapshot, source_name="edge-1").rejected == 1
        rows = projected_by_source(builder.target, TABLE, list(sources))
        assert rows["central"]["o-0004"][0] == "completed"
        assert rows["edge-1"]["o-0004"][0] == "pending"
        with pytest.raises(ProjectionError) as missing:
            builder.offer(snapshot)
        assert (missing.value.code, missing.value.detail) == (
            "invalid_sources", "source_name is required with several sources")
        with pytest.raises(ProjectionError) as unknown:
            builder.rebuild("edge-9")
        assert unknown.value.code == "invalid_sources" and "edge-9" not in str(unknown.value)


def test_ownership_history_from_several_stores_keeps_each_stores_runs_apart(sources, make_db_url):
    """The same run id owned by different workers in two stores: two histories, one per source."""
    for n, (name, store) in enumerate(sources.items()):
        if name == "edge-2":
            continue
        store.runs.create("job-1", "{}")
        store.runs.claim_and_own("job-1", RunSnapshot("pending", None, None), OwnerId(f"host-{name}", 1 + n, "n1"),
                                 store.clock.now_ms())
    with ProjectionBuilder(sources, make_db_url(), OwnershipHistory()) as builder:
        assert [c.name for c in builder.projection.table.primary_key.columns] == [
            "source_name", "run_id", "opened_position"]
        result = builder.catch_up()
        assert list(result) == list(KINDS)
        rows = builder.target.read(lambda conn: sorted(tuple(r) for r in conn.execute(text(
            "SELECT source_name, run_id, owner_host_id, activated_position IS NOT NULL, closed_position "
            "FROM projection_ownership_history"))))
    assert rows == [("central", "job-1", "host-central", True, None), ("edge-1", "job-1", "host-edge-1", True, None)]


def test_single_and_several_source_builders_never_share_a_name_on_a_target(sources, make_db_url):
    """A name holds either one single-source checkpoint or several source shares, never both; the
    refused builder creates nothing."""
    target_url = make_db_url()
    with ProjectionBuilder(sources["edge-1"], target_url, RunsByStatus()) as single:
        single.catch_up()
    with ProjectionBuilder(sources, target_url, RunsByStatus(table="several_by_status")) as several:
        with pytest.raises(ProjectionError) as refused:
            several.catch_up()
        assert refused.value.code == "invalid_projection"
        assert "single-source projection holds this name" in refused.value.detail
        assert _share_rows(several.target) == [("runs_by_status", None, None)]
        assert not several.target.read(lambda conn: several.target.backend.has_table(conn, "several_by_status"))

    with ProjectionBuilder(sources, target_url, RunsByStatus("by_source", table="several_by_status")) as several:
        several.catch_up()
    with ProjectionBuilder(sources["central"], target_url, RunsByStatus("by_source", table="t_source")) as single:
        with pytest.raises(ProjectionError) as refused:
            single.catch_up()
        assert refused.value.code == "invalid_projection"
        assert "several sources holds this name" in refused.value.detail
    # A share's checkpoint name: refused when the builder is made ('@' in a single-source name).
    with pytest.raises(ProjectionError) as refused:
        ProjectionBuilder(sources["central"], target_url, RunsByStatus("by_source@central", table="t_central"))
    assert refused.value.code == "invalid_projection" and "'@'" in refused.value.detail


def test_status_of_a_name_the_other_kind_holds_is_refused_not_shown_as_never_built(sources, make_db_url):
    """``status()`` of a single-source builder on a target where a projection fed by several sources
    holds the name (``fencepost --db a.db projection status`` after ``--db a=... --db b=...
    projection run``) answered "never built": no source, nothing applied, the whole source as lag,
    while ``catch_up`` refuses that builder (``invalid_projection``), and the reverse likewise. The
    read model is built and caught up; saying otherwise sends an operator to rebuild it. ``status``
    (and ``rebuilds``) now refuse as ``catch_up`` does, naming the other kind, and write nothing."""
    several_target, single_target = make_db_url(), make_db_url()
    with ProjectionBuilder(sources, several_target, RunsByStatus()) as several:
        several.catch_up()
    with ProjectionBuilder(sources["edge-1"], single_target, RunsByStatus()) as single:
        single.catch_up()
    cases = [(sources["edge-1"], several_target, "several sources holds this name"),
             (sources, single_target, "single-source projection holds this name")]
    for source, target, words in cases:
        with ProjectionBuilder(source, target, RunsByStatus()) as other:
            before = _share_rows(other.target)
            for call in (other.status, other.rebuilds, other.catch_up):
                with pytest.raises(ProjectionError) as refused:
                    call()
                assert refused.value.code == "invalid_projection", (call, refused.value)
                assert words in refused.value.detail, (call, refused.value)
            assert _share_rows(other.target) == before


def test_one_failing_source_does_not_hold_back_the_others(sources, make_db_url, monkeypatch):
    """``catch_up`` applies every source it can reach, then raises the failure of the one it could not."""
    ids = {name: [] for name in sources}
    for name, store in sources.items():
        seed(store, ids[name], "f", 5)
    with ProjectionBuilder(sources, make_db_url(), RunsByStatus()) as builder:
        share = next(s for s in builder._shares if s.label == "edge-2")

        def down() -> tuple[str, int]:
            raise RunStoreError("persistence_failed", "position", "the database is unavailable")

        monkeypatch.setattr(share.feed, "head", down)
        with pytest.raises(RunStoreError):
            builder.catch_up()
        projected = projected_by_source(builder.target, TABLE, list(sources))
        assert (len(projected["edge-1"]), len(projected["edge-2"]), len(projected["central"])) == (5, 0, 5)
        monkeypatch.undo()
        assert builder.catch_up()["edge-2"].applied == 5


def test_the_console_lists_only_the_projections_of_its_own_store(sources, make_db_url):
    """A target that is also a store holds source shares measured against other stores: the
    console's projection list shows only the projections of that store itself."""
    from fencepost.ui import views

    central = sources["central"]
    with ProjectionBuilder(sources, central.db, RunsByStatus("everywhere", table="everywhere_by_status")) as several:
        several.catch_up()
    with ProjectionBuilder(central, central.db, RunsByStatus("solo", table="solo_by_status")) as single:
        single.catch_up()
    assert [p["name"] for p in views.projections(central)] == ["solo"]
