"""Paging the whole journal by ``position`` while writer processes append: a race, run as one.

A reader that pages ``position > last`` misses a lower position that commits after a higher one
(what a sequence does on PostgreSQL: taken at INSERT, visible at COMMIT). ``journal.log()`` is safe
only because positions are allocated under the writer lock; this test races it for real on SQLite
and PostgreSQL: writer processes released together append single entries and batches to their own
and a shared run while a thread here pages ``log()`` with a small page size.
"""

from __future__ import annotations

import threading

import pytest

import fencepost
from fencepost.journal import NewEntry
from tests.conftest import race_processes
from tests.journal.conftest import rows, writer_process

PROCESSES = 3
ROUNDS = 30


def _step(j, index: int, k: int) -> None:
    j.append_unfenced(f"own-{index}", "tick", {"k": k}, source_id="self")
    if k % 3 == 0:
        j.append_many_unfenced("shared", [NewEntry("batch", {"p": index, "k": k, "b": b})
                                          for b in range(3)], source_id=f"p{index}")


@pytest.mark.slow
def test_log_paged_while_processes_append_skips_no_position(store: fencepost.Store, db_url: str) -> None:
    """Pitfall "sequences are not commit order": the pages read while the writers run, plus a last
    pass after they stop, yield every stored entry exactly once, in position order, positions 1..N."""
    seen: list[tuple[int, str]] = []
    done = threading.Event()
    errors: list[BaseException] = []
    pages = [0]

    def reader() -> None:
        try:
            last = 0
            while True:
                finished = done.is_set()
                got = 0
                for entry in store.journal.log(after=last, page_size=4):
                    seen.append((entry.position, entry.event_id))
                    last = entry.position
                    got += 1
                pages[0] += 1
                if finished and got == 0:
                    return
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        results, _ = race_processes(writer_process, lambda i: (db_url, i, ROUNDS, _step), PROCESSES, timeout=240)
    finally:
        done.set()
        thread.join(60)
    assert not thread.is_alive()
    assert not errors, errors
    assert sorted(results) == [("ok", i) for i in range(PROCESSES)]

    stored = rows(store)
    per_process = ROUNDS + 3 * len(range(0, ROUNDS, 3))
    assert len(stored) == PROCESSES * per_process
    positions = [position for position, _ in seen]
    assert positions == list(range(1, len(stored) + 1))  # none skipped, none twice, in order
    assert [event_id for _, event_id in seen] == [e.event_id for e in store.journal.log()]
    assert pages[0] > 2  # the reader really paged while the writers ran
