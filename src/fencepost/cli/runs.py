"""``fencepost init`` and ``fencepost runs list|show|cancel``."""

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
    """Create the database (if needed) and apply every migration.

    Example: fencepost --db sqlite:///.flows/flows.db init
    """
    from fencepost._durable import redact_url

    write_store()
    click.echo(f"initialized {redact_url(obj.resolved_url)}")


@click.group()
def runs() -> None:
    """List, inspect and cancel runs."""


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
