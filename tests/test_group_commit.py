"""Group commit: concurrent write calls of one process share a COMMIT, each keeps its own outcome.

Races are run with group commit on and off (the single-transaction path as the reference), with
real threads against a real database; the deterministic tests hold the leader's body until the
other callers are queued, so they provably share one transaction.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from functools import partial

import pytest
from sqlalchemy import event, text

import fencepost
from fencepost import Activated, LivenessEvidence, OwnerId
from fencepost._durable import DbFailure
from fencepost.clock import ManualClock
from fencepost.journal.verify import verify
from tests.conftest import race_threads
from tests.runstore.conftest import facts
from tests.runstore.test_race import _replay

THREADS = 4
RUNS = 6
ROUNDS = 4
ROUND_MS = 31_000


def _owner(i: int) -> OwnerId:
    return OwnerId(f"host-{i % 2}", 2000 + i, f"thread-{i}")


def _threads(n: int, target, *args) -> list[BaseException]:
    """``target(i, *args)`` on ``n`` threads at once; the errors they raised."""
    got = race_threads([partial(target, i, *args) for i in range(n)], join_s=120)
    return [r for r in got if isinstance(r, BaseException)]


@pytest.mark.parametrize("store", ["group", "single"], indirect=True)
def test_threads_racing_claim_and_own_admit_one_owner_per_epoch(store, clock):
    """The run-store race of tests/runstore/test_race.py with threads of one store instead of processes."""
    ids = [f"run-{i}" for i in range(RUNS)]
    for rid in ids:
        store.runs.create(rid, "{}")
    barrier = threading.Barrier(THREADS)
    wins: list[tuple[int, int, str]] = []

    def worker(i: int) -> None:
        me = _owner(i)
        for rnd in range(ROUNDS):
            now = rnd * ROUND_MS
            barrier.wait(60)
            if i == 0:
                clock.set(now)
            barrier.wait(60)
            for rid in ids[i % RUNS:] + ids[:i % RUNS]:
                row = store.runs.get(rid)
                evidence = LivenessEvidence(row.owner, now, "lease-expired") if row.owner is not None else None
                if store.runs.claim_and_own(rid, row, me, now, evidence) == Activated():
                    wins.append((rnd, i, rid))
            barrier.wait(60)

    assert _threads(THREADS, worker) == []
    count = Counter((rnd, rid) for rnd, _i, rid in wins)
    assert all(count[(rnd, rid)] == 1 for rnd in range(ROUNDS) for rid in ids), count
    winner = {(rnd, rid): _owner(i) for rnd, i, rid in wins}
    for rid in ids:
        assert _replay(facts(store, rid)) == [winner[(rnd, rid)] for rnd in range(ROUNDS)]
        assert store.runs.get(rid).owner == winner[(ROUNDS - 1, rid)]
    assert verify(store).ok


@pytest.mark.parametrize("store", ["group", "single"], indirect=True)
def test_threaded_fenced_appends_and_heartbeats_stay_gapless_and_chained(store):
    """8 threads each own a run and append + heartbeat; a ninth appends with a fence it lost."""
    n = 8
    for i in range(n):
        store.runs.create(f"r{i}", "{}")
        assert store.runs.claim_and_own(f"r{i}", fencepost.RunSnapshot("pending", None, None), _owner(i), 0) \
            == Activated()
    barrier = threading.Barrier(n + 1)
    lost: list[str] = []

    def worker(i: int) -> None:
        barrier.wait(60)
        for k in range(15):
            store.journal.append(f"r{i}", "step", {"k": k}, owner=_owner(i), source_id="w")
            if k % 5 == 0:
                store.runs.heartbeat(f"r{i}", _owner(i), k + 1)

    def zombie() -> None:
        barrier.wait(60)
        for _ in range(10):
            try:
                store.journal.append("r0", "step", {"zombie": True}, owner=_owner(99), source_id="z")
            except fencepost.JournalError as exc:
                lost.append(exc.code)

    errors: list[BaseException] = []
    z = threading.Thread(target=zombie)
    z.start()
    errors = _threads(n, worker)
    z.join(60)
    assert errors == [] and lost == ["fence_lost"] * 10
    for i in range(n):
        entries = store.journal.entries(f"r{i}").entries
        assert [e.seq for e in entries] == list(range(15)) and all(e.source_id == "w" for e in entries)
    positions = [e.position for e in store.journal.log()]
    assert positions == list(range(1, len(positions) + 1))
    assert verify(store).ok


# --------------------------------------------------------------------------- one shared transaction
def _recorder(store: fencepost.Store, outcomes: dict[str, object]):
    """``call(name, fn)``: write ``fn`` and record its result, or the exception it raised, as the
    outcome of ``name`` (run in a thread per caller)."""

    def call(name: str, fn) -> None:
        try:
            outcomes[name] = store.db.write(fn)
        except BaseException as exc:  # the caller's own outcome
            outcomes[name] = exc

    return call


def _hold_until_queued(store: fencepost.Store, queued: int):
    """A leader body that returns only once ``queued`` other calls wait to join its group (the
    first time it runs; run again alone, it just writes)."""
    first = [True]

    def body(conn):
        conn.execute(text("INSERT INTO flows_runs (run_id, status, state_json, created_at_ms) "
                          "VALUES ('leader', 'pending', '{}', 0)"))
        deadline = time.monotonic() + 30
        while first[0] and store.db._group._waiting < queued:
            assert time.monotonic() < deadline, "the other callers never queued"
            time.sleep(0.001)
        first[0] = False
        return "leader"

    return body


def _insert(run_id: str):
    return lambda conn: conn.execute(text(
        "INSERT INTO flows_runs (run_id, status, state_json, created_at_ms) VALUES (:r, 'pending', '{}', 0)"),
        {"r": run_id})


def _run_ids(store: fencepost.Store) -> set[str]:
    return set(store.db.read(lambda conn: conn.execute(text("SELECT run_id FROM flows_runs")).scalars().all()))


def _commits(store: fencepost.Store) -> list[int]:
    counted: list[int] = []
    event.listen(store.db.engine, "commit", lambda _conn: counted.append(1))
    return counted


def test_one_callers_failure_leaves_the_others_committed(store):
    commits = _commits(store)
    outcomes: dict[str, object] = {}
    called: list[str] = []

    def ok(conn):
        _insert("ok")(conn)
        store.db.after_commit(lambda: called.append("ok"))
        return "ok"

    def refuses(conn):
        _insert("refused")(conn)
        store.db.after_commit(lambda: called.append("refused"))
        raise fencepost.JournalError("fence_lost", "append", "owner does not hold the run")

    def violates(conn):
        _insert("leader")(conn)  # the leader's row: a primary-key violation, this call's alone

    bodies = {"refuses": refuses, "violates": violates, "ok": ok}
    leader_started = threading.Event()

    call = _recorder(store, outcomes)

    leader = threading.Thread(target=lambda: (leader_started.set(),
                                              call("leader", _hold_until_queued(store, len(bodies)))))
    leader.start()
    assert leader_started.wait(10)
    while store.db._group._group is None:  # the leader's group is open
        time.sleep(0.001)
    followers = [threading.Thread(target=call, args=(name, fn)) for name, fn in bodies.items()]
    for t in followers:
        t.start()
    for t in [leader, *followers]:
        t.join(60)
    assert len(commits) == 1  # four calls, one COMMIT
    assert outcomes["leader"] == "leader" and outcomes["ok"] == "ok"
    assert isinstance(outcomes["refuses"], fencepost.JournalError) and outcomes["refuses"].code == "fence_lost"
    assert isinstance(outcomes["violates"], DbFailure) and outcomes["violates"].category == "constraint"
    assert _run_ids(store) == {"leader", "ok"}
    assert called == ["ok"]  # after-commit callbacks of the successful call only


def test_asyncio_tasks_through_threads_share_one_commit(store):
    commits = _commits(store)

    async def main() -> list[object]:
        leader = asyncio.create_task(asyncio.to_thread(store.db.write, _hold_until_queued(store, 5)))
        while store.db._group._group is None:
            await asyncio.sleep(0.001)
        rest = [asyncio.to_thread(store.db.write, _insert(f"task-{i}")) for i in range(5)]
        return await asyncio.gather(leader, *rest)

    results = asyncio.run(main())
    assert len(commits) == 1
    assert results[0] == "leader"
    assert _run_ids(store) == {"leader", *(f"task-{i}" for i in range(5))}


def test_a_failed_shared_commit_fails_the_successes_once_and_reruns_the_refusals(store):
    """A COMMIT that fails with its outcome unknown: calls whose body succeeded get a persistence
    failure and are never re-run (they may have committed); a refused call decides again alone."""
    runs: Counter[str] = Counter()
    outcomes: dict[str, object] = {}
    fail = [True]

    def broken_commit(_conn) -> None:
        if fail[0]:
            fail[0] = False
            raise RuntimeError("the connection died during COMMIT")

    def ok(conn):
        runs["ok"] += 1
        _insert("ok")(conn)

    def refuses(conn):
        runs["refuses"] += 1
        raise fencepost.JournalError("fence_lost", "append", "owner does not hold the run")

    call = _recorder(store, outcomes)

    event.listen(store.db.engine, "commit", broken_commit)
    leader = threading.Thread(target=call, args=("leader", _hold_until_queued(store, 2)))
    leader.start()
    while store.db._group._group is None:
        time.sleep(0.001)
    followers = [threading.Thread(target=call, args=(n, f)) for n, f in (("ok", ok), ("refuses", refuses))]
    for t in followers:
        t.start()
    for t in [leader, *followers]:
        t.join(60)
    assert isinstance(outcomes["leader"], RuntimeError)
    assert isinstance(outcomes["ok"], DbFailure) and outcomes["ok"].category == "persistence_failed"
    assert isinstance(outcomes["refuses"], fencepost.JournalError)
    assert runs == {"ok": 1, "refuses": 2}
    assert _run_ids(store) == set()  # nothing of the failed group landed
    store.runs.create("after", "{}")  # and the store works again
    assert _run_ids(store) == {"after"}


def test_group_commit_can_be_switched_off(db_url):
    with fencepost.open(db_url, clock=ManualClock(0), group_commit=False) as single:
        assert single.db._group is None
        single.runs.create("r", "{}")
    with fencepost.open(db_url, clock=ManualClock(0)) as grouped:
        assert grouped.db._group is not None
        assert grouped.runs.get("r").run_id == "r"


def test_a_deferred_constraint_broken_by_one_member_fails_that_member_alone(store):
    """The shared COMMIT is refused by a deferred foreign key one body broke: nothing of the group
    committed, so every call runs again alone; the culprit fails, the others commit."""
    from tests.faults.test_writer_deferred import _deferred_fk, _violate

    _deferred_fk(store)
    store.db.write(lambda c: c.exec_driver_sql("INSERT INTO fault_parent (id) VALUES (7)"))
    outcomes: dict[str, object] = {}

    call = _recorder(store, outcomes)

    leader = threading.Thread(target=call, args=("leader", _hold_until_queued(store, 2)))
    leader.start()
    while store.db._group._group is None:
        time.sleep(0.001)
    followers = [
        threading.Thread(target=call, args=("culprit", _violate)),
        threading.Thread(target=call, args=("innocent", lambda c: c.exec_driver_sql(
            "INSERT INTO fault_child (pid) VALUES (7)"))),
    ]
    for t in followers:
        t.start()
    for t in [leader, *followers]:
        t.join(60)
    assert outcomes["leader"] == "leader"
    assert isinstance(outcomes["culprit"], DbFailure) and outcomes["culprit"].category == "constraint"
    assert not isinstance(outcomes["innocent"], BaseException)
    assert _run_ids(store) == {"leader"}
    children = store.db.read(lambda c: c.exec_driver_sql("SELECT pid FROM fault_child").scalars().all())
    assert children == [7]


# --------------------------------------------------------------------------- bodies run by the leader
def _call_all(store: fencepost.Store, leader_body, bodies: dict) -> dict[str, object]:
    """Start a leader holding its group open until every body is queued, then the bodies' callers
    (one thread each, started in order, each queued before the next starts); every outcome."""
    outcomes: dict[str, object] = {}

    call = _recorder(store, outcomes)

    leader = threading.Thread(target=call, args=("leader", leader_body))
    leader.start()
    deadline = time.monotonic() + 30
    while store.db._group._group is None:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    threads = []
    for i, (name, fn) in enumerate(bodies.items()):
        t = threading.Thread(target=call, args=(name, fn))
        t.start()
        threads.append(t)
        # Queued in this order (once the last one queues, the leader drains the queue at once).
        while i + 1 < len(bodies) and store.db._group._waiting < i + 1:
            assert time.monotonic() < deadline
            time.sleep(0.001)
    for t in [leader, *threads]:
        t.join(60)
    assert not any(t.is_alive() for t in [leader, *threads])
    return outcomes


def test_failures_between_successes_undo_only_their_own_rows(store):
    """Members alternate success and failure in one group: each failure's savepoint undoes exactly
    its own rows, never an earlier member's, and the successes after it still commit."""
    commits = _commits(store)

    def fails(run_id: str):
        def body(conn):
            _insert(run_id)(conn)
            _insert(run_id + "-second")(conn)
            raise fencepost.RunStoreError("invalid_run", "create", "refused")
        return body

    bodies = {"a": _insert("a"), "b": fails("b"), "c": _insert("c"), "d": fails("d"), "e": _insert("e")}
    outcomes = _call_all(store, _hold_until_queued(store, len(bodies)), bodies)
    assert len(commits) == 1
    assert all(isinstance(outcomes[n], fencepost.RunStoreError) for n in ("b", "d"))
    assert not any(isinstance(outcomes[n], BaseException) for n in ("leader", "a", "c", "e"))
    assert _run_ids(store) == {"leader", "a", "c", "e"}


