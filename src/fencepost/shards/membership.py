"""Shard membership: every store of a set records the set, its own name and the ordered member list.

Opening a set reads every store's record (table ``flows_shard_membership``, migration 4001) and
refuses, naming the rule and the shard's position, a set that does not match what the stores
recorded: a shard missing, an extra store, stores in another order or under other names, a store of
another set, or members that disagree because a grow was interrupted. A fresh set (every store
empty, none with a record) is founded by the first opener; an interrupted founding is finished by
the next one. The open that finds every member recorded and in agreement marks each member founded
(``founded_at_ms``, migration 4002; migration 4003 marks the records written before the mark
existed); from then on no store that records no set joins it but by a grow. Growing a set
(``grow=True``) appends names, and empty stores only; it never removes or reorders them.

A writable ``reconcile`` that has anything to write (a founding, a grow, a mark) does it all while
holding store #0's write lock (``_holding``): every open of one set shares store #0 (a grow only
appends), so two opens that would record different memberships take turns, and the second is
judged on what the first recorded. Store #0's record is written in that held transaction and so
commits last; a grow writes the appended stores first. An interrupted grow thus always leaves a
state the same grow finishes (``_appended_from``), and every record write compares, inside the
write, with the record the decision was made on (``_record``).

Before anything is created, ``look_all`` reads every store that exists, read-only, and
``check_before_creating`` makes the refusals ``reconcile`` would make, so a refused open creates
and migrates no database. What tells an unfinished founding from a stand-in for a member: every
store of a founding exists before the first record is written, and runs are created only once a
founding has finished (every member recorded); a member is marked founded only once every member
is recorded. So a store that does not exist yet, or an unrecorded store beside a set that already
holds runs or beside a member marked founded, is no unfinished founding.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import msgspec
from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from fencepost._durable import DEFAULT_SCHEMA, Database, DbFailure, map_failure, parse_url
from fencepost._migrations import _applied, check_ledger
from fencepost._schema import flows_journal_events, flows_run_source, flows_runs
from fencepost._schema import flows_shard_membership as t
from fencepost._store import Store
from fencepost.errors import DatabaseMissing, FencepostError
from fencepost.runstore._checks import clock_reading

__all__ = ["Look", "Membership", "ShardError", "check_before_creating", "check_distinct", "check_name", "look_all",
           "read", "reconcile"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
FOUNDED_MIGRATION = 4002
"""The migration that adds ``founded_at_ms``; a store at 4001 (opened read-only, or looked at before
it is migrated) lacks the column."""
EARLIER_MARKED_MIGRATION = 4003
"""The migration that marks founded every record no open had marked (one written before the mark
existed). A store with a record and without it, looked at before it is migrated, counts as marked:
the writable open that would adopt a store beside it migrates it first."""


class ShardError(FencepostError):
    """A shard set could not be opened or used as given (``membership_mismatch``, ``invalid_shards`` ...)."""

    component = "Shards"


class Membership(msgspec.Struct, frozen=True):
    """One store's record: the set it belongs to, its name there, every member in order, the generation."""

    set_id: str
    shard_name: str
    members: tuple[str, ...]
    generation: int


def check_name(name: object, index: int) -> str:
    """A shard name: 1..64 characters of ``A-Z a-z 0-9 . _ -``, starting with a letter or digit."""
    if type(name) is not str or not _NAME.match(name):
        raise ShardError("invalid_shards", "open_shards",
                         f"shard #{index} name must be 1..64 characters of A-Z a-z 0-9 . _ -, "
                         "starting with a letter or digit")
    return name


