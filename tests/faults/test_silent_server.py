"""A PostgreSQL server that accepts the connection and never answers is an outage, not a refused login.

Defect: such a server (something listening that never replies, or a real postmaster that is
SIGSTOPped) was reported by ``fencepost.open`` as ``auth_failed``, which is permanent, so the
console, followers and workers gave up instead of waiting; and the open took about six
``connect_timeout``s (the diagnosis tried six more connections, each waiting out its timeout).
Now it is ``cannot_connect``, transient, saying the server did not answer within the timeout, after
the one connection. The faults are real: a listening socket that never replies, and a private
server (``started_private``, never the shared one) whose postmaster is stopped with SIGSTOP and
resumed with SIGCONT. PostgreSQL only: SQLite has no server that could fall silent.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import make_url

import fencepost
from fencepost import OpenError, RunStoreError
from fencepost.worker import Worker
from tests.changefeed.test_follow_server_restart import PrivateServer, started_private
from tests.cli.conftest import assert_one_line_error
from tests.conftest import SilentServer, run_in_background
from tests.faults.conftest import assert_value_free
from tests.worker.conftest import run_in_thread, stop_worker, wait_for

pytestmark = pytest.mark.slow
SECRET = "pw-Silent-31"
TIMEOUT_S = 2  # libpq's smallest connect_timeout (a URL's 1 is taken as 2)
ANSWER = f"did not answer within {TIMEOUT_S} s"


class SilentListener(SilentServer):
    """A TCP port that accepts every connection at once and never sends a byte; ``held`` counts
    what it accepted."""

    def __init__(self) -> None:
        super().__init__()
        self.listen()

    def url(self, timeout: int = 1) -> str:
        return f"postgresql://app:{SECRET}@127.0.0.1:{self.port}/app?connect_timeout={timeout}"


@pytest.fixture
def silent() -> Iterator[SilentListener]:
    listener = SilentListener()
    try:
        yield listener
    finally:
        listener.close()


def _open_fails(url: str) -> tuple[OpenError, float]:
    began = time.monotonic()
    with pytest.raises(OpenError) as err:
        fencepost.open(url).close()
    elapsed = time.monotonic() - began
    exc = err.value
    assert exc.__cause__ is None
    assert_value_free(exc)
    assert SECRET not in str(exc) and "***" in str(exc), exc
    return exc, elapsed


def test_a_listener_that_never_answers_is_cannot_connect_after_one_connection(silent: SilentListener) -> None:
    """Before: ``auth_failed`` (not transient) after six connections, 6 x connect_timeout (about 20 s
    here). Now: ``cannot_connect``, transient, saying the server did not answer within 2 s, after the
    one connection the open makes."""
    exc, elapsed = _open_fails(silent.url())
    assert (exc.code, exc.transient) == ("cannot_connect", True), exc
    assert ANSWER in str(exc) and "authentication" not in str(exc), exc
    assert len(silent.held) == 1, f"{len(silent.held)} connections, the diagnosis waited on each"
    assert elapsed < 3 * TIMEOUT_S, elapsed


def test_a_connect_that_timed_out_lets_its_socket_go_at_once(silent: SilentListener) -> None:
    """Before: psycopg kept the timed-out connect's frame, and with it the half-open connection, in
    a reference cycle through the error's traceback, so its socket to the silent server stayed open
    until Python's cycle collector happened to run (a console retrying every second held one more
    each time). Now the open's failure leaves nothing open, the cycle collector switched off."""
    gc.collect()
    gc.disable()
    try:
        exc, _elapsed = _open_fails(silent.url())
        assert exc.code == "cannot_connect", exc
        assert len(silent.held) == 1
        deadline = time.monotonic() + 2
        while silent.still_held() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not silent.still_held(), "the timed-out connection's socket is still open"
    finally:
        gc.enable()


def test_the_cli_says_the_server_did_not_answer(silent: SilentListener, run_cli) -> None:
    result = run_cli("--db", silent.url(), "runs", "list")
    assert_one_line_error(result)
    assert result.code == 1, result
    assert "cannot_connect" in result.err and ANSWER in result.err, result
    assert "authentication" not in result.err and SECRET not in result.err, result
    assert len(silent.held) == 1, result