def test_member_savepoints_are_released_as_the_next_member_opens_and_never_nest(store, monkeypatch):
    """The group's own statements, in order: a member that succeeded keeps its savepoint only until
    the next member opens (on PostgreSQL the release and the next savepoint are one round trip);
    a failed member is rolled back to its savepoint and released at once; COMMIT releases the last.
    So savepoints never nest, whatever the group's size."""
    from fencepost import _group

    sent: list[str] = []

    class Recording:
        def __init__(self, raw) -> None:
            self._raw = raw

        def execute(self, sql, *args):
            sent.append(sql)
            return self._raw.execute(sql, *args)

    real_member = _group.GroupCommit._member

    def member(self, conn, raw, fn, opening):
        return real_member(self, conn, Recording(raw), fn, opening)

    monkeypatch.setattr(_group.GroupCommit, "_member", member)

    def fails(conn):
        _insert("b")(conn)
        raise fencepost.RunStoreError("invalid_run", "create", "refused")

    bodies = {"a": _insert("a"), "b": fails, "c": _insert("c"), "d": _insert("d")}
    outcomes = _call_all(store, _hold_until_queued(store, len(bodies)), bodies)
    assert isinstance(outcomes["b"], fencepost.RunStoreError)
    assert _run_ids(store) == {"leader", "a", "c", "d"}
    sp, rollback, release = _group._SAVEPOINT, _group._ROLLBACK_TO, _group._RELEASE
    if store.db.backend.joins_statements:
        release_then_open = [f"{release}; {sp}"]
    else:
        release_then_open = [release, sp]
    assert sent == [sp, *release_then_open, rollback, release, sp, *release_then_open]


