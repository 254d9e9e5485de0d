"""``fencepost demo``: the main job on the embedded default, end to end, in well under a minute.

It creates a few hundred runs, starts worker processes that claim, heartbeat, checkpoint and settle
them, SIGKILLs one worker while it holds runs (another steals them once the lease expires), cancels a
few runs, follows the change feed into the ``RunsByStatus`` projection, and prints a summary.

**Demo time runs faster than wall time.** The store's lease constants are not changed (a heartbeat
is stale after 30 s, pulses every 1 s), but the demo's store and its worker processes share a
``ScaledClock`` that runs ``--speed`` times faster than the wall clock (10 by default), so the killed
worker's 30-second lease expires after about 3 wall seconds. Time stamps the demo writes are
therefore ahead of the wall clock; the output says so.
"""

from __future__ import annotations

import random
import shlex
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.markup import escape
from rich.progress import Progress

from fencepost.cli._common import CliContext, FiniteRange, console, echo_error, fail, progress_columns, table

TERMINAL = ("completed", "failed", "cancelled")
DEMO_TASK = "fencepost.cli.demo:demo_task"


class ScaledClock:
    """A wall clock that runs ``speed`` times faster from ``base_ms`` (shared by every demo process)."""

    def __init__(self, base_ms: int, speed: float) -> None:
        self.base_ms = int(base_ms)
        self.speed = float(speed)

    def now_ms(self) -> int:
        wall = time.time_ns() // 1_000_000
        return self.base_ms + int((wall - self.base_ms) * self.speed)

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds) / self.speed)


def demo_task(ctx: Any) -> Any:
    """The demo's run function: a few steps of simulated work, a checkpoint after each one.

    Resumes from the last checkpoint (a run taken over from a killed worker continues where its
    previous owner stopped). A run whose state says ``fail`` raises, so the run settles ``failed``.
    """
    state = dict(ctx.state) if isinstance(ctx.state, dict) else {}
    steps = int(state.get("steps", 3))
    done = int(state.get("done", 0))
    while done < steps:
        ctx.check()
        time.sleep(random.uniform(0.02, 0.08))
        done += 1
        state["done"] = done
        ctx.checkpoint(state)
    if state.get("fail"):
        raise RuntimeError("the demo's deliberately failing step")
    state["result"] = "ok"
    return state


def _status_counts(store: Any, prefix: str) -> Counter:
    counts: Counter = Counter()
    cursor = None
    while True:
        page = store.feed.list_runs(None, cursor, 200)
        for r in page.runs:
            if r.run_id.startswith(prefix):
                counts[r.status] += 1
        cursor = page.cursor
        if cursor is None:
            return counts


def _holders(store: Any, prefix: str) -> dict[int, list[str]]:
    """The demo's running runs by the pid of the worker process that owns them."""
    held: dict[int, list[str]] = {}
    cursor = None
    while True:
        page = store.feed.list_runs({"status": "running"}, cursor, 200)
        for r in page.runs:
            if r.run_id.startswith(prefix) and r.owner:
                held.setdefault(r.owner.pid, []).append(r.run_id)
        cursor = page.cursor
        if cursor is None:
            return held


@click.command()
@click.option("--runs", "n_runs", default=300, show_default=True, type=click.IntRange(10, 5000),
              help="Runs to create.")
@click.option("--workers", "n_workers", default=4, show_default=True, type=click.IntRange(2, 16),
              help="Worker processes (one of them is killed mid-run).")
@click.option("--speed", default=10.0, show_default=True, type=FiniteRange(1.0, 100.0),
              help="How much faster demo time runs than wall time (lease expiry takes 30 s of demo time).")
@click.option("--timeout", default=55.0, show_default=True, type=FiniteRange(5.0),
              help="Give up after this many wall seconds.")