class Look(msgspec.Struct, frozen=True):
    """What a read-only look found at a URL before anything is created.

    ``exists``: a fencepost store is there (its migration ledger). ``empty``: it holds no run and no
    journal entry. ``record``: its membership record, if any. ``source``: its change-feed source id,
    if it has one. ``place``: where the URL points (the SQLite file's real path, or the PostgreSQL
    server, database and schema), so one database given twice is seen before anything is created.
    ``founded``: its record is marked founded (the set's founding finished).
    """

    exists: bool
    empty: bool
    record: Membership | None
    source: str | None = None
    place: str = ""
    founded: bool = False


def _decode(row: Any) -> Membership:
    try:
        members = tuple(msgspec.json.decode(row.members_json, type=list[str]))
    except msgspec.DecodeError:
        raise ShardError("decode_failed", "open_shards",
                         "members_json of a shard record is not a list of names") from None
    return Membership(row.set_id, row.shard_name, members, int(row.generation))


_RECORD = select(t.c.set_id, t.c.shard_name, t.c.members_json, t.c.generation).where(t.c.singleton == 1)
"""The record's columns as of migration 4001 (a store at 4001 opened read-only has no others)."""


def read(store: Store) -> Membership | None:
    """The store's membership record, or ``None`` when it belongs to no set."""
    def body(conn: Connection) -> Membership | None:
        row = conn.execute(_RECORD).first()
        return None if row is None else _decode(row)

    try:
        return store.db.read(body)
    except DbFailure as exc:
        raise map_failure(exc, ShardError, "open_shards", "shard membership") from None


def clock_now(clock: Any) -> int:
    """The clock's reading for a membership stamp (``joined_at_ms``, ``founded_at_ms``), refused by
    name (``invalid_shards``) as the run store refuses it, before the stamp is written: the columns
    bound it to a non-negative safe integer and would otherwise fail as a bare ``constraint``."""
    return clock_reading(clock, "open_shards", code="invalid_shards", cls=ShardError)


def read_founded(store: Store) -> int | None:
    """When the store's record was marked founded (``founded_at_ms``), or ``None``: no record, a
    founding not finished yet, or a store at migration 4001 (read-only) that was never marked."""
    try:
        return store.db.read(lambda conn: _founded_in(store.db, conn))
    except DbFailure as exc:
        raise map_failure(exc, ShardError, "open_shards", "shard membership") from None


def _founded_in(db: Database, conn: Connection) -> int | None:
    if FOUNDED_MIGRATION not in _applied(conn, db):
        return None
    value = conn.execute(select(t.c.founded_at_ms).where(t.c.singleton == 1)).scalar()
    return None if value is None else int(value)


def _mark_founded(store: Store, set_id: str) -> None:
    """Mark the store's record of ``set_id`` founded, unless it is already (the time is kept)."""
    stmt = (update(t).where(t.c.singleton == 1, t.c.set_id == set_id, t.c.founded_at_ms.is_(None))
            .values(founded_at_ms=clock_now(store.clock)))
    try:
        store.db.write(lambda conn: conn.execute(stmt))
    except DbFailure as exc:
        raise map_failure(exc, ShardError, "open_shards", "shard membership") from None


def read_in(conn: Connection) -> tuple[str, int] | None:
    """``(set_id, generation)`` read inside an open transaction (the check a run creation makes)."""
    row = conn.execute(_GENERATION).first()
    return None if row is None else (row.set_id, int(row.generation))


_GENERATION = select(t.c.set_id, t.c.generation).where(t.c.singleton == 1)


