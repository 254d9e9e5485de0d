"""``fencepost.testing.memory_store``: the real SQL on a RAM-backed file, a ManualClock, removed on close."""

from __future__ import annotations

import os

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
