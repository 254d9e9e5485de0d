"""``fencepost journal show|replay|verify``."""

from __future__ import annotations

from typing import Any

import click

from fencepost._printable import one_line
from fencepost._values import ascii_digits
from fencepost.cli._common import (
    MAX_SAFE_INTEGER,
    RunIdType,
    fail,
    owner_text,
    progress_bar,
    progress_option,
    read_store,
    table,
    when,
)
from fencepost.cli._output import Column, Output, output_options, to_data
from fencepost.runstore._reading import run_exists

ENTRY_COLUMNS = [
    Column("seq", "seq", wrap=False),
    Column("position", "position", wrap=False),
    Column("emitted", "emitted_at_ms", lambda r: when(r.get("emitted_at_ms")), wrap=False),
    Column("event_type", "event_type", wrap=False),
    Column("payload", "payload", lambda r: f"(cannot be decoded: {r['undecodable']})" if "undecodable" in r
           else _short(r.get("payload"))),
]


@click.group()
def journal() -> None:
    """Read, replay and verify the journal."""


@journal.command("show")
@click.argument("run_id", type=RunIdType())
@click.option("--companion", is_flag=True,
              help="Show the run's ownership facts (its run-store companion stream) instead of its own stream.")
@click.option("--after", type=click.IntRange(-1, MAX_SAFE_INTEGER), default=None,
              help="Only entries with seq greater than this.")
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1, 1000), help="At most this many.")
@output_options
def journal_show(run_id: str, companion: bool, after: int | None, limit: int, out: Output) -> None:
    """Show the entries of a run's journal stream in sequence order.

    The table cuts a payload or meta longer than 160 characters (ending it with "..."); json,
    jsonl and csv print them exactly as they were recorded (the hash chain covers them). With
    --format json, prints the page {"entries": [...], "has_more": ...}; jsonl and csv print the
    entries alone. An entry that cannot be decoded (edited in the database by hand) is shown in
    its place by seq and position only, with what cannot be decoded (json and jsonl:
    {"seq", "position", "undecodable"}; csv: the undecodable column; never its stored values), the
    other entries as usual, and the command then exits 1 naming its position. Exits 1 when RUN_ID
    names neither a run nor any journal entries. Given the shards of a set (--db repeated), shows
    the stream on the run's shard.

    Example: fencepost runs create order-17 && fencepost journal show order-17 --companion
    """
    from fencepost.cli.runs import run_store
    from fencepost.journal import companion_stream
    from fencepost.journal.verify import stream_page

    store = run_store(run_id, readonly=True)  # given a shard set, the run's shard
    stream = companion_stream(run_id) if companion else run_id
    rows = stream_page(store, stream, -1 if after is None else after, limit + 1)
    has_more = len(rows) > limit
    entries, undecodable = _shown(rows[:limit])

    def has_entries(s: str) -> bool:
        return bool(stream_page(store, s, -1, 1))

    if not entries and not run_exists(store, run_id) and not any(
            has_entries(s) for s in (run_id, companion_stream(run_id))):
        # A mistyped id is not an empty stream (journal replay refuses it the same way).
        raise fail("journal show: no run and no journal entries with this run id")
    last_seq = entries[-1]["seq"] if entries else None
    more = [f"more entries follow: --after {last_seq}"] if has_more and type(last_seq) is int else []
    if (out.is_table and not companion and after is None and not entries
            and has_entries(companion_stream(run_id))):
        # A run a worker settled has its history as ownership facts, none on its own stream: an
        # empty table alone reads as "no history".
        import shlex

        more.append("no entries on the run's own stream; its ownership facts are on its companion "
                    f"stream: fencepost journal show {shlex.quote(run_id)} --companion")
    from fencepost.journal.entries import Entry

    fields = (*_fields(Entry), "undecodable")
    if out.format == "csv":  # one header for every row: an entry's cells, or the marker's
        entries = [{k: e.get(k) for k in fields} for e in entries]
    out.rows(entries, ENTRY_COLUMNS, footer=more, document={"entries": entries, "has_more": has_more},
             fields=fields, title=f"{'companion stream of ' if companion else 'stream '}{run_id}: "
                                  f"{len(entries)} entr(ies)")
    if undecodable:
        if len(undecodable) == 1:
            # What cannot be decoded (a column and the rule it breaks, never the stored value).
            detail = next(e["undecodable"] for e in entries if "undecodable" in e and e.get("undecodable"))
            which = f"the entry at position {undecodable[0]} cannot be decoded: {detail}"
        else:
            which = (f"{len(undecodable)} entries cannot be decoded, at positions "
                     + ", ".join(str(p) for p in undecodable[:10]) + (", ..." if len(undecodable) > 10 else ""))
        raise fail(f"journal show: decode_failed: {which} (shown in its place by seq and position only); "
                   "the other entries are shown")


