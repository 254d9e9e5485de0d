"""Interrupts (Ctrl-C, ``SystemExit``, a signal handler that writes) around a write, with group
commit on and off: an interrupted call is the only one that sees it, a thread keeps working after
it caught one, and nobody waits forever.

A ``KeyboardInterrupt`` is raised at one exact line, as a signal handler raises it at a bytecode
boundary: through ``sys.settrace`` (``_interrupt``) or the wake-up hook ``_group._new_event``.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

import fencepost
from fencepost import _durable, _group
from fencepost._txn import current

JOIN_S = 30


@contextmanager
def _interrupt(func: Callable, fragment: str, *, at: bool = False) -> Iterator[list[int]]:
    """Raise ``KeyboardInterrupt`` once in this thread, in ``func``: at the first line executed
    after the line holding ``fragment`` (``at``: just before that line runs). Yields a list that
    gets an item when it fired."""
    code = func.__code__
    lines, first = inspect.getsourcelines(func)
    targets = {first + i for i, line in enumerate(lines) if fragment in line}
    assert targets, fragment
    fired: list[int] = []

    def tracer(frame, event, arg):
        if frame.f_code is not code:
            return None
        previous = [0]

        def local(frame, event, arg):
            if event == "line" and not fired:
                hit = frame.f_lineno in targets if at else previous[0] in targets
                previous[0] = frame.f_lineno
                if hit:
                    fired.append(frame.f_lineno)
                    raise KeyboardInterrupt
            return local
        return local

    sys.settrace(tracer)
    try:
        yield fired
    finally:
        sys.settrace(None)


def _count(url: str, stream: str) -> int:
    """Entries of ``stream`` a fresh store sees (committed ones only)."""
    with fencepost.open(url) as other:
        return len(other.journal.entries(stream).entries)


def _in_thread(fn: Callable[[], object], name: str | None = None) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def body() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # asserted by the caller
            out["error"] = exc

    t = threading.Thread(target=body, name=name, daemon=True)
    t.start()
    return t, out


def _wait_queued(store: fencepost.Store, n: int) -> None:
    deadline = time.monotonic() + JOIN_S
    while store.db._group._waiting < n:
        assert time.monotonic() < deadline, "calls did not queue"
        time.sleep(0.001)


def _wait_leading(store: fencepost.Store) -> None:
    deadline = time.monotonic() + JOIN_S
    while store.db._group._group is None:
        assert time.monotonic() < deadline, "no group began"
        time.sleep(0.001)


# ---------------------------------------------------------------- the thread's transaction marker
@pytest.mark.parametrize("store", ["group", "single"], indirect=True)
@pytest.mark.parametrize("call", ["write", "read"])
def test_ctrl_c_just_after_a_call_marks_its_thread_leaves_the_thread_working(store, db_url, call):
    """Ctrl-C lands just after the call marks its thread as inside a transaction: the call raises
    it and writes nothing, and the thread's later writes commit (not joined to a transaction that
    is never committed) while other threads' writes are not held up."""
    j = store.journal
    j.append_unfenced("warm", "e", {}, source_id="w")
    store.runs.create("r0", "{}")
    group = store.db._group is not None
    if group and call == "write":
        func, fragment = _group.GroupCommit._run_group, "current.set({id(db): txn})"
    else:
        func, fragment = _durable.Database._attempt, "_current.set(active)"
    with _interrupt(func, fragment) as fired, pytest.raises(KeyboardInterrupt):
        if call == "write":
            j.append_unfenced("r", "interrupted", {}, source_id="p")
        else:
            store.runs.get("r0")
    assert fired
    assert not (current.get() or {}).get(id(store.db))  # the thread is in no transaction
    j.append_unfenced("r", "after", {}, source_id="p")
    assert store.runs.get("r0").run_id == "r0"
    t, out = _in_thread(lambda: j.append_unfenced("o", "other", {}, source_id="o"))
    t.join(JOIN_S)
    assert not t.is_alive() and "error" not in out
    assert [e.event_type for e in fencepost.open(db_url).journal.entries("r").entries] == ["after"]
    assert _count(db_url, "o") == 1


# ---------------------------------------------------------------- a member's BaseException
class _Abort(BaseException):
    """Raised by a callback to abandon its own write (not an ``Exception``)."""


