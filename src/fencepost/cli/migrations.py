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


def _ledger(url: str | None) -> tuple[Any, dict[int, str]]:
    """The database (read-only) and its migration ledger; a missing database has an empty ledger."""
    from fencepost._durable import Database, DbFailure, resolve_url
    from fencepost._migrations import applied
    from fencepost.errors import DatabaseMissing

    try:
        db = Database(resolve_url(url), readonly=True)
    except DatabaseMissing:
        return _Missing(resolve_url(url)), {}
    try:
        def read() -> dict[int, str]:
            db.probe()  # a server that cannot be reached says why, as the store's open does
            try:
                return applied(db)
            except DbFailure as exc:  # not a database, corrupt, no permission ...: the open's diagnosis
                raise db.open_error(exc) from None

        # Only the ledger is read: a SQLite file is left as it was (see ``Database.vetted``).
        return db, db.vetted(read)
    except BaseException:
        db.dispose()
        raise


class _Missing:
    """Stands in for a database file that does not exist yet: its backend, never a connection."""

    def __init__(self, url: str) -> None:
        from fencepost._dialects import SqliteBackend

        self.url = url
        self.backend = SqliteBackend()

    def dispose(self) -> None:
        """Nothing to release."""


@migrations.command("status")
@output_options
@click.pass_obj
def migrations_status(obj: CliContext, out: Output) -> None:
    """List every migration of this version: applied, pending, unknown or mismatch.

    unknown: recorded by a newer version of fencepost; mismatch: recorded under another name than
    this version gives it (another build migrated the database, or its ledger was edited). Never
    creates or changes the database. Exits 1 when any migration is unknown or a mismatch.

    Example: fencepost migrations status
    """
    from fencepost._migrations import status

    db, ledger = _ledger(obj.url)
    try:
        rows = status(db, ledger)
    finally:
        db.dispose()
    count = {state: sum(r.state == state for r in rows) for state in ("applied", "pending", "unknown", "mismatch")}
    summary = (f"{count['applied']} applied, {count['pending']} pending"
               + (f", {count['unknown']} unknown (the database is newer than this fencepost)"
                  if count["unknown"] else "")
               + (f", {count['mismatch']} recorded under another name (fencepost init refuses the database)"
                  if count["mismatch"] else ""))
    out.rows([{"id": r.id, "name": r.name, "state": r.state} for r in rows], MIGRATION_COLUMNS,
             footer=[summary])
    if count["unknown"] or count["mismatch"]:
        raise SystemExit(1)


@migrations.command("sql")
@output_options
@click.pass_obj
def migrations_sql(obj: CliContext, out: Output) -> None:
    """Print the SQL that applies the pending migrations, for the URL's backend, ledger rows included.

    For a DBA who applies schema changes by hand: run the script in one transaction (the
    PostgreSQL script begins and commits its own, and sets search_path for it alone, so the
    session keeps its own), then fencepost init reports the store current. Never creates or
    changes the database; a database that does not exist yet gets the whole schema. A database
    that is newer than this version, or records a migration under another name, is refused
    (exit 1), as init refuses it. With --json: {"backend", "pending", "sql"}.

    Example: fencepost --db postgresql://app@db/prod migrations sql > fencepost.sql
    """
    from fencepost._migrations import check_ledger, script, status

    db, ledger = _ledger(obj.url)
    try:
        check_ledger(db, ledger)
        text = script(db, ledger)
        if out.is_table:
            click.echo(text, nl=False)
        else:
            pending = [r.id for r in status(db, ledger) if r.state == "pending"]
            out.record({"backend": db.backend.name, "pending": pending, "sql": text})
    finally:
        db.dispose()