def _shown(rows: list[Any]) -> tuple[list[dict[str, Any]], list[int]]:
    """Each stored row as its entry's data, or, for an entry that cannot be decoded, its seq (None
    when that is not an integer), its position and what cannot be decoded, never what it holds; and
    the positions of those."""
    from fencepost.journal.verify import decoded

    shown: list[dict[str, Any]] = []
    bad: list[int] = []
    for row in rows:
        entry, detail = decoded(row, "entries")
        if detail is None:
            shown.append(to_data(entry))
            continue
        position = int(row.position)
        shown.append({"seq": row.seq if type(row.seq) is int else None, "position": position,
                      "undecodable": detail})
        bad.append(position)
    return shown, bad


def _short(payload: Any) -> str:
    import msgspec

    text = msgspec.json.encode(payload).decode()
    return text if len(text) <= 160 else text[:160] + "..."


@journal.command("replay")
@click.argument("run_id", required=False, type=RunIdType())
@click.option("--all", "every", is_flag=True, help="Replay every run that has ownership facts and summarise.")
@progress_option
@output_options
def journal_replay(run_id: str | None, every: bool, out: Output, progress: bool) -> None:
    """Rebuild a run's ownership history from its consensus facts alone and check it.

    Checks: never two owners at once, every activation preceded by its claim, every steal and
    expiry justified by the heartbeat and cutoff the store recorded, no release by a non-holder, and
    no fact edited or removed by hand (chain_broken: the facts' stream fails its hash chain).
    With --all, every run with ownership facts is replayed and the summary counts runs, intervals
    and violations by rule (json: the summary with every history; jsonl: one history per line;
    csv: one row per run; on a terminal, a progress bar on stderr counts the runs replayed). jsonl
    and csv print each run as it is replayed, and they and json list the runs in the order of
    their companion streams (not by run id); the memory --all takes does not grow with the number
    of runs. For one
    run, csv prints a row per interval and then a row per violation, told apart by the first
    column, kind (interval or violation); each row leaves the other kind's columns empty. Exits
    1 when any history breaks a rule, or when RUN_ID names neither a run nor any ownership facts.
    Given the shards of a set (--db repeated), RUN_ID is replayed on its shard; --all works on one
    store (replay each shard in turn).

    Example: fencepost runs create order-17 && fencepost journal replay order-17
    """
    if every == (run_id is not None):
        raise click.UsageError("give a RUN_ID or --all (not both)")
    if every:
        _replay_all(read_store(), out, progress)
        return
    from fencepost.cli.runs import run_store
    from fencepost.journal import ownership_history

    assert run_id is not None
    store = run_store(run_id, readonly=True)  # given a shard set, the run's shard
    history = ownership_history(store, run_id)
    if history.facts == 0 and not run_exists(store, run_id):
        raise fail("journal replay: no run and no ownership facts with this run id")
    if out.is_table:
        out.rows([to_data(i) | {"owner_text": owner_text(i.owner)} for i in history.intervals], INTERVAL_COLUMNS,
                 title=f"ownership of {run_id} ({history.facts} fact(s))",
                 footer=[f"violation {v.rule} {v.where}{f' ({v.event_type})' if v.event_type else ''}: {v.detail}"
                         for v in history.violations] or ["ownership history is consistent"])
    elif out.format == "csv":
        out.rows(_replay_rows(history), [], fields=_replay_csv_fields())
    else:
        out.record(to_data(history))
    if history.violations:
        raise fail(f"the ownership history breaks {len(history.violations)} invariant(s)")