@pytest.mark.parametrize("store", ["group", "single"], indirect=True)
@pytest.mark.parametrize("kind", [_Abort, SystemExit])
def test_a_queued_callers_base_exception_is_its_own_alone(store, db_url, kind):
    """A callback raising a ``BaseException`` (``SystemExit``, one of its own) while it is a member
    of another thread's group: that caller alone gets it, once, in its own thread; nothing of its
    write lands; the leader and the other member commit, as with group commit off."""
    j = store.journal
    release = threading.Event()
    ran: list[str] = []

    def lead(tx):
        tx.append_unfenced("a", "e", {}, source_id="a")
        assert release.wait(JOIN_S)
        return "a"

    def aborting(tx):
        ran.append("b")
        tx.append_unfenced("b", "e", {}, source_id="b")
        raise kind("b abandons its write")

    ta, a = _in_thread(lambda: j.transact(lead))
    if store.db._group is not None:
        _wait_leading(store)
    else:
        time.sleep(0.2)
    tb, b = _in_thread(lambda: j.transact(aborting))
    tc, c = _in_thread(lambda: j.append_unfenced("c", "e", {}, source_id="c"))
    if store.db._group is not None:
        _wait_queued(store, 2)
    else:
        time.sleep(0.3)
    release.set()
    for t in (ta, tb, tc):
        t.join(JOIN_S)
        assert not t.is_alive()
    assert a == {"value": "a"}
    assert isinstance(b.get("error"), kind) and str(b["error"]) == "b abandons its write"
    assert "error" not in c
    assert ran == ["b"]
    assert (_count(db_url, "a"), _count(db_url, "b"), _count(db_url, "c")) == (1, 0, 1)


# ---------------------------------------------------------------- Ctrl-C in the leader after COMMIT
@pytest.mark.parametrize("where", ["after_wake", "before_wake", "second_wake"])
def test_ctrl_c_in_the_leader_while_it_answers_its_group_answers_every_member_once(store, db_url,
                                                                                    monkeypatch, where):
    """Ctrl-C reaches the leader after the shared COMMIT, while it wakes its members (just after a
    wake-up, or just before one): the leader raises it, every member is told its write succeeded,
    nobody waits forever, and no member's write runs (and commits) a second time."""
    fired: list[int] = []
    sets = [0]

    class _Wake(_group._Wake):
        def set(self):
            if threading.current_thread().name == "leader":
                sets[0] += 1
                nth = 2 if where == "second_wake" else 1
                if sets[0] == nth and not fired:
                    fired.append(1)
                    if where == "before_wake":
                        raise KeyboardInterrupt  # as if it landed on entering the wake-up
                    super().set()
                    raise KeyboardInterrupt
            super().set()

    monkeypatch.setattr(_group, "_new_event", _Wake)
    j = store.journal
    release = threading.Event()
    ran: list[int] = []

    def lead(tx):
        tx.append_unfenced("lead", "e", {}, source_id="L")
        assert release.wait(JOIN_S)
        return "lead"

    def member(i: int):
        def body(tx):
            ran.append(i)
            return tx.append_unfenced(f"m{i}", "e", {"i": i}, source_id="M")
        return j.transact(body)

    tl, lo = _in_thread(lambda: j.transact(lead), name="leader")
    _wait_leading(store)
    members = []
    for i in range(3):
        members.append(_in_thread(lambda i=i: member(i)))
        _wait_queued(store, i + 1)
    release.set()
    tl.join(JOIN_S)
    for t, _ in members:
        t.join(JOIN_S)
    assert fired
    assert not tl.is_alive() and isinstance(lo.get("error"), KeyboardInterrupt)
    assert not any(t.is_alive() for t, _ in members), "a member waits forever"
    assert all("error" not in out for _, out in members), [out for _, out in members]
    assert sorted(ran) == [0, 1, 2]  # each body ran once
    assert [_count(db_url, f"m{i}") for i in range(3)] == [1, 1, 1]
    assert _count(db_url, "lead") == 1
    j.append_unfenced("after", "e", {}, source_id="x")  # the lead was not stranded


