"""Races between the connection pool's reclaim of idle threads' connections and the connections
that must not be taken back or that wait for a checkout. Real threads, real databases.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy.engine import make_url

import fencepost
from fencepost import _durable
from fencepost.errors import ProjectionError
from fencepost.projections._lock import BuilderLock
from tests.conftest import run_forked

SMALL = (2, 6)  # a pool of 8 connections
DEADLINE = 20.0
POOL_WAIT_BOUND = 10.0  # far below SQLAlchemy's own pool wait (30 s)


@pytest.fixture
def small_pool_url(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(_durable, "POOL_SIZE", SMALL[0], raising=False)
    monkeypatch.setattr(_durable, "POOL_OVERFLOW", SMALL[1], raising=False)
    yield db_url


class _Parked:
    """Threads that each read once (keeping their connection) and then sit idle until stopped:
    ``count`` of them, or (``count`` None) as many as fill the store's pool."""

    def __init__(self, store: fencepost.Store, count: int | None) -> None:
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        pool = store.db.engine.pool
        limit = sum(SMALL)

        def park(ready: threading.Event) -> None:
            try:
                store.db.read(lambda c: c.exec_driver_sql("SELECT 1").scalar())
            except Exception as exc:  # reported by the test
                self.errors.append(repr(exc))
            ready.set()
            self._stop.wait(DEADLINE * 3)

        while (len(self._threads) < count) if count is not None else (pool.checkedout() < limit):  # type: ignore[attr-defined]
            ready = threading.Event()
            t = threading.Thread(target=park, args=(ready,), daemon=True)
            t.start()
            self._threads.append(t)
            assert ready.wait(DEADLINE)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(DEADLINE)


@pytest.mark.parametrize("backend", ["postgresql"])
def test_builder_lock_survives_pool_exhaustion_and_reclaim(small_pool_url: str) -> None:
    """PostgreSQL only: the builder's lock is a session advisory lock on a connection of its own
    (SQLite's is an ``flock`` beside the file, no connection involved).

    The lock's connection came from the store's pool but outside the reclaim path: with every
    pooled connection kept by an idle thread, taking the lock waited the pool's own 30 s and then
    failed with SQLAlchemy's bare TimeoutError; and it held one of the pool's connections for the
    builder's whole life."""
    store = fencepost.open(small_pool_url)
    other = fencepost.open(small_pool_url)
    parked = _Parked(store, None)
    lock = BuilderLock(store.db, "proj")
    try:
        assert parked.errors == []
        assert store.db.engine.pool.checkedout() == sum(SMALL)  # type: ignore[attr-defined]
        lock.acquire(0)  # the pool is full of idle threads' kept connections
        assert lock.held
        # More threads than the pool holds come and go, taking back idle connections.
        more = _Parked(store, sum(SMALL) * 2)
        more.stop()
        assert more.errors == []
        lock.acquire(0)  # still held: the same session
        with pytest.raises(ProjectionError) as caught:
            BuilderLock(other.db, "proj").acquire(0)
        assert caught.value.code == "builder_busy"
    finally:
        parked.stop()
        lock.release()
        other.close()
        store.close()
    # Released: another builder takes the name at once.
    again = fencepost.open(small_pool_url)
    try:
        second = BuilderLock(again.db, "proj")
        second.acquire(0)
        second.release()
    finally:
        again.close()


