"""A signal handler (or a finalizer) that writes or reads while its own thread is beginning or
committing a transaction on the same store, group commit off.

Defect: the call waited for the connection its own thread held (the thread's transaction, which
cannot go on until the handler returns): the process hung for ever, on both backends (a timer
signal every 3 ms whose handler creates a run, while the main thread creates runs). It now fails at
once with ``persistence_failed`` saying why, and the interrupted call completes; as with group
commit on, where a write made while its thread leads a group is refused the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from sqlalchemy import event

import fencepost

pytestmark = pytest.mark.timeout(150)  # a hang (what these tests guard against) fails fast


@pytest.fixture
def single(db_url: str):
    store = fencepost.open(db_url, group_commit=False)
    try:
        yield store
    finally:
        store.close()


def _ids(store: fencepost.Store) -> set[str]:
    return {r.run_id for r in store.feed.iter_runs()}


def _during_commit(store: fencepost.Store, call):
    """Run ``call`` once, at the next COMMIT of the store's connections, as a signal handler that
    ran there would; return what it returned or raised."""
    got: dict = {}

    def on_commit(_conn) -> None:
        if got:
            return
        got["ran"] = True
        try:
            got["value"] = call()
        except fencepost.FencepostError as exc:
            got["error"] = exc

    event.listen(store.db.engine, "commit", on_commit)
    return got


def test_a_write_made_while_its_thread_commits_a_write_fails_at_once(single):
    got = _during_commit(single, lambda: single.runs.create("from-handler", "{}"))
    single.runs.create("main", "{}")  # completes: the handler's refusal is the handler's alone
    err = got["error"]
    assert isinstance(err, fencepost.RunStoreError) and err.code == "persistence_failed"
    assert "its own write" in err.detail and "signal handler" in err.detail, err.detail
    assert _ids(single) == {"main"}
    single.runs.create("after", "{}")  # the same store goes on writing
    assert _ids(single) == {"main", "after"}


def test_a_read_made_while_its_thread_commits_a_read_fails_at_once(single):
    single.runs.create("there", "{}")
    got = _during_commit(single, lambda: single.runs.get("there"))
    assert single.runs.get("there") is not None
    err = got["error"]
    assert isinstance(err, fencepost.RunStoreError) and err.code == "persistence_failed"
    assert "its own read" in err.detail, err.detail
    assert single.runs.get("there").run_id == "there"


def test_a_write_made_while_its_thread_commits_a_read_goes_through(single):
    """A write is not a read's twin: it takes the store's write connection, which the thread does
    not hold, and lands."""
    single.runs.create("there", "{}")
    got = _during_commit(single, lambda: single.runs.create("from-handler", "{}"))
    assert single.runs.get("there") is not None
    assert "error" not in got, got
    assert _ids(single) == {"there", "from-handler"}


def test_a_write_made_while_its_thread_holds_the_group_lock_fails_at_once(store, monkeypatch):
    """Group commit on: a signal landing while its thread's own call holds the group's lock (taking
    the lead, queueing, ending its group) ran a handler whose write waited for that lock, for ever
    (a timer signal every 3 ms hung PostgreSQL's run about one time in ten). The handler's write is
    made here right after the lock is taken, as such a signal would: refused at once, and the
    interrupted call completes."""
    from fencepost import _group

    got: dict = {}

    class Interrupted(_group._MarkedLock):
        def __enter__(self) -> None:
            super().__enter__()
            if not got:
                got["ran"] = True
                try:
                    store.runs.create("from-handler", "{}")
                except fencepost.RunStoreError as exc:
                    got["error"] = exc

    group = store.db._group
    assert group is not None
    monkeypatch.setattr(group, "_lock", Interrupted())
    store.runs.create("main", "{}")
    err = got["error"]
    assert err.code == "persistence_failed" and "its own write" in err.detail, err.detail
    store.runs.create("after", "{}")
    assert _ids(store) == {"main", "after"}


_TIMER_SCRIPT = r"""
import signal, sys
import fencepost

store = fencepost.open(sys.argv[1], group_commit=sys.argv[2] == "group")
landed, refused, inside = [], [], [False]

def handler(signum, frame):
    if inside[0]:
        return
    inside[0] = True
    try:
        run_id = f"h{len(landed) + len(refused):05d}"
        try:
            store.runs.create(run_id, "{}")
            landed.append(run_id)
        except fencepost.RunStoreError as exc:
            assert "its own write" in exc.detail, exc.detail
            refused.append(run_id)
    finally:
        inside[0] = False

signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.003, 0.003)
for i in range(600):
    store.runs.create(f"m{i:05d}", "{}")
signal.setitimer(signal.ITIMER_REAL, 0)
ids = {r.run_id for r in store.feed.iter_runs()}
assert {f"m{i:05d}" for i in range(600)} <= ids
assert set(landed) <= ids and not (set(refused) & ids)
print(len(landed), len(refused))
store.close()
"""


@pytest.mark.parametrize("mode", ["single", "group"])
def test_a_timer_signal_whose_handler_writes_never_hangs_the_process(db_url, mode, tmp_path):
    """A real timer signal every 3 ms whose handler creates a run, while the main thread creates
    600: the process ends; every main write landed, every handler write landed or was refused
    with the reason, and none of the refused ones landed."""
    script = tmp_path / "timer.py"
    script.write_text(_TIMER_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    try:
        done = subprocess.run([sys.executable, str(script), db_url, mode], capture_output=True, text=True,
                              timeout=90, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("the process hung: a handler's write waited for its own thread")
    assert done.returncode == 0, done.stderr[-3000:]
    landed, _refused = map(int, done.stdout.split())
    assert landed > 0, done.stdout  # the handler ran and wrote (between its thread's transactions)