class StoppableServer(PrivateServer):
    """A private server whose postmaster can be stopped (SIGSTOP) and resumed (SIGCONT): it then
    accepts connections (the kernel does) and answers none of them, its sessions already open
    still answer."""

    @property
    def postmaster(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def freeze(self) -> None:
        os.kill(self.postmaster, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.postmaster, signal.SIGCONT)


@pytest.fixture
def stoppable() -> Iterator[StoppableServer]:
    with started_private(StoppableServer, "fencepost-pg-silent", "the silent-server tests") as server:
        try:
            yield server
        finally:
            server.thaw()


def _url(server: PrivateServer) -> str:
    url = make_url(server.url).set(password=SECRET)
    return url.update_query_dict({"connect_timeout": "1"}).render_as_string(hide_password=False)


def test_a_stopped_postmaster_is_cannot_connect_and_the_same_open_succeeds_once_it_runs(
        stoppable: StoppableServer) -> None:
    url = _url(stoppable)
    fencepost.open(url).close()  # migrated while it answers
    stoppable.freeze()
    try:
        exc, elapsed = _open_fails(url)
        assert (exc.code, exc.transient) == ("cannot_connect", True), exc
        assert ANSWER in str(exc), exc
        assert elapsed < 3 * TIMEOUT_S, elapsed
    finally:
        stoppable.thaw()
    with fencepost.open(url) as store:
        store.runs.create("r1", "{}")


def test_an_open_store_whose_server_stops_answering_fails_new_connections_as_transient(
        stoppable: StoppableServer) -> None:
    """Its new connection times out: ``persistence_failed`` with ``transient`` (so a worker waits),
    saying the server did not answer, after one timeout (no second probe waiting its own).

    Defect: with group commit (the default) the leader's connection timed out, then the call ran
    again as a single write whose new connection waited a second ``connect_timeout``."""
    with fencepost.open(_url(stoppable)) as store:
        stoppable.freeze()
        try:
            store.db.dispose()  # the next call needs a new connection
            began = time.monotonic()
            with pytest.raises(RunStoreError) as err:
                store.runs.create("r1", "{}")
            elapsed = time.monotonic() - began
            assert (err.value.code, err.value.transient) == ("persistence_failed", True), err.value
            assert ANSWER in str(err.value) and SECRET not in str(err.value), err.value
            assert_value_free(err.value)
            assert elapsed < 1.9 * TIMEOUT_S, elapsed  # one connect_timeout (2 s), not two (4 s)
        finally:
            stoppable.thaw()
        store.runs.create("r1", "{}")
        assert store.runs.get("r1").run_id == "r1"


def test_concurrent_writes_of_an_open_store_whose_server_stops_answering_wait_one_timeout(
        stoppable: StoppableServer) -> None:
    """Defect: with group commit (the default), writes of several threads queued behind the group's
    leader, whose new connection waited its whole ``connect_timeout``; then the next queued call
    led, its own new connection waited another, and so on: the last of four concurrent writes
    failed after four timeouts. Now the leader's failure after the whole wait answers the calls
    queued behind it as well (nothing of them ran): each fails transient after about one timeout."""
    with fencepost.open(_url(stoppable)) as store:
        stoppable.freeze()
        waited: dict[int, float] = {}
        failures: dict[int, BaseException] = {}

        def write(i: int) -> None:
            began = time.monotonic()
            try:
                store.runs.create(f"r{i}", "{}")
            except RunStoreError as exc:
                failures[i] = exc
            waited[i] = time.monotonic() - began

        try:
            store.db.dispose()  # every call needs a new connection
            threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(8 * TIMEOUT_S)
            assert sorted(failures) == list(range(4)), (failures, waited)
            for exc in failures.values():
                assert (exc.code, exc.transient) == ("persistence_failed", True), exc  # type: ignore[attr-defined]
                assert ANSWER in str(exc) and SECRET not in str(exc), exc
                assert_value_free(exc)
            assert max(waited.values()) < 1.9 * TIMEOUT_S, waited  # one connect_timeout (2 s), not four (8 s)
        finally:
            stoppable.thaw()
        store.runs.create("r1", "{}")
        assert store.runs.get("r1").run_id == "r1"


def test_a_worker_mid_run_waits_out_a_server_that_stopped_answering(stoppable: StoppableServer) -> None:
    """Before: the checkpoint's new connection timed out as a permanent failure, so the run failed.
    Now the worker retries it as an outage and the run succeeds once the server answers."""
    with fencepost.open(_url(stoppable)) as store:
        store.runs.create("r1", "{}")
        running, go = threading.Event(), threading.Event()
        seen: list[BaseException] = []

        def fn(ctx):
            running.set()
            go.wait(30)
            try:
                ctx.checkpoint({"v": 1})
            except BaseException as exc:
                seen.append(exc)
                raise

        worker = Worker(store, fn, concurrency=1)
        stop = threading.Event()
        t, outcome = run_in_thread(worker, stop)
        try:
            assert running.wait(20)
            stoppable.freeze()
            try:
                store.db.dispose()  # every connection the worker kept is gone: it needs new ones
                go.set()
                time.sleep(2.5 * TIMEOUT_S)  # the checkpoint meets at least one timeout
            finally:
                stoppable.thaw()
            assert wait_for(lambda: store.runs.get("r1").status == "completed", 30), store.runs.get("r1")
        finally:
            go.set()
            stop_worker(t, stop, outcome, 30)
        assert seen == [], seen


def test_a_follower_waits_out_a_server_that_stopped_answering(stoppable: StoppableServer) -> None:
    """A follower whose store needs a new connection while the postmaster is stopped keeps trying
    (each try now ends after one connect_timeout) and delivers what was written meanwhile, once."""
    url = _url(stoppable)
    writer, follower_store = fencepost.open(url), fencepost.open(url)
    seen: list[str] = []
    stop = threading.Event()

    def follow() -> None:
        for change in follower_store.feed.follow(stop=stop, poll_interval=0.5):
            seen.append(change.run_id)

    thread, errors = run_in_background(follow)
    try:
        writer.runs.create("before", "{}")
        assert wait_for(lambda: "before" in seen, 20), seen
        stoppable.freeze()
        try:
            follower_store.db.dispose()  # its next page needs a new connection
            writer.runs.create("during", "{}")  # on the writer's open session, which still answers
            time.sleep(2.5 * TIMEOUT_S)
            assert "during" not in seen
        finally:
            stoppable.thaw()
        assert wait_for(lambda: "during" in seen, 30), seen
    finally:
        stop.set()
        thread.join(15)
        writer.close()
        follower_store.close()
    assert not errors and not thread.is_alive(), errors
    assert seen == ["before", "during"], seen


def test_the_console_starts_with_its_server_silent_and_picks_it_up(stoppable: StoppableServer) -> None:
    """Before: ``fencepost ui`` refused to start (``auth_failed``). Now the store is served as down
    (``cannot_connect``) and opened once the postmaster runs again."""
    from tests.ui.test_cli import _get_when_up, _serve, _stop

    url = _url(stoppable)
    with fencepost.open(url) as store:
        store.runs.create("late-1", '{"flowName": "f"}')
    stoppable.freeze()
    proc, console = _serve("ui", "--db", url, "--port", "0")
    try:
        try:
            down = _get_when_up(console + "/health.json")
        finally:
            stoppable.thaw()
        deadline = time.monotonic() + 30
        up = httpx.get(console + "/", timeout=10)
        while up.status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
            up = httpx.get(console + "/", timeout=10)
    finally:
        code, err = _stop(proc)
    assert down.status_code == 503 and down.json()["error"] == "cannot_connect", down.text
    assert SECRET not in down.text
    assert up.status_code == 200 and 'data-run-id="late-1"' in up.text, up.text[:500]
    assert code == 130, err
    assert "auth_failed" not in err and SECRET not in err, err
