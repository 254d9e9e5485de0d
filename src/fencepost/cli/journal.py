"""``fencepost journal show|replay|verify``."""

from __future__ import annotations

from typing import Any

import click

from fencepost.cli._common import console, fmt, json_option, print_json, read_store, table, when


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
    violations = list(getattr(history, "violations", []) or [])
    if as_json:
        print_json(history)
    else:
        intervals = list(getattr(history, "intervals", []) or [])
        table(f"ownership of {run_id}", [f for f in _fields(intervals[0])] if intervals else ["interval"],
              [[fmt(getattr(i, f)) for f in _fields(i)] for i in intervals])
        if violations:
            for v in violations:
                console.print(f"[red]violation[/red] {fmt(v)}")
        else:
            console.print("[green]ownership history is consistent[/green]")
    if violations:
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
    result = verify(store)
    ok = bool(getattr(result, "ok", False))
    if as_json:
        print_json(result)
    elif ok:
        console.print(f"[green]journal verified[/green]: {fmt(_summary(result))}")
    else:
        console.print(f"[red]journal broken[/red]: {fmt(_summary(result))}")
    if not ok:
        raise SystemExit(1)


def _summary(result: Any) -> str:
    parts = []
    for f in _fields(result):
        value = getattr(result, f)
        if isinstance(value, list):
            parts.append(f"{f}={len(value)}")
        else:
            parts.append(f"{f}={value}")
    return ", ".join(parts)
