"""Control characters a store holds never reach the operator's terminal as control characters.

A run id, a flow name, a failure message: the store takes any text without NUL or a lone surrogate,
so ``ESC [ 2 J`` (clear the screen) or ``ESC ] 0 ; ... BEL`` (set the window title) are valid run ids
and state. The tables printed them raw, on a terminal and through a pipe, so whoever created a run
could drive the terminal of the operator listing it. Tables, the lines of ``feed tail`` and the
sentences of ``runs retry`` now show them escaped (``\\x1b``); json, jsonl and csv keep the exact text.
"""

from __future__ import annotations

import json

import pytest

import fencepost
from fencepost.clock import ManualClock
from tests.cli.conftest import on_a_terminal

EVIL_ID = "evil\x1b]0;PWNED\x07\x1b[31mred\x9b2J"
EVIL_FLOW = "\x1b[2Jflow"
INJECTED = ["\x1b]0;PWNED", "\x07", "\x1b[31m", "\x1b[2J", "\x9b"]
SHOWN_ID = "evil\\x1b]0;PWNED\\x07\\x1b[31mred\\x9b2J"


@pytest.fixture
def hostile(db_url):
    with fencepost.open(db_url, clock=ManualClock(1_000_000)) as store:
        store.runs.create(EVIL_ID, json.dumps({"flowName": EVIL_FLOW}))
    return db_url


def _clean(text: str) -> None:
    for seq in INJECTED:
        assert seq not in text, (seq, text)


COMMANDS = [["runs", "list"], ["runs", "show", EVIL_ID], ["feed", "tail"], ["feed", "snapshot", EVIL_ID]]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_table_through_a_pipe_shows_control_characters_escaped(run_cli, hostile, args):
    result = run_cli("--db", hostile, *args)
    assert result.code == 0, result
    _clean(result.out)
    assert SHOWN_ID in result.out, result


@pytest.mark.parametrize("columns", ["60", "250"], ids=["narrow", "wide"])
@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_table_on_a_terminal_shows_control_characters_escaped(hostile, args, columns):
    text = on_a_terminal("--db", hostile, *args, columns=columns)
    _clean(text)
    assert SHOWN_ID in text, text


def test_runs_list_flow_column_is_escaped_too(run_cli, hostile):
    out = run_cli("--db", hostile, "runs", "list").out
    assert "\\x1b[2Jflow" in out, out


def test_machine_formats_keep_the_exact_text(run_cli, hostile):
    doc = json.loads(run_cli("--db", hostile, "runs", "list", "--json").out)
    assert [r["run_id"] for r in doc["runs"]] == [EVIL_ID]
    assert doc["runs"][0]["state"] == {"flowName": EVIL_FLOW}
    line = json.loads(run_cli("--db", hostile, "runs", "show", EVIL_ID, "--format", "jsonl").out)
    assert line["run"]["run_id"] == EVIL_ID


def test_runs_retry_names_the_new_round_escaped(run_cli, db_url):
    from fencepost.journal.owner import OwnerId

    owner = OwnerId("h", 1, "n")
    with fencepost.open(db_url, clock=ManualClock(1_000_000)) as store:
        store.runs.create(EVIL_ID, "{}")
        store.runs.claim_and_own(EVIL_ID, store.runs.get(EVIL_ID).snapshot(), owner, store.clock.now_ms())
        store.runs.transition_owned(EVIL_ID, owner, "completed")
    result = run_cli("--db", db_url, "runs", "retry", EVIL_ID)
    assert result.code == 0, result
    _clean(result.out)
    assert f"created {SHOWN_ID}.retry-1: round 1 of lineage {SHOWN_ID}" in result.out, result
