"""``fencepost init`` and ``fencepost runs list|show|cancel|create|retry|delete``."""

from __future__ import annotations

from typing import Any

import click
import msgspec

from fencepost.cli._common import (
    CliContext,
    console,
    json_option,
    owner_text,
    print_json,
    read_store,
    table,
    when,
    write_store,
)

STATUSES = ("pending", "running", "suspended", "completed", "failed", "cancelled")
RUN_DECISION = "flows.engine.run-decision"


class RunWarning(msgspec.Struct, frozen=True):
    """A journaled warning about a run: ``lease-reconfirmed`` after ``unconfirmed_ms`` without a pulse."""

    code: str
    unconfirmed_ms: int
    occurred_at_ms: int
    seq: int


class RunDetail(msgspec.Struct, frozen=True):
    """What ``runs show`` reports: the row and its warnings (the run keeps its recorded status)."""

    run: Any
    warnings: list[RunWarning]


@click.command()
@click.pass_obj
def init(obj: CliContext) -> None:
    """Create the database (if needed) and apply every migration; say which of the three it did.

    Prints "created" (a new store, every migration applied), "migrated" (the migrations it applied
    to an existing store) or "current" (nothing to do). A database newer than this version of
    fencepost is refused. To apply the SQL by hand instead, see fencepost migrations sql.

    Example: fencepost --db sqlite:///.flows/flows.db init
    """
    from fencepost._durable import redact_url
    from fencepost._migrations import STORE_NAMESPACES, discover

    store = write_store()
    done = store.migrations_applied
    where = redact_url(obj.resolved_url)
    everything = [m.id for m in discover(store.db.backend.migration_suffix, STORE_NAMESPACES)]
    if not done:
        click.echo(f"current: {where} (no migration to apply)")
    elif list(done) == everything:
        click.echo(f"created {where} ({len(done)} migrations applied)")
    else:
        click.echo(f"migrated {where}: applied {len(done)} migration(s): {', '.join(str(i) for i in done)}")


@click.group()
def runs() -> None:
    """List, inspect, create, retry, cancel and delete runs."""


def list_rows(store: Any, statuses: tuple[str, ...], limit: int) -> list[Any]:
    """Run rows in creation order, up to ``limit``, optionally only some statuses.

    The listing filters one status at a time, so several statuses are listed separately and merged
    on the listing's own key ``(created_at_ms, run_id)``.
    """
    found: list[Any] = []
    for status in statuses or (None,):
        found += _listed(store, {"status": status} if status else None, limit)
    found.sort(key=lambda r: (r.created_at_ms, r.run_id))
    return _rows(store, [r.run_id for r in found[:limit]])


def _listed(store: Any, filters: dict[str, Any] | None, limit: int) -> list[Any]:
    out: list[Any] = []
    cursor = None
    while len(out) < limit:
        page = store.feed.list_runs(filters, cursor, min(200, limit - len(out)))
        out.extend(page.runs)
        cursor = page.cursor
        if cursor is None:
            break
    return out


def _rows(store: Any, run_ids: list[str]) -> list[Any]:
    from fencepost.errors import RunStoreError

    rows = []
    for run_id in run_ids:
        try:
            rows.append(store.runs.get(run_id))
        except RunStoreError as exc:
            if exc.code != "not_found_row":  # deleted between the page and the read
                raise
    return rows


@runs.command("list")
@click.option("--status", "statuses", multiple=True, type=click.Choice(STATUSES),
              help="Only runs in this status (repeatable).")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 100_000),
              help="At most this many runs.")
@json_option
def runs_list(statuses: tuple[str, ...], limit: int, as_json: bool) -> None:
    """List runs in creation order.

    With --json, prints a JSON array of run objects with the RunRow field names.

    Example: fencepost runs list --status running --json
    """
    store = read_store()
    rows = list_rows(store, statuses, limit)
    if as_json:
        print_json(rows)
        return
    table(f"{len(rows)} run(s)", ["run_id", "status", "owner", "heartbeat", "cancel", "created"],
          [(r.run_id, r.status, owner_text(r.owner), when(r.heartbeat_at_ms),
            "requested" if r.cancel_requested_at_ms is not None else "-", when(r.created_at_ms)) for r in rows])