# ---------------------------------------------------------------- Ctrl-C as the group ends
@pytest.mark.parametrize("fragment", ["_last_members = len(taken)", "if taken:"])
def test_ctrl_c_as_a_lone_writer_ends_its_group_does_not_strand_the_lead(store, db_url, fragment):
    """Ctrl-C lands in a lone writer just as its write ends, before it drops the lead: the write
    committed, and later writes of the process (on any thread) still go through."""
    j = store.journal
    j.append_unfenced("warm", "e", {}, source_id="w")
    with _interrupt(_group.GroupCommit._end_group, fragment, at=True) as fired, \
            pytest.raises(KeyboardInterrupt):
        j.append_unfenced("cli", "work.done", {}, source_id="cli")
    assert fired
    t, out = _in_thread(lambda: j.append_unfenced("cli", "shutdown", {}, source_id="cli"))
    t.join(JOIN_S)
    assert not t.is_alive(), "the lead was stranded"
    assert "error" not in out
    assert _count(db_url, "cli") == 2


# ---------------------------------------------------------------- Ctrl-C during the shared COMMIT
@pytest.mark.parametrize("sent", [False, True])
def test_ctrl_c_in_the_leader_during_the_shared_commit_blames_the_interrupt(store, db_url, monkeypatch, sent):
    """Ctrl-C reaches the leader during the COMMIT it runs for its group, before the COMMIT went to
    the database or after. The interrupt also closes the connection, so fencepost cannot tell
    which: each member is told its outcome is unknown, once, in words that blame the interrupt and
    not the connection or the disk, and its write is never repeated (no duplicate)."""
    dialect = store.db.engine.dialect
    do_commit = dialect.do_commit
    fired: list[int] = []

    def commit(dbapi_connection):
        if threading.current_thread().name == "leader" and not fired:
            fired.append(1)
            if sent:
                do_commit(dbapi_connection)
            raise KeyboardInterrupt
        do_commit(dbapi_connection)

    monkeypatch.setattr(dialect, "do_commit", commit)
    j = store.journal
    release = threading.Event()
    ran: list[int] = []

    def lead(tx):
        tx.append_unfenced("lead", "e", {}, source_id="L")
        assert release.wait(JOIN_S)
        return "lead"

    def member(i: int):
        def body(tx):
            ran.append(i)
            return tx.append_unfenced(f"m{i}", "e", {}, source_id="M")
        return j.transact(body)

    tl, lo = _in_thread(lambda: j.transact(lead), name="leader")
    _wait_leading(store)
    members = []
    for i in range(2):
        members.append(_in_thread(lambda i=i: member(i)))
        _wait_queued(store, i + 1)
    release.set()
    for t in [tl] + [t for t, _ in members]:
        t.join(JOIN_S)
        assert not t.is_alive()
    assert fired and isinstance(lo.get("error"), KeyboardInterrupt)
    for _, out in members:
        err = out.get("error")
        assert isinstance(err, fencepost.JournalError), out
        assert "interrupted" in err.detail and "may have committed" in err.detail, err.detail
        assert "connection or the disk" not in err.detail
    assert sorted(ran) == [0, 1]  # never run again
    landed = 1 if sent else 0
    assert [_count(db_url, s) for s in ("lead", "m0", "m1")] == [landed] * 3
    j.append_unfenced("after", "e", {}, source_id="x")


# ---------------------------------------------------------------- a signal handler that writes
_HANDLER_SCRIPT = textwrap.dedent("""
    import os, signal, sys, threading, time
    import fencepost

    url, mode = sys.argv[1], sys.argv[2]
    store = fencepost.open(url, group_commit=mode != "single")
    j = store.journal
    g = store.db._group
    gate = threading.Event()
    handled = threading.Event()
    outcome = {}

    def handler(signum, frame):
        try:
            j.append_unfenced("sig", "e", {}, source_id="sig")
            outcome["handler"] = "ok"
        except Exception as exc:
            outcome["handler"] = type(exc).__name__ + ": " + str(exc)
        handled.set()

    signal.signal(signal.SIGUSR1, handler)

    def lead():
        j.transact(lambda tx: (tx.append_unfenced("lead", "e", {}, source_id="L"), gate.wait(30)))

    leader = threading.Thread(target=lead)
    leader.start()
    if g is not None:
        while g._group is None:
            time.sleep(0.001)
    else:
        time.sleep(0.2)

    def poke():
        if g is not None:
            while g._waiting < 1:  # main's call is queued
                time.sleep(0.001)
        else:
            time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.3)
        gate.set()

    threading.Thread(target=poke).start()
    j.append_unfenced("main", "e", {}, source_id="main")
    leader.join(30)
    handled.wait(30)
    counts = [len(j.entries(s).entries) for s in ("main", "sig", "lead")]
    print(outcome.get("handler"), counts)
    store.close()
""")


