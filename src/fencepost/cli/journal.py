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
@click.argument("run_id", required=False)
@click.option("--all", "every", is_flag=True, help="Replay every run that has ownership facts and summarise.")
@json_option
def journal_replay(run_id: str | None, every: bool, as_json: bool) -> None:
    """Rebuild a run's ownership history from its consensus facts alone and check it.

    Checks: never two owners at once, every activation preceded by its claim, every steal and
    expiry justified by the heartbeat and cutoff the store recorded, no release by a non-holder.
    With --all, every run with ownership facts is replayed and the summary counts runs, intervals
    and violations by rule. Exits 1 when any history breaks a rule, or when RUN_ID names neither a
    run nor any ownership facts.

    Example: fencepost journal replay demo-0001
    """
    if every == (run_id is not None):
        raise click.UsageError("give a RUN_ID or --all (not both)")
    store = read_store()
    if every:
        _replay_all(store, as_json)
        return
    from fencepost.journal import ownership_history

    assert run_id is not None
    history = ownership_history(store, run_id)
    if history.facts == 0 and not _run_exists(store, run_id):
        raise click.ClickException("journal replay: no run and no ownership facts with this run id")
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


def _run_exists(store: Any, run_id: str) -> bool:
    from fencepost.errors import RunStoreError

    try:
        store.runs.get(run_id)
    except RunStoreError as exc:
        if exc.code in ("not_found_row", "invalid_run"):
            return False
        raise
    return True


def _replay_all(store: Any, as_json: bool) -> None:
    from fencepost.journal.replay import replay_all

    summary = replay_all(store)
    if as_json:
        print_json({"ok": summary.ok, "runs": summary.runs, "intervals": summary.intervals,
                    "violations": summary.violations, "unattributed_streams": summary.unattributed_streams,
                    "histories": summary.histories})
    else:
        total = sum(summary.violations.values())
        console.print(f"{summary.runs} run(s) replayed, {summary.intervals} ownership interval(s), "
                      f"{total} violation(s)")
        if summary.violations:
            table("violations by rule", ["rule", "count"], sorted(summary.violations.items()))
            broken = [h for h in summary.histories if h.violations]
            table("runs with violations", ["run", "violations", "first"],
                  [(h.run_id, len(h.violations), f"{h.violations[0].rule} at seq {h.violations[0].seq}")
                   for h in broken])
        for stream in summary.unattributed_streams:
            console.print(f"[red]unattributed[/red] ownership facts on {stream} name no run that hashes to it")
        if summary.ok:
            console.print("[green]every ownership history is consistent[/green]")
    if not summary.ok:
        raise SystemExit(1)


def _fields(struct: Any) -> tuple[str, ...]:
    return tuple(getattr(struct, "__struct_fields__", ()))


def _anchor(value: str | None) -> Any:
    if value is None:
        return None
    from fencepost.journal import Head

    position, sep, digest = value.partition(":")
    if not sep or not position.isdigit() or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise click.BadParameter("expected POSITION:HASH (a journal position and its 64-hex entry hash)",
                                 param_hint="--anchor")
    return Head(position=int(position), entry_hash=digest)


@journal.command("verify")
@click.option("--anchor", metavar="POSITION:HASH", default=None,
              help="A head recorded earlier (printed by verify): also prove the entry there is unchanged.")
@json_option
def journal_verify(anchor: str | None, as_json: bool) -> None:
    """Verify every stream's hash chain and the global position sequence.

    Exits 1 when an entry was edited, removed or reordered. The report ends with the journal head
    (POSITION:HASH); keep it elsewhere and pass it back with --anchor to prove later that nothing
    up to it was removed or rewritten.

    Example: fencepost journal verify --anchor 1042:5f1c...e9
    """
    from fencepost.journal import verify

    head = _anchor(anchor)
    store = read_store()
    report = verify(store, anchor=head)
    if as_json:
        print_json(report)
    elif report.ok:
        tail = f"; head {report.head.position}:{report.head.entry_hash}" if report.head else ""
        console.print(f"[green]journal verified[/green]: {report.entries_checked} entries in "
                      f"{report.streams_checked} streams, chains intact{tail}")
    else:
        b = report.first_break
        where = ""
        if b is not None:
            if b.what == "anchor":
                place = "the anchor"
            elif b.run_id is not None and b.run_id != b.stream:
                place = f"run {b.run_id} (its companion stream)"
            else:
                place = f"stream {b.stream}"
            where = f" first at {place} seq {b.seq} (position {b.position}): {b.what}, {b.detail}"
        console.print(f"[red]journal broken[/red]: {report.breaks} break(s);{where}")
    if not report.ok:
        raise SystemExit(1)
