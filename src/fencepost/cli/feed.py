"""``fencepost feed tail|snapshot`` and ``fencepost source show|rotate``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import click

from fencepost._values import ascii_digits
from fencepost.cli._common import (
    MAX_SAFE_INTEGER,
    RunIdType,
    cli_context,
    error_text,
    fail,
    owner_text,
    read_store,
    stop_on_signals,
    when,
    write_store,
)
from fencepost.cli._output import Column, Output, output_options, to_data

CHANGE_COLUMNS = [
    Column("revision", "revision", wrap=False),
    Column("change", "deleted", lambda r: "deleted" if r["deleted"] else "changed", wrap=False),
    Column("run_id", "run_id", wrap=False),
]


def _change_fields() -> list[str]:
    """The keys of every change record, in order (the ``csv`` header, printed even with no change)."""
    from fencepost.changefeed import Change

    return list(Change.__struct_fields__)


@click.group()
def feed() -> None:
    """Tail run changes and read run snapshots."""


_HEX = frozenset("0123456789abcdef")


class Revision(click.ParamType):
    """``[NAME=][SOURCE:]REVISION``: a revision (0 or more), optionally of a named source (the
    ``source`` a change printed, 32 hex digits), for one of several stores with ``NAME=``. Converts
    to ``(name or None, source or None, revision)``."""

    name = "[NAME=][SOURCE:]REVISION"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[str | None, str | None, int]:
        if isinstance(value, tuple):
            return value
        head, sep, tail = str(value).strip().rpartition("=")
        source, colon, tail = tail.rpartition(":")
        if colon:
            source = source.lower()
            if len(source) != 32 or not _HEX.issuperset(source):
                self.fail("a source is the 32 hex digits of a change's source, as SOURCE:REVISION", param, ctx)
        if ascii_digits(tail) and (not sep or head):
            if len(tail) > 17 or int(tail) > MAX_SAFE_INTEGER:  # int() refuses thousands of digits
                self.fail(f"a revision is at most {MAX_SAFE_INTEGER}", param, ctx)
            return (head if sep else None, source if colon else None, int(tail))
        self.fail("must be a revision (0 or more), SOURCE:REVISION, or NAME=[SOURCE:]REVISION for one store "
                  "of several", param, ctx)


@feed.command("tail")
@click.option("--from", "starts", type=Revision(), multiple=True,
              help="Start after this revision of the current source [default: 0]. SOURCE:REVISION (a "
                   "change's source and revision, as json, jsonl and csv print them; source show prints the "
                   "source) resumes there and exits 1 if the store's source is "
                   "no longer SOURCE (rotated, or another database). With several stores it applies to each; "
                   "NAME=[SOURCE:]REVISION (repeatable) sets one store's.")
@click.option("--follow", "-f", is_flag=True,
              help="Keep following new changes until stopped (Ctrl-C exits 130, SIGTERM exits 0, its "
                   "output pipe closing exits 1).")
@click.option("--limit", default=500, show_default=True, type=click.IntRange(1, 1000),
              help="Changes per page.")
@output_options
def feed_tail(starts: tuple[tuple[str | None, str | None, int], ...], follow: bool, limit: int, out: Output) -> None:
    """Print the changes after a revision (one line each), then stop or --follow.

    Each change has run_id, source, revision and deleted. With --follow, json prints one object per
    line, like jsonl (the stream has no end).

    Across several stores (--db repeated) each change also has "store", its store's name (the
    first column of a table): store by store, or with --follow as they come. Revisions of two
    stores are never compared; order holds within a store only.

    Example: fencepost feed tail --from 0 --follow --format jsonl
    """
    from fencepost.changefeed import Position

    obj = cli_context()
    if obj.labelled:
        _tail_across(obj.stores(readonly=True), starts, follow, limit, out)
        return
    if any(name is not None for name, _, _ in starts):
        raise click.UsageError("--from NAME=REVISION needs several stores (--db repeated)")
    if len(starts) > 1:
        raise click.UsageError(f"--from was given {len(starts)} times: give it once")
    store = read_store()
    head = store.feed.position()
    _refuse_other_source(starts[0][1] if starts else None, head)
    start = Position(head.source, starts[0][2] if starts else 0)
    _refuse_ahead(start.revision, head.revision, source=starts[0][1] if starts else None)
    with _rotation_explained({None: store}):
        if follow:
            emit = out.stream(CHANGE_COLUMNS, _change_fields())
            with stop_on_signals(output=True) as stop:
                # Pages of changes, each read with its runs' snapshots in one query.
                for page in store.feed.follow_batches(start, stop=stop, limit=limit):
                    for change in page.changes:
                        emit(to_data(change))
            return
        if out.format == "json":  # one document: the array of every change
            out.rows([to_data(c) for c in _pages(store, start, limit)], CHANGE_COLUMNS)
            return
        emit = out.stream(CHANGE_COLUMNS, _change_fields())  # page by page, never the whole feed in memory
        for change in _pages(store, start, limit):
            emit(to_data(change))


_WENT_BACK = "went back to an earlier revision (an older copy restored?)"
_OLD_DATABASE = "positions of the old database mean nothing in this one"


def _whose(store: str | None, what: str) -> str:
    """Whose ``what`` it is: the one store's, or the named one's of several."""
    return f"the store's {what}" if store is None else f"store {store}: its {what}"


def _start_again(store: str | None) -> str:
    """How every refusal to resume ends: where to start again to see everything."""
    again = "--from 0" if store is None else f"--from {store}=0"
    return f"start again with {again} to see every run and tombstone"


@contextmanager
def _rotation_explained(stores: Mapping[Any, Any]) -> Iterator[None]:
    """A source rotated while the changes were read: say so, with the new source and how to start
    again, instead of the store's own words (exit 1). ``stores`` by name (``None`` for one store);
    across several stores any other error names its store."""
    from fencepost.errors import FencepostError, SourceChanged

    try:
        yield
    except FencepostError as exc:
        name = exc.store
        store = stores.get(name)
        if isinstance(exc, SourceChanged) and exc.rotated and store is not None:
            now = store.feed.position()
            raise fail(f"{_whose(name, 'source')} rotated while its changes were read (now {now.source} at "
                       f"revision {now.revision}); positions of the old source mean nothing in the new one: "
                       f"{_start_again(name)}") from None
        if isinstance(exc, SourceChanged) and store is not None:
            # Not a rotation: the SQLite file was replaced or removed under the follower, or the
            # store went back in time (an older copy restored with its source id). Said in a
            # tailer's terms, not the library's "rebuild".
            cause = "was replaced or removed" if exc.method == "follow" else _WENT_BACK
            raise fail(f"{_whose(name, 'database')} {cause} while its changes were read; {_OLD_DATABASE}: "
                       f"{_start_again(name)}") from None
        if name is None:
            raise
        raise fail(f"store {name}: {error_text(exc)}") from exc


LABELLED_CHANGE_COLUMNS = [Column("store", "store", wrap=False), *CHANGE_COLUMNS]


def _tail_across(stores: dict[str, Any], starts: tuple[tuple[str | None, str | None, int], ...], follow: bool,
                 limit: int, out: Output) -> None:
    """``feed tail`` over several stores: each change labelled with its store's name."""
    from fencepost.changefeed import Position
    from fencepost.shards.router import merged_changes, merged_follow

    every = [(source, rev) for name, source, rev in starts if name is None]
    given = [name for name, _, _ in starts if name is not None]
    if len(every) > 1 or len(given) != len(set(given)):
        raise click.UsageError("--from was given twice for one store: give REVISION once and NAME=REVISION "
                               "once per store")
    default = every[0] if every else (None, 0)
    named = {name: (source, rev) for name, source, rev in starts if name is not None}
    if not set(named) <= set(stores):
        raise click.UsageError("--from NAME=REVISION names no given store")
    positions = {}
    for name, store in stores.items():
        head = store.feed.position()
        source, revision = named.get(name, default)
        _refuse_other_source(source, head, name)
        positions[name] = Position(head.source, revision)
        _refuse_ahead(positions[name].revision, head.revision, name, source=source)

    def record(item: Any) -> dict[str, Any]:
        return {"store": item.shard, **to_data(item.change)}

    with _rotation_explained(stores):
        if follow:
            emit = out.stream(LABELLED_CHANGE_COLUMNS, ["store", *_change_fields()])
            with stop_on_signals(output=True) as stop:
                for item in merged_follow(list(stores.items()), positions, stop=stop):
                    emit(record(item))
            return
        changes = merged_changes(list(stores.items()), positions, limit=limit)
        if out.format == "json":
            out.rows([record(c) for c in changes], LABELLED_CHANGE_COLUMNS)
            return
        emit = out.stream(LABELLED_CHANGE_COLUMNS, ["store", *_change_fields()])
        for item in changes:
            emit(record(item))


