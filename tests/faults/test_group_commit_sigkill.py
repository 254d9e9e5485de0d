"""SIGKILL of a process whose threads share group commits, then the store opened again.

Four threads write at once, so their calls share COMMITs (run rows, journal entries and tombstones
of several calls in one transaction). The process is killed while they write. Whatever was in
flight must be all there or not at all: each run row with its journal entry, each deleted run with
its tombstone, the feed's revisions unique and within the source's; every write the killed process
saw acknowledged is there; and the store, opened again (and a store opened before the kill), writes.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from sqlalchemy import text

import fencepost
from tests.faults.conftest import REPO, Peer

pytestmark = pytest.mark.slow

ACKED_BEFORE_KILL = 60  # acknowledged writes the killed process makes first (a few groups' worth)


def _kill_mid_groups(url: str, prefix: str) -> list[str]:
    """Start the writer, kill it once it acknowledged ``ACKED_BEFORE_KILL`` writes; return them."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.faults._group_writer", url, prefix],
                            stdout=subprocess.PIPE, cwd=REPO)
    reader = Peer.__new__(Peer)  # the peer's bounded line reader, on this pipe
    reader.proc, reader._buf = proc, b""
    try:
        assert reader._line(60) == "ready"
        acked: list[str] = []
        while len(acked) < ACKED_BEFORE_KILL:
            line = reader._line(60)
            assert line is not None, "the writer stopped writing"
            acked.append(line)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        # Lines already in the pipe were acknowledged before the kill, too.
        while (line := reader._line(0.2)) is not None:
            acked.append(line)
        return acked
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def _state(store: fencepost.Store):
    def read(conn):
        runs = set(conn.execute(text("SELECT run_id FROM flows_runs")).scalars())
        made = list(conn.execute(text(
            "SELECT run_id FROM flows_journal_events WHERE event_type = 'made'")).scalars())
        changes = {r[0]: (int(r[1]), bool(r[2])) for r in conn.execute(text(
            "SELECT run_id, revision, deleted FROM flows_run_changes"))}
        source = int(conn.execute(text("SELECT revision FROM flows_run_source")).scalar())
        return runs, made, changes, source

    return store.db.read(read)


def test_sigkill_during_group_commits_leaves_every_transaction_whole(db_url: str, backend: str) -> None:
    before = fencepost.open(db_url)  # opened before the kills; must keep working after them
    try:
        before.runs.create("before", "{}")
        acked: list[str] = []
        for round_ in range(2):
            acked += _kill_mid_groups(db_url, f"k{round_}")
        with fencepost.open(db_url) as store:
            runs, made, changes, source = _state(store)
            made_set = set(made)
            assert len(made) == len(made_set)  # no entry twice
            assert set(acked) <= made_set  # every acknowledged write is there
            written = runs - {"before"}
            assert written <= made_set  # no run row without its entry
            for run_id in made_set - runs:  # a run gone since: deleted, so its tombstone is in the feed
                assert changes[run_id][1] is True, run_id
            for run_id in runs:
                assert changes[run_id][1] is False, run_id
            revisions = [rev for rev, _ in changes.values()]
            assert len(set(revisions)) == len(revisions) and max(revisions) <= source
            store.runs.create("after", "{}")
            store.journal.transact(lambda tx: tx.append_unfenced("after", "made", {}, source_id="after"))
        before.runs.create("before-after", "{}")
        assert before.runs.get("after").status == "pending"
    finally:
        before.close()
