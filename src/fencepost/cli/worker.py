"""``fencepost worker``: run N worker processes on a database until interrupted (or idle)."""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import click
import msgspec

from fencepost._printable import one_line, printable
from fencepost.cli._common import (
    CliContext,
    StopRelay,
    echo_error,
    err_console,
    error_text,
    fail,
    stop_on_signals,
    table,
    write_store,
)
from fencepost.cli._output import redacted_first_line


def load_task(ref: str, import_dir: str | None = None) -> Any:
    """Import ``module:function`` the way ``python -m`` does: the current folder first on the path.

    A bad reference is a usage error that shows the import's own error text, not a traceback.
    ``import_dir`` (default: the current folder) is put first on ``sys.path`` if it is not there.
    """
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise click.BadParameter("expected module:function", param_hint="--task")
    folder = os.path.abspath(import_dir if import_dir is not None else os.getcwd())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # ImportError, or whatever the module raised (or exited) importing
        if isinstance(exc, (ImportError, TypeError)) and _looks_like_a_path(module_name, folder):
            raise click.BadParameter(_module_name_wanted(module_name, attr), param_hint="--task") from None
        raise click.BadParameter(f"cannot import module {module_name!r}: {type(exc).__name__}: "
                                 f"{redacted_first_line(exc, 'no message')}", param_hint="--task") from None
    try:
        fn = getattr(module, attr)
    except AttributeError:
        raise click.BadParameter(f"module {module_name!r} has no attribute {attr!r}", param_hint="--task") from None
    from fencepost.worker import fn_problem

    problem = fn_problem(fn)
    if problem:
        raise click.BadParameter(f"{ref!r} {problem}", param_hint="--task")
    return fn


def _looks_like_a_path(module_name: str, folder: str) -> bool:
    """``./mytasks`` (a slash), or ``mytasks.py`` naming a file in ``folder``: a file path where a
    module name belongs. ``pkg.py`` with no such file is a module name (a submodule ``py`` of
    ``pkg``), whose own import error is the one to show."""
    if "/" in module_name or os.sep in module_name:
        return True
    return module_name.endswith(".py") and os.path.isfile(os.path.join(folder, module_name))


def _module_name_wanted(module_name: str, attr: str) -> str:
    """The usage error for a file path given as the module: the module name to give instead, and the
    folder to run from when the path named one."""
    folder, _, file = module_name.replace(os.sep, "/").rpartition("/")
    name = file[:-3] if file.endswith(".py") else file
    where = "" if folder in ("", ".") else f", from the folder {folder!r} (or with it on PYTHONPATH)"
    return f"give a module name, not a file path: --task {name}:{attr}{where}"


class TerminalSafeFormatter(logging.Formatter):
    """Log lines for the operator's terminal, showing stored text as a table does: the record's run
    id (given as ``extra={"run_id": ...}`` and as an argument) as an identifier (``one_line``: a
    newline in it can forge no log line), the rest of the line with control and invisible characters
    escaped (``printable``: a traceback keeps its line ends)."""

    def format(self, record: logging.LogRecord) -> str:
        run_id = getattr(record, "run_id", None)
        if isinstance(run_id, str) and isinstance(record.args, tuple) and run_id in record.args:
            record = logging.makeLogRecord(record.__dict__)
            record.args = tuple(one_line(a) if a == run_id else a for a in record.args)  # type: ignore[union-attr]
        return printable(super().format(record))