def _refuse_other_source(source: str | None, head: Any, store: str | None = None) -> None:
    """A --from SOURCE:REVISION of a source the store no longer has: exit 1 before printing anything.

    Its revisions mean nothing on the store's source (rotated after a restore, or another
    database): resuming there would skip changes silently, so the tailer must start again."""
    if source is None or source == head.source:
        return
    raise fail(f"--from names source {source}, but {_whose(store, 'source')} is {head.source} (at revision "
               f"{head.revision}): it was rotated, or this is another database, and positions of one source mean "
               f"nothing in another: {_start_again(store)}")


def _refuse_ahead(start: int, head: int, store: str | None = None, *, source: str | None = None) -> None:
    """A --from REVISION past the newest revision is a typo: a usage error. A --from SOURCE:REVISION
    (a position this store's source printed) past it means the database went back in time (an older
    copy restored with its source id): exit 1, saying so, as a rewind met while tailing is."""
    if start <= head:
        return
    if source is not None:
        raise fail(f"--from {source}:{start} is ahead of the newest revision ({head}) of that source: "
                   f"{_whose(store, 'database')} {_WENT_BACK}; {_OLD_DATABASE}: {_start_again(store)}")
    where = f" of store {store}" if store is not None else ""
    raise click.UsageError(f"--from {start} is ahead of the newest revision{where} ({head})")