class _HoldingProxy:
    """A TCP proxy to the PostgreSQL server that, once ``hold`` is set, keeps new connections
    waiting (a server that does not answer) until ``wanted`` of them wait at once (or ``free``)."""

    def __init__(self, target: tuple[str, int], wanted: int) -> None:
        self._target = target
        self._wanted = wanted
        self._lock = threading.Lock()
        self._waiting: list[socket.socket] = []
        self.hold = False
        self.most_waiting = 0
        self.reached = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if not self.hold:
                    self._forward(client)
                    continue
                self._waiting.append(client)
                self.most_waiting = max(self.most_waiting, len(self._waiting))
                if len(self._waiting) >= self._wanted:
                    self.reached.set()
                    self._free_locked()

    def free(self) -> None:
        with self._lock:
            self._free_locked()

    def _free_locked(self) -> None:
        self.hold = False
        for client in self._waiting:
            self._forward(client)
        self._waiting = []

    def _forward(self, client: socket.socket) -> None:
        server = socket.create_connection(self._target)

        def pump(src: socket.socket, dst: socket.socket) -> None:
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        threading.Thread(target=pump, args=(client, server), daemon=True).start()
        threading.Thread(target=pump, args=(server, client), daemon=True).start()

    def close(self) -> None:
        self.free()
        self._listener.close()


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_connect_to_a_server_that_does_not_answer_does_not_hold_up_other_threads(db_url: str) -> None:
    """PostgreSQL only: a SQLite connect opens a local file and does not wait on a server.

    Every checkout ran under one lock, including the connect of a new connection: while a server
    did not answer (up to ``connect_timeout``, 10 s by default), every other thread's checkout
    waited behind it, so N threads starting together failed one ``connect_timeout`` after another.
    The proxy keeps new connections waiting until ``wanted`` of them wait at once: reached only
    when the threads connect side by side."""
    wanted = 4
    url = make_url(db_url)
    proxy = _HoldingProxy((url.host or "127.0.0.1", url.port or 5432), wanted)
    proxied = url.set(host="127.0.0.1", port=proxy.port).update_query_dict({"connect_timeout": "60"})
    store = fencepost.open(proxied.render_as_string(hide_password=False))
    stop = threading.Event()
    errors: list[str] = []
    done = threading.Semaphore(0)

    def client() -> None:
        try:
            store.db.read(lambda c: c.exec_driver_sql("SELECT 1").scalar())
        except Exception as exc:  # reported by the test
            errors.append(repr(exc))
        done.release()
        stop.wait(DEADLINE * 3)  # keeps its connection: the next thread needs a new one

    threads: list[threading.Thread] = []
    try:
        # The pool's free connections go first, to threads that need no connect.
        for _ in range(store.db.engine.pool.checkedin()):  # type: ignore[attr-defined]
            threads.append(threading.Thread(target=client, daemon=True))
            threads[-1].start()
            assert done.acquire(timeout=DEADLINE)
        proxy.hold = True
        for _ in range(wanted):
            threads.append(threading.Thread(target=client, daemon=True))
            threads[-1].start()
        reached = proxy.reached.wait(DEADLINE)
        most = proxy.most_waiting
    finally:
        proxy.free()  # whatever still waits connects now
        finished = sum(done.acquire(timeout=DEADLINE) for _ in range(wanted))
        stop.set()
        for t in threads:
            t.join(DEADLINE)
        store.close()
        proxy.close()
    assert reached, f"at most {most} of {wanted} threads were connecting at once"
    assert finished == wanted
    assert errors == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_checks_out_its_own_connections_outside_a_thread_slot(store: fencepost.Store) -> None:
    """``connect()`` and ``detached_connection()`` (a follower's change detection, a projection
    builder's lock) check out without a thread's kept connection: in a forked child, before any
    read or write, they were handed the parent's pooled connections (the parent's live sessions),
    and waited forever on a checkout lock a parent thread held at ``fork()``."""
    store.runs.create("before-fork", "{}")
    db = store.db
    pool = db.engine.pool
    held = [db.connect() for _ in range(pool.checkedin() + 1)]  # type: ignore[attr-defined]
    parents = {id(c.connection.dbapi_connection) for c in held}
    for c in held:
        c.close()  # back into the pool's free connections, which the child inherits
    assert pool.checkedin() >= 1  # type: ignore[attr-defined]

    def child() -> None:
        signal.alarm(int(DEADLINE))  # a checkout that waits forever ends the child
        for open_one in (db.connect, db.detached_connection):
            conn = open_one()
            assert id(conn.connection.dbapi_connection) not in parents
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
            conn.close()
        assert store.runs.get("before-fork").run_id == "before-fork"

    # Another thread of the parent in the middle of a checkout, taking back idle connections (the
    # parent holds the locks until the child is done: the child's copies stay held throughout).
    with db._checkout_lock, db._slots_lock:
        assert run_forked(child) == 0
    store.runs.create("after-fork", "{}")  # the parent's connections are still its own
    assert store.runs.get("before-fork").run_id == "before-fork"


class _Holders:
    """``count`` threads each inside a read transaction (holding a connection) until ``end``."""

    def __init__(self, store: fencepost.Store, count: int) -> None:
        self.results: list[object] = []
        self._release = threading.Event()
        inside = threading.Semaphore(0)

        def hold(conn: object) -> None:
            inside.release()
            self._release.wait(DEADLINE)

        def holder() -> None:
            try:
                store.db.read(hold)
                self.results.append("ok")
            except Exception as exc:  # reported by the test
                self.results.append(repr(exc))

        self._threads = [threading.Thread(target=holder, daemon=True) for _ in range(count)]
        for t in self._threads:
            t.start()
        assert all(inside.acquire(timeout=DEADLINE) for _ in self._threads)

    def end(self) -> None:
        self._release.set()
        for t in self._threads:
            t.join(DEADLINE)


