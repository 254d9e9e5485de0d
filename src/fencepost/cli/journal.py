"""``fencepost journal show|replay|verify``."""

from __future__ import annotations

from typing import Any

import click

from fencepost.cli._common import fail, owner_text, read_store, when
from fencepost.cli._output import Column, Output, output_options, to_data

ENTRY_COLUMNS = [
    Column("seq", "seq", wrap=False),
    Column("position", "position", wrap=False),
    Column("emitted", "emitted_at_ms", lambda r: when(r.get("emitted_at_ms")), wrap=False),
    Column("event_type", "event_type", wrap=False),
    Column("payload", "payload", lambda r: _short(r.get("payload"))),
]


@click.group()
def journal() -> None:
    """Read, replay and verify the journal."""


@journal.command("show")
@click.argument("run_id")
@click.option("--companion", is_flag=True,
              help="Show the run's ownership facts (its run-store companion stream) instead of its own stream.")
@click.option("--after", type=click.IntRange(-1), default=None, help="Only entries with seq greater than this.")
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1, 1000), help="At most this many.")
@output_options
def journal_show(run_id: str, companion: bool, after: int | None, limit: int, out: Output) -> None:
    """Show the entries of a run's journal stream in sequence order.

    An entry's payload and meta are shown exactly as they were recorded (the hash chain covers
    them). With --format json, prints the page {"entries": [...], "has_more": ...}; jsonl and csv
    print the entries alone.

    Example: fencepost journal show demo-0001 --companion
    """
    from fencepost.journal import companion_stream

    store = read_store()
    stream = companion_stream(run_id) if companion else run_id
    page = store.journal.entries(stream, after=after, limit=limit)
    entries = to_data(page.entries)
    more = [f"more entries follow: --after {page.entries[-1].seq}"] if page.has_more and page.entries else []
    out.rows(entries, ENTRY_COLUMNS, footer=more, document=to_data(page),
             title=f"{'companion stream of ' if companion else 'stream '}{run_id}: {len(entries)} entr(ies)")


def _short(payload: Any) -> str:
    import msgspec

    text = msgspec.json.encode(payload).decode()
    return text if len(text) <= 160 else text[:160] + "..."


@journal.command("replay")
@click.argument("run_id")
@output_options
def journal_replay(run_id: str, out: Output) -> None:
    """Rebuild a run's ownership history from its consensus facts alone and check it.

    Checks: never two owners at once, every activation preceded by its claim, nothing after a
    terminal release. Exits 1 when the history breaks an invariant.

    Example: fencepost journal replay demo-0001
    """
    from fencepost.journal import ownership_history

    store = read_store()
    history = ownership_history(store, run_id)
    if out.is_table:
        out.rows([to_data(i) | {"owner_text": owner_text(i.owner)} for i in history.intervals], INTERVAL_COLUMNS,
                 title=f"ownership of {run_id} ({history.facts} fact(s))",
                 footer=[f"violation {v.rule} at seq {v.seq} ({v.event_type}): {v.detail}"
                         for v in history.violations] or ["ownership history is consistent"])
    elif out.format == "csv":
        out.rows(to_data(history.intervals), INTERVAL_COLUMNS)
    else:
        out.record(to_data(history))
    if history.violations:
        raise fail(f"the ownership history breaks {len(history.violations)} invariant(s)")


INTERVAL_COLUMNS = [
    Column("owner", "owner_text", wrap=False),
    Column("granted", "granted_at_ms", wrap=False),
    Column("from seq", "start_seq", wrap=False),
    Column("started", "started_at_ms", lambda r: when(r.get("started_at_ms")), wrap=False),
    Column("to seq", "end_seq", wrap=False),
    Column("ended", "ended_at_ms", lambda r: when(r.get("ended_at_ms")), wrap=False),
    Column("ended by", "ended_by"),
]


def _fields(struct: Any) -> tuple[str, ...]:
    return tuple(getattr(struct, "__struct_fields__", ()))


@journal.command("verify")
@output_options
def journal_verify(out: Output) -> None:
    """Verify every stream's hash chain and the global position sequence.

    Exits 1 when an entry was edited, removed or reordered.

    Example: fencepost journal verify
    """
    from fencepost.journal import verify

    store = read_store()
    report = verify(store)
    b = report.first_break
    where = f" first at stream {b.stream} seq {b.seq} (position {b.position}): {b.what}, {b.detail}" if b else ""
    if not out.is_table:
        out.record(to_data(report))
    elif report.ok:
        out.message(f"journal verified: {report.entries_checked} entries in "
                    f"{report.streams_checked} streams, chains intact")
    else:
        out.message(f"journal broken: {report.breaks} break(s);{where}")
    if not report.ok:
        raise fail(f"the journal is broken: {report.breaks} break(s)")