def worker_process(url: str | dict[str, str], task: str, concurrency: int, until_idle: bool,
                   clock_spec: tuple[int, float] | None, prefix: str | None, results: Any,
                   log_level: str = "WARNING", liveness: str = "lease", import_dir: str | None = None) -> None:
    """Entry point of one worker process: open the store, work until SIGTERM/SIGINT (or idle)."""
    import logging

    import fencepost

    logging.basicConfig(level=log_level, format=f"%(asctime)s worker {os.getpid()} %(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:
        handler.setFormatter(TerminalSafeFormatter(handler.formatter._fmt if handler.formatter else None))
    from fencepost.cli.demo import ScaledClock
    from fencepost.runstore.liveness import same_host_pid_probe
    from fencepost.worker import Worker

    stop = threading.Event()
    relay = StopRelay(stop)  # a handler that sets the event itself can deadlock on a second signal
    signal.signal(signal.SIGTERM, relay.trigger)
    signal.signal(signal.SIGINT, relay.trigger)
    threading.Thread(target=_stop_when_orphaned, args=(os.getppid(), stop), daemon=True,
                     name="fencepost-worker-parent").start()
    clock = ScaledClock(*clock_spec) if clock_spec else None
    # One URL: one store. A mapping of name to URL: a shard set, which the Worker sweeps shard by shard.
    try:
        opened = fencepost.open_shards(url, clock=clock) if isinstance(url, dict) else fencepost.open(url, clock=clock)
        with opened as store:
            check = same_host_pid_probe if liveness == "pid" else None
            worker = Worker(store, load_task(task, import_dir), concurrency=concurrency, run_prefix=prefix,
                            liveness=check)
            stats = worker.run(stop, until_idle=until_idle)
    except fencepost.FencepostError as exc:
        # The process ends as a command does: one Error: line (naming the shard that failed, over a
        # set), exit 1, no traceback; the command then reports the process's exit code.
        echo_error(error_text(exc) if exc.store is None else f"shard {exc.store}: {error_text(exc)}")
        raise SystemExit(1) from None
    if results is not None:
        results.put((os.getpid(), msgspec.json.encode(stats)))


#: Seconds between a worker process's checks that the command that started it is still there.
PARENT_POLL_S = 0.5


def _stop_when_orphaned(parent: int, stop: threading.Event) -> None:
    """Stop gracefully (as on SIGTERM) once the process that started this one is gone: killed with
    SIGKILL, it could neither stop this process nor collect its report, and an orphaned worker would
    go on claiming runs for good."""
    import logging

    while not stop.wait(PARENT_POLL_S):
        if os.getppid() != parent:
            logging.getLogger("fencepost.worker").warning(
                "the process that started this worker (pid %d) is gone; stopping", parent)
            stop.set()
            return


def spawn_workers(url: str | dict[str, str], n: int, *, task: str, concurrency: int = 4, until_idle: bool = False,
                  clock_spec: tuple[int, float] | None = None, prefix: str | None = None,
                  results: Any = None, log_level: str = "WARNING", liveness: str = "lease",
                  started: list[Any] | None = None, cancelled: Any = None) -> list[Any]:
    """Start ``n`` worker processes (spawned, so each opens its own connections).

    Each imports ``task`` with this process's current folder first on its path. Each process is
    appended to ``started`` (when given) as soon as it runs, so a signal handler can stop the ones
    already started; ``cancelled()`` (when given) returning True stops starting more.
    """
    ctx = multiprocessing.get_context("spawn")
    import_dir = os.getcwd()
    procs = started if started is not None else []
    try:
        for i in range(n):
            if cancelled is not None and cancelled():
                break
            p = ctx.Process(target=worker_process, name=f"fencepost-worker-{i}",
                            args=(url, task, concurrency, until_idle, clock_spec, prefix, results, log_level,
                                  liveness, import_dir))
            # A new process starts with Ctrl-C ignored (the disposition survives exec) until
            # worker_process installs its graceful handler: a Ctrl-C while it is still importing
            # must not kill it mid-import with a traceback; this process stops it instead. Ignored
            # here only while the process starts, and blocked meanwhile: Linux keeps a blocked
            # signal pending even while it is ignored, so a Ctrl-C in that moment reaches this
            # process once its own handler is back (it used to be ignored for the whole loop, and
            # a Ctrl-C then was lost: the workers went on).
            held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if _main_thread() else None
            try:
                p.start()
                procs.append(p)
            finally:
                if previous is not None:
                    signal.signal(signal.SIGINT, previous)
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
    except BaseException:
        # One failed to start (or Ctrl-C came while starting them): stop those already running, which
        # the caller never learns of and multiprocessing would otherwise wait on at interpreter exit.
        stop_workers(procs, grace=10.0)
        raise
    return procs


def stop_workers(procs: list[Any], grace: float | None = None) -> None:
    """Stop worker processes: SIGTERM each live one (runs in hand finish or are parked suspended),
    wait for them (at most ``grace`` seconds when given), then SIGKILL what is left, whose leases
    simply expire. A Ctrl-C while waiting kills them too, and propagates once they are gone."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = None if grace is None else time.monotonic() + grace
    try:
        for p in procs:
            p.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    finally:
        # Every one is sent SIGKILL before any is waited for: a further Ctrl-C during a wait then
        # cuts short only the waiting, never the killing.
        left = [p for p in procs if p.is_alive()]
        for p in left:
            p.kill()
        for p in left:
            p.join()


#: Seconds between start-up attempts to reach a database that does not answer: doubling up to the last.
START_RETRY_S = (1.0, 2.0, 4.0, 8.0, 10.0)


def until_it_answers(attempt: Callable[[], None], stop: threading.Event) -> bool:
    """Run ``attempt()`` (opening the stores read-only) until it no longer fails transiently.

    True once it succeeded; False when ``stop`` was set first (the attempt in flight, perhaps
    waiting out a silent server's ``connect_timeout``, is abandoned on its daemon thread). A failure
    that waiting may cure (``OpenError.transient``: the server takes no connection or does not
    answer; another connection's lock held past the busy timeout) is retried with backoff, and
    printed on stderr once per change of state, the URL's password masked; any other is raised.
    """
    from fencepost.errors import waiting_may_cure

    shown: tuple[str, str] | None = None
    tried = 0
    while True:
        outcome: list[BaseException | None] = []
        thread = threading.Thread(target=_attempt, args=(attempt, outcome), daemon=True,
                                  name="fencepost-worker-start")
        thread.start()
        while thread.is_alive():
            if stop.wait(0.1):
                return False
        failure = outcome[0] if outcome else None
        if failure is None:
            if shown is not None:
                _say("the database answers: starting the workers")
            return True
        if not waiting_may_cure(failure):
            raise failure
        state = (failure.code, failure.detail)  # type: ignore[attr-defined]
        if state != shown:
            _say(f"waiting for the database: {error_text(failure)} (retrying until it answers; Ctrl-C to stop)")
            shown = state
        if stop.wait(START_RETRY_S[min(tried, len(START_RETRY_S) - 1)]):
            return False
        tried += 1


def _attempt(attempt: Callable[[], None], outcome: list[BaseException | None]) -> None:
    try:
        attempt()
    except BaseException as exc:  # handed to the waiting thread, which raises it there
        outcome.append(exc)
    else:
        outcome.append(None)


def _say(line: str) -> None:
    # A line stderr cannot take (a pipe nobody reads any more) is dropped by err_console itself.
    err_console.print(line, soft_wrap=not err_console.is_terminal, markup=False, highlight=False)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@click.command()
@click.option("-n", "--processes", default=2, show_default=True, type=click.IntRange(1, 64),
              help="Worker processes to start.")
@click.option("--concurrency", default=4, show_default=True, type=click.IntRange(1, 256),
              help="Runs each process works on at once.")
@click.option("--task", required=True, metavar="MODULE:FUNCTION",
              help="The run function (required), imported like python -m does, the current folder first: "
                   "called with a RunContext; its return value settles the run completed, an exception "
                   "settles it failed and records why (see runs show).")
@click.option("--until-idle", is_flag=True, help="Exit once no run is claimable or running.")
@click.option("--log-level", default="warning", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
              help="Log level of the worker processes (logs go to stderr).")
@click.option("--liveness", type=click.Choice(["lease", "pid"]), default="lease", show_default=True,
              help="How an expired owner is judged gone: its stale lease alone, or also a same-host pid probe.")
@click.pass_obj
def worker(obj: CliContext, processes: int, concurrency: int, task: str, until_idle: bool, log_level: str,
           liveness: str) -> None:
    """Run worker processes that claim, heartbeat, checkpoint and settle runs.

    --task names your run function as module:function; run from the folder that holds the module
    (or have it on PYTHONPATH). When the function raises, the run settles failed with the exception's
    type, message and traceback recorded (redacted); fencepost runs show ID prints them.

    A database that does not answer yet (its server not started, not accepting connections, or
    silent; a SQLite file another connection holds) is waited for, saying so on stderr, before any
    process starts; one that can never open (no such store, refused credentials) is an error at once.

    Stops on Ctrl-C (exit 130) or SIGTERM (exit 0): runs in hand finish, or are parked suspended at
    their next check and resumed later from their last checkpoint; a second Ctrl-C kills the
    processes. With --until-idle it exits once nothing is left to do. Prints what each process did,
    one row per process started: its counts and its state (worked; stopped-before-start, with zero
    counts, for one a stop ended while it was still starting, before it took any run; killed-by-SIGNAL
    or exit-code-N, with unknown counts shown as -, for one that ended without reporting; unknown,
    counts -, for one not seen to end, when a repeated Ctrl-C cut short the wait for it).

    Given several --db (or --shards), they are one shard set: every process sweeps every shard and
    settles each run on its own shard. Empty stores that record no set found one (as with init).

    Example: fencepost worker -n 4 --task mytasks:work --until-idle
    """
    import fencepost

    load_task(task)  # refuse a bad reference before starting anything
    # A host may start the worker before its database (a service manager, containers): wait for
    # every store to answer, as the console does; a failure waiting cannot cure exits at once.
    urls = [spec.url for spec in obj.specs] if obj.several else [obj.url]
    def open_each() -> None:
        for url in urls:
            fencepost.open(url, readonly=True).close()

    with stop_on_signals() as stop:
        answered = until_it_answers(open_each, stop)
    if not answered:
        return  # stopped while waiting: SIGTERM exits 0 (Ctrl-C exited 130 above)
    # Every store must already exist (as for runs create): a mistyped --db is an error naming
    # fencepost init instead of a new empty store.
    target: str | dict[str, str]
    if obj.several:
        for spec in obj.specs:
            fencepost.open(spec.url, readonly=True).close()
        # A shard set: found (or check) it once, then every process opens the set and sweeps every shard.
        shards = obj.shard_set(readonly=False, create=True)
        target = {name: store.db.url for name, store in shards.items()}
    else:
        write_store(create=False)  # proves it exists, then that it opens writable, before any process starts
        obj.close()
        target = obj.resolved_url
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs: list[Any] = []
    terminated: list[bool] = []

    def on_sigterm(*_: object) -> None:
        # Installed before the first process starts: a SIGTERM while they are being started stops
        # those already running and starts no more (it no longer killed this process alone,
        # leaving them working with nobody to stop them).
        first = not terminated
        terminated.append(True)
        for p in procs:
            p.terminate()  # a no-op for one that already ended
        if first:
            _say(STOPPING)  # after the processes were told: a line that cannot be written stops nothing

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    interrupted = False
    try:
        spawn_workers(target, processes, task=task, concurrency=concurrency, until_idle=until_idle,
                      results=results, log_level=log_level.upper(), liveness=liveness, started=procs,
                      cancelled=lambda: bool(terminated))
        if terminated:  # one may have started between the handler's loop and being listed
            on_sigterm()
        for p in procs:
            p.join()
    except KeyboardInterrupt:
        # Ctrl-C: ask every process to stop gracefully; a second Ctrl-C kills them, also one that
        # comes while the stop is being announced (a fast double Ctrl-C, ``timeout -s INT``).
        interrupted = True
        again = False
        try:
            _say(f"{STOPPING}; Ctrl-C again kills the worker processes")
        except KeyboardInterrupt:
            again = True
        with contextlib.suppress(KeyboardInterrupt):
            stop_workers(procs, grace=0 if again else None)
    finally:
        signal.signal(signal.SIGTERM, previous)
    # After a SIGTERM (or a Ctrl-C, which stop_workers turns into one), a process that ended by it
    # stopped as asked: it was still starting, before its graceful handler was installed, so it had
    # taken no run.
    stopped = bool(terminated) or interrupted
    # Once stopped by Ctrl-C every process is gone: a further one no longer cuts the summary short.
    quiet = signal.signal(signal.SIGINT, signal.SIG_IGN) if interrupted and _main_thread() else None
    try:
        table("workers", [*COUNTS, "state"], _summary(procs, results, stopped))
    finally:
        if quiet is not None:
            signal.signal(signal.SIGINT, quiet)
    if interrupted:
        raise SystemExit(130)
    clean = (0, None, -signal.SIGTERM) if terminated else (0, None)
    failed = [p for p in procs if p.exitcode not in clean]
    if failed:
        # The reason is the command's one Error: line on stderr, as for every failure (the table
        # on stdout already shows each process's state).
        said = []
        for p in failed:
            code = p.exitcode
            if code is not None and code < 0:
                how = f"was killed by {_signal_name(-code)}"
            else:
                how = f"exited abnormally (exit code {code})"
            said.append(f"worker process {p.pid} {how}")
        raise fail("; ".join(said))


#: Said on stderr when a stop is asked for: a run function that does not call check() keeps its
#: process running until it returns, and the command would otherwise sit silent meanwhile.
STOPPING = "stopping: runs in hand finish, or are parked suspended at their next check"


#: The summary's columns before ``state``: a process's pid, then the counts its ``WorkerStats`` reports.
COUNTS = ("pid", "claimed", "takeovers", "completed", "failed", "cancelled", "suspended", "lost")


def _summary(procs: list[Any], results: Any, stopped: bool) -> list[tuple[Any, ...]]:
    """One row per started process, by pid: the counts it reported (state ``worked``); zero counts
    for one a stop ended while it was still starting (``stopped-before-start``: it had taken no
    run); unknown counts (``-``) for one that ended without reporting otherwise (its exit code or
    signal as the state, ``unknown`` when it was not seen to end)."""
    reported: dict[int, dict[str, Any]] = {}
    while not results.empty():
        pid, raw = results.get()
        reported[pid] = msgspec.json.decode(raw)
    rows: list[tuple[Any, ...]] = []
    for pid in sorted({*reported, *(p.pid for p in procs if p.pid is not None)}):
        if pid in reported:
            rows.append((pid, *(reported[pid][k] for k in COUNTS[1:]), "worked"))
            continue
        code = next(p.exitcode for p in procs if p.pid == pid)
        if stopped and code == -signal.SIGTERM:
            rows.append((pid, *(0 for _ in COUNTS[1:]), "stopped-before-start"))
        else:
            if code is None:
                # Never seen to end: a Ctrl-C cut short the last wait for it (after stop_workers'
                # kill), so neither a signal nor an exit code is known.
                state = "unknown"
            elif code < 0:
                state = f"killed-by-{_signal_name(-code)}"
            else:
                state = f"exit-code-{code}"
            rows.append((pid, *(None for _ in COUNTS[1:]), state.replace(" ", "-")))
    return rows


def _signal_name(number: int) -> str:
    """``SIGKILL`` for 9; the number for a signal this platform has no name for."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