def test_close_wakes_a_call_waiting_for_a_connection_with_the_closed_error(
        small_pool_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call waiting in the checkout for a full pool kept waiting after ``close()`` until the
    pool's wait ran out (30 s), then failed with ``pool_exhausted``, as if the store were still
    open: now ``close()`` wakes it with the error any call after ``close()`` gets.

    Told by what ends the wait, not by a wall-clock bound on it: the pool's own wait is set far past
    the test's, so a call that ``close()`` did not wake is still waiting when the test stops
    waiting for it, and one woken by anything else than ``close()`` fails with another code."""
    monkeypatch.setattr(_durable, "POOL_WAIT", 3 * DEADLINE, raising=False)
    store = fencepost.open(small_pool_url)
    store.runs.create("shared", "{}")
    db = store.db
    holders = _Holders(store, sum(SMALL))
    entered = threading.Event()
    checkout = db._checkout

    def watched() -> object:
        if threading.current_thread().name == "waiter":
            entered.set()
        return checkout()

    monkeypatch.setattr(db, "_checkout", watched)
    caught: list[BaseException] = []
    done = threading.Event()

    def waiter() -> None:
        try:
            store.runs.get("shared")
        except BaseException as exc:  # examined below
            caught.append(exc)
        done.set()

    t = threading.Thread(target=waiter, name="waiter", daemon=True)
    try:
        t.start()
        assert entered.wait(DEADLINE)  # in the checkout, every connection inside a transaction
        store.close()
        # The holders still hold every connection: only close() can end this wait in time.
        woken = done.wait(DEADLINE)
    finally:
        holders.end()
        t.join(DEADLINE)
        store.close()
    assert woken, f"close() did not wake the call waiting for a connection within {DEADLINE:g} s"
    assert holders.results == ["ok"] * sum(SMALL)
    assert len(caught) == 1, caught
    err = caught[0]
    assert getattr(err, "db_code", None) == "closed", repr(err)
    assert "closed" in str(err)


def test_a_reclaim_whose_release_stalls_does_not_hold_up_other_threads_checkouts(
        small_pool_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Taking an idle thread's connection back returns it to the pool, which on PostgreSQL rolls it
    back over the network: that ran under the store's checkout lock, so a server that stopped
    answering mid-rollback held up every other thread's checkout. Here the first reclaimed
    connection's release blocks (as that rollback would); another thread that finds the pool full
    takes back another idle connection and reads while the first release is still blocked."""
    store = fencepost.open(small_pool_url)
    parked = _Parked(store, None)  # every connection of the pool kept by an idle thread
    stalled, unblock = threading.Event(), threading.Event()
    release = _durable._Slot.release

    def stalling_release(slot: _durable._Slot) -> None:
        if threading.current_thread().name == "first" and not stalled.is_set():
            stalled.set()
            unblock.wait(DEADLINE)
        release(slot)

    monkeypatch.setattr(_durable._Slot, "release", stalling_release)
    results: dict[str, object] = {}
    done = {name: threading.Event() for name in ("first", "second")}

    def reader() -> None:
        name = threading.current_thread().name
        try:
            results[name] = store.db.read(lambda c: c.exec_driver_sql("SELECT 1").scalar())
        except Exception as exc:  # reported by the test
            results[name] = repr(exc)
        done[name].set()

    threads = [threading.Thread(target=reader, name=name, daemon=True) for name in ("first", "second")]
    try:
        assert parked.errors == []
        threads[0].start()
        assert stalled.wait(DEADLINE)
        threads[1].start()
        second_done = done["second"].wait(5.0)
        first_done_early = done["first"].is_set()
    finally:
        unblock.set()
        for t in threads:
            t.join(DEADLINE)
        parked.stop()
        store.close()
    assert second_done, "the second thread's checkout waited for the first thread's stalled release"
    assert not first_done_early
    assert results == {"first": 1, "second": 1}


def test_a_taken_back_connection_is_not_counted_free_before_its_taker_has_a_place(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout that takes back an idle thread's connection counts it as "releasing" (its place
    is the taker's) until the release is over; the pool counted it free as soon as it was back, a
    moment before that count dropped. A checkout in between found one place more than there was,
    took the very connection meant for the taker, and left the taker inside SQLAlchemy's own pool
    wait (30 s) with the pool full. Here a one-connection pool: the reclaimed connection's release
    lets another thread check out right after the pool has it back; that thread must wait (it
    meets ``pool_exhausted`` after a short ``POOL_WAIT``), not take the taker's connection."""
    url = db_url + ("&" if "?" in db_url else "?") + "pool_size=1"
    monkeypatch.setattr(_durable, "POOL_WAIT", 0.5)
    store = fencepost.open(url)
    parked = _Parked(store, 1)  # the pool's one connection, kept by an idle thread
    release = _durable._Slot.release
    intruder: dict[str, object] = {}

    def read() -> None:
        try:
            intruder["got"] = store.db.read(lambda c: c.exec_driver_sql("SELECT 1").scalar())
        except Exception as exc:  # the expected outcome is a pool_exhausted failure
            intruder["error"] = exc

    def release_then_intrude(slot: _durable._Slot) -> None:
        release(slot)
        if threading.current_thread().name == "taker" and not intruder:
            intruder["started"] = True
            t = threading.Thread(target=read, daemon=True)
            t.start()
            t.join(DEADLINE)

    monkeypatch.setattr(_durable._Slot, "release", release_then_intrude)
    taker: dict[str, object] = {}

    def take() -> None:
        try:
            taker["got"] = store.db.read(lambda c: c.exec_driver_sql("SELECT 2").scalar())
        except Exception as exc:  # reported by the test
            taker["got"] = repr(exc)

    t = threading.Thread(target=take, name="taker", daemon=True)
    try:
        assert parked.errors == []
        t.start()
        t.join(DEADLINE)
    finally:
        parked.stop()
        store.close()
    assert intruder.get("started"), "the taker took back no idle connection"
    assert "got" not in intruder, "a checkout took the connection the taker had taken back for itself"
    err = intruder.get("error")
    assert getattr(err, "code", None) == "pool_exhausted", repr(err)
    assert taker.get("got") == 2


def test_dispose_while_a_reclaim_is_mid_release_keeps_the_takers_place(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout that takes back an idle thread's connection counts it as "releasing" until the
    pool has it back. ``dispose`` in between put a new pool in place, which never counted that
    connection, yet the count still subtracted it from the new pool's: one place more than there
    was, until the release ended. A checkout then took the taker's place and left the taker waiting
    in SQLAlchemy's own pool wait (30 s) with the pool full. Here a one-connection pool: the
    reclaim's release is held (an event hook) while ``dispose`` runs and another thread checks out;
    that thread must wait (``pool_exhausted`` after a short ``POOL_WAIT``), and the taker, let go,
    reads at once."""
    url = db_url + ("&" if "?" in db_url else "?") + "pool_size=1"
    monkeypatch.setattr(_durable, "POOL_WAIT", 0.5)
    store = fencepost.open(url)
    parked = _Parked(store, 1)  # the pool's one connection, kept by an idle thread
    release = _durable._Slot.release
    stalled, unblock = threading.Event(), threading.Event()

    def held_release(slot: _durable._Slot) -> None:
        if threading.current_thread().name == "taker" and not stalled.is_set():
            stalled.set()
            unblock.wait(DEADLINE)
        release(slot)

    monkeypatch.setattr(_durable._Slot, "release", held_release)
    taker: dict[str, object] = {}
    intruder: dict[str, object] = {}

    def take() -> None:
        try:
            taker["got"] = store.db.read(lambda c: c.exec_driver_sql("SELECT 2").scalar())
        except Exception as exc:  # reported by the test
            taker["got"] = repr(exc)
        taker["after_unblock_s"] = time.monotonic() - taker.get("unblocked", time.monotonic())  # type: ignore[operator]

    def intrude() -> None:
        try:
            intruder["got"] = store.db.read(lambda c: c.exec_driver_sql("SELECT 1").scalar())
        except Exception as exc:  # the expected outcome is a pool_exhausted failure
            intruder["error"] = exc

    t = threading.Thread(target=take, name="taker", daemon=True)
    try:
        assert parked.errors == []
        t.start()
        assert stalled.wait(DEADLINE), "the taker took back no idle connection"
        store.db.dispose()  # while the taken-back connection is on its way back to the old pool
        x = threading.Thread(target=intrude, name="intruder", daemon=True)
        x.start()
        x.join(DEADLINE)
        taker["unblocked"] = time.monotonic()
        unblock.set()
        t.join(DEADLINE)
    finally:
        unblock.set()
        parked.stop()
        store.close()
    assert "got" not in intruder, "a checkout took the place of the taker mid-release"
    err = intruder.get("error")
    assert getattr(err, "code", None) == "pool_exhausted", repr(err)
    assert taker.get("got") == 2, taker
    assert taker["after_unblock_s"] < POOL_WAIT_BOUND, taker  # type: ignore[operator]
