"""``projection status --name NAME`` for a projection built with the library (not a built-in one):
found among the projections checkpointed on the target and shown as ``builder.status()`` reports
it, in every output format; ``--all`` lists every checkpointed projection of the target."""

from __future__ import annotations

import csv
import io
import json
import sqlite3

import msgspec
import pytest
from sqlalchemy import Column, MetaData, Table, Text, create_engine, delete, text
from sqlalchemy.pool import NullPool

import fencepost
from fencepost import Missing, OwnerId
from fencepost.projections import ConsensusFact, ProjectionBuilder, RunsByStatus, Target
from tests.cli.conftest import assert_one_line_error
from tests.conftest import require_postgres, store_exists

pytestmark = pytest.mark.cli_in_process

_md = MetaData()
_seen = Table("seen_runs", _md, Column("run_id", Text, primary_key=True), Column("status", Text, nullable=False))
_facts = Table("fact_kinds", _md, Column("run_id", Text, primary_key=True), Column("kind", Text, nullable=False))


class SeenRuns:
    """A custom runs projection whose name has a dash (never read as ``seen_runs``)."""

    name = "seen-runs"
    feed = "runs"
    tables = (_seen,)

    def reset(self, target: Target) -> None:
        target.conn.execute(delete(target.table("seen_runs")))

    def apply(self, target: Target, update) -> None:
        table = target.table("seen_runs")
        if isinstance(update, Missing):
            target.conn.execute(delete(table).where(table.c.run_id == update.run_id))
            return
        upsert = target.insert(table).values(run_id=update.run_id, status=update.status)
        target.conn.execute(upsert.on_conflict_do_update(index_elements=[table.c.run_id],
                                                         set_={"status": update.status}))


class LastFact:
    """A custom consensus projection."""

    name = "Last Fact"
    feed = "consensus"
    tables = (_facts,)

    def reset(self, target: Target) -> None:
        target.conn.execute(delete(target.table("fact_kinds")))

    def apply(self, target: Target, fact: ConsensusFact) -> None:
        table = target.table("fact_kinds")
        upsert = target.insert(table).values(run_id=fact.run_id, kind=fact.kind)
        target.conn.execute(upsert.on_conflict_do_update(index_elements=[table.c.run_id], set_={"kind": fact.kind}))


def _json(value) -> object:
    return json.loads(msgspec.json.encode(value))


def _build(store_url: str, target: str) -> dict[str, dict]:
    """Runs r1..r3 (r1 owned), seen-runs caught up then rebuilt, Last Fact and runs_by_status caught up,
    then r4 created (a lag of one for the runs projections). Each projection's ``builder.status()``
    as JSON, by name."""
    with fencepost.open(store_url) as store:
        for run_id in ("r1", "r2", "r3"):
            store.runs.create(run_id, "{}")
        store.runs.claim_and_own("r1", store.runs.get("r1"), OwnerId("h", 1, "n"), store.clock.now_ms())
        builders = [ProjectionBuilder(store, target, p) for p in (SeenRuns(), LastFact(), RunsByStatus())]
        try:
            for builder in builders:
                builder.catch_up()
            builders[0].rebuild()
            store.runs.create("r4", "{}")
            return {b.name: _json(b.status()) for b in builders}
        finally:
            for builder in builders:
                builder.close()