def test_each_body_sees_its_own_callers_context_variables(store):
    """The leader runs queued bodies in its own thread, but inside each caller's context."""
    import contextvars

    who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")
    seen: dict[str, str] = {}

    def caller(name: str):
        def body(conn):
            seen[name] = who.get()
            _insert(name)(conn)
            who.set("changed-by-" + name)  # stays inside this call's context copy
        return body

    def as_caller(name: str):
        # Runs in the calling thread before it queues: set the variable there.
        def run(conn):
            return caller(name)(conn)
        return run

    outcomes: dict[str, object] = {}
    leader = threading.Thread(target=lambda: outcomes.setdefault(
        "leader", store.db.write(_hold_until_queued(store, 2))))
    leader.start()
    while store.db._group._group is None:
        time.sleep(0.001)

    def call(name: str) -> None:
        who.set(name)
        store.db.write(as_caller(name))
        outcomes[name] = who.get()  # the body's own set() did not leak back

    threads = [threading.Thread(target=call, args=(n,)) for n in ("x", "y")]
    for t in threads:
        t.start()
    for t in [leader, *threads]:
        t.join(60)
    assert seen == {"x": "x", "y": "y"}
    assert outcomes["x"] == "x" and outcomes["y"] == "y"
    assert _run_ids(store) == {"leader", "x", "y"}


