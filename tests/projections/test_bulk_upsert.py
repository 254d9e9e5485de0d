"""The projection targets' bulk upsert: one statement per page where the backend has one, row by
row otherwise, the same rows either way."""

from __future__ import annotations

from sqlalchemy import Boolean, Column, Float, MetaData, Table, Text, event, select

from fencepost._durable import Database
from fencepost.projections import _sql
from fencepost.projections._sql import Int


def _tables() -> tuple[Table, Table]:
    meta = MetaData()
    plain = Table("bulk_plain", meta, Column("k", Text, primary_key=True), Column("n", Int),
                  Column("s", Text))
    # Float and boolean values are not carried exactly by the JSON path: row by row.
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
