"""SQLite: the store checkpoints the write-ahead log on a thread of its own, not inside a COMMIT.

Whether a write reached the database file (not only the log) is read from a copy of that file
alone: SQLite opens the copy without any log, so it holds exactly what was checkpointed.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path

import pytest

import fencepost
from fencepost import _checkpoint, _dialects
from tests.conftest import eventually, run_forked


def in_database_file(path: Path, run_id: str) -> bool:
    """Whether ``run_id``'s row is in the database file itself (the log left out)."""
    with tempfile.TemporaryDirectory() as elsewhere:  # not on the (maybe full) disk under test
        copy = Path(elsewhere) / "copy.db"
        shutil.copyfile(path, copy)
        conn = sqlite3.connect(copy)
        try:
            if not conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'flows_runs'").fetchone()[0]:
                return False  # not even the store's tables were copied yet
            return conn.execute("SELECT count(*) FROM flows_runs WHERE run_id = ?", (run_id,)).fetchone()[0] == 1
        except sqlite3.DatabaseError:
            return False  # copied while a checkpoint was half way: the file alone is not whole yet
        finally:
            conn.close()


def test_a_commit_reaches_the_database_file_through_the_store_s_thread(tmp_path: Path) -> None:
    path = tmp_path / "flows.db"
    with fencepost.open(f"sqlite:///{path}") as store:
        checkpointer = store.db.backend.checkpointer
        before = checkpointer.passes
        store.runs.create("ck-1", '{"n": 1}')  # committed to the log; copied later, off the write path
        # Waited for in the file itself: a pass the migrations' commits asked for may run while this
        # write commits, and count without having copied it (the pass after it copies it).
        assert eventually(lambda: checkpointer.passes > before and in_database_file(path, "ck-1"))
        thread = checkpointer._thread
        assert thread is not None and thread.is_alive() and thread.name == "fencepost-checkpoint"

        def autocheckpoint(conn):
            return conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar()

        # The writer's own checkpoint is only the backstop.
        assert store.db.write(autocheckpoint) == _checkpoint.WRITER_BACKSTOP_PAGES
    assert not checkpointer.running and not thread.is_alive()  # closing the store stops the thread


def test_a_disposed_database_that_writes_again_checkpoints_again(tmp_path: Path) -> None:
    path = tmp_path / "flows.db"
    store = fencepost.open(f"sqlite:///{path}")
    store.runs.create("before-close", '{"n": 1}')
    store.db.dispose()  # connections and the checkpoint thread released (Store.close also refuses later calls)
    checkpointer = store.db.backend.checkpointer
    assert not checkpointer.running
    try:
        passes = checkpointer.passes
        store.runs.create("after-close", '{"n": 1}')  # a disposed database reconnects when used again
        assert checkpointer.running
        assert eventually(lambda: checkpointer.passes > passes and in_database_file(path, "after-close"))
    finally:
        store.close()


def test_a_store_dropped_without_close_stops_its_thread(tmp_path: Path) -> None:
    import gc
    import weakref

    store = fencepost.open(f"sqlite:///{tmp_path / 'flows.db'}")
    store.runs.create("dropped", '{"n": 1}')
    thread = store.db.backend.checkpointer._thread  # this store's (other tests' may still run)
    assert thread is not None and thread.is_alive()
    backend = weakref.ref(store.db.backend)
    del store
    gc.collect()
    held = backend()
    assert held is None, [repr(r)[:300] for r in gc.get_referrers(held)]
    # A pass under way finishes first; on a loaded machine its first statement can wait out the
    # busy timeout (5 s) while the collected store's last connection checkpoints and resets the log.
    assert eventually(lambda: not thread.is_alive(), timeout=20)


