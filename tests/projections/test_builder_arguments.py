"""ProjectionBuilder refuses bad arguments with ProjectionError('invalid_projection') naming the
argument, at construction or at the call, before anything is written to the target.

Before: a None or non-URL target failed with AttributeError 'backend'; lock_timeout='5' failed in
catch_up() and lock_timeout=nan waited forever on a held name; poll_interval '5', -1, 0, nan or None
were accepted; offer(None)/offer('x')/offer([5]) and run('x') failed with raw TypeError or
AttributeError; and an empty target URL was read as the default and created ./.flows/flows.db.
Both backends.
"""

from __future__ import annotations

import threading

import msgspec
import pytest

import fencepost
from fencepost import OwnerId
from fencepost._migrations import pending
from fencepost.changefeed import Observed
from fencepost.errors import ProjectionError
from fencepost.projections import ConsensusFact, OwnershipHistory, ProjectionBuilder, RunsByStatus
from tests.projections import _runs


def _refused(caught: pytest.ExceptionInfo, field: str) -> None:
    assert caught.value.code == "invalid_projection"
    assert caught.value.detail.startswith(f"{field} ")


@pytest.mark.parametrize(("field", "target"), [
    ("target", None),
    ("target", 5),
    ("target", ""),
    ("target", b"sqlite:///x.db"),
    # A string that is no database URL was a bare ValueError from URL parsing, not naming ``target``.
    ("target", "nope://host/db"),
    ("target", "flows.db"),
    ("target", "postgresql://u@127.0.0.1/db?schema=NOT-A-SCHEMA"),
    ("target", "postgresql://u@127.0.0.1/db?colour=blue"),
    ("target", "sqlite:///x.db?synchronous=sometimes"),
])
def test_a_bad_target_is_refused_and_nothing_is_created(store, tmp_path, monkeypatch, field, target):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("FENCEPOST_DB", raising=False)
    with pytest.raises(ProjectionError) as caught:
        ProjectionBuilder(store, target, RunsByStatus())
    _refused(caught, field)
    assert list(cwd.iterdir()) == []  # no ./.flows/flows.db


@pytest.mark.parametrize(("field", "kwargs"), [
    ("lock_timeout", {"lock_timeout": "5"}),
    ("lock_timeout", {"lock_timeout": float("nan")}),
    ("lock_timeout", {"lock_timeout": float("inf")}),
    ("lock_timeout", {"lock_timeout": -1}),
    ("lock_timeout", {"lock_timeout": True}),
    ("poll_interval", {"poll_interval": "5"}),
    ("poll_interval", {"poll_interval": -1}),
    ("poll_interval", {"poll_interval": 0}),
    ("poll_interval", {"poll_interval": float("nan")}),
    ("poll_interval", {"poll_interval": float("inf")}),
    ("poll_interval", {"poll_interval": None}),
    ("poll_interval", {"poll_interval": False}),
])
def test_a_bad_timing_argument_is_refused_at_construction(store, tmp_path, field, kwargs):
    target = tmp_path / "never.db"
    with pytest.raises(ProjectionError) as caught:
        ProjectionBuilder(store, f"sqlite:///{target}", RunsByStatus(), **kwargs)
    _refused(caught, field)
    assert not target.exists()


def test_good_timing_arguments_are_accepted(store, make_db_url):
    for kwargs in ({"lock_timeout": None}, {"lock_timeout": 0}, {"lock_timeout": 2.5}, {"poll_interval": 0.01},
                   {"poll_interval": 3}):
        ProjectionBuilder(store, make_db_url(), RunsByStatus(), **kwargs).close()


def _untouched(builder: ProjectionBuilder) -> None:
    # The builder never took its lock, migrated or created a table on the target.
    assert not builder._lock.held
    assert pending(builder.target, ("projections",))


def _snapshot(store, run_id: str):
    snap = store.feed.read([run_id]).snapshots[0]
    assert isinstance(snap, Observed)
    return snap


@pytest.mark.parametrize("updates", [None, "x", [5], 5, [{"run_id": "r"}], "fact"])
def test_offer_refuses_what_is_not_a_list_of_snapshots_before_writing(store, make_db_url, updates):
    store.db.write(lambda conn: _runs.create(conn, "r-1", 0))
    good = _snapshot(store, "r-1")
    builder = ProjectionBuilder(store, make_db_url(), RunsByStatus())
    try:
        with pytest.raises(ProjectionError) as caught:
            builder.offer(updates if updates != "fact" else [good, object()])
        _refused(caught, "updates")
        _untouched(builder)
    finally:
        builder.close()


def test_offer_to_a_consensus_projection_wants_consensus_facts(store, make_db_url):
    store.db.write(lambda conn: _runs.create(conn, "r-1", 0))
    builder = ProjectionBuilder(store, make_db_url(), OwnershipHistory())
    try:
        with pytest.raises(ProjectionError) as caught:
            builder.offer([_snapshot(store, "r-1")])
        _refused(caught, "updates")
        _untouched(builder)
    finally:
        builder.close()


