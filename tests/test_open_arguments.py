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