def test_a_write_inside_another_stores_transaction_commits_on_its_own(store, make_db_url):
    """A write to store B from inside a write to store A runs alone on B (the body may use A's
    connection, which belongs to the calling thread), so A rolling back leaves B's row."""
    with fencepost.open(make_db_url(), clock=ManualClock(0)) as other:
        def body(conn):
            other.runs.create("in-b", "{}")
            _insert("in-a")(conn)
            raise fencepost.RunStoreError("invalid_run", "create", "refused")

        with pytest.raises(fencepost.RunStoreError):
            store.db.write(body)
        assert other.runs.get("in-b").run_id == "in-b"
        assert _run_ids(store) == set()


def test_a_queued_caller_interrupted_by_ctrl_c_leaves_the_group_untouched(store):
    """SIGINT reaches the main thread while its call waits in the queue: the call raises
    KeyboardInterrupt, its body never runs, the group commits without it, and the store works."""
    import os
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    commits = _commits(store)
    ran: list[str] = []
    outcomes: dict[str, object] = {}
    release = threading.Event()

    def leader_body(conn):
        _insert("leader")(conn)
        assert release.wait(30)
        return "leader"

    leader = threading.Thread(target=lambda: outcomes.setdefault("leader", store.db.write(leader_body)))
    leader.start()
    while store.db._group._group is None:
        time.sleep(0.001)

    def interrupt() -> None:
        deadline = time.monotonic() + 30
        while store.db._group._waiting < 1:  # the main thread's call is queued
            assert time.monotonic() < deadline
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGINT)

    killer = threading.Thread(target=interrupt)
    killer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            store.db.write(lambda conn: (ran.append("main"), _insert("main")(conn)))
            time.sleep(30)  # reached only if the signal came after the call returned
    finally:
        signal.signal(signal.SIGINT, previous)
    killer.join(30)
    assert store.db._group._waiting == 0  # the interrupted call left the queue
    other = threading.Thread(target=lambda: outcomes.setdefault("other", store.db.write(_insert("other"))))
    other.start()
    while store.db._group._waiting < 1:
        time.sleep(0.001)
    release.set()
    for t in (leader, other):
        t.join(60)
    assert ran == [] and outcomes["leader"] == "leader" and "other" in outcomes
    assert len(commits) == 1  # the leader and the other call, one COMMIT
    assert _run_ids(store) == {"leader", "other"}
    store.runs.create("after", "{}")
    assert "after" in _run_ids(store)