def test_offer_still_applies_snapshots(store, make_db_url):
    store.db.write(lambda conn: _runs.create(conn, "r-1", 0))
    with ProjectionBuilder(store, make_db_url(), RunsByStatus()) as builder:
        builder.catch_up()
        assert builder.offer(iter([_snapshot(store, "r-1")])).rejected == 1  # a generator is fine too


def test_offer_takes_what_feed_read_returns(store, make_db_url):
    """``offer(store.feed.read(ids))``, as the docs put it, was refused ("updates must be an iterable
    of snapshots"): ``read`` returns a ``Batch``, and only its ``snapshots`` list was accepted."""
    store.db.write(lambda conn: _runs.create(conn, "r-1", 0))
    with ProjectionBuilder(store, make_db_url(), RunsByStatus()) as builder:
        builder.catch_up()
        store.db.write(lambda conn: _runs.start(conn, "r-1", 1))
        assert builder.offer(store.feed.read(["r-1"])).applied == 1
        assert builder.offer(store.feed.read(["r-1"])).rejected == 1


@pytest.mark.parametrize("stop", ["x", 5, object()])
def test_run_refuses_a_stop_that_is_not_an_event_before_writing(store, make_db_url, stop):
    builder = ProjectionBuilder(store, make_db_url(), RunsByStatus())
    try:
        with pytest.raises(ProjectionError) as caught:
            builder.run(stop)
        _refused(caught, "stop")
        _untouched(builder)
    finally:
        builder.close()


def test_run_takes_any_stop_with_is_set(store, make_db_url):
    class Flag:
        def __init__(self) -> None:
            self.event = threading.Event()

        def is_set(self) -> bool:
            return self.event.is_set()

    flag = Flag()
    with ProjectionBuilder(store, make_db_url(), RunsByStatus(), poll_interval=0.05) as builder:
        thread = threading.Thread(target=builder.run, args=(flag,), daemon=True)
        thread.start()
        flag.event.set()
        thread.join(timeout=20)
        assert not thread.is_alive()


def test_offer_refuses_a_snapshot_ahead_of_its_source_and_writes_nothing(store, make_db_url):
    """A snapshot of this source whose revision the source has not reached cannot have come from
    the feed. ``offer`` applied it: the projection then held that revision for the run and rejected
    every real change of it as stale until a rebuild (found by typing the docs' projection out and
    offering a hand-built ``Observed``). Now the offer is refused, nothing is applied or counted,
    and the next real change still arrives. Both backends."""
    store.db.write(lambda conn: _runs.create(conn, "r-1", 0))
    with ProjectionBuilder(store, make_db_url(), RunsByStatus()) as builder:
        builder.catch_up()
        before = builder.status()
        head = store.feed.position().revision
        forged = msgspec.structs.replace(_snapshot(store, "r-1"), status="completed", revision=head + 1)
        with pytest.raises(ProjectionError) as caught:
            builder.offer([forged])
        _refused(caught, "updates")
        assert "#0" in caught.value.detail and "ahead" in caught.value.detail
        after = builder.status()
        assert (after.applied, after.rejected) == (before.applied, before.rejected)
        store.db.write(lambda conn: _runs.start(conn, "r-1", 1))
        assert builder.catch_up().applied == 1  # the real change is not shadowed by the forged one


def test_offer_refuses_a_consensus_fact_ahead_of_the_journal_and_writes_nothing(store, make_db_url):
    """The same for a journal-fed projection: a fact whose position the journal has not reached
    was applied, and shadowed the run's later facts. Both backends."""
    owner = OwnerId("host-a", 1, "n1")
    store.runs.create("r-1", "{}")
    store.runs.claim_and_own("r-1", store.runs.get("r-1").snapshot(), owner, store.clock.now_ms())
    with ProjectionBuilder(store, make_db_url(), OwnershipHistory()) as builder:
        builder.catch_up()
        before = builder.status()
        head = before.source_revision
        forged = ConsensusFact("r-1", before.source, head + 5, "released", None, None, 0)
        with pytest.raises(ProjectionError) as caught:
            builder.offer([forged])
        _refused(caught, "updates")
        after = builder.status()
        assert (after.applied, after.rejected) == (before.applied, before.rejected)
        store.runs.transition_owned("r-1", owner, "completed")
        assert builder.catch_up().applied == 1


class _LongIndex:
    """A runs projection whose declared index name fits PostgreSQL's 63 bytes, but not with ``__shadow``."""

    name = "long_index"
    feed = "runs"

    def __init__(self) -> None:
        from sqlalchemy import Column, Index, MetaData, Table, Text

        self.table = Table("long_index_runs", MetaData(), Column("run_id", Text, primary_key=True),
                           Column("status", Text))
        Index("i" * 60, self.table.c.status)
        self.tables = (self.table,)

    def reset(self, target) -> None:
        target.conn.execute(self.table.delete())

    def apply(self, target, update) -> None:
        table = target.table("long_index_runs")
        row = {"run_id": update.run_id, "status": getattr(update, "status", None)}
        target.conn.execute(target.insert(table).values(**row).on_conflict_do_update(
            index_elements=[table.c.run_id], set_={"status": row["status"]}))


