"""``fencepost.testing.memory_store``: the real SQL on a RAM-backed file, a ManualClock, removed on close."""

from __future__ import annotations

import os

import pytest

from fencepost import Activated, EvidenceRequired, RunSnapshot
from fencepost.clock import ManualClock
from fencepost.testing import memory_store

from .conftest import A, B


def test_memory_store_runs_the_real_contract_and_cleans_up():
    with memory_store() as store:
        assert isinstance(store.clock, ManualClock)
        store.runs.create("r", "{}")
        assert store.runs.claim_and_own("r", RunSnapshot("pending", None, None), A, 0) == Activated()
        store.clock.advance(31_000)
        assert store.runs.claim_and_own("r", store.runs.get("r"), B, 31_000) == EvidenceRequired()
        directory = store.directory
        assert os.path.exists(os.path.join(directory, "flows.db"))
        if os.path.isdir("/dev/shm"):
            assert directory.startswith("/dev/shm/")
    assert not os.path.exists(directory)


def _shm_dirs() -> set[str]:
    import tempfile

    places = [p for p in ("/dev/shm", tempfile.gettempdir()) if os.path.isdir(p)]
    return {os.path.join(p, d) for p in places for d in os.listdir(p) if d.startswith("fencepost-")}


@pytest.mark.parametrize(("option", "value", "kind"), [
    ("clock", "x", "str"), ("clock", 12, "int"), ("consensus", "x", "str"), ("consensus", object(), "object"),
])
def test_memory_store_refuses_a_wrong_clock_or_consensus_before_creating_anything(option, value, kind):
    """SQLite only (memory_store is a SQLite file by design). A clock without ``now_ms`` or a
    consensus that is not a strategy used to be accepted, failing only at the first call with an
    ``AttributeError`` or a bare ``persistence_failed``; it is refused at once, as
    ``fencepost.open`` refuses it, naming the argument and the type (never the value), and no
    temporary directory is left behind."""
    before = _shm_dirs()
    with pytest.raises(ValueError, match=rf"^memory_store: {option} must be None or an object with .* not {kind}$"):
        memory_store(**{option: value})
    assert _shm_dirs() - before == set()


def test_memory_store_still_takes_a_manual_clock_and_a_strategy():
    from fencepost.journal.consensus import SqlConsensus

    clock = ManualClock(5)
    with memory_store(clock=clock, consensus=SqlConsensus()) as store:
        assert store.clock is clock and store.clock.now_ms() == 5


@pytest.mark.parametrize("value", [None, "sqlite:///x.db", 3])
def test_limit_pages_refuses_what_is_not_a_store(value):
    """SQLite only (limit_pages caps a SQLite file). Anything but a store used to raise a bare
    ``AttributeError`` ('... has no attribute db'); it is a ``ValueError`` naming the argument."""
    from fencepost.testing import limit_pages

    with pytest.raises(ValueError, match=rf"^limit_pages: store must be a fencepost Store, not {type(value).__name__}"):
        limit_pages(value, 1)


def test_limit_pages_on_a_shard_set_names_the_member_store(tmp_path):
    """SQLite only. A shard set is no store: the error says to pass one member, ``shards[name]``."""
    import fencepost
    from fencepost.testing import limit_pages

    with fencepost.open_shards([f"sqlite:///{tmp_path / 'a.db'}"]) as shards:
        with pytest.raises(ValueError, match=r"not ShardSet; pass one member store, shards\[name\]"):
            limit_pages(shards, 1)
        limit_pages(shards["shard-0"], None)