def _record(store: Store, wanted: Membership, *, expected: Membership | None = None, index: int = 0,
            grow: bool = False) -> None:
    """Write ``wanted`` as the store's record, comparing first, inside the write, with what was read.

    ``expected``: the record the caller read (``None``: no record) and decided on. The write goes
    ahead only while the store still records exactly that; a record already equal to ``wanted`` is
    left as it is (an identical open, or a retried transaction, wrote it). Anything else was written
    by another open since the read (a concurrent founder or grower that does not share this one's
    lock on store #0) and is refused (``membership_mismatch``, naming the shard #``index``): never
    skipped in silence, which let two grows each believe its own list was recorded.

    A store without a record is written only while it holds no run and no journal entry. The look
    and the write share one write transaction, so runs that reached the store since it was found
    empty are seen, and the store is refused (``shard #<index> holds runs``: ``grow`` says a grow
    adds empty stores only), never adopted with them.
    """
    def body(conn: Connection) -> None:
        row = conn.execute(_RECORD).first()
        current = None if row is None else _decode(row)
        if current == wanted:
            return
        if current != expected:
            raise _refuse(f"shard #{index} records another membership than it did when this open read it "
                          "(another open founding or growing the set at the same time?): open it again")
        values = {"set_id": wanted.set_id, "shard_name": wanted.shard_name,
                  "members_json": msgspec.json.encode(list(wanted.members)).decode(),
                  "generation": wanted.generation}
        if current is None:
            if not _empty_in(conn):
                raise _holds_runs(index, grow=grow)
            conn.execute(t.insert().values(singleton=1, joined_at_ms=clock_now(store.clock), **values))
        else:
            conn.execute(update(t).where(t.c.singleton == 1).values(**values))

    try:
        store.db.write(body)
    except DbFailure as exc:
        raise map_failure(exc, ShardError, "open_shards", "shard membership") from None


def _holds_runs(index: int, *, grow: bool) -> ShardError:
    """A store that holds runs and records no set: never founded into a set, never appended by a grow
    (its runs would join the set unplaced, and an id could then be held by two shards)."""
    if grow:
        return _refuse(f"shard #{index} holds runs and records no shard set: a grow adds empty stores only")
    return _refuse(f"shard #{index} holds runs and records no shard set: a shard set is founded on empty stores only")


def _empty_in(conn: Connection) -> bool:
    """True when the store holds no run and no journal entry (safe to adopt into a founding set)."""
    runs = conn.execute(select(flows_runs.c.run_id).limit(1)).first()
    events = conn.execute(select(flows_journal_events.c.position).limit(1)).first()
    return runs is None and events is None


def look_all(urls: Sequence[str]) -> list[Look]:
    """Look at every store read-only (a missing SQLite file or PostgreSQL schema is no store): nothing
    is created, migrated or written. A store migrated by a newer fencepost raises ``schema_too_new``,
    one whose ledger names a migration otherwise ``schema_mismatch``.
    Every store's emptiness is read before any store's record (see
    ``_adoptable``). A store that cannot be read raises the ``OpenError`` its open would raise."""
    dbs: list[Database | None] = []
    try:
        for url in urls:
            try:
                db: Database | None = Database(url, readonly=True, group_commit=False)
            except DatabaseMissing:
                db = None
            dbs.append(db)
            if db is not None:
                # A store of a newer fencepost (or another build) is refused now, before any other
                # store is created.
                db.vetted(partial(_check_store, db))
        empty = [True if db is None else _look(db, _look_empty) for db in dbs]
        records = [None if db is None else _look(db, _look_record) for db in dbs]
        founded = [db is not None and r is not None and _look(db, _look_founded)
                   for db, r in zip(dbs, records, strict=True)]
        if any(founded):  # read again after the mark: see _after_the_mark
            records = [r if r is not None or db is None else _look(db, _look_record)
                       for db, r in zip(dbs, records, strict=True)]
        return [Look(db is not None and _look(db, _look_exists), e, r,
                     None if db is None else _look(db, _look_source), _place(url), f)
                for db, e, r, f, url in zip(dbs, empty, records, founded, urls, strict=True)]
    finally:
        for db in dbs:
            if db is not None:
                db.dispose()


def _check_store(db: Database) -> None:
    db.probe()
    check_ledger(db, _read(db, lambda d, conn: _applied(conn, d)))


def _look(db: Database, fn: Any) -> Any:
    # Each look leaves a SQLite file as it was, so a refused open (one look refusing) changes nothing.
    return db.vetted(partial(_read, db, fn))