def reconfirm_warnings(store: Any, run_id: str) -> list[RunWarning]:
    """One warning per ``lease-reconfirmed`` run decision journaled on the run's own stream."""
    warnings: list[RunWarning] = []
    after = None
    while True:
        page = store.journal.entries(run_id, after=after, event_types=[RUN_DECISION], limit=1000)
        for e in page.entries:
            payload = e.payload if isinstance(e.payload, dict) else {}
            detail = payload.get("detail") if isinstance(payload.get("detail"), dict) else {}
            ms = detail.get("unconfirmedMs")
            if payload.get("decision") == "lease-reconfirmed" and type(ms) is int and ms >= 0:
                warnings.append(RunWarning("lease-reconfirmed", ms, e.emitted_at_ms, e.seq))
        if not page.has_more or not page.entries:
            return warnings
        after = page.entries[-1].seq


@runs.command("show")
@click.argument("run_id")
@json_option
def runs_show(run_id: str, as_json: bool) -> None:
    """Show one run: its row, and a warning for every lease-reconfirmed decision.

    A reconfirmed run keeps its recorded status: the warning says its owner worked for a while
    without a confirmed heartbeat, then proved it still held the lease.

    Example: fencepost runs show demo-0001
    """
    store = read_store()
    detail = RunDetail(store.runs.get(run_id), reconfirm_warnings(store, run_id))
    if as_json:
        print_json(detail)
        return
    r = detail.run
    table(f"run {r.run_id}", ["field", "value"], [
        ("status", r.status),
        ("state_json", r.state_json if len(r.state_json) <= 200 else r.state_json[:200] + "..."),
        ("created", when(r.created_at_ms)),
        ("started", when(r.started_at_ms)),
        ("finished", when(r.finished_at_ms)),
        ("heartbeat", when(r.heartbeat_at_ms)),
        ("owner", owner_text(r.owner)),
        ("claimant", owner_text(r.claimant)),
        ("claimed", when(r.claimed_at_ms)),
        ("cancel requested", when(r.cancel_requested_at_ms)),
        ("cancel acknowledged", "yes" if r.cancel_acknowledgement else "-"),
        ("parent", r.parent_run_id),
        ("lineage / round", f"{r.lineage_id or '-'} / {r.round_ordinal if r.round_ordinal is not None else '-'}"),
    ])
    if r.failure is not None:
        show_failure(r.failure)
    for w in detail.warnings:
        console.print(f"[yellow]warning[/yellow] lease-reconfirmed: owner ran {w.unconfirmed_ms} ms unconfirmed "
                      f"(journal seq {w.seq}, {when(w.occurred_at_ms)})")


def show_failure(failure: Any) -> None:
    """Print why a run failed: the exception type and message, then its recorded traceback."""
    click.echo(f"failed with {failure.type}: {failure.message}")
    click.echo(failure.traceback.rstrip("\n"))


@runs.command("cancel")
@click.argument("run_id")
@json_option
def runs_cancel(run_id: str, as_json: bool) -> None:
    """Request cancellation of a run (its owner acknowledges and settles it as cancelled).

    A running run becomes cancelled when its function next calls check() or checkpoint() (within a
    heartbeat interval it is acknowledged). A pending or suspended run has no owner: it stays
    pending, with the request recorded, until a worker next claims it, and that worker settles it
    cancelled at once without calling the function.

    Exits 0 when the request is recorded or already was; 1 when the run is unknown or already settled.

    Example: fencepost runs cancel demo-0007
    """
    from fencepost.runstore.outcomes import AlreadyRequested, CancelRequested

    store = write_store(create=False)
    outcome = store.runs.request_cancel(run_id, store.clock.now_ms())
    if as_json:
        print_json(outcome)
    else:
        click.echo(f"{run_id}: {type(outcome).__name__}"
                   + (f" ({outcome.status})" if hasattr(outcome, "status") else ""))
    if not isinstance(outcome, CancelRequested | AlreadyRequested):
        raise SystemExit(1)


