"""``fencepost feed tail|snapshot`` and ``fencepost source show|rotate``."""

from __future__ import annotations

import signal
import threading

import click

from fencepost.cli._common import console, json_option, owner_text, print_json, read_store, table, when, write_store


@click.group()
def feed() -> None:
    """Tail run changes and read run snapshots."""


@feed.command("tail")
@click.option("--from", "from_revision", type=click.IntRange(0), default=0, show_default=True,
              help="Start after this revision of the current source.")
@click.option("--follow", "-f", is_flag=True, help="Keep following new changes until interrupted.")
@click.option("--limit", default=500, show_default=True, type=click.IntRange(1, 1000),
              help="Changes per page.")
@click.option("--snapshots", is_flag=True,
              help="Print each change's run snapshot (read with its page) instead of the change.")
@json_option
def feed_tail(from_revision: int, follow: bool, limit: int, snapshots: bool, as_json: bool) -> None:
    """Print the changes after a revision (one line each), then stop or --follow.

    Each page of changes is read together with the snapshots of its runs. With --json, prints one
    JSON object per change (JSON Lines); with --snapshots, the run's snapshot at that change.

    Example: fencepost feed tail --from 0 --follow --json
    """
    from fencepost.changefeed import Position

    store = read_store()
    start = Position(store.feed.position().source, from_revision)
    emit = _printer(as_json, snapshots)
    if follow:
        stop = threading.Event()
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            for page in store.feed.follow_batches(start, stop=stop, limit=limit):
                for change, snapshot in zip(page.changes, page.snapshots, strict=True):
                    emit(change, snapshot)
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
        return
    position = start
    while True:
        batch = store.feed.changes_with_snapshots(position, limit)
        for change, snapshot in zip(batch.changes, batch.snapshots, strict=True):
            emit(change, snapshot)
        position = batch.next_position
        if not batch.has_more:
            break


def _printer(as_json: bool, snapshots: bool):
    if as_json:
        if snapshots:
            return lambda _change, snapshot: print_json(snapshot)
        return lambda change, _snapshot: print_json(change)

    def line(change, snapshot) -> None:
        status = getattr(snapshot, "status", "deleted")
        extra = f"  {status}" if snapshots else ""
        click.echo(f"{change.revision:>8}  {'deleted' if change.deleted else 'changed':<7}  {change.run_id}{extra}")

    return line


@feed.command("snapshot")
@click.argument("run_ids", nargs=-1, required=True)
@json_option
def feed_snapshot(run_ids: tuple[str, ...], as_json: bool) -> None:
    """Read up to 200 runs in one snapshot, in request order, with the batch position.

    Example: fencepost feed snapshot demo-0001 demo-0002
    """
    store = read_store()
    batch = store.feed.read(list(run_ids))
    if as_json:
        print_json(batch)
        return
    rows = []
    for s in batch.snapshots:
        if type(s).__name__ == "Observed":
            rows.append((s.run_id, s.revision, s.status, owner_text(s.owner), when(s.created_at_ms),
                         "requested" if s.cancellation else "-"))
        else:
            rows.append((s.run_id, s.revision, "deleted" if s.deleted else "missing", "-", "-", "-"))
    table(f"snapshot at {batch.source}:{batch.revision}", ["run_id", "revision", "status", "owner", "created",
                                                          "cancel"], rows)


@click.group()
def source() -> None:
    """Show or rotate the revision source."""


@source.command("show")
@json_option
def source_show(as_json: bool) -> None:
    """Show the current position: the source id and its revision.

    Example: fencepost source show --json
    """
    position = read_store().feed.position()
    if as_json:
        print_json(position)
    else:
        console.print(f"source {position.source} revision {position.revision}")


@source.command("rotate")
@json_option
def source_rotate(as_json: bool) -> None:
    """Give the database a new source id (after a restore or a divergent copy).

    Every consumer holding a position of the old source must rebuild.

    Example: fencepost source rotate
    """
    position = write_store(create=False).feed.rotate_source()
    if as_json:
        print_json(position)
    else:
        console.print(f"rotated: source {position.source} revision {position.revision}")