def _read(db: Database, fn: Any) -> Any:
    try:
        return db.read(lambda conn: fn(db, conn))
    except DbFailure as exc:
        raise db.open_error(exc) from None


def _look_exists(db: Database, conn: Connection) -> bool:
    return db.backend.has_table(conn, "flows_migrations")


def _look_empty(db: Database, conn: Connection) -> bool:
    has = db.backend.has_table
    if not (has(conn, flows_runs.name) and has(conn, flows_journal_events.name)):
        return True
    return _empty_in(conn)


def _look_founded(db: Database, conn: Connection) -> bool:
    """Whether the record (the caller found one) is marked founded, or will be by the migration that
    marks records written before the mark (``EARLIER_MARKED_MIGRATION``)."""
    if not db.backend.has_table(conn, t.name):
        return False
    if EARLIER_MARKED_MIGRATION not in _applied(conn, db):
        return True
    return _founded_in(db, conn) is not None


def _look_source(db: Database, conn: Connection) -> str | None:
    if not db.backend.has_table(conn, flows_run_source.name):
        return None
    return conn.execute(select(flows_run_source.c.source).where(flows_run_source.c.singleton == 1)).scalar()


def _place(url: str) -> str:
    """Where ``url`` points, one spelling per database: two URLs with one place are one database."""
    parsed, options = parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        return "sqlite:" + os.path.realpath(parsed.database or "")
    return (f"postgresql://{(parsed.host or '').lower()}:{parsed.port or 5432}/{parsed.database or ''}"
            f"#{options.get('schema', DEFAULT_SCHEMA)}")


def check_distinct(places: Sequence[str | None], sources: Sequence[str | None], *,
                   labels: Sequence[str] | None = None, error: Callable[[str], Exception] | None = None) -> None:
    """Refuse one database given twice: two positions with one change-feed source id, or (for
    stores that may not exist yet) one place, the SQLite file's real path or the PostgreSQL schema.
    A position whose source or place is None (not read) is not compared by it.

    Checked before anything is written: founding a set on the same store twice would record a
    member list with a shard that does not exist. The one rule for every caller: ``labels`` name the
    stores in the message (``shard #1`` unless given: the CLI's ``--db #2``, the console's
    ``store 'b'``), ``error`` makes the exception raised with it (``membership_mismatch`` unless
    given: the CLI's usage error, the console's ``ValueError``).
    """
    def label(i: int) -> str:
        return labels[i] if labels is not None else f"shard #{i}"

    for keys, why in ((sources, "one source id"), (places, "one file or schema")):
        seen: dict[str, int] = {}
        for i, key in enumerate(keys):
            if key is None:
                continue
            if key in seen:
                detail = f"{label(i)} is the same database as {label(seen[key])} ({why}): give each store once"
                raise (error or _refuse)(detail)
            seen[key] = i


def _look_record(db: Database, conn: Connection) -> Membership | None:
    if not db.backend.has_table(conn, t.name):
        return None
    row = conn.execute(_RECORD).first()
    return None if row is None else _decode(row)


def _founding(empty: Sequence[bool]) -> None:
    """A set is founded on empty stores only (runs in a store of no set would join it unplaced)."""
    for i, is_empty in enumerate(empty):
        if not is_empty:
            raise _holds_runs(i, grow=False)


def _adoptable(empty: Sequence[bool], generation: int, founded: bool) -> bool:
    """Whether unrecorded stores beside recorded ones may be an unfinished founding, to be finished.

    Only a first generation, only while every given store is empty (runs are created only once a
    founding has finished) and only while no member is marked founded. ``empty`` must have been read
    before ``records``: a store found holding runs then shows every record its finished founding
    wrote, so a record still missing is real. Likewise a record missing is real only when read
    after a ``founded`` mark (see ``_after_the_mark``).
    """
    return generation == 1 and all(empty) and not founded


