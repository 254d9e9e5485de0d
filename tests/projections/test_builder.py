"""ProjectionBuilder with RunsByStatus: catch-up, one-transaction pages, stale rejection, locking, status."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from fencepost.changefeed import Missing, Observed
from fencepost.errors import ProjectionError
from fencepost.projections import CatchUp, Projection, ProjectionBuilder, RunsByStatus
from tests.projections import _runs


def _seed(store, n: int, prefix: str = "run") -> list[str]:
    ids = [f"{prefix}-{i:04d}" for i in range(n)]

    def body(conn):
        for i, run_id in enumerate(ids):
            _runs.create(conn, run_id, i)

    store.db.write(body)
    return ids


def _projected(builder: ProjectionBuilder, table: str = "projection_runs_by_status") -> dict:
    return builder.target.read(_runs.projected_rows_fn(table))


def test_catch_up_projects_every_live_run_and_no_deleted_run(store, target_url):
    ids = _seed(store, 130)

    def mutate(conn):
        _runs.start(conn, ids[0], 5, host="h1", pid=7, nonce="x")
        _runs.settle(conn, ids[1], "failed", 9)
        _runs.cancel(conn, ids[2], 11)
        _runs.delete(conn, ids[3])

    store.db.write(mutate)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=50) as builder:
        result = builder.catch_up()
        assert result == CatchUp(applied=130, rejected=0, rebuilt=False, revision=store.feed.position().revision)
        rows = _projected(builder)
        assert rows == store.db.read(_runs.live_rows)
        assert ids[3] not in rows
        assert rows[ids[0]][:4] == ("running", "h1", 7, "x")
        status = builder.status()
        assert (status.lag, status.applied, status.rejected, status.rebuilds) == (0, 130, 0, 0)
        assert builder.catch_up() == CatchUp(0, 0, False, result.revision)


def test_projection_rows_carry_source_and_snapshot_revision(store, target_url):
    ids = _seed(store, 3)
    store.db.write(lambda conn: _runs.start(conn, ids[1], 3))
    with ProjectionBuilder(store, target_url, RunsByStatus()) as builder:
        builder.catch_up()
        snapshots = {s.run_id: s for s in store.feed.read(ids).snapshots}
        rows = builder.target.read(lambda conn: conn.execute(
            text("SELECT run_id, source, revision FROM projection_runs_by_status")).all())
        assert {r[0]: (r[1], r[2]) for r in rows} == {i: (s.source, s.revision) for i, s in snapshots.items()}


class _FailOnPage:
    """RunsByStatus that raises inside the target transaction of its ``fail_at``-th page."""

    def __init__(self, fail_at: int) -> None:
        self.inner = RunsByStatus()
        self.name, self.feed, self.tables = self.inner.name, "runs", self.inner.tables
        self.pages = 0
        self.fail_at = fail_at

    def reset(self, target):
        self.inner.reset(target)

    def apply(self, target, update):
        self.inner.apply(target, update)

    def apply_batch(self, target, updates):
        self.pages += 1
        self.inner.apply_batch(target, updates)
        if self.pages == self.fail_at:
            raise RuntimeError("injected failure after the page's rows were written")


def test_page_and_checkpoint_commit_together_or_not_at_all(store, target_url):
    _seed(store, 30)
    projection = _FailOnPage(fail_at=2)
    with ProjectionBuilder(store, target_url, projection, batch_size=10) as builder:
        with pytest.raises(RuntimeError):
            builder.catch_up()
        status = builder.status()
        # Page 1 committed with its checkpoint; page 2's rows were rolled back with its checkpoint.
        assert status.applied_revision == 10
        assert status.applied == 10
        assert len(_projected(builder)) == 10
        result = builder.catch_up()
        assert result.applied == 20 and result.rejected == 0
        assert _projected(builder) == store.db.read(_runs.live_rows)


def test_older_snapshot_replayed_after_a_newer_one_is_rejected_and_counted(store, target_url):
    """REFERENCE 4: a delayed pre-terminal observation never overwrites a newer terminal one."""
    _seed(store, 2, "base")
    with ProjectionBuilder(store, target_url, RunsByStatus()) as builder:
        builder.catch_up()
        store.db.write(lambda conn: _runs.create(conn, "late", 1))
        older = store.feed.read(["late"]).snapshots[0]
        store.db.write(lambda conn: _runs.start(conn, "late", 2))
        store.db.write(lambda conn: _runs.settle(conn, "late", "completed", 3))
        newer = store.feed.read(["late"]).snapshots[0]
        assert isinstance(older, Observed) and isinstance(newer, Observed)
        assert older.revision < newer.revision

        result = builder.offer([newer, older])
        assert (result.applied, result.rejected) == (1, 1)
        assert _projected(builder)["late"][0] == "completed"
        again = builder.offer([older, newer])  # both stale now: the equal revision is not newer
        assert (again.applied, again.rejected) == (0, 2)
        assert _projected(builder)["late"][0] == "completed"
        assert builder.status().rejected == 3

        # The feed then delivers the same change: its snapshot is not newer than what is held.
        caught = builder.catch_up()
        assert (caught.applied, caught.rejected) == (0, 1)
        assert _projected(builder) == store.db.read(_runs.live_rows)


def test_late_snapshot_of_a_deleted_run_does_not_resurrect_it(store, target_url):
    _seed(store, 1, "keep")
    with ProjectionBuilder(store, target_url, RunsByStatus()) as builder:
        builder.catch_up()
        store.db.write(lambda conn: _runs.create(conn, "doomed", 1))
        alive = store.feed.read(["doomed"]).snapshots[0]
        store.db.write(lambda conn: _runs.delete(conn, "doomed"))
        builder.catch_up()
        assert "doomed" not in _projected(builder)
        result = builder.offer([alive])
        assert (result.applied, result.rejected) == (0, 1)
        assert "doomed" not in _projected(builder)
        tombstone = store.feed.read(["doomed"]).snapshots[0]
        assert isinstance(tombstone, Missing) and tombstone.deleted


def test_update_from_another_source_is_rejected_never_compared(store, target_url):
    _seed(store, 1)
    with ProjectionBuilder(store, target_url, RunsByStatus()) as builder:
        builder.catch_up()
        snap = store.feed.read(["run-0000"]).snapshots[0]
        foreign = Observed(**{**{f: getattr(snap, f) for f in snap.__struct_fields__},
                              "source": "f" * 32, "revision": snap.revision + 100, "status": "failed"})
        assert builder.offer([foreign]).rejected == 1
        assert _projected(builder)["run-0000"][0] == "pending"


def test_second_builder_with_the_same_name_refuses_while_the_first_applies(store, target_url):
    _seed(store, 5)
    first = ProjectionBuilder(store, target_url, RunsByStatus())
    second = ProjectionBuilder(store, target_url, RunsByStatus())
    try:
        first.catch_up()
        with pytest.raises(ProjectionError) as caught:
            second.catch_up()
        assert caught.value.code == "builder_busy"
        assert second.status().applied_revision == first.status().applied_revision  # status needs no lock
    finally:
        first.close()
        second.close()


def test_second_builder_with_a_lock_timeout_waits_for_the_first_to_close(store, target_url):
    _seed(store, 5)
    first = ProjectionBuilder(store, target_url, RunsByStatus())
    first.catch_up()
    second = ProjectionBuilder(store, target_url, RunsByStatus(), lock_timeout=30)
    closing = threading.Event()

    def close_first() -> None:
        closing.set()  # before the close releases the name: the second may take it from then on
        first.close()

    # Timed from before the timer starts: the test's own thread may be descheduled right after
    # ``start()``, which must not shorten what the second builder is seen to wait.
    started = time.monotonic()
    closer = threading.Timer(0.3, close_first)
    closer.start()
    try:
        result = second.catch_up()
        waited = time.monotonic() - started
        assert closing.is_set(), "the second builder applied while the first still held the name"
        assert waited >= 0.2, waited
        assert result.applied == 0
    finally:
        closer.join()
        second.close()


def test_builders_with_different_names_share_one_target(store, target_url):
    _seed(store, 12)
    one = ProjectionBuilder(store, target_url, RunsByStatus())
    two = ProjectionBuilder(store, target_url, RunsByStatus("mirror", table="projection_runs_mirror"))
    try:
        assert one.catch_up().applied == 12
        assert two.catch_up().applied == 12
        assert _projected(one) == _projected(two, "projection_runs_mirror")
    finally:
        one.close()
        two.close()


def test_status_shows_lag_until_caught_up(store, target_url):
    _seed(store, 10)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=4) as builder:
        before = builder.status()
        assert before.source is None and before.applied_revision == 0 and before.lag == 10
        builder.catch_up()
        store.db.write(lambda conn: _runs.start(conn, "run-0001", 1))
        behind = builder.status()
        assert behind.lag == 1 and behind.source_revision == behind.applied_revision + 1
        builder.catch_up()
        assert builder.status().lag == 0


def test_status_of_a_never_built_projection_writes_nothing(store, backend, make_db_url):
    _seed(store, 4)
    target_url = make_db_url()
    with ProjectionBuilder(store, target_url, RunsByStatus()) as builder:
        status = builder.status()
        assert (status.source, status.applied_revision, status.lag, status.rebuilds) == (None, 0, 4, 0)
        assert builder.rebuilds() == []

        def tables(conn):
            if backend == "sqlite":
                return conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'table'")).scalars().all()
            return conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = :s"),
                                {"s": builder.target.schema}).scalars().all()

        assert builder.target.read(tables) == []


def test_status_of_a_missing_sqlite_target_creates_no_file(store, make_db_url):
    """status() and rebuilds() on a SQLite target file that is not there created an empty database
    file (PostgreSQL created nothing): "never built", and the file is still not there."""
    from pathlib import Path

    _seed(store, 3)
    target_url = make_db_url("sqlite")
    with ProjectionBuilder(store, target_url, RunsByStatus()) as builder:
        status = builder.status()
        assert (status.source, status.applied_revision, status.lag) == (None, 0, 3)
        assert builder.rebuilds() == []
    assert not Path(target_url[len("sqlite:///"):]).exists()


def test_run_follows_the_source_until_stopped(store, target_url):
    _seed(store, 3)
    stop = threading.Event()
    with ProjectionBuilder(store, target_url, RunsByStatus(), poll_interval=0.2) as builder:
        thread = threading.Thread(target=builder.run, args=(stop,))
        thread.start()
        try:
            for i in range(5):
                store.db.write(lambda conn, i=i: _runs.create(conn, f"live-{i}", 10 + i))
            deadline = time.monotonic() + 20
            while builder.status().lag and time.monotonic() < deadline:
                time.sleep(0.05)
            assert builder.status().lag == 0
            assert _projected(builder) == store.db.read(_runs.live_rows)
        finally:
            stop.set()
            thread.join(timeout=20)
        assert not thread.is_alive()


def test_close_from_another_thread_stops_run(store, target_url):
    _seed(store, 3)
    builder = ProjectionBuilder(store, target_url, RunsByStatus(), poll_interval=0.2)
    thread = threading.Thread(target=builder.run)
    thread.start()
    deadline = time.monotonic() + 20
    while builder.status().lag and time.monotonic() < deadline:
        time.sleep(0.05)
    builder.close()
    thread.join(timeout=20)
    assert not thread.is_alive()
    with ProjectionBuilder(store, target_url, RunsByStatus()) as again:  # the lock was released
        assert again.catch_up().applied == 0


@pytest.mark.parametrize("problem", ["name", "feed", "tables", "batch"])
def test_invalid_projection_is_refused_before_anything_is_written(store, tmp_path, problem):
    projection = RunsByStatus()
    kwargs = {}
    if problem == "name":
        projection.name = ""
    elif problem == "feed":
        projection.feed = "journal"
    elif problem == "tables":
        projection.tables = ()
    else:
        kwargs["batch_size"] = 5000
    target = tmp_path / "never.db"
    with pytest.raises(ProjectionError) as caught:
        ProjectionBuilder(store, f"sqlite:///{target}", projection, **kwargs)
    assert caught.value.code == "invalid_projection"
    assert not target.exists()


def test_builtin_projections_satisfy_the_protocol():
    from fencepost.projections import OwnershipHistory

    assert isinstance(RunsByStatus(), Projection)
    assert isinstance(OwnershipHistory(), Projection)


_AWKWARD = ['quote " and backslash \\ and slash /', "tab\tnewline\nreturn\r", "naïve café ✓ 漢字 😀",
            "\\u0000 spelled out", "'single' and ; -- sql", "x" * 1024]


def test_awkward_text_and_largest_numbers_reach_the_projection_unchanged(store, target_url):
    """Every text and number a run can hold is projected exactly, whatever the target's bulk path
    does with them (JSON escapes, quotes, non-ASCII and astral characters, 1024-unit ids, 2**53 - 1)."""
    import msgspec

    biggest = 2**53 - 1
    ids = [f"awk-{i}-{text_}"[:1024] for i, text_ in enumerate(_AWKWARD)]

    def body(conn):
        for i, (run_id, text_) in enumerate(zip(ids, _AWKWARD, strict=True)):
            conn.execute(_runs._CREATE, {"run_id": run_id, "state": msgspec.json.encode({"flowName": text_}).decode(),
                                         "t": biggest - i})
            if i % 2:
                _runs.start(conn, run_id, biggest, host=text_, pid=biggest, nonce=text_[::-1])

    store.db.write(body)
    with ProjectionBuilder(store, target_url, RunsByStatus()) as builder:
        assert builder.catch_up().applied == len(ids)
        assert _projected(builder) == store.db.read(_runs.live_rows)
        flows = builder.target.read(lambda conn: dict(conn.execute(
            text("SELECT run_id, flow_name FROM projection_runs_by_status")).all()))
        assert flows == dict(zip(ids, _AWKWARD, strict=True))


def _commit_level(conn) -> str:
    if conn.dialect.name == "sqlite":
        return "relaxed" if conn.exec_driver_sql("PRAGMA synchronous").scalar() < 2 else "durable"
    return "relaxed" if conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "off" else "durable"


class _Levels:
    """RunsByStatus noting, per page and per reset, whether its transaction's COMMIT waits for the disk."""

    def __init__(self) -> None:
        self.inner = RunsByStatus()
        self.name, self.feed, self.tables = self.inner.name, "runs", self.inner.tables
        self.pages: list[str] = []
        self.resets: list[str] = []

    def reset(self, target):
        self.resets.append(_commit_level(target.conn))
        self.inner.reset(target)

    def apply(self, target, update):
        self.inner.apply(target, update)

    def apply_batch(self, target, updates):
        self.pages.append(_commit_level(target.conn))
        self.inner.apply_batch(target, updates)


