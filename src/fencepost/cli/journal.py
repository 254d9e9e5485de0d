"""``fencepost journal show|replay|verify``."""

from __future__ import annotations

from typing import Any

import click

from fencepost.cli._common import console, fmt, json_option, owner_text, print_json, read_store, table, when


@click.group()
def journal() -> None:
    """Read, replay and verify the journal."""


@journal.command("show")
@click.argument("run_id")
@click.option("--companion", is_flag=True,
              help="Show the run's ownership facts (its run-store companion stream) instead of its own stream.")
@click.option("--after", type=click.IntRange(-1), default=None, help="Only entries with seq greater than this.")
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1, 1000), help="At most this many.")
@json_option
def journal_show(run_id: str, companion: bool, after: int | None, limit: int, as_json: bool) -> None:
    """Show the entries of a run's journal stream in sequence order.

    Example: fencepost journal show demo-0001 --companion
    """
    from fencepost.journal import companion_stream

    store = read_store()
    stream = companion_stream(run_id) if companion else run_id
    page = store.journal.entries(stream, after=after, limit=limit)
    if as_json:
        print_json(page)
        return
    table(f"{'companion stream of ' if companion else 'stream '}{run_id}: {len(page.entries)} entr(ies)"
          + (" (more)" if page.has_more else ""),
          ["seq", "position", "emitted", "event_type", "payload"],
          [(e.seq, e.position, when(e.emitted_at_ms), e.event_type, fmt(_short(e.payload))) for e in page.entries])


def _short(payload: Any) -> Any:
    import msgspec

    text = msgspec.json.encode(payload).decode()
    return text if len(text) <= 160 else text[:160] + "..."


@journal.command("replay")
@click.argument("run_id")
@json_option
def journal_replay(run_id: str, as_json: bool) -> None:
    """Rebuild a run's ownership history from its consensus facts alone and check it.

    Checks: never two owners at once, every activation preceded by its claim, nothing after a
    terminal release. Exits 1 when the history breaks an invariant.

    Example: fencepost journal replay demo-0001
    """
    from fencepost.journal import ownership_history

    store = read_store()
    history = ownership_history(store, run_id)
    if as_json:
        print_json(history)
    else:
        table(f"ownership of {run_id} ({history.facts} fact(s))",
              ["owner", "granted", "from seq", "started", "to seq", "ended", "ended by"],
              [(owner_text(i.owner), i.granted_at_ms, i.start_seq, when(i.started_at_ms), i.end_seq,
                when(i.ended_at_ms), i.ended_by) for i in history.intervals])
        for v in history.violations:
            console.print(f"[red]violation[/red] {v.rule} at seq {v.seq} ({v.event_type}): {v.detail}")
        if not history.violations:
            console.print("[green]ownership history is consistent[/green]")
    if history.violations:
        raise SystemExit(1)


def _fields(struct: Any) -> tuple[str, ...]:
    return tuple(getattr(struct, "__struct_fields__", ()))


@journal.command("verify")
@json_option
def journal_verify(as_json: bool) -> None:
    """Verify every stream's hash chain and the global position sequence.

    Exits 1 when an entry was edited, removed or reordered.

    Example: fencepost journal verify
    """
    from fencepost.journal import verify

    store = read_store()
    report = verify(store)
    if as_json:
        print_json(report)
    elif report.ok:
        console.print(f"[green]journal verified[/green]: {report.entries_checked} entries in "
                      f"{report.streams_checked} streams, chains intact")
    else:
        b = report.first_break
        where = f" first at stream {b.stream} seq {b.seq} (position {b.position}): {b.what}, {b.detail}" if b else ""
        console.print(f"[red]journal broken[/red]: {report.breaks} break(s);{where}")
    if not report.ok:
        raise SystemExit(1)