# --------------------------------------------------------------------------- operator commands
def _parse_ndjson(stream: Any) -> list[tuple[str, str]]:
    """``{"run_id": ..., "state": <JSON>}`` per line (blank lines skipped); errors name the line."""
    pairs: list[tuple[str, str]] = []
    for n, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            doc = msgspec.json.decode(line)
        except msgspec.DecodeError:
            raise click.ClickException(f"stdin line {n}: not valid JSON") from None
        if type(doc) is not dict or type(doc.get("run_id")) is not str:
            raise click.ClickException(f'stdin line {n}: expected an object with a string "run_id"')
        extra = set(doc) - {"run_id", "state"}
        if extra:
            raise click.ClickException(f"stdin line {n}: unknown field(s) {', '.join(sorted(extra))}")
        pairs.append((doc["run_id"], msgspec.json.encode(doc.get("state", {})).decode()))
    return pairs


@runs.command("create")
@click.argument("run_id")
@click.option("--state", "state_json", default="{}", show_default=True, metavar="JSON",
              help="The run's initial state, stored byte for byte.")
@json_option
def runs_create(run_id: str, state_json: str, as_json: bool) -> None:
    """Create a pending run (a worker then claims and runs it).

    RUN_ID "-" reads NDJSON from stdin instead, one run per line:
    {"run_id": "...", "state": {...}}. All of them are created in one transaction, or none (a
    bad line or an id that already exists changes nothing). The database must exist (fencepost init).

    Example: fencepost runs create order-17 --state '{"step": 0}'
    """
    store = write_store(create=False)
    if run_id == "-":
        pairs = _parse_ndjson(click.get_text_stream("stdin"))
        created = store.runs.create_many(pairs)
        if as_json:
            print_json({"created": [rid for rid, _ in pairs]})
        else:
            click.echo(f"created {created} run(s)")
        return
    store.runs.create(run_id, state_json)
    if as_json:
        print_json(store.runs.get(run_id))
    else:
        click.echo(f"created {run_id}")


@runs.command("retry")
@click.argument("run_id")
@click.option("--new-id", "new_run_id", default=None, metavar="ID",
              help="The new round's run id. Default: <lineage>.retry-<round>.")
@json_option
def runs_retry(run_id: str, new_run_id: str | None, as_json: bool) -> None:
    """Start a new round of a settled run's lineage from its last checkpoint.

    The new run is pending, with the state the lineage's latest round ended with, and joins the
    lineage (fencepost runs show prints lineage / round). Refused while the latest round is still
    live, or while any round of the lineage has a cancellation request. Journaled on the lineage's
    stream as flows.run-store.retried.

    Example: fencepost runs retry order-17
    """
    store = write_store(create=False)
    row = store.runs.retry(run_id, new_run_id=new_run_id)
    if as_json:
        print_json(row)
    else:
        click.echo(f"created {row.run_id}: round {row.round_ordinal} of lineage {row.lineage_id}, "
                   f"pending, from the last state of {row.parent_run_id}")


@runs.command("delete")
@click.argument("run_id")
@click.option("--force", is_flag=True,
              help="Also delete a running or claimed run, releasing its lease in the same transaction.")
@json_option
def runs_delete(run_id: str, force: bool, as_json: bool) -> None:
    """Delete a run and its step attempts.

    Change-feed readers (fencepost feed tail, projections) see the deletion. The journal is
    append-only and keeps the run's history. A running or claimed run is refused unless --force;
    a run other runs name as their parent is refused.

    Example: fencepost runs delete order-17
    """
    store = write_store(create=False)
    store.runs.delete(run_id, force=force)
    if as_json:
        print_json({"deleted": run_id, "forced": force})
    else:
        click.echo(f"deleted {run_id}")