@click.pass_obj
def demo(obj: CliContext, n_runs: int, n_workers: int, speed: float, timeout: float) -> None:
    """Run the main job on a database (default .flows/flows.db): workers, a kill, a takeover,
    cancellations, a projection following the feed, then a summary.

    Demo time runs --speed times faster than wall time so the killed worker's 30-second lease
    expires quickly; the library's lease constants are unchanged. Exits 1 (saying so) when
    --timeout passes before every run settled, 130 on Ctrl-C (the workers are stopped first).

    Example: fencepost demo && fencepost runs list --status cancelled
    """
    import fencepost
    from fencepost._durable import redact_url
    from fencepost.journal import companion_stream
    from fencepost.projections import ProjectionBuilder, RunsByStatus

    started = time.monotonic()
    url = obj.resolved_url
    base = time.time_ns() // 1_000_000
    clock = ScaledClock(base, speed)
    prefix = f"demo-{uuid.uuid4().hex[:6]}-"
    store = fencepost.open(url, clock=clock)
    obj._store = store  # closed by the group with everything else
    _say(f"[bold]fencepost demo[/bold] on {escape(redact_url(url))}  (runs {prefix}*)")
    _say(f"demo time runs {speed:g}x faster than wall time: the 30 s lease expires in "
         f"~{30 / speed:.1f} s; stamps are demo time")

    # Every exit from here on (an error, Ctrl-C, or the output pipe closing, which rich turns into
    # SystemExit) leaves through these blocks: the workers are stopped, then the projection thread,
    # then the builder lock is released.
    with ProjectionBuilder(store, url, RunsByStatus(), lock_timeout=10.0) as builder:
        _hold_projection(builder)
        # Bars on a terminal only: into a pipe or a file rich writes each bar once, as it ends, after
        # the lines printed meanwhile (the story would read out of order); a line says it instead.
        with Progress(*progress_columns(), console=console, transient=False,
                      disable=not console.is_terminal) as progress:
            task = progress.add_task("creating runs", total=n_runs)
            rng = random.Random(7)
            for i in range(n_runs):
                state = {"flowName": "demo", "n": i, "steps": rng.randint(2, 5), "done": 0}
                if i % 50 == 49:
                    state["fail"] = True
                store.runs.create(f"{prefix}{i:04d}", _dumps(state))
                progress.advance(task)
            if not console.is_terminal:
                _say(f"created {n_runs} runs")

            victim = None
            killed: list[str] = []
            cancelled_ids: list[str] = []
            cancel_done = False
            deadline = started + timeout
            timed_out = True
            interrupted = False
            fifth_settled = False
            with _following(builder) as projection_failures, _workers(url, n_workers, (base, speed), prefix) as procs:
                try:
                    _say(f"started {n_workers} worker processes: pids {', '.join(str(p.pid) for p in procs)}")
                    work = progress.add_task("settling runs", total=n_runs)
                    while time.monotonic() < deadline and not projection_failures:
                        counts = _status_counts(store, prefix)
                        settled = sum(counts[s] for s in TERMINAL)
                        progress.update(work, completed=settled)
                        fifth_settled = fifth_settled or settled >= n_runs // 5
                        if not killed and settled >= n_runs // 5:
                            # The victim is whichever live worker holds runs now (the busiest): one fixed
                            # process could be between runs at every look on a loaded machine.
                            holders = _holders(store, prefix)
                            alive = [p for p in procs if p.is_alive() and holders.get(p.pid)]
                            if alive and sum(p.is_alive() for p in procs) > 1:
                                victim = max(alive, key=lambda p: len(holders[p.pid]))
                                held = holders[victim.pid]
                                victim.kill()
                                victim.join()
                                killed = held
                                _say(f"[red]SIGKILLed worker {victim.pid}[/red] holding {len(held)} run(s): "
                                     f"{', '.join(held)}; a peer takes them over once the lease expires")
                        if not cancel_done and settled >= n_runs // 3:
                            cancel_done = True
                            cancelled_ids = _cancel_some(store, prefix, n_runs)
                            _say(f"requested cancellation of {len(cancelled_ids)} run(s)")
                        if settled >= n_runs:
                            timed_out = False
                            break
                        if not any(p.is_alive() for p in procs):
                            _say("[red]every worker process exited[/red]")
                            timed_out = False
                            break
                        time.sleep(0.1)
                except KeyboardInterrupt:
                    # Ctrl-C: stop gracefully below (workers park what they hold), then exit 130.
                    interrupted = True
        if projection_failures:
            raise projection_failures[0]  # the boundary prints it as one line
        if interrupted:
            # What the stop left, on stderr; not an ``Error:`` line: the user asked for it.
            click.echo("interrupted: the workers were stopped (runs in hand were parked suspended)", err=True)
            raise SystemExit(130)
        final = builder.catch_up()
        status = builder.status()
        counts = _status_counts(store, prefix)
        takeovers = _takeovers(store, prefix, n_runs, companion_stream)
        projected = _projected(builder, RunsByStatus())
        source_rows = {r.run_id: r.status for r in _all_runs(store)}
        in_step = status.lag == 0 and projected == source_rows
        from fencepost.journal import verify

        verified = verify(store)
        ok = bool(getattr(verified, "ok", False))

    table("runs by status", ["status", "runs"], sorted(counts.items()))
    if killed and victim is not None:
        _say(f"takeovers: {len(takeovers)} run(s) stolen after worker {victim.pid} was killed"
             + (f" ({', '.join(takeovers[:6])}{', ...' if len(takeovers) > 6 else ''})" if takeovers else ""))
    elif not fifth_settled:
        _say("[red]no worker was killed: the demo stopped before a fifth of the runs had settled[/red]")
    else:
        _say("[red]no worker was killed: none held a run once a fifth of the runs had settled[/red]")
    _say(f"journal verified: {'[green]yes[/green]' if ok else '[red]NO[/red]'}")
    _say(f"projection runs_by_status in step with the source: "
         f"{'[green]yes[/green]' if in_step else '[red]NO[/red]'} "
         f"(revision {final.revision}, lag {status.lag}, {len(projected)} rows)")
    _say(f"finished in {time.monotonic() - started:.1f} s. Explore:")
    for hint in _hints(url, prefix):
        _say(f"  {escape(hint)}")
    # Counted after the workers stopped: runs they finished while stopping count as settled, so a
    # deadline that passed as the last runs settled is no failure (nothing is left unsettled).
    unsettled = n_runs - sum(counts[s] for s in TERMINAL)
    if timed_out and unsettled:
        echo_error(f"timed out after {timeout:g} s (--timeout) with {unsettled} of {n_runs} run(s) unsettled")
        raise SystemExit(1)
    if unsettled or not ok or not in_step or not killed:
        raise SystemExit(1)