def _tables(url: str) -> set[str]:
    if url.startswith("sqlite:"):
        with sqlite3.connect(url[len("sqlite:///"):]) as conn:
            return {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    schema = url.rsplit("schema=", 1)[1]
    engine = create_engine(require_postgres(), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = :s"), {"s": schema})
            return {r[0] for r in rows}
    finally:
        engine.dispose()


@pytest.mark.parametrize("where", ["store", "target"])
def test_status_of_a_custom_projection_is_the_builders_in_every_format(run_cli, db_url, make_db_url, where):
    target = db_url if where == "store" else make_db_url()
    expected = _build(db_url, target)
    where_args = [] if where == "store" else ["--target", target]
    for name in ("seen-runs", "Last Fact"):
        args = ["--db", db_url, "projection", "status", "--name", name, *where_args]
        shown = run_cli(*args, "--json")
        assert shown.code == 0, shown
        assert json.loads(shown.out) == expected[name]
        jsonl = run_cli(*args, "--format", "jsonl")
        assert [json.loads(line) for line in jsonl.out.splitlines()] == [expected[name]], jsonl
        rows = list(csv.DictReader(io.StringIO(run_cli(*args, "--format", "csv").out)))
        assert len(rows) == 1 and rows[0]["name"] == name and rows[0]["lag"] == str(expected[name]["lag"]), rows
        table = run_cli(*args)
        assert table.code == 0, table
        assert table.out.splitlines()[0].split() == ["field", "value"], table
        fields = {line.split(None, 1)[0]: line.split(None, 1)[1].strip() for line in table.out.splitlines()[1:]}
        assert fields["name"] == name and fields["feed"] == expected[name]["feed"], table
        assert fields["lag"] == str(expected[name]["lag"]) and fields["rebuilds"] == str(expected[name]["rebuilds"])
    assert expected["seen-runs"]["lag"] == 1 and expected["seen-runs"]["rebuilds"] == 1
    assert expected["seen-runs"]["last_rebuild"] is not None
    assert expected["Last Fact"]["feed"] == "consensus"
    # A built-in name behaves as it always did (dashes or underscores, any case).
    builtin = run_cli("--db", db_url, "projection", "status", "--name", "Runs-By-Status", *where_args, "--json")
    assert json.loads(builtin.out) == expected["runs_by_status"], builtin


def test_status_all_lists_every_checkpointed_projection_of_the_target(run_cli, db_url, make_db_url):
    target = make_db_url()
    expected = _build(db_url, target)
    args = ["--db", db_url, "projection", "status", "--all", "--target", target]
    shown = run_cli(*args, "--json")
    assert shown.code == 0, shown
    assert json.loads(shown.out) == [expected[n] for n in ("Last Fact", "runs_by_status", "seen-runs")]
    jsonl = run_cli(*args, "--format", "jsonl")
    assert [json.loads(line)["name"] for line in jsonl.out.splitlines()] == ["Last Fact", "runs_by_status",
                                                                               "seen-runs"]
    rows = list(csv.DictReader(io.StringIO(run_cli(*args, "--format", "csv").out)))
    assert [(r["name"], r["lag"]) for r in rows] == [(n, str(expected[n]["lag"]))
                                                     for n in ("Last Fact", "runs_by_status", "seen-runs")]
    table = run_cli(*args).out.splitlines()
    assert table[0].split()[:3] == ["name", "feed", "source"], table
    assert [line.split("  ")[0] for line in table[1:]] == ["Last Fact", "runs_by_status", "seen-runs"], table
    # The store's own database holds none of them.
    empty = run_cli("--db", db_url, "projection", "status", "--all", "--json")
    assert (empty.code, json.loads(empty.out)) == (0, []), empty
    both = run_cli("--db", db_url, "projection", "status", "--all", "--name", "seen-runs")
    assert both.code == 2 and "--all" in both.err, both
    assert_one_line_error(both)


def test_a_name_with_no_checkpoint_on_the_target_is_an_error_naming_what_it_has(run_cli, db_url, make_db_url):
    target = make_db_url()
    _build(db_url, target)
    before, before_store = _tables(target), _tables(db_url)
    for name in ("seen_runs", "nope"):  # a custom name is matched exactly: no dash for an underscore
        for fmt in ("table", "json"):
            result = run_cli("--db", db_url, "projection", "status", "--name", name, "--target", target,
                             "--format", fmt)
            assert_one_line_error(result)
            assert result.code == 1 and result.out == "", result
            assert result.err.startswith("Error: ") and f"no projection {name} " in result.err, result.err
            assert "Last Fact, runs_by_status, seen-runs" in result.err, result.err
    # The store's own database has no projection at all.
    result = run_cli("--db", db_url, "projection", "status", "--name", "seen-runs")
    assert_one_line_error(result)
    assert result.code == 1 and "has none" in result.err, result.err
    assert _tables(target) == before and _tables(db_url) == before_store


def test_a_custom_name_on_a_target_that_does_not_exist_creates_nothing(run_cli, db_url, make_db_url):
    with fencepost.open(db_url) as store:
        store.runs.create("r1", "{}")
    target = make_db_url()
    for args in (["--name", "seen-runs"], ["--all"]):
        result = run_cli("--db", db_url, "projection", "status", *args, "--target", target)
        assert_one_line_error(result)
        assert result.code == 1 and "database_missing" in result.err, result
    assert not store_exists(target)


def test_run_and_rebuild_still_take_only_built_in_names(run_cli, db_url, make_db_url):
    target = make_db_url()
    _build(db_url, target)
    for command in ("run", "rebuild"):
        result = run_cli("--db", db_url, "projection", command, "--name", "seen-runs", "--target", target)
        assert_one_line_error(result)
        assert result.code == 2 and "runs_by_status, ownership_history" in result.err, result


def test_all_with_several_stores_is_a_usage_error_and_a_one_store_name_is_said_to_be_one(run_cli, make_db_url):
    """``--all`` lists the projections of one store; ``--name`` of a projection fed by one store,
    given several stores, says it is fed by one (exit 1). (``--name`` of a custom projection with
    several stores was a usage error; it now shows a projection fed by several stores.)"""
    one, two, target = make_db_url(), make_db_url(), make_db_url()
    _build(one, target)
    with fencepost.open(two) as store:
        store.runs.create("b1", "{}")
    before = _tables(target)
    for db in (["--db", f"a={one}", "--db", f"b={two}"], ["--db", f"a={one}"], ["--db", one, "--db", two]):
        result = run_cli(*db, "projection", "status", "--all", "--target", target)
        assert_one_line_error(result)
        assert result.code == 2 and "one store" in result.err, result
        result = run_cli(*db, "projection", "status", "--name", "seen-runs", "--target", target)
        assert_one_line_error(result)
        assert result.code == 1 and "is fed by one store" in result.err, result
    assert _tables(target) == before
