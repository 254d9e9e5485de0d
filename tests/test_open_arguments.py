"""``fencepost.open``'s arguments are checked before anything is created, and a closed store says so.

Found by a review that called the public API with wrong arguments: ``open(url, clock="...")``
opened (and created) the store, then failed at the first write with an ``AttributeError``; a bad
``attempt_policy`` was refused only after the database had been created and migrated; ``open("")``
created ``.flows/flows.db`` in the working directory; a closed store reconnected silently and
kept writing; and writes on a read-only store said only "persistence failed".
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

import fencepost
from fencepost.runstore.attempts import AttemptPolicy
from tests.conftest import store_exists

SECRET = "S3CR3T-xyz"


class _NotAClock:
    def now(self) -> int:
        return 0


@pytest.mark.parametrize(("option", "value", "words"), [
    ("clock", SECRET, "clock"),
    ("clock", _NotAClock(), "clock"),
    ("consensus", SECRET, "consensus"),
    ("consensus", object(), "consensus"),
    ("readonly", "yes", "readonly"),
    ("readonly", 1, "readonly"),
    ("group_commit", None, "group_commit"),
    ("group_commit", "no", "group_commit"),
    ("attempt_policy", {"max_checkpoint_bytes": 5}, "attempt_policy"),
    ("attempt_policy", AttemptPolicy(max_checkpoint_bytes=0), "max_checkpoint_bytes"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 20 else type(v).__name__)
def test_a_bad_option_is_refused_before_the_database_is_created(db_url: str, option: str, value: object,
                                                                 words: str) -> None:
    with pytest.raises((ValueError, fencepost.FencepostError)) as err:
        fencepost.open(db_url, **{option: value})
    assert words in str(err.value)
    assert SECRET not in str(err.value)
    assert not store_exists(db_url), "the refused open created the database"
    # The same URL opens once the option is right.
    with fencepost.open(db_url) as store:
        store.runs.create("r", "{}")


@pytest.mark.parametrize("url", ["", "   "])
def test_an_empty_url_is_refused_and_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     url: str) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FENCEPOST_DB", raising=False)
    with pytest.raises(ValueError, match="url"):
        fencepost.open(url)
    assert os.listdir(tmp_path) == []


def test_a_closed_store_refuses_every_call_and_writes_nothing(db_url: str) -> None:
    store = fencepost.open(db_url)
    store.runs.create("kept", "{}")
    before = store.feed.position()
    store.close()
    calls = [
        lambda: store.runs.create("late", "{}"),
        lambda: store.runs.get("kept"),
        lambda: store.journal.append_unfenced("kept", "note", {}, source_id="cli"),
        lambda: store.feed.changes_since(before),
        lambda: store.feed.list_runs(),
    ]
    for call in calls:
        with pytest.raises(fencepost.FencepostError) as err:
            call()
        assert "closed" in str(err.value), err.value
    # A follower gives up at once: it must not wait for a closed store to come back.
    for follow in (store.feed.follow, store.feed.follow_batches):
        raised: list[BaseException] = []

        def tail(follow=follow, raised=raised) -> None:
            try:
                next(iter(follow(before)))
            except BaseException as exc:  # recorded for the assertion
                raised.append(exc)

        t = threading.Thread(target=tail, daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive(), f"{follow.__name__} kept retrying on a closed store"
        assert raised and "closed" in str(raised[0]), raised
    store.close()  # closing twice is harmless
    with fencepost.open(db_url, readonly=True) as again:
        assert again.feed.position() == before
        assert [r.run_id for r in again.feed.list_runs().runs] == ["kept"]


def test_a_write_on_a_readonly_store_says_the_store_is_read_only(db_url: str) -> None:
    fencepost.open(db_url).close()
    with fencepost.open(db_url, readonly=True) as ro:
        for call in (lambda: ro.runs.create("x", "{}"),
                     lambda: ro.journal.append_unfenced("x", "note", {}, source_id="cli")):
            with pytest.raises(fencepost.FencepostError) as err:
                call()
            assert "read-only" in str(err.value), err.value


def test_a_postgresql_url_without_the_driver_is_an_open_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Callers catch ``OpenError`` for every failure of ``open``; the missing driver was a ``PersistenceError``."""
    monkeypatch.setitem(sys.modules, "psycopg", None)  # what an install without the extra looks like
    with pytest.raises(fencepost.OpenError) as err:
        fencepost.open(f"postgresql+psycopg://app:{SECRET}@127.0.0.1:1/db")
    assert err.value.code == "driver_missing"
    assert "fencepost[postgres]" in str(err.value) and SECRET not in str(err.value)


class _OnlyNow:
    """A clock as the library uses it: ``now_ms`` alone."""

    def now_ms(self) -> int:
        return 1_000_000


def test_a_clock_with_only_now_ms_is_accepted(db_url: str) -> None:
    with fencepost.open(db_url, clock=_OnlyNow()) as store:
        store.runs.create("r", "{}")
        assert store.runs.get("r").created_at_ms == 1_000_000


def test_each_refused_write_raises_its_own_exception(db_url: str) -> None:
    """One shared exception object would gather the traceback (and the frames) of every refusal."""
    fencepost.open(db_url).close()
    with fencepost.open(db_url, readonly=True) as ro:
        seen = []
        for i in range(3):
            try:
                ro.runs.create(f"r{i}", "{}")
            except fencepost.RunStoreError as exc:
                seen.append(exc.__context__)
    assert len(seen) == 3 and len({id(e) for e in seen}) == 3


def _ends_with_closed(target) -> BaseException:
    """Run ``target`` in a thread, close the store meanwhile (by the caller), and give what it raised."""
    raised: list[BaseException] = []

    def work() -> None:
        try:
            target()
        except BaseException as exc:  # recorded for the assertion
            raised.append(exc)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    return t, raised


def test_long_running_calls_end_when_their_store_is_closed(db_url: str, make_db_url) -> None:
    """A caught-up follower, a projection builder following the store and a worker waiting for runs
    each end with the closed error (a caught-up SQLite follower waited for a write that never came,
    the builder retried forever, the worker raised an internal exception)."""
    from fencepost.projections import ProjectionBuilder, RunsByStatus
    from fencepost.worker import Worker

    store = fencepost.open(db_url)
    store.runs.create("r", "{}")
    builder = ProjectionBuilder(store, make_db_url(), RunsByStatus(), poll_interval=0.1)
    started = [
        _ends_with_closed(lambda: [None for _ in store.feed.follow(None, poll_interval=0.2)]),
        _ends_with_closed(builder.run),
        _ends_with_closed(lambda: Worker(store, lambda ctx: None, run_prefix="none-").run()),
    ]
    time.sleep(1.0)  # each is waiting: caught up, or no run to take
    store.close()
    try:
        for (t, raised), what in zip(started, ("follow", "ProjectionBuilder.run", "Worker.run"), strict=True):
            t.join(15)
            assert not t.is_alive(), f"{what} kept going on a closed store"
            assert raised and isinstance(raised[0], fencepost.FencepostError), (what, raised)
            assert "closed" in str(raised[0]), (what, raised[0])
    finally:
        builder.close()