def _say(text: str) -> None:
    """Print one line of the demo's story (rich markup). Written to a pipe or a file it is never
    hard-wrapped, as tables are not (``cli._output``): a URL or a list of run ids stays on its line."""
    console.print(text, soft_wrap=not console.is_terminal)


def _hints(url: str, prefix: str) -> list[str]:
    """Commands that explore what the demo left, with the ``--db`` it used unless that is the default
    (else they would read ``.flows/flows.db``). The URL is shown as ever: its password masked."""
    from fencepost._durable import DEFAULT_URL, redact_url

    db = "" if url == DEFAULT_URL else f"--db {shlex.quote(redact_url(url))} "
    return [f"fencepost {db}runs list", f"fencepost {db}runs show {prefix}0000",
            f"fencepost {db}journal show {prefix}0000 --companion", f"fencepost {db}feed tail",
            f"fencepost {db}projection status", f"fencepost {db}ui  (live web console)"]


def _hold_projection(builder: Any) -> None:
    """Take the projection's builder lock by catching up once, before any run or worker exists.

    Another builder of ``runs_by_status`` on this database (a second demo, ``projection run``)
    is a one-line error here; found later by the builder's thread it was a raw thread traceback.
    """
    from fencepost.errors import ProjectionError

    try:
        builder.catch_up()
    except ProjectionError as exc:
        if exc.code != "builder_busy":
            raise
        raise fail("another process is building the runs_by_status projection on this database (another "
                   "fencepost demo, or fencepost projection run): wait for it to finish, or give this demo "
                   "its own database with --db") from None


@contextmanager
def _following(builder: Any) -> Iterator[list[BaseException]]:
    """Run the builder in a thread until the block ends; yields the list its failure lands in.

    The main thread checks the list and raises what it holds, so a failure reaches the CLI's one
    error boundary instead of printing a thread's traceback.
    """
    failures: list[BaseException] = []
    stop = threading.Event()

    def follow() -> None:
        try:
            builder.run(stop)
        except BaseException as exc:  # raised by the main thread
            failures.append(exc)

    thread = threading.Thread(target=follow, name="fencepost-demo-projection", daemon=True)
    thread.start()
    try:
        yield failures
    finally:
        stop.set()
        thread.join(10)


@contextmanager
def _workers(url: str, n: int, clock_spec: tuple[int, float], prefix: str) -> Iterator[list[Any]]:
    """The demo's worker processes, stopped when the block ends, however it ends.

    They are not daemonic, so ``multiprocessing`` joins each one at interpreter exit: a worker left
    running keeps the demo from ever exiting (a closed output pipe did exactly that).
    """
    from fencepost.cli.worker import spawn_workers, stop_workers

    procs = spawn_workers(url, n, task=DEMO_TASK, concurrency=4, clock_spec=clock_spec, prefix=prefix,
                          log_level="ERROR")
    try:
        yield procs
    finally:
        stop_workers(procs, grace=10.0)


def _dumps(value: Any) -> str:
    import msgspec

    return msgspec.json.encode(value).decode()


def _cancel_some(store: Any, prefix: str, n_runs: int) -> list[str]:
    """Request cancellation of a few runs that have not settled yet (pending or running)."""
    chosen = []
    for i in range(n_runs - 1, -1, -7):
        run_id = f"{prefix}{i:04d}"
        outcome = store.runs.request_cancel(run_id, store.clock.now_ms())
        if type(outcome).__name__ == "CancelRequested":
            chosen.append(run_id)
        if len(chosen) >= 8:
            break
    return chosen


def _takeovers(store: Any, prefix: str, n_runs: int, companion_stream: Any) -> list[str]:
    stolen = []
    for i in range(n_runs):
        run_id = f"{prefix}{i:04d}"
        page = store.journal.entries(companion_stream(run_id), event_types=["flows.consensus.stolen"])
        if page.entries:
            stolen.append(run_id)
    return stolen


def _all_runs(store: Any) -> list[Any]:
    out, cursor = [], None
    while True:
        page = store.feed.list_runs(None, cursor, 200)
        out += page.runs
        cursor = page.cursor
        if cursor is None:
            return out


def _projected(builder: Any, projection: Any) -> dict[str, str]:
    from sqlalchemy import select

    t = projection.table
    return dict(builder.target.read(lambda conn: [tuple(r) for r in conn.execute(select(t.c.run_id, t.c.status))]))