def test_only_the_last_page_of_a_pass_and_the_swap_wait_for_the_disk(store, target_url):
    """Earlier pages commit without waiting for the disk: the last page's durable COMMIT (the
    swap's, for a rebuild) makes them durable with it; each page still commits whole with its
    checkpoint, and the tables hold every run afterwards."""
    _seed(store, 25)
    projection = _Levels()
    with ProjectionBuilder(store, target_url, projection, batch_size=10) as builder:
        builder.catch_up()
        assert projection.pages == ["relaxed", "relaxed", "durable"]
        assert _projected(builder) == store.db.read(_runs.live_rows)
        projection.pages.clear()
        projection.resets.clear()
        builder.rebuild()
        assert projection.pages == ["relaxed", "relaxed", "relaxed"]
        # Emptying the old rows, in a write of its own after the swap committed: nothing waits for
        # the disk there (lost, it leaves old shadow rows, which the next rebuild empties first).
        assert projection.resets[-1] == "relaxed"
        assert _projected(builder) == store.db.read(_runs.live_rows)
        assert builder.status().lag == 0
        store.db.write(lambda conn: _runs.create(conn, "one-more", 99))
        projection.pages.clear()
        builder.catch_up()
        assert projection.pages == ["durable"]  # a pass of one page: as before


def test_builder_busy_names_the_projection_and_target_and_says_what_to_do(store, target_url):
    """It said only "another builder is applying this projection name on this target"."""
    _seed(store, 2)
    first = ProjectionBuilder(store, target_url, RunsByStatus())
    second = ProjectionBuilder(store, target_url, RunsByStatus())
    try:
        first.catch_up()
        with pytest.raises(ProjectionError) as caught:
            second.catch_up()
        message = str(caught.value)
        assert caught.value.code == "builder_busy"
        assert "runs_by_status" in message and first.target.where in message
        assert "stop" in message and "lock_timeout" in message
    finally:
        first.close()
        second.close()