def _replay_csv_fields() -> tuple[str, ...]:
    """The csv columns of one run's replay: ``kind``, an interval's fields, a violation's fields."""
    from fencepost.journal.replay import OwnershipInterval, Violation

    return ("kind", *_fields(OwnershipInterval), *_fields(Violation))


def _replay_rows(history: Any) -> list[dict[str, Any]]:
    """One csv row per interval (``kind`` interval), then one per violation (``kind`` violation);
    every row has every column, the other kind's left empty."""
    blank = dict.fromkeys(_replay_csv_fields())
    return ([blank | {"kind": "interval"} | to_data(i) for i in history.intervals]
            + [blank | {"kind": "violation"} | to_data(v) for v in history.violations])


INTERVAL_COLUMNS = [
    Column("owner", "owner_text", wrap=False),
    Column("granted", "granted_at_ms", wrap=False),
    Column("from seq", "start_seq", wrap=False),
    Column("started", "started_at_ms", lambda r: when(r.get("started_at_ms")), wrap=False),
    Column("to seq", "end_seq", wrap=False),
    Column("ended", "ended_at_ms", lambda r: when(r.get("ended_at_ms")), wrap=False),
    Column("ended by", "ended_by"),
]


REPLAY_ALL_FIELDS = ("run_id", "facts", "intervals", "violations", "first_violation", "stream")


def _replay_all(store: Any, out: Output, progress: bool) -> None:
    """Replay every run, printing each as it is replayed (jsonl, csv) or spooling it (json, whose
    totals come first), and keeping only the totals and the runs that break a rule."""
    from fencepost.journal.replay import replay_each

    spool: Any = None
    on_history: Any = None
    if out.format == "jsonl":  # one history per line, as `replay RUN_ID --format jsonl` prints one
        line = out.stream([])
        on_history = lambda h: line(to_data(h))  # noqa: E731
    elif out.format == "csv":  # one row per run; `replay RUN_ID --format csv` has its intervals and violations
        row = out.stream([], fields=REPLAY_ALL_FIELDS)
        on_history = lambda h: row(_replay_all_row(h))  # noqa: E731
    elif not out.is_table:
        # One document whose totals come before the histories: the histories wait in a temporary
        # file (in memory while small), not in a list.
        import tempfile

        spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY, mode="w+", encoding="utf-8")

        def on_history(h: Any) -> None:
            if spool.tell():
                spool.write(",")
            spool.write(_json_text(to_data(h)))

    try:
        with progress_bar("replaying ownership histories", enabled=progress) as on_progress:
            totals = replay_each(store, on_history, on_progress=on_progress)
        if spool is not None:
            _write_replay_document(totals, spool)
    finally:
        if spool is not None:
            spool.close()
    if out.is_table:
        total = sum(totals.violations.values())
        click.echo(f"{totals.runs} run(s) replayed, {totals.intervals} ownership interval(s), "
                      f"{total} violation(s)")
        if totals.violations:
            table("violations by rule", ["rule", "count"], sorted(totals.violations.items()))
            table("runs with violations", ["run", "violations", "first"],
                  [(h.run_id, len(h.violations), f"{h.violations[0].rule} {h.violations[0].where}")
                   for h in totals.broken])
        for stream in totals.unattributed_streams:
            click.echo(f"unattributed ownership facts on {one_line(stream)} name no run that hashes to it")
        if totals.ok:
            click.echo("every ownership history is consistent")
    if not totals.ok:
        broken_runs = len(totals.broken)
        problems = [f"{broken_runs} of {totals.runs} run(s) break the ownership rules "
                    f"({sum(totals.violations.values())} violation(s))"] if broken_runs else []
        if totals.unattributed_streams:
            problems.append(f"{len(totals.unattributed_streams)} stream(s) of ownership facts name no run")
        raise fail("; ".join(problems) or "the ownership histories are not consistent")


#: Up to this many characters of ``replay --all --json`` histories are spooled in memory, then on disk.
_SPOOL_IN_MEMORY = 1 << 20


def _replay_all_row(h: Any) -> dict[str, Any]:
    return {"run_id": h.run_id, "facts": h.facts, "intervals": len(h.intervals), "violations": len(h.violations),
            "first_violation": f"{h.violations[0].rule} {h.violations[0].where}" if h.violations else "",
            "stream": h.stream}


