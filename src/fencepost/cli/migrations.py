"""``fencepost migrations status|sql``: what the store's schema has, what it lacks, and the SQL for it."""

from __future__ import annotations

from typing import Any

import click

from fencepost.cli._common import CliContext
from fencepost.cli._output import Column, Output, output_options

MIGRATION_COLUMNS = [Column("id", "id", wrap=False), Column("name", "name", wrap=False),
                     Column("state", "state", wrap=False)]


@click.group()
def migrations() -> None:
    """Show applied and pending schema migrations, or print their SQL for a DBA."""


def _ledger(url: str | None) -> tuple[Any, dict[int, str], list[Any]]:
    """The database (read-only), its migration ledger and what the applied migrations created that
    it lacks (``_migrations.damage``); a missing database has an empty ledger."""
    from fencepost._durable import Database, DbFailure, resolve_url
    from fencepost._migrations import read_state
    from fencepost.errors import DatabaseMissing

    try:
        db = Database(resolve_url(url), readonly=True)
    except DatabaseMissing:
        return _Missing(resolve_url(url)), {}, []
    try:
        def read() -> tuple[dict[int, str], list[Any]]:
            db.probe()  # a server that cannot be reached says why, as the store's open does
            try:
                return db.read(lambda conn: read_state(conn, db))
            except DbFailure as exc:  # not a database, corrupt, no permission ...: the open's diagnosis
                raise db.open_error(exc) from None

        # Only the ledger and the catalog are read: a SQLite file is left as it was (see ``Database.vetted``).
        ledger, missing = db.vetted(read)
        return db, ledger, missing
    except BaseException:
        db.dispose()
        raise


_PROJECTIONS_HELP = ("Only the projection builder's migrations (3001 ...): for a projection target in a "
                     "database of its own that the builder has not prepared yet.")


def _namespaces(projections: bool) -> tuple[str, ...] | None:
    from fencepost._migrations import PROJECTIONS

    return PROJECTIONS if projections else None


class _Missing:
    """Stands in for a database file that does not exist yet: its backend, never a connection."""

    def __init__(self, url: str) -> None:
        from fencepost._dialects import SqliteBackend

        self.url = url
        self.backend = SqliteBackend()

    def dispose(self) -> None:
        """Nothing to release."""


@migrations.command("status")
@click.option("--projections", is_flag=True, help=_PROJECTIONS_HELP)
@output_options
@click.pass_obj
def migrations_status(obj: CliContext, out: Output, projections: bool) -> None:
    """List every migration of this version: applied, pending, unknown, mismatch or altered.

    The store's migrations, and the projection builder's (3001 ...) once the database records any
    (it is also a projection target); a database that records the builder's alone is a projection
    target of its own, listed with those only. unknown: recorded by a newer version of fencepost;
    mismatch: recorded under another name than this version gives it (another build migrated the
    database, or its ledger was edited); altered: applied, but a trigger or column it created is
    missing or disabled (changed by hand; fencepost refuses to open the store). Never creates or
    changes the database. Exits 1 when any migration is unknown, a mismatch or altered.

    Example: fencepost migrations status
    """
    from fencepost._migrations import BLOCKS, damage_phrase, status

    db, ledger, missing = _ledger(obj.url)
    try:
        rows = status(db, ledger, _namespaces(projections), altered=frozenset(x.by for x in missing))
    finally:
        db.dispose()
    states = ("applied", "pending", "unknown", "mismatch", "altered")
    count = {state: sum(r.state == state for r in rows) for state in states}
    summary = (f"{count['applied']} applied, {count['pending']} pending"
               + (f", {count['unknown']} unknown (the database is newer than this fencepost)"
                  if count["unknown"] else "")
               + (f", {count['mismatch']} recorded under another name (fencepost init refuses the database)"
                  if count["mismatch"] else "")
               + (f", {count['altered']} altered (fencepost refuses to open the store)" if count["altered"] else ""))
    footer = [summary]
    if missing:
        footer.append(f"missing: {damage_phrase(missing)}")
    start = BLOCKS["projections"]
    if any(r.state == "pending" and start < r.id < start + 1000 for r in rows):
        footer.append("the projection builder's migrations (3001 ...) are applied by the next projection builder "
                      "on this database, not by fencepost init (or by hand: fencepost migrations sql)")
    out.rows([{"id": r.id, "name": r.name, "state": r.state} for r in rows], MIGRATION_COLUMNS,
             footer=footer)
    if count["unknown"] or count["mismatch"] or count["altered"]:
        raise SystemExit(1)


@migrations.command("sql")
@click.option("--projections", is_flag=True, help=_PROJECTIONS_HELP)
@output_options
@click.pass_obj
def migrations_sql(obj: CliContext, out: Output, projections: bool) -> None:
    """Print the SQL that applies the pending migrations, for the URL's backend, ledger rows included.

    For a DBA who applies schema changes by hand: run the script in one transaction (the
    PostgreSQL script begins and commits its own, and sets search_path for it alone, so the
    session keeps its own), then fencepost init reports the store current. Never creates or
    changes the database; a database that does not exist yet gets the whole schema. A database
    that is newer than this version, or records a migration under another name, is refused
    (exit 1), as init refuses it. It covers the migrations migrations status lists: the projection
    builder's too once the database records any. With --json: {"backend", "pending", "sql"}.

    Example: fencepost --db postgresql://app@db/prod migrations sql > fencepost.sql
    """
    from fencepost._migrations import check_ledger, script, status

    db, ledger, _ = _ledger(obj.url)
    try:
        check_ledger(db, ledger)
        namespaces = _namespaces(projections)
        text = script(db, ledger, namespaces)
        if out.is_table:
            click.echo(text, nl=False)
        else:
            pending = [r.id for r in status(db, ledger, namespaces) if r.state == "pending"]
            out.record({"backend": db.backend.name, "pending": pending, "sql": text})
    finally:
        db.dispose()