def test_a_caller_interrupted_just_as_it_is_handed_the_lead_passes_it_on(store, monkeypatch):
    """The lead passes to the first queued call after each COMMIT; a caller interrupted at that
    moment hands it to the next one, so nobody waits forever behind an abandoned lead."""
    from fencepost import _group

    interrupted: list[str] = []

    class _InterruptOnLead(_group._Wake):
        def wait(self):
            super().wait()
            if threading.current_thread().name == "victim":
                interrupted.append("victim")
                raise KeyboardInterrupt

    monkeypatch.setattr(_group, "_new_event", _InterruptOnLead)
    outcomes: dict[str, object] = {}

    call = _recorder(store, outcomes)

    # The leader commits alone (its body returns before anyone queues); "victim" and "next" queue
    # behind it while it holds the lead, the victim first.
    release = threading.Event()

    def leader_body(conn):
        _insert("leader")(conn)
        assert release.wait(30)
        return "leader"

    leader = threading.Thread(target=call, args=("leader", leader_body))
    leader.start()
    while store.db._group._group is None:
        time.sleep(0.001)
    victim = threading.Thread(target=call, args=("victim", _insert("victim")), name="victim")
    victim.start()
    while store.db._group._waiting < 1:
        time.sleep(0.001)
    nxt = threading.Thread(target=call, args=("next", _insert("next")))
    nxt.start()
    while store.db._group._waiting < 2:
        time.sleep(0.001)
    # A group of one: the leader commits alone and hands the lead to the first queued call.
    monkeypatch.setattr(_group, "MAX_MEMBERS", 1)
    release.set()
    for t in (leader, victim, nxt):
        t.join(60)
    assert not any(t.is_alive() for t in (leader, victim, nxt))
    assert interrupted == ["victim"]
    assert isinstance(outcomes["victim"], KeyboardInterrupt)
    assert outcomes["leader"] == "leader" and not isinstance(outcomes["next"], BaseException)
    assert _run_ids(store) == {"leader", "next"}