@pytest.mark.parametrize("mode", ["group"])
def test_a_signal_handler_that_writes_while_its_thread_waits_for_the_group(db_url, mode, tmp_path):
    """A signal handler writes while its thread's own write waits in the group's queue: the
    handler's write does not queue behind the call it interrupted (which cannot run until the
    handler returns); both land, and nobody waits forever."""
    script = tmp_path / "handler.py"
    script.write_text(_HANDLER_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    try:
        done = subprocess.run([sys.executable, str(script), db_url, mode], capture_output=True, text=True,
                              timeout=60, env=env, cwd=os.getcwd())
    except subprocess.TimeoutExpired:
        pytest.fail("the process hung: its writes wait for each other")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok [1, 1, 1]", done.stdout + done.stderr[-3000:]


@pytest.mark.parametrize("where", ["queued", "handed"])
def test_a_write_made_on_a_thread_whose_call_waits_for_the_group_goes_alone(store, db_url, monkeypatch, where):
    """What a signal handler does when it writes while its thread's own call waits for the group,
    run at that exact moment through the wake-up hook: while the call is queued, or just after the
    lead was handed to it (before it runs). That write does not wait behind its own thread's call:
    it runs alone, and all three writes land."""
    j = store.journal
    got: dict = {}

    def handler():
        got["handler"] = j.append_unfenced("sig", "e", {}, source_id="sig")

    class _Wake(_group._Wake):
        def wait(self):
            if threading.current_thread().name == "victim" and where == "queued" and not got:
                threading.Timer(0.3, release.set).start()  # the leader commits while the handler waits
                handler()
            super().wait()
            if threading.current_thread().name == "victim" and where == "handed" and not got:
                handler()

    monkeypatch.setattr(_group, "_new_event", _Wake)
    release = threading.Event()
    tl, lo = _in_thread(lambda: j.transact(lambda tx: (tx.append_unfenced("lead", "e", {}, source_id="L"),
                                                         release.wait(JOIN_S))[0]), name="leader")
    _wait_leading(store)
    tv, vo = _in_thread(lambda: j.append_unfenced("victim", "e", {}, source_id="V"), name="victim")
    if where == "handed":
        _wait_queued(store, 1)
        monkeypatch.setattr(_group, "MAX_MEMBERS", 1)  # the leader commits alone, hands the lead on
        release.set()
    for t in (tl, tv):
        t.join(JOIN_S)
        assert not t.is_alive(), "a write waits forever"
    assert "error" not in lo and "error" not in vo, (lo, vo)
    assert "handler" in got
    assert (_count(db_url, "lead"), _count(db_url, "victim"), _count(db_url, "sig")) == (1, 1, 1)


def test_a_signal_handler_that_writes_while_its_thread_leads_a_group_is_refused_at_once(store, db_url):
    """A write made on the thread that is leading a group, outside any body (a signal handler or
    finalizer that ran while the leader commits): it cannot join that group nor wait for it, so
    it fails at once, clearly; the group commits."""
    j = store.journal
    got: dict = {}
    taken = _group.GroupCommit._take_members

    def nested_write(self, *args):
        try:
            j.append_unfenced("sig", "e", {}, source_id="sig")
            got["handler"] = "ok"
        except fencepost.JournalError as exc:
            got["handler"] = exc
        return taken(self, *args)

    release = threading.Event()
    tl, lo = _in_thread(lambda: j.transact(lambda tx: (tx.append_unfenced("lead", "e", {}, source_id="L"),
                                                         release.wait(JOIN_S))[0]))
    _wait_leading(store)
    tm, mo = _in_thread(lambda: j.append_unfenced("m", "e", {}, source_id="M"))
    _wait_queued(store, 1)
    _group.GroupCommit._take_members = nested_write  # type: ignore[method-assign]
    try:
        release.set()
        tl.join(JOIN_S)
        tm.join(JOIN_S)
    finally:
        _group.GroupCommit._take_members = taken  # type: ignore[method-assign]
    assert not tl.is_alive() and not tm.is_alive()
    err = got["handler"]
    assert isinstance(err, fencepost.JournalError) and "its own write" in err.detail, err
    assert "error" not in lo and "error" not in mo
    assert (_count(db_url, "lead"), _count(db_url, "m"), _count(db_url, "sig")) == (1, 1, 0)