def test_the_writer_still_checkpoints_when_the_thread_cannot_keep_up(tmp_path: Path, monkeypatch) -> None:
    """The thread stalled: the log is still bounded, by the writer's backstop."""
    monkeypatch.setattr(_checkpoint, "INTERVAL_S", 3600.0)
    monkeypatch.setattr(_dialects, "WRITER_BACKSTOP_PAGES", 40)
    path = tmp_path / "flows.db"
    with fencepost.open(f"sqlite:///{path}") as store:
        for i in range(300):
            store.runs.create(f"ck-{i}", '{"n": 1}')
        assert store.db.backend.checkpointer.passes == 0
        page = 4096
        # 300 runs take several hundred log pages; the backstop keeps the log near 40.
        assert os.path.getsize(str(path) + "-wal") < 120 * page
        assert in_database_file(path, "ck-0")


def test_a_forked_child_checkpoints_its_own_writes(tmp_path: Path) -> None:
    path = tmp_path / "flows.db"
    with fencepost.open(f"sqlite:///{path}") as store:
        store.runs.create("parent", '{"n": 1}')  # the parent's thread is running now
        # Forked while another thread of the parent holds the checkpointer's lock: the child's
        # copy of it is never released, and the child must not wait for it.
        held = store.db.backend.checkpointer._lock
        held.acquire()

        def child() -> None:
            checkpointer = store.db.backend.checkpointer
            # The count of passes is the parent's at the fork (its thread may have passed already).
            before = checkpointer.passes
            store.runs.create("child", '{"n": 1}')
            assert checkpointer.running
            # The child leaves by os._exit, without closing: only its own thread copies its write.
            assert eventually(lambda: checkpointer.passes > before and in_database_file(path, "child"))

        released: list[bool] = []

        def let_go() -> None:  # in the parent, once forked: the child's copy stays held
            held.release()
            released.append(True)

        try:
            code = run_forked(child, parent=let_go, timeout=20)
        except TimeoutError:
            raise AssertionError("the child hung on its first write") from None
        finally:
            if not released:  # the fork itself failed
                held.release()
        assert code == 0
        assert in_database_file(path, "child")


@pytest.mark.parametrize("backend", ["postgresql"])
def test_postgresql_has_no_checkpoint_thread(make_db_url) -> None:
    before = set(threading.enumerate())  # other tests' stores may still have threads running
    with fencepost.open(make_db_url()) as store:
        store.runs.create("pg-1", '{"n": 1}')
        assert not hasattr(store.db.backend, "checkpointer")  # the server checkpoints its own log
        assert [t for t in set(threading.enumerate()) - before if t.name == "fencepost-checkpoint"] == []


def test_checkpoints_writer_keeps_sqlite_s_own_checkpoints_and_runs_no_thread(tmp_path: Path) -> None:
    path = tmp_path / "flows.db"
    before = set(threading.enumerate())  # other tests' stores may still have threads running
    with fencepost.open(f"sqlite:///{path}?checkpoints=writer") as store:
        store.runs.create("w-1", '{"n": 1}')
        assert store.db.backend.checkpointer is None
        assert [t for t in set(threading.enumerate()) - before if t.name == "fencepost-checkpoint"] == []

        def autocheckpoint(conn):
            return conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar()

        assert store.db.write(autocheckpoint) == 1000  # SQLite's default: the writer checkpoints


def test_a_store_opened_read_only_runs_no_thread(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'flows.db'}"
    with fencepost.open(url) as writer:
        writer.runs.create("ro-1", '{"n": 1}')
        with fencepost.open(url, readonly=True) as reader:
            assert reader.runs.get("ro-1") is not None
            assert reader.db.backend.checkpointer is None


@pytest.mark.parametrize(("option", "field"), [("checkpoints=sometimes", "checkpoints"),
                                               ("synchronous=sometimes", "synchronous")])
def test_a_bad_sqlite_option_is_refused_before_anything_is_created(tmp_path: Path, option: str, field: str) -> None:
    path = tmp_path / "not-yet" / "flows.db"
    with pytest.raises(ValueError) as caught:
        fencepost.open(f"sqlite:///{path}?{option}")
    assert str(caught.value).startswith(field) and "sometimes" not in str(caught.value)
    assert not path.parent.exists()


