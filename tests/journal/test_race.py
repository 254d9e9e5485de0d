"""Real races: several processes append to one stream and to their own streams at once."""

from __future__ import annotations

from collections import defaultdict

import pytest

import fencepost
from fencepost.journal import NewEntry, verify
from tests.conftest import race_processes
from tests.journal.conftest import A, hold, rows, writer_process

PROCESSES = 4
ROUNDS = 25


def _step(j, index: int, k: int) -> None:
    j.append_unfenced("shared", "tick", {"p": index, "k": k}, source_id=f"p{index}")
    j.append_unfenced(f"own-{index}", "tick", {"k": k}, source_id="self")
    j.append("fenced", "tick", {"p": index, "k": k}, owner=A, source_id=f"p{index}")
    if k % 5 == 0:
        batch = [NewEntry("batch", {"p": index, "k": k, "b": b}) for b in range(3)]
        j.append_many_unfenced("shared", batch, source_id=f"p{index}")


@pytest.mark.slow
def test_concurrent_processes_keep_seq_and_position_gapless_and_the_chain_valid(store: fencepost.Store,
                                                                               db_url: str) -> None:
    hold(store, "fenced", A)
    results, _ = race_processes(writer_process, lambda i: (db_url, i, ROUNDS, _step), PROCESSES, timeout=240)
    assert sorted(results) == [("ok", i) for i in range(PROCESSES)]

    stored = rows(store)
    per_process = ROUNDS * 3 + 3 * len(range(0, ROUNDS, 5))
    assert len(stored) == PROCESSES * per_process
    assert [r[5] for r in stored] == list(range(1, len(stored) + 1))  # positions gapless, in order
    seqs: dict[str, list[int]] = defaultdict(list)
    source_seqs: dict[tuple[str, str], list[int]] = defaultdict(list)
    for run_id, seq, source_id, source_seq, _payload, _position in stored:
        seqs[run_id].append(seq)
        source_seqs[(run_id, source_id)].append(source_seq)
    for run_id, found in seqs.items():
        assert found == list(range(len(found))), run_id  # commit order is seq order, gapless
    for key, found in source_seqs.items():
        assert found == list(range(len(found))), key
    report = verify(store)
    assert report.ok, report.first_break
    assert report.entries_checked == len(stored)