def test_a_new_leader_yields_until_the_last_groups_callers_are_back_and_a_lone_writer_never_yields(
        store, monkeypatch):
    """Before a group begins, its leader yields the interpreter (``time.sleep(0)``) at most once per
    caller the last group took, and stops as soon as that many are queued; a process whose writes
    never overlap never yields. The calls of such a gathered group still share one COMMIT."""
    from fencepost import _group

    group = store.db._group
    sleeps: list[float] = []
    real_sleep = time.sleep
    # (``time`` is the shared module: record the zero-second yields only, not the test's own waits)
    monkeypatch.setattr(_group.time, "sleep", lambda s: (s == 0 and sleeps.append(s), real_sleep(s)))
    for i in range(5):  # one thread: every group is its leader alone
        store.db.write(_insert(f"alone-{i}"))
    assert sleeps == [] and group._last_members == 0

    group._last_members = 3  # as after a group of four: nobody comes back here, so it yields three times
    store.db.write(_insert("after-a-group"))
    assert sleeps == [0, 0, 0]
    assert group._last_members == 0

    # Callers already queued when the lead passes: no yield at all.
    sleeps.clear()
    commits = _commits(store)
    outcomes: dict[str, object] = {}
    call = _recorder(store, outcomes)
    leader = threading.Thread(target=call, args=("leader", _hold_until_queued(store, 3)))
    leader.start()
    while group._group is None:
        real_sleep(0.001)
    followers = [threading.Thread(target=call, args=(f"f-{i}", _insert(f"f-{i}"))) for i in range(3)]
    for t in followers:
        t.start()
    for t in [leader, *followers]:
        t.join(60)
    assert len(commits) == 1 and group._last_members == 3
    group._queue.extend([object()] * 3)  # three callers back in the queue before the next leader starts
    try:
        group._gather()
    finally:
        group._queue.clear()
    assert sleeps == []
    assert _run_ids(store) >= {"leader", "f-0", "f-1", "f-2"}
