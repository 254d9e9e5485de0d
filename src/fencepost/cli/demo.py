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
import threading
import time
import uuid
from collections import Counter
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fencepost.cli._common import CliContext, console, echo_error, table

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
@click.option("--speed", default=10.0, show_default=True, type=click.FloatRange(1.0, 100.0),
              help="How much faster demo time runs than wall time (lease expiry takes 30 s of demo time).")
@click.option("--timeout", default=55.0, show_default=True, type=click.FloatRange(5.0),
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
    from fencepost.cli.worker import spawn_workers
    from fencepost.journal import companion_stream
    from fencepost.projections import ProjectionBuilder, RunsByStatus

    started = time.monotonic()
    url = obj.resolved_url
    base = time.time_ns() // 1_000_000
    clock = ScaledClock(base, speed)
    prefix = f"demo-{uuid.uuid4().hex[:6]}-"
    store = fencepost.open(url, clock=clock)
    obj._store = store  # closed by the group with everything else
    console.print(f"[bold]fencepost demo[/bold] on {redact_url(url)}  (runs {prefix}*)")
    console.print(f"demo time runs {speed:g}x faster than wall time: the 30 s lease expires in "
                  f"~{30 / speed:.1f} s; stamps are demo time")

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        task = progress.add_task("creating runs", total=n_runs)
        rng = random.Random(7)
        for i in range(n_runs):
            state = {"flowName": "demo", "n": i, "steps": rng.randint(2, 5), "done": 0}
            if i % 50 == 49:
                state["fail"] = True
            store.runs.create(f"{prefix}{i:04d}", _dumps(state))
            progress.advance(task)

        builder = ProjectionBuilder(store, url, RunsByStatus(), lock_timeout=10.0)
        stop_projection = threading.Event()
        projector = threading.Thread(target=builder.run, args=(stop_projection,), daemon=True)
        projector.start()

        procs = spawn_workers(url, n_workers, task=DEMO_TASK, concurrency=4, clock_spec=(base, speed), prefix=prefix,
                              log_level="ERROR")
        victim = None
        console.print(f"started {n_workers} worker processes: pids {', '.join(str(p.pid) for p in procs)}")
        work = progress.add_task("settling runs", total=n_runs)
        killed: list[str] = []
        cancelled_ids: list[str] = []
        cancel_done = False
        deadline = started + timeout
        timed_out = True
        interrupted = False
        try:
            while time.monotonic() < deadline:
                counts = _status_counts(store, prefix)
                settled = sum(counts[s] for s in TERMINAL)
                progress.update(work, completed=settled)
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
                        progress.console.print(f"[red]SIGKILLed worker {victim.pid}[/red] holding {len(held)} run(s): "
                                               f"{', '.join(held)}; a peer takes them over once the lease expires")
                if not cancel_done and settled >= n_runs // 3:
                    cancel_done = True
                    cancelled_ids = _cancel_some(store, prefix, n_runs)
                    progress.console.print(f"requested cancellation of {len(cancelled_ids)} run(s)")
                if settled >= n_runs:
                    timed_out = False
                    break
                if not any(p.is_alive() for p in procs):
                    progress.console.print("[red]every worker process exited[/red]")
                    timed_out = False
                    break
                time.sleep(0.1)
        except KeyboardInterrupt:
            # Ctrl-C: stop gracefully below (workers park what they hold), then exit 130.
            interrupted = True
        finally:
            # Never leave worker processes behind, whatever happened above.
            for p in procs:
                if p.is_alive():
                    p.terminate()
            for p in procs:
                p.join(10)

    stop_projection.set()
    projector.join(10)
    if interrupted:
        builder.close()
        echo_error("interrupted: the workers were stopped (runs in hand were parked suspended)")
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
    builder.close()

    table("runs by status", ["status", "runs"], sorted(counts.items()))
    if killed and victim is not None:
        console.print(f"takeovers: {len(takeovers)} run(s) stolen after worker {victim.pid} was killed"
                      + (f" ({', '.join(takeovers[:6])}{', ...' if len(takeovers) > 6 else ''})" if takeovers else ""))
    else:
        console.print("[red]no worker was killed: none held a run once a fifth of the runs had settled[/red]")
    console.print(f"journal verified: {'[green]yes[/green]' if ok else '[red]NO[/red]'}")
    console.print(f"projection runs_by_status in step with the source: "
                  f"{'[green]yes[/green]' if in_step else '[red]NO[/red]'} "
                  f"(revision {final.revision}, lag {status.lag}, {len(projected)} rows)")
    console.print(f"finished in {time.monotonic() - started:.1f} s. Explore: fencepost runs list, "
                  f"fencepost runs show {prefix}0000, fencepost journal show {prefix}0000 --companion, "
                  "fencepost feed tail, fencepost projection status, fencepost ui (live web console)")
    unsettled = n_runs - sum(counts[s] for s in TERMINAL)
    if timed_out:
        echo_error(f"timed out after {timeout:g} s (--timeout) with {unsettled} of {n_runs} run(s) unsettled")
        raise SystemExit(1)
    if unsettled or not ok or not in_step or not killed:
        raise SystemExit(1)


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