@pytest.mark.parametrize(("field", "projection"), [
    ("table", lambda: RunsByStatus(table="t" * 58)),      # its shadow's name is 66 bytes
    ("table", lambda: RunsByStatus(table="t" * 70)),
    ("table", lambda: RunsByStatus(table="é" * 30)),      # 60 bytes: characters are not bytes
    ("index", _LongIndex),
])
def test_a_name_postgresql_would_truncate_is_refused_at_construction(store, make_db_url, field, projection):
    """A projection table (or declared index) whose name, or its ``__shadow`` copy's, is longer than
    PostgreSQL's 63 bytes failed at the first catch_up with a bare 'projection target persistence
    failed' (no db_code): PostgreSQL truncated the live and shadow index names to the same 63 bytes
    and refused the second. Refused at construction instead, naming the table or index and the
    limit. On a SQLite target, which has no such limit, the same projection builds."""
    target = make_db_url("postgresql")
    with pytest.raises(ProjectionError) as caught:
        ProjectionBuilder(store, target, projection())
    _refused(caught, field)
    assert "63 bytes" in caught.value.detail
    store.runs.create("r", "{}")
    with ProjectionBuilder(store, make_db_url("sqlite"), projection()) as builder:
        assert builder.catch_up().applied == 1
        store.feed.rotate_source()
        assert builder.catch_up().rebuilt


def test_the_longest_names_postgresql_keeps_build_and_rebuild(store, make_db_url):
    store.runs.create("r", "{}")
    table = "t" * (63 - len("__shadow") - len("_status_idx"))
    with ProjectionBuilder(store, make_db_url("postgresql"), RunsByStatus(table=table)) as builder:
        assert builder.catch_up().applied == 1
        store.feed.rotate_source()
        assert builder.catch_up().rebuilt and builder.status().lag == 0


@pytest.mark.parametrize("kind", [RunsByStatus, OwnershipHistory])
@pytest.mark.parametrize("table", [None, 5, "", b"projection_x"])
def test_a_built_in_projection_refuses_a_table_that_is_not_a_name(kind, table):
    """``RunsByStatus(table=None)`` raised SQLAlchemy's bare AssertionError ('use
    quoted_name.construct() for None passthrough'); ``table=5`` and ``table=''`` were accepted and
    built a table named '5', or '' (SQLite) / failed as a bare persistence_failed (PostgreSQL)."""
    with pytest.raises(ProjectionError) as caught:
        kind(table=table)
    _refused(caught, "table")


def test_a_projection_table_without_a_name_is_refused_before_writing(store, make_db_url):
    from sqlalchemy import Column, MetaData, Table, Text

    class Nameless:
        name = "nameless"
        feed = "runs"
        tables = (Table("", MetaData(), Column("run_id", Text, primary_key=True)),)

        def reset(self, target) -> None: ...

        def apply(self, target, update) -> None: ...

    target = make_db_url()
    with pytest.raises(ProjectionError) as caught:
        ProjectionBuilder(store, target, Nameless())
    _refused(caught, "table")


def _nul_named(where: str):
    """A projection whose table, column or declared index has a NUL in its name."""
    from sqlalchemy import Column, Index, MetaData, Table, Text

    table, column, index = ("nul\x00table" if where == "table" else "nul_table",
                            "run\x00id" if where == "column" else "run_id",
                            "nul\x00idx" if where == "index" else "nul_idx")
    columns = [Column(column, Text, primary_key=True), Column("status", Text)]

    class NulNamed:
        name = "nul_named"
        feed = "runs"
        tables = (Table(table, MetaData(), *columns, Index(index, "status")),)

        def reset(self, target) -> None: ...

        def apply(self, target, update) -> None: ...

    return NulNamed()


@pytest.mark.parametrize("where", ["table", "column", "index"])
def test_a_name_holding_nul_is_refused_at_construction_and_nothing_is_written(store, make_db_url, tmp_path, where):
    """A projection table (or its column or declared index) whose name holds NUL, which neither
    SQLite nor PostgreSQL can take in an identifier, passed construction (the projection's own name
    with NUL was refused) and failed at the first catch_up as a bare 'projection target persistence
    failed' at ``Projection.apply``, after the target had been migrated and the lock file made.
    Refused at construction now, naming what holds the NUL; the target is left as it was."""
    store.runs.create("r", "{}")
    target = make_db_url()
    with pytest.raises(ProjectionError) as caught:
        ProjectionBuilder(store, target, _nul_named(where))
    _refused(caught, where)
    assert "NUL" in caught.value.detail and "\x00" not in caught.value.detail
    if target.startswith("sqlite"):
        assert not list(tmp_path.glob("db-*"))  # no database, no lock file
    else:
        with pytest.raises(fencepost.OpenError) as missing:
            fencepost.open(target, readonly=True).close()
        assert missing.value.code == "database_missing"  # the target's schema was never made