def _after_the_mark(stores: Sequence[Store], records: list[Membership | None]) -> list[bool]:
    """Which stores are marked founded; when any is, the stores read without a record are read again.

    A member is marked only once every member is recorded, but this opener read the records before
    the marks: a concurrent founder may have recorded a store (read here as blank) and marked the
    set founded in between. Read after the mark, a member shows its record; a store still without
    one is no member.
    """
    marked = [rec is not None and read_founded(s) is not None for s, rec in zip(stores, records, strict=True)]
    if any(marked):
        for i, store in enumerate(stores):
            if records[i] is None:
                records[i] = read(store)
    return marked


def _appended_from(records: Sequence[Membership | None]) -> int:
    """The first position a grow appends: past every recorded member list.

    A grow records the new list in the appended stores first, then in the other members, in store
    #0 last; so whatever point it stopped at, some given store (store #0 at the latest) still
    records the list as it was before, and an unrecorded store past that list is one the grow had
    yet to record. A recorded list never shrinks, so the shortest is the set's list before the grow.
    """
    return min(len(r.members) for r in records if r is not None)


def _stands_for_a_member(i: int, records: Sequence[Membership | None], empty: Sequence[bool], *,
                         founded: bool, grow: bool) -> bool:
    """Whether unrecorded store #i stands where the set already has a member and is no unfinished
    founding: then it is refused. A grow's appended positions (``_appended_from``) are new shards,
    not stand-ins."""
    present = [r for r in records if r is not None]
    if grow and i >= _appended_from(records):
        return False
    return not _adoptable(empty, max(r.generation for r in present), founded)


def _not_a_member(i: int) -> ShardError:
    return _refuse(f"shard #{i} is not a member of this set (a shard missing, or an extra store? "
                   "grow the set to add a store)")


def check_before_creating(names: Sequence[str], looks: Sequence[Look], *, grow: bool = False) -> None:
    """Refuse, before any store is created or migrated, what ``reconcile`` would refuse.

    A store that does not exist yet is never a member of a recorded set (only ``grow`` adds one).
    """
    check_distinct([lk.place for lk in looks], [lk.source for lk in looks])
    records = [lk.record for lk in looks]
    present = [r for r in records if r is not None]
    empty = [lk.empty for lk in looks]
    if not present:
        _founding(empty)
        return
    _same_set(records)
    newest = max(present, key=lambda r: r.generation)
    if grow:
        _prefixes(names, records)
        for i, rec in enumerate(records):
            if rec is not None and rec.shard_name != names[i]:
                raise _refuse(f"shard #{i} is recorded under another name or position (stores in another order?)")
    elif newest.members != tuple(names) or any(r.generation != newest.generation for r in present):
        _verify(names, records)
    founded = any(lk.founded for lk in looks)
    for i, lk in enumerate(looks):
        if lk.record is None and _stands_for_a_member(i, records, empty, founded=founded, grow=grow):
            if not lk.exists and i < len(newest.members) and names[i] == newest.members[i]:
                # A recorded member whose database is gone: growing would not bring it back.
                raise _refuse(f"shard #{i} is not a member of this set as given: no database is there, where "
                              f"the set records member {names[i]}; restore its database (or fix its URL)")
            raise _not_a_member(i)
        if lk.record is None and grow and i >= _appended_from(records) and not lk.empty:
            raise _holds_runs(i, grow=True)
        if lk.record is None and not lk.exists and not (grow and i >= len(newest.members)):
            raise _refuse(f"shard #{i} is not a member of this set: it is a new store (a shard missing? "
                          "grow the set to add a store)")


def _same_set(records: Sequence[Membership | None]) -> None:
    present = [r for r in records if r is not None]
    if len({r.set_id for r in present}) > 1:
        index = next(i for i, r in enumerate(records) if r is not None and r.set_id != present[0].set_id)
        raise _refuse(f"shard #{index} belongs to another shard set")


