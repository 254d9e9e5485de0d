"""Bad ``sources`` for a ``ProjectionBuilder``: one clear ``ProjectionError``, nothing written to the target.

The error has a code, names the field (``sources``, a position such as ``source #1``) and never a
value: neither the source name given nor a URL.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Column, MetaData, Table, Text, create_engine, text
from sqlalchemy.pool import NullPool

import fencepost
from fencepost._durable import Database
from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.conftest import require_postgres

SECRET = "s3cret-pa55"


@pytest.fixture
def stores(backend, make_db_url):
    opened = [fencepost.open(make_db_url()) for _ in range(2)]
    yield opened
    for store in opened:
        store.close()


@pytest.fixture
def untouched_target(backend, tmp_path):
    """A target URL that must still not exist after the refused construction."""
    if backend == "sqlite":
        path = tmp_path / f"never-{SECRET}.db"
        yield f"sqlite:///{path}"
        assert not path.exists()
        return
    base = require_postgres()
    schema = f"never_{uuid.uuid4().hex[:12]}"
    yield f"{base}?schema={schema}"
    engine = create_engine(base, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            found = conn.execute(text("SELECT 1 FROM information_schema.schemata WHERE schema_name = :s"),
                                 {"s": schema}).first()
        assert found is None
    finally:
        engine.dispose()


def _refused(sources, target: str, projection=None) -> ProjectionError:
    with pytest.raises(ProjectionError) as caught:
        ProjectionBuilder(sources, target, projection or RunsByStatus())
    err = caught.value
    assert SECRET not in str(err) and "://" not in str(err)
    return err


def test_an_empty_mapping_is_refused(untouched_target):
    err = _refused({}, untouched_target)
    assert (err.code, err.method, err.detail) == (
        "invalid_sources", "ProjectionBuilder", "sources: the mapping must name at least one store")


@pytest.mark.parametrize("bad", ["", "-edge", "edge 1", "x" * 65, "edge/1", "édge", f"{SECRET}!", 7, None, ("a",)],
                         ids=["empty", "leading-dash", "space", "too-long", "slash", "non-ascii", "bang", "int",
                              "none", "tuple"])
def test_a_bad_source_name_is_refused_by_position(bad, stores, untouched_target):
    err = _refused({"good": stores[0], bad: stores[1]}, untouched_target)
    assert err.code == "invalid_sources"
    assert err.detail == ("sources: source #1 name must be 1..64 characters of A-Z a-z 0-9 . _ -, "
                          "starting with a letter or digit")
    if isinstance(bad, str) and bad:
        assert bad not in str(err)


def test_the_same_store_twice_is_refused(stores, untouched_target):
    err = _refused({"a": stores[0], "b": stores[1], "c": stores[0]}, untouched_target)
    assert (err.code, err.detail) == ("invalid_sources", "sources: source #2 is the database of source #0 again")


def test_two_stores_opened_on_one_database_are_refused(backend, stores, untouched_target):
    """Another ``Store`` object on the same database (another spelling of the same SQLite path)."""
    url = stores[1].url
    if backend == "sqlite":
        path = stores[1].db.path
        url = f"sqlite:///{path.parent}/./{path.name}"
    again = fencepost.open(url)
    try:
        err = _refused({"a": stores[1], "b": stores[0], "c": again}, untouched_target)
        assert (err.code, err.detail) == ("invalid_sources", "sources: source #2 is the database of source #0 again")
    finally:
        again.close()


@pytest.mark.parametrize("kind", ["list", "url", "none", "value-url", "value-database", "value-none"])
def test_sources_of_the_wrong_type_are_refused(kind, stores, untouched_target):
    store = stores[0]
    database = Database(f"sqlite:///{store.db.path}") if store.db.path is not None else store.db
    sources = {
        "list": [stores[0], stores[1]],
        "url": f"sqlite:///{SECRET}.db",
        "none": None,
        "value-url": {"a": store, "b": f"sqlite:///{SECRET}.db"},
        "value-database": {"a": store, "b": database},
        "value-none": {"a": store, "b": None},
    }[kind]
    err = _refused(sources, untouched_target)
    assert err.code == "invalid_sources"
    if kind.startswith("value"):
        assert err.detail == "sources: source #1 must be a fencepost Store"
    else:
        assert err.detail == "sources: must be a Store or a mapping of source names to Stores"


def test_a_projection_that_cannot_be_keyed_by_source_is_refused(stores, untouched_target):
    class Plain:
        name = "plain"
        feed = "runs"
        tables = (Table("plain_rows", MetaData(), Column("run_id", Text, primary_key=True)),)

        def reset(self, target): ...

        def apply(self, target, update): ...

    err = _refused({"a": stores[0], "b": stores[1]}, untouched_target, Plain())
    assert (err.code, err.detail) == (
        "invalid_projection", "fed by several sources, every table needs a source_name column in its primary key")


def test_a_projection_keyed_by_source_needs_named_sources(stores, untouched_target):
    err = _refused(stores[0], untouched_target, RunsByStatus(by_source=True))
    assert (err.code, err.detail) == ("invalid_projection", "a projection keyed by source_name needs named sources")


def test_a_source_name_for_a_single_source_builder_is_refused(stores, untouched_target):
    with ProjectionBuilder(stores[0], untouched_target, RunsByStatus()) as builder:
        with pytest.raises(ProjectionError) as caught:
            builder.rebuild("edge-1")
        assert (caught.value.code, caught.value.detail) == (
            "invalid_sources", "source_name: this builder has one unnamed source")
        with pytest.raises(ProjectionError) as caught:
            builder.offer([], source_name="edge-1")
        assert caught.value.code == "invalid_sources"


def test_an_unknown_or_missing_source_name_is_refused_before_the_target_is_touched(stores, untouched_target):
    with ProjectionBuilder({"a": stores[0], "b": stores[1]}, untouched_target, RunsByStatus()) as builder:
        unknown = "source_name names no source of this builder"
        for call, detail in ((lambda: builder.rebuild(SECRET), unknown),
                             (lambda: builder.offer([]), "source_name is required with several sources"),
                             (lambda: builder.offer([], source_name="c"), unknown)):
            with pytest.raises(ProjectionError) as caught:
                call()
            assert (caught.value.code, caught.value.detail) == ("invalid_sources", detail)
            assert SECRET not in str(caught.value)
