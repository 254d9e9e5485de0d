"""The projection targets' bulk upsert: one statement per page where the backend has one, row by
row otherwise, the same rows either way."""

from __future__ import annotations

import pytest
from sqlalchemy import Boolean, Column, Float, MetaData, Table, Text, event, select

import fencepost
from fencepost._durable import Database
from fencepost.projections import _sql
from fencepost.projections._sql import Int


def _tables() -> tuple[Table, Table]:
    meta = MetaData()
    plain = Table("bulk_plain", meta, Column("k", Text, primary_key=True), Column("n", Int),
                  Column("s", Text))
    # Only text and integer columns take PostgreSQL's JSON path; anything else goes row by row.
    mixed = Table("bulk_mixed", meta, Column("k", Text, primary_key=True), Column("x", Float),
                  Column("b", Boolean))
    return plain, mixed


def _statements(db: Database) -> list[str]:
    seen: list[str] = []
    event.listen(db.engine, "before_cursor_execute",
                 lambda conn, cursor, statement, *rest: seen.append(statement))
    return seen


def test_a_page_is_upserted_and_replaces_existing_rows(store, backend: str) -> None:
    db: Database = store.db
    plain, mixed = _tables()
    db.write(lambda conn: [t.create(conn) for t in (plain, mixed)])
    seen = _statements(db)
    first = [{"k": f"k{i}", "n": 2**53 - 1 - i, "s": f'"quoted" \\ {i} ✓'} for i in range(300)]
    db.write(lambda conn: _sql.upsert_many(conn, db.backend, plain, ("k",), first))
    again = [{"k": "k1", "n": 7, "s": None}, {"k": "new", "n": None, "s": "fresh"}]
    db.write(lambda conn: _sql.upsert_many(conn, db.backend, plain, ("k",), again))
    rows = db.read(lambda conn: {r.k: (r.n, r.s) for r in conn.execute(select(plain))})
    expected = {r["k"]: (r["n"], r["s"]) for r in first}
    expected.update({r["k"]: (r["n"], r["s"]) for r in again})
    assert rows == expected
    upserts = [s for s in seen if "bulk_plain" in s and s.lstrip().upper().startswith("INSERT")]
    if backend == "postgresql":
        # One statement per page, the page as one JSON text.
        assert len(upserts) == 2 and all("json_populate_recordset" in s for s in upserts)
    else:
        assert len(upserts) == 2 and not any("json" in s for s in upserts)

    seen.clear()
    floats = [{"k": f"m{i}", "x": i / 3, "b": i % 2 == 0} for i in range(5)]
    db.write(lambda conn: _sql.upsert_many(conn, db.backend, mixed, ("k",), floats))
    got = db.read(lambda conn: {r.k: (r.x, r.b) for r in conn.execute(select(mixed))})
    assert got == {r["k"]: (r["x"], r["b"]) for r in floats}
    assert not any("json_populate_recordset" in s for s in seen)


def test_two_tables_of_one_name_keep_their_own_statements(store, make_db_url) -> None:
    """A table named like another one elsewhere (another database or schema, other columns) is
    upserted with its own columns, not with a statement built for the first."""
    narrow = Table("bulk_named", MetaData(), Column("k", Text, primary_key=True), Column("n", Int))
    wide = Table("bulk_named", MetaData(), Column("k", Text, primary_key=True), Column("n", Int),
                 Column("extra", Text))
    other_store = fencepost.open(make_db_url())
    other = other_store.db
    try:
        for db, table in ((store.db, narrow), (other, wide)):
            db.write(lambda conn, table=table: table.create(conn))
        store.db.write(lambda conn: _sql.upsert_many(conn, store.db.backend, narrow, ("k",), [{"k": "a", "n": 1}]))
        other.write(lambda conn: _sql.upsert_many(conn, other.backend, wide, ("k",),
                                                  [{"k": "a", "n": 2, "extra": "kept"}]))
        assert other.read(lambda conn: conn.execute(select(wide)).all()) == [("a", 2, "kept")]
        assert store.db.read(lambda conn: conn.execute(select(narrow)).all()) == [("a", 1)]
    finally:
        other_store.close()


def test_a_row_missing_a_column_is_refused_on_both_backends(store) -> None:
    """Every row must carry every column: neither backend quietly stores NULL for a missing one."""
    table = Table("bulk_missing", MetaData(), Column("k", Text, primary_key=True), Column("n", Int))
    store.db.write(lambda conn: table.create(conn))
    with pytest.raises(KeyError):
        store.db.write(lambda conn: _sql.upsert_many(conn, store.db.backend, table, ("k",),
                                                                 [{"k": "a", "n": 1}, {"k": "b"}]))
    assert store.db.read(lambda conn: conn.execute(select(table)).all()) == []


def test_rows_given_as_tuples_are_upserted_as_the_same_rows_as_dicts(store, backend: str) -> None:
    """``upsert_values`` (a page built as tuples in column order, as ``RunsByStatus`` builds it)
    stores what ``upsert_many`` stores, replaces by the key, and refuses a tuple of another width
    before anything is written."""
    db: Database = store.db
    plain, _mixed = _tables()
    db.write(lambda conn: plain.create(conn))
    first = [(f"k{i}", 2**53 - 1 - i, f'"quoted" \\ {i} ✓') for i in range(300)]
    db.write(lambda conn: _sql.upsert_values(conn, db.backend, plain, ("k",), first))
    again = [("k1", 7, None), ("new", None, "fresh")]
    db.write(lambda conn: _sql.upsert_values(conn, db.backend, plain, ("k",), again))
    expected = {k: (n, s) for k, n, s in first}
    expected.update({k: (n, s) for k, n, s in again})
    assert db.read(lambda conn: {r.k: (r.n, r.s) for r in conn.execute(select(plain))}) == expected
    with pytest.raises(ValueError, match="2 values for 3 columns"):
        db.write(lambda conn: _sql.upsert_values(conn, db.backend, plain, ("k",), [("z", 1, "s"), ("y", 1)]))
    assert db.read(lambda conn: conn.execute(select(plain).where(plain.c.k == "z")).all()) == []