def _prefixes(names: Sequence[str], records: Sequence[Membership | None]) -> None:
    for i, rec in enumerate(records):
        if rec is not None and tuple(names[: len(rec.members)]) != rec.members:
            raise _refuse(f"shard #{i} records members that are not a prefix of the given list "
                          "(a grow only appends shards)")


def _empty(store: Store) -> bool:
    """``_empty_in`` in a read transaction of its own."""
    return store.db.read(_empty_in)


def _refuse(detail: str) -> ShardError:
    return ShardError("membership_mismatch", "open_shards", detail)


def _verify(names: Sequence[str], records: Sequence[Membership | None]) -> Membership:
    """The set's membership when every record agrees with ``names``; else refuse, naming the rule."""
    first = next(r for r in records if r is not None)
    for i, rec in enumerate(records):
        if rec is None:
            raise _not_a_member(i)
        if rec.set_id != first.set_id:
            raise _refuse(f"shard #{i} belongs to another shard set")
    for i, rec in enumerate(records):
        assert rec is not None
        if rec.generation != first.generation or rec.members != first.members:
            raise _refuse(f"shard #{i} records another generation of the member list "
                          "(an interrupted grow: open with grow=True to finish it)")
    recorded = first.members
    if len(recorded) > len(names):
        raise _refuse(f"the set has {len(recorded)} shards and {len(names)} were given: a shard is missing")
    if len(recorded) < len(names):
        raise _refuse(f"the set has {len(recorded)} shards and {len(names)} were given: an extra store")
    for i, rec in enumerate(records):
        assert rec is not None
        if rec.shard_name != names[i] or recorded[i] != names[i]:
            raise _refuse(f"shard #{i} is recorded under another name or position (stores in another order?)")
    return first


def reconcile(names: Sequence[str], stores: Sequence[Store], *, grow: bool = False,
              readonly: bool = False) -> Membership:
    """Check (and, where allowed, record) the membership of ``stores`` named ``names``; return it.

    No store has a record: the set is founded (not when ``readonly``), on empty stores only. Some
    stores lack a record while the others name exactly ``names`` at the first generation and every
    store is empty: an interrupted founding, finished here. ``grow``: the recorded member list must
    be a prefix of ``names``; the new list is recorded in every store under the next generation
    (re-running an interrupted grow finishes it); an appended store must be empty.

    Every writable reconcile of a set runs inside one write transaction held on store #0 (see
    ``_holding``): two opens that would record different memberships at once (two grows, two
    foundings sharing store #0) take turns, and the second reads what the first recorded and is
    refused by the rules above, or finds its membership already recorded. Store #0's own record and
    mark are written in that transaction, so they commit last: store #0 is where a founding or a
    grow is decided. The other stores are marked founded after that commit (see ``_after_the_mark``).
    """
    if readonly:
        records = [read(s) for s in stores]
        if not any(r is not None for r in records):
            raise _refuse("no store of the given set records a membership (open it writable once)")
        return _verify(names, records)
    if not grow:
        settled = _settled(names, stores)
        if settled is not None:
            return settled
    membership, unmarked = _holding(stores[0], partial(_reconcile_held, names, stores, grow))
    # After the commit: a member is marked only once every member's record is committed.
    for store in unmarked:
        _mark_founded(store, membership.set_id)
    return membership


def _settled(names: Sequence[str], stores: Sequence[Store]) -> Membership | None:
    """The membership when every store already records exactly ``names`` and is marked founded
    (nothing to write: an ordinary open of a set), else ``None`` (then the locked path decides)."""
    records = [read(s) for s in stores]
    if any(r is None for r in records):
        return None
    try:
        membership = _verify(names, records)
    except ShardError:
        return None
    return membership if all(read_founded(s) is not None for s in stores) else None


