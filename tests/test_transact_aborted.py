"""A ``transact`` callback that catches a failed statement of its own and returns.

On PostgreSQL a failed statement aborts the whole transaction: its COMMIT would silently roll
back. The call must fail, clearly, rather than report success for writes that never landed; as a
member of a shared COMMIT (group commit) it fails alone, once, and the others still commit. SQLite
undoes only the failed statement, so there the call commits.
"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

import fencepost

JOIN_S = 30


def _count(url: str, stream: str) -> int:
    with fencepost.open(url) as other:
        return len(other.journal.entries(stream).entries)


def _prepare(store: fencepost.Store) -> None:
    with store.db.connect() as c:
        c.exec_driver_sql("CREATE TABLE app_kv (k TEXT PRIMARY KEY, v TEXT)")
        c.exec_driver_sql("INSERT INTO app_kv VALUES ('a', '1')")
        c.commit()


def _swallowing(ran: list[str], before=None):
    def body(tx):
        ran.append("body")
        tx.append_unfenced("r", "e.before", {}, source_id="P")
        try:
            tx.conn.execute(text("INSERT INTO app_kv VALUES ('a', '2')"))  # a duplicate key
        except Exception:
            ran.append("caught")
        if before is not None:
            before()
        return "done"
    return body


def _outcome(fn):
    try:
        return ("value", fn())
    except BaseException as exc:  # asserted by the caller
        return ("error", exc)


@pytest.mark.parametrize("store", ["group", "single"], indirect=True)
def test_a_callback_that_swallows_a_failed_statement_alone(store, db_url, backend):
    _prepare(store)
    ran: list[str] = []
    kind, got = _outcome(lambda: store.journal.transact(_swallowing(ran)))
    assert ran == ["body", "caught"]  # run once, never retried
    if backend == "sqlite":  # SQLite undid the failed statement only
        assert (kind, got) == ("value", "done")
        assert _count(db_url, "r") == 1
        return
    assert kind == "error" and isinstance(got, fencepost.JournalError), got
    assert got.code == "sink_failed" and "aborted by a failed statement" in got.detail
    assert _count(db_url, "r") == 0
    store.journal.append_unfenced("r", "e.after", {}, source_id="P")  # the connection is fine
    assert _count(db_url, "r") == 1


@pytest.mark.parametrize("store", ["group", "single"], indirect=True)
def test_a_callback_that_swallows_a_failed_statement_among_others(store, db_url, backend):
    """The swallowing call is a member of another thread's group (with group commit): it alone
    fails, its callback runs once, and the leader and the member queued after it commit."""
    _prepare(store)
    j = store.journal
    release = threading.Event()
    group = store.db._group is not None

    def lead(tx):
        tx.append_unfenced("L", "e", {}, source_id="L")
        assert release.wait(JOIN_S)
        return "lead"

    out: dict[str, tuple] = {}
    ran: list[str] = []

    def run(name, fn):
        t = threading.Thread(target=lambda: out.__setitem__(name, _outcome(fn)), daemon=True)
        t.start()
        return t

    def queued(n):
        deadline = time.monotonic() + JOIN_S
        while group and store.db._group._waiting < n:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        if not group:
            time.sleep(0.2)

    tl = run("lead", lambda: j.transact(lead))
    if group:
        while store.db._group._group is None:
            time.sleep(0.001)
    else:
        time.sleep(0.2)
    ts = run("swallow", lambda: j.transact(_swallowing(ran)))
    queued(1)
    to = run("other", lambda: j.append_unfenced("o", "e", {}, source_id="O"))
    queued(2)
    release.set()
    for t in (tl, ts, to):
        t.join(JOIN_S)
        assert not t.is_alive()
    assert out["lead"] == ("value", "lead")
    assert out["other"][0] == "value"
    assert ran == ["body", "caught"]  # once
    assert _count(db_url, "L") == 1 and _count(db_url, "o") == 1
    if backend == "sqlite":
        assert out["swallow"] == ("value", "done") and _count(db_url, "r") == 1
        return
    kind, got = out["swallow"]
    assert kind == "error" and isinstance(got, fencepost.JournalError), got
    assert "aborted by a failed statement" in got.detail
    assert _count(db_url, "r") == 0


def test_a_leader_whose_callback_swallows_a_failed_statement_fails_alone(store, db_url, backend):
    """The swallowing call leads the group (its body runs first): it fails alone; the calls that
    queued behind it meanwhile commit."""
    _prepare(store)
    j = store.journal
    gate = threading.Event()
    ran: list[str] = []
    out: dict[str, tuple] = {}

    def run(name, fn):
        t = threading.Thread(target=lambda: out.__setitem__(name, _outcome(fn)), daemon=True)
        t.start()
        return t

    tl = run("swallow", lambda: j.transact(_swallowing(ran, before=lambda: gate.wait(JOIN_S))))
    while store.db._group._group is None:
        time.sleep(0.001)
    to = run("other", lambda: j.append_unfenced("o", "e", {}, source_id="O"))
    while store.db._group._waiting < 1:
        time.sleep(0.001)
    gate.set()
    for t in (tl, to):
        t.join(JOIN_S)
        assert not t.is_alive()
    assert ran == ["body", "caught"] and out["other"][0] == "value"
    assert _count(db_url, "o") == 1
    if backend == "sqlite":
        assert out["swallow"] == ("value", "done")
        return
    kind, got = out["swallow"]
    assert kind == "error" and "aborted by a failed statement" in got.detail, got
    assert _count(db_url, "r") == 0
