"""An identifier in an audit report cannot forge a line of it.

Defect (found by an audit review, both backends): ``journal verify`` named a broken entry's run or
stream as stored, through a filter that keeps line feeds, so a run id such as
``evil<LF>journal verified: 3 entries in 1 streams, chains intact`` printed a line of its own that
reads like the verdict of an intact journal. Identifiers are now written on one line, their line
ends, tabs and backslashes escaped (``\\x0a``), as every table of the command line writes them.
"""

from __future__ import annotations

import pytest
from sqlalchemy import update

import fencepost
from fencepost._schema import flows_journal_events as events
from fencepost.journal import companion_stream
from fencepost.journal.owner import OwnerId
from fencepost.runstore.outcomes import Claimed
from tests.cli.test_audit import _drop_append_only_guard

pytestmark = pytest.mark.cli_in_process

FORGED = "journal verified: 3 entries in 1 streams, chains intact"
RUN = "evil\n" + FORGED
OWNER = OwnerId("host-a", 101, "owner-a")


def _claimed_and_tampered(db_url: str, *, stream: str | None = None) -> None:
    """RUN claimed and owned (a companion stream), or entries on ``stream``; then one entry edited."""
    with fencepost.open(db_url) as store:
        if stream is None:
            store.runs.create(RUN, "{}")
            row = store.runs.get(RUN)
            claimed = store.runs.claim(RUN, row.snapshot(), OWNER, store.clock.now_ms())
            assert isinstance(claimed, Claimed)
            store.runs.activate(RUN, OWNER, claimed.claimed_at_ms, row)
            where, seq = companion_stream(RUN), 1
        else:
            for i in range(2):
                store.journal.append_unfenced(stream, "step", {"i": i}, source_id="w")
            where, seq = stream, 1
        with store.db.connect() as conn:
            _drop_append_only_guard(store, conn)
            conn.execute(update(events).where(events.c.run_id == where, events.c.seq == seq)
                         .values(payload_json='{"i": 99}'))
            conn.commit()


def _assert_no_forged_line(text: str) -> None:
    assert not any(line.strip().startswith("journal verified") for line in text.splitlines()), text


@pytest.mark.parametrize("kind", ["companion", "stream"])
def test_verify_writes_a_broken_entrys_run_or_stream_on_one_line(run_cli, db_url, kind):
    _claimed_and_tampered(db_url, stream=None if kind == "companion" else RUN)
    broken = run_cli("--db", db_url, "journal", "verify")
    assert broken.code == 1, broken
    _assert_no_forged_line(broken.out)
    _assert_no_forged_line(broken.err)
    assert "evil\\x0a" + FORGED in broken.out, broken.out


def test_replay_writes_the_run_id_on_one_line(run_cli, db_url):
    _claimed_and_tampered(db_url)
    replay = run_cli("--db", db_url, "journal", "replay", RUN)
    assert replay.code == 1, replay
    _assert_no_forged_line(replay.out)
    _assert_no_forged_line(replay.err)