def _json_text(value: Any) -> str:
    """``value`` as the machine formats write it: compact JSON (a lone surrogate escaped)."""
    from fencepost.cli._output import _encoder, _surrogates_escaped

    try:
        return _encoder.encode(value).decode()
    except UnicodeEncodeError:  # a lone surrogate, which msgspec refuses: JSON escapes it instead
        import json

        return _surrogates_escaped(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def _write_replay_document(totals: Any, spool: Any) -> None:
    """The ``--json`` summary: the totals, then ``histories`` copied from ``spool``; one line."""
    from fencepost.cli._output import _MachineOut

    head = _json_text({"ok": totals.ok, "runs": totals.runs, "intervals": totals.intervals,
                       "violations": totals.violations, "unattributed_streams": totals.unattributed_streams})
    target = _MachineOut()
    target.write(head[:-1] + ',"histories":[')
    spool.seek(0)
    while chunk := spool.read(1 << 13):
        target.write(chunk)
    target.write("]}\n")
    target.flush()


def _fields(struct: Any) -> tuple[str, ...]:
    return tuple(getattr(struct, "__struct_fields__", ()))


def _anchor(value: str | None) -> Any:
    if value is None:
        return None
    from fencepost.errors import JournalError
    from fencepost.journal import Head
    from fencepost.journal.verify import checked_anchor

    expected = "expected POSITION:HASH (a journal position and its 64-hex entry hash)"
    position, sep, digest = value.strip().partition(":")
    if not sep or not ascii_digits(position, 16):
        raise click.BadParameter(expected, param_hint="--anchor")
    try:
        return checked_anchor(Head(position=int(position), entry_hash=digest))
    except JournalError as exc:
        raise click.BadParameter(f"{expected}: {exc.detail}", param_hint="--anchor") from None


def _break_place(b: Any) -> str:
    """Where a break is and what it is (never a payload value)."""
    if b.what == "anchor":  # a position, not an entry of a stream: it has no seq
        return f"the anchor (position {b.position}): {b.detail}"
    # Identifiers on one line: a run id holding a line feed must not print a line of the report.
    if b.run_id is not None and b.run_id != b.stream:
        place = f"run {one_line(b.run_id)} (its companion stream)"
    else:
        place = f"stream {one_line(b.stream)}"
    seq = f" seq {b.seq}" if b.seq >= 0 else ""  # -1: the stored seq is not an integer
    return f"{place}{seq} (position {b.position}): {b.what}, {b.detail}"


@journal.command("verify")
@click.option("--anchor", metavar="POSITION:HASH", default=None,
              help="A head recorded earlier (printed by verify): also prove the entry there is unchanged.")
@progress_option
@output_options
def journal_verify(anchor: str | None, out: Output, progress: bool) -> None:
    """Verify every stream's hash chain and the global position sequence.

    Exits 1 when an entry was edited, removed or reordered. The report ends with the journal head
    (POSITION:HASH); keep it elsewhere and pass it back with --anchor to prove later that nothing
    up to it was removed or rewritten. On a terminal, a progress bar on stderr counts the entries
    checked (Ctrl-C stops the verification, exit 130).

    Example: fencepost journal verify --anchor 1042:5f1c...e9
    """
    from fencepost.journal import verify

    head = _anchor(anchor)
    store = read_store()
    with progress_bar("verifying journal entries", enabled=progress) as on_progress:
        report = verify(store, anchor=head, on_progress=on_progress)
    if not out.is_table:
        out.record(to_data(report))
    elif report.ok:
        tail = f"; head {report.head.position}:{report.head.entry_hash}" if report.head else ""
        out.message(f"journal verified: {report.entries_checked} entries in "
                    f"{report.streams_checked} streams, chains intact{tail}")
    else:
        listed = report.first_breaks
        where = f" first at {_break_place(listed[0])}" if listed else ""
        out.message(f"journal broken: {report.breaks} break(s);{where}")
        for b in listed[1:]:  # every other break, one line each, so each tampered place is named
            out.message(f"  then at {_break_place(b)}")
        if report.breaks > len(listed):
            out.message(f"  and {report.breaks - len(listed)} more after these (only the first "
                        f"{len(listed)} are listed)")
    if not report.ok:
        raise fail(f"the journal is broken: {report.breaks} break(s)")