def _holding(store: Store, fn: Callable[[], Any]) -> Any:
    """``fn()`` inside a write transaction of its own on ``store`` (``BEGIN IMMEDIATE``, or the
    schema's advisory lock, as every write of the store takes it), never shared with other writes.

    While ``fn`` runs, this process holds ``store``'s write lock: another process's reconcile of the
    set waits for it, then reads what this one recorded. Inside, reads and writes of ``store`` go
    through the held transaction (a nested ``write`` is a savepoint of it); writes of the other
    stores run alone, each in a transaction of its own, as every write made inside a transaction
    does. Not through group commit, whose leader could run ``fn`` on another thread while the
    store's other writers of this process queue behind it. A transient failure (a lost connection)
    runs ``fn`` again from the start: it re-reads every record, so what the first run wrote on the
    other stores is found written, never written twice.
    """
    try:
        return store.db.write(lambda conn: fn(), alone=True)
    except DbFailure as exc:
        raise map_failure(exc, ShardError, "open_shards", "shard membership") from None


def _reconcile_held(names: Sequence[str], stores: Sequence[Store], grow: bool) -> tuple[Membership, list[Store]]:
    """``reconcile`` while holding store #0's write lock: the membership, and the stores still to be
    marked founded once the transaction committed.

    Every refusal is made before anything is written, so a refused open leaves every store as it
    was. Then the records are written: the stores a grow appends first, then the other members,
    store #0 last (in the held transaction). An interruption anywhere (a kill, a store that cannot
    be written) thus leaves store #0 with the list as it was and every store recording either list:
    the same grow run again finishes it. (Until it does, the old list still opens only if no old
    member records the new list yet; any other open is refused as an interrupted grow.)
    """
    empty = [_empty(s) for s in stores]  # before the records: see _adoptable
    records = [read(s) for s in stores]
    present = [r for r in records if r is not None]
    if not present:
        _founding(empty)
        founder = Membership(secrets.token_hex(16), names[0], tuple(names), 1)
        _record(stores[0], founder, expected=None)  # in the held transaction
        records[0] = founder
    marked = _after_the_mark(stores, records)
    founded = any(marked)
    present = [r for r in records if r is not None]
    _same_set(records)
    newest = max(present, key=lambda r: r.generation)
    if grow:
        _prefixes(names, records)
        generation = newest.generation + (0 if tuple(names) == newest.members else 1)
        target = tuple(names)
    else:
        generation, target = newest.generation, newest.members
        if target != tuple(names) or any(r.generation != generation for r in present):
            _verify(names, records)  # refuses, naming the first broken rule
    appended_from = _appended_from(records)
    writes: list[int] = []
    for i, rec in enumerate(records):
        if rec is None:
            if _stands_for_a_member(i, records, empty, founded=founded, grow=grow):
                # A blank store standing in for a member (of a grown set, of a set that holds runs,
                # or of a set marked founded) is no unfinished founding.
                raise _not_a_member(i)
            if not empty[i]:
                raise _holds_runs(i, grow=grow)
            writes.append(i)
        elif grow and rec.generation < generation:
            if rec.shard_name != names[i]:
                raise _refuse(f"shard #{i} is recorded under another name or position (stores in another order?)")
            writes.append(i)
    # The appended stores first, then the other members, store #0 last.
    for i in sorted(writes, key=lambda i: (i == 0, i < appended_from)):
        _record(stores[i], Membership(newest.set_id, names[i], target, generation),
                expected=records[i], index=i, grow=grow)
    membership = _verify(names, [read(s) for s in stores])
    # Every member is recorded and agrees: the founding (or the grow) is finished. Store #0 is
    # marked in the held transaction, with its record; the others once it committed (see
    # _after_the_mark). A record written before the mark existed was marked by migration 4003.
    if not marked[0]:
        _mark_founded(stores[0], membership.set_id)
    return membership, [s for s, was in zip(stores[1:], marked[1:], strict=True) if not was]
