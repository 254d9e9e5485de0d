"""docs/guides/custom-projection.md: its two complete projections run as written, and its field
tables list exactly the fields of the types a projection receives."""

from __future__ import annotations

import re

import msgspec
import pytest

import fencepost
from fencepost.projections import ConsensusFact
from tests._docs import DOCS, run_snippets

GUIDE = DOCS / "guides" / "custom-projection.md"


def test_the_custom_projection_guide_runs() -> None:
    run_snippets(GUIDE, "custom_projection_guide")


def _tables(text: str) -> dict[str, list[str]]:
    """The first-column names of each ``| field | type | meaning |`` table, keyed by the type named
    in the paragraph above it."""
    found: dict[str, list[str]] = {}
    for match in re.finditer(r"`fencepost\.(?:projections\.)?(\w+)`[^\n]*\n(?:[^|\n][^\n]*\n)*\n?"
                             r"\| field \| type \| meaning \|\n\|---\|---\|---\|\n((?:\|[^\n]*\n)+)", text):
        found[match.group(1)] = re.findall(r"^\| `(\w+)` \|", match.group(2), re.M)
    return found


@pytest.mark.parametrize("struct", [fencepost.Observed, fencepost.Missing, ConsensusFact])
def test_the_guide_lists_every_field_of_each_update_type(struct: type[msgspec.Struct]) -> None:
    tables = _tables(GUIDE.read_text())
    assert tables.get(struct.__name__) == list(struct.__struct_fields__)


class _Poisoned:
    """A runs projection whose apply raises on a chosen run after writing its row."""

    def __init__(self) -> None:
        from sqlalchemy import BigInteger, Column, MetaData, Table, Text

        self.table = Table("guide_poisoned", MetaData(), Column("run_id", Text, primary_key=True),
                           Column("revision", BigInteger, nullable=False))
        self.name, self.feed, self.tables = "guide_poisoned", "runs", (self.table,)
        self.poison: str | None = None

    def reset(self, target) -> None:
        from sqlalchemy import delete

        target.conn.execute(delete(target.table("guide_poisoned")))

    def apply(self, target, update) -> None:
        from sqlalchemy import delete

        table = target.table("guide_poisoned")
        if isinstance(update, fencepost.Missing):
            target.conn.execute(delete(table).where(table.c.run_id == update.run_id))
            return
        row = {"run_id": update.run_id, "revision": update.revision}
        target.conn.execute(target.insert(table).values(**row).on_conflict_do_update(
            index_elements=[table.c.run_id], set_={"revision": update.revision}))
        if update.run_id == self.poison:
            raise ValueError("the projection cannot handle this run")


def test_when_apply_raises_as_the_guide_says(store) -> None:
    """The guide's "When apply raises": the failing page leaves nothing, earlier pages stay, a
    fixed projection continues; a failed rebuild keeps the live rows and the next catch_up ends it."""
    from sqlalchemy import func, select

    from fencepost.projections import ProjectionBuilder

    for i in range(25):
        store.runs.create(f"r{i:02d}", "{}")
    projection = _Poisoned()
    projection.poison = "r15"

    def count(builder) -> int:
        return builder.target.read(lambda c: c.execute(select(func.count()).select_from(projection.table)).scalar())

    with ProjectionBuilder(store, store.url, projection, batch_size=10) as builder:
        with pytest.raises(ValueError):
            builder.catch_up()
        assert count(builder) == 10 and builder.status().applied_revision == 10
        projection.poison = None
        assert builder.catch_up().applied == 15 and count(builder) == 25
        projection.poison = "r05"
        with pytest.raises(ValueError):
            builder.rebuild()
        assert count(builder) == 25 and builder.status().pending_rebuild is not None
        projection.poison = None
        result = builder.catch_up()
        assert result.rebuilt and count(builder) == 25 and builder.status().pending_rebuild is None
        assert builder.status().lag == 0