def _pages(store: Any, position: Any, limit: int) -> Iterator[Any]:
    while True:
        batch = store.feed.changes_since(position, limit)
        yield from batch.changes
        position = batch.next_position
        if not batch.has_more:
            return


SNAPSHOT_COLUMNS = [
    Column("run_id", "run_id", wrap=False),
    Column("revision", "revision", wrap=False),
    Column("status", "status",
           lambda r: r["status"] if r["type"] == "Observed" else ("deleted" if r["deleted"] else "missing")),
    Column("owner", "owner", lambda r: _owner_cell(r.get("owner"))),
    Column("created", "created_at_ms", lambda r: when(r.get("created_at_ms")), wrap=False),
    Column("cancel", "cancellation", lambda r: "requested" if r.get("cancellation") else "-"),
]


def _owner_cell(owner: Any) -> str:
    if not isinstance(owner, dict):
        return "-"
    from fencepost.journal.owner import OwnerId

    return owner_text(OwnerId(owner["host_id"], owner["pid"], owner["nonce"]))


@feed.command("snapshot")
@click.argument("run_ids", nargs=-1, required=True, type=RunIdType())
@output_options
def feed_snapshot(run_ids: tuple[str, ...], out: Output) -> None:
    """Read up to 200 runs in one snapshot, in request order, with the batch position.

    With --format json, prints the batch {"source", "revision", "snapshots": [...]}; jsonl and csv
    print the snapshots alone (each with "type": Observed or Missing).

    Example: fencepost runs create order-17 && fencepost feed snapshot order-17 order-18
    """
    from fencepost.changefeed.feed import MAX_READ_IDS

    if len(run_ids) > MAX_READ_IDS:
        raise click.UsageError(f"at most {MAX_READ_IDS} run ids per snapshot (got {len(run_ids)})")
    batch = read_store().feed.read(list(run_ids))
    out.rows([to_data(s) for s in batch.snapshots], SNAPSHOT_COLUMNS,
             title=f"snapshot at {batch.source}:{batch.revision}",
             footer=[f"snapshot at source {batch.source} revision {batch.revision}"], document=to_data(batch))


@click.group()
def source() -> None:
    """Show or rotate the revision source."""


@source.command("show")
@output_options
def source_show(out: Output) -> None:
    """Show the current position: the source id and its revision.

    Example: fencepost source show --format json
    """
    position = read_store().feed.position()
    if out.is_table:
        out.message(f"source {position.source} revision {position.revision}")
    else:
        out.record(to_data(position))


@source.command("rotate")
@output_options
def source_rotate(out: Output) -> None:
    """Give the database a new source id (after a restore or a divergent copy).

    Every consumer holding a position of the old source must rebuild: a projection does so itself
    when it next reads (projection status then counts the rebuild and shows last_rebuild, reason
    source_changed); a running feed tail --follow stops with exit 1, saying to start again with
    --from 0. Prints the new position.

    Example: fencepost source rotate
    """
    position = write_store(create=False).feed.rotate_source()
    if out.is_table:
        out.message(f"rotated: source {position.source} revision {position.revision}")
    else:
        out.record(to_data(position))