PROCS = 3
RUNS_EACH = 120


def _writer_process(url: str, k: int, barrier, out) -> None:
    """One process writing runs and journal entries while its own thread checkpoints every few ms."""
    _checkpoint.INTERVAL_S = 0.003
    try:
        with fencepost.open(url) as store:
            barrier.wait(timeout=30)
            for i in range(RUNS_EACH):
                run_id = f"p{k}-{i}"
                store.runs.create(run_id, '{"blob": "' + "x" * 3000 + '"}')  # pages enough to copy
                store.journal.append_unfenced(run_id, "made", {"i": i}, source_id=f"proc-{k}")
            checkpointer = store.db.backend.checkpointer
            eventually(lambda: checkpointer.passes > 0)
            out.put((k, checkpointer.passes, None))
    except BaseException as exc:  # reported, so the parent shows why instead of a bare exit code
        out.put((k, 0, repr(exc)))


def test_processes_checkpointing_one_file_while_writing_and_reading_lose_nothing(tmp_path: Path) -> None:
    """Races as races: three processes write one file, each with its own checkpoint thread copying
    the log every few milliseconds, while this process reads the change feed throughout."""
    import multiprocessing as mp

    from fencepost.journal.verify import verify

    path = tmp_path / "flows.db"
    url = f"sqlite:///{path}"
    fencepost.open(url).close()  # migrated once, before the race
    ctx = mp.get_context("fork")  # the parent holds no open store while children start
    barrier, out = ctx.Barrier(PROCS + 1), ctx.Queue()
    procs = [ctx.Process(target=_writer_process, args=(url, k, barrier, out)) for k in range(PROCS)]
    for p in procs:
        p.start()
    seen: set[str] = set()
    with fencepost.open(url, readonly=True) as reader:
        position = reader.feed.position()  # before any writer passes the barrier
        barrier.wait(timeout=30)
        while True:
            writing = any(p.is_alive() for p in procs)
            batch = reader.feed.changes_since(position, 500)
            seen.update(c.run_id for c in batch.changes)
            position = batch.next_position
            if not writing and not batch.has_more:
                break
        results = sorted(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert [error for _, _, error in results] == [None] * PROCS
    assert all(passes > 0 for _, passes, _ in results)  # every process's thread did copy
    assert seen == {f"p{k}-{i}" for k in range(PROCS) for i in range(RUNS_EACH)}
    with fencepost.open(url) as store:
        report = verify(store)
        assert report.ok and report.entries_checked == PROCS * RUNS_EACH
        assert store.db.read(lambda c: c.exec_driver_sql("PRAGMA integrity_check").scalar()) == "ok"
    # Every store closed: the log went into the file, which alone holds everything.
    assert all(in_database_file(path, f"p{k}-{RUNS_EACH - 1}") for k in range(PROCS))


def test_idle_waits_for_the_pass_a_write_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``idle`` returns once the copy of the writes so far is done: the row is in the database file
    itself at that moment, not later. Right after a write the thread is still letting writes
    gather (here a second, so no stall of this thread lets it finish first), so a zero timeout
    answers False."""
    monkeypatch.setattr(_checkpoint, "INTERVAL_S", 1.0)
    path = tmp_path / "flows.db"
    with fencepost.open(f"sqlite:///{path}") as store:
        checkpointer = store.db.backend.checkpointer
        for i in range(2):
            run_id = f"idle-{i}"
            store.runs.create(run_id, '{"n": 1}')
            assert checkpointer.idle(0) is False  # asked for, not done yet
            assert checkpointer.idle(10) is True
            assert in_database_file(path, run_id)
    assert checkpointer.idle(0) is True  # a closed store's thread has nothing left to do
