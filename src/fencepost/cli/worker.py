"""``fencepost worker``: run N worker processes on a database until interrupted (or idle)."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import threading
from typing import Any

import click
import msgspec

from fencepost.cli._common import CliContext, console, table

DEFAULT_TASK = "fencepost.cli.demo:demo_task"


def load_task(ref: str) -> Any:
    """Import ``module:function``; a bad reference is a usage error, not a traceback."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise click.BadParameter("expected module:function", param_hint="--task")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError):
        raise click.BadParameter("cannot import that function", param_hint="--task") from None
    if not callable(fn):
        raise click.BadParameter("not callable", param_hint="--task")
    return fn


def worker_process(url: str, task: str, concurrency: int, until_idle: bool, clock_spec: tuple[int, float] | None,
                   prefix: str | None, results: Any, log_level: str = "WARNING", liveness: str = "lease") -> None:
    """Entry point of one worker process: open the store, work until SIGTERM/SIGINT (or idle)."""
    import logging

    import fencepost

    logging.basicConfig(level=log_level, format=f"%(asctime)s worker {os.getpid()} %(levelname)s %(message)s")
    from fencepost.cli.demo import ScaledClock
    from fencepost.runstore.liveness import same_host_pid_probe
    from fencepost.worker import Worker

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    clock = ScaledClock(*clock_spec) if clock_spec else None
    with fencepost.open(url, clock=clock) as store:
        check = same_host_pid_probe if liveness == "pid" else None
        worker = Worker(store, load_task(task), concurrency=concurrency, run_prefix=prefix, liveness=check)
        stats = worker.run(stop, until_idle=until_idle)
    if results is not None:
        results.put((os.getpid(), msgspec.json.encode(stats)))


def spawn_workers(url: str, n: int, *, task: str = DEFAULT_TASK, concurrency: int = 4, until_idle: bool = False,
                  clock_spec: tuple[int, float] | None = None, prefix: str | None = None,
                  results: Any = None, log_level: str = "WARNING", liveness: str = "lease") -> list[Any]:
    """Start ``n`` worker processes (spawned, so each opens its own connections)."""
    ctx = multiprocessing.get_context("spawn")
    procs = []
    for i in range(n):
        p = ctx.Process(target=worker_process, name=f"fencepost-worker-{i}",
                        args=(url, task, concurrency, until_idle, clock_spec, prefix, results, log_level,
                              liveness))
        p.start()
        procs.append(p)
    return procs


@click.command()
@click.option("-n", "--processes", default=2, show_default=True, type=click.IntRange(1, 64),
              help="Worker processes to start.")
@click.option("--concurrency", default=4, show_default=True, type=click.IntRange(1, 256),
              help="Runs each process works on at once.")
@click.option("--task", default=DEFAULT_TASK, show_default=True, metavar="MODULE:FUNCTION",
              help="The run function: called with a RunContext; its return value settles the run.")
@click.option("--until-idle", is_flag=True, help="Exit once no run is claimable or running.")
@click.option("--log-level", default="WARNING", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Log level of the worker processes (logs go to stderr).")
@click.option("--liveness", type=click.Choice(["lease", "pid"]), default="lease", show_default=True,
              help="How an expired owner is judged gone: its stale lease alone, or also a same-host pid probe.")
@click.pass_obj
def worker(obj: CliContext, processes: int, concurrency: int, task: str, until_idle: bool, log_level: str,
           liveness: str) -> None:
    """Run worker processes that claim, heartbeat, checkpoint and settle runs.

    Stops on Ctrl-C or SIGTERM (runs in hand finish, or are parked suspended at their next check and
    resumed later from their last checkpoint), or with --until-idle once nothing is left to do.
    Prints what each process did.

    Example: fencepost worker -n 4 --until-idle
    """
    import fencepost

    load_task(task)  # refuse a bad reference before starting anything
    fencepost.open(obj.url).close()  # create and migrate once, before the processes race to
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = spawn_workers(obj.resolved_url, processes, task=task, concurrency=concurrency,
                          until_idle=until_idle, results=results,
                          log_level=log_level.upper(), liveness=liveness)
    previous = signal.signal(signal.SIGTERM, lambda *_: [p.terminate() for p in procs])
    try:
        for p in procs:
            p.join()
    except KeyboardInterrupt:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
    rows = []
    while not results.empty():
        pid, raw = results.get()
        s = msgspec.json.decode(raw)
        rows.append((pid, s["claimed"], s["takeovers"], s["completed"], s["failed"], s["cancelled"],
                     s["suspended"], s["lost"]))
    table("workers", ["pid", "claimed", "takeovers", "completed", "failed", "cancelled", "suspended", "lost"],
          sorted(rows))
    failed = [p for p in procs if p.exitcode not in (0, None)]
    if failed:
        console.print(f"[red]{len(failed)} worker process(es) exited abnormally[/red]")
        raise SystemExit(1)
