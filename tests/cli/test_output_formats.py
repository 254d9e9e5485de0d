"""Output formats as a script and a reader at a terminal meet them, on SQLite and PostgreSQL.

- ``csv`` with nothing to print still prints its header (a CSV reader reads an empty table, not an
  empty file that fails it): ``feed tail``, ``journal show``, ``journal replay``, as ``runs list``.
- Invisible format characters (right-to-left override, zero-width space, ...) in a run id or a
  flow name are escaped in tables and lines, as control characters are: a run id holding U+202E
  otherwise shows on screen as another run's id. ``json``, ``jsonl`` and ``csv`` keep the text.
- ``csv`` spells booleans ``true``/``false``, as ``json`` does (it printed Python's ``True``).
"""

from __future__ import annotations

import csv
import io
import json

import pytest

import fencepost
from fencepost.clock import ManualClock
from fencepost.journal.owner import OwnerId

# Each command runs through fencepost.cli.main in this interpreter (see run_cli in conftest.py).
pytestmark = pytest.mark.cli_in_process


A = OwnerId("host-a", 101, "owner-a")


def _csv(result) -> list[dict[str, str]]:
    assert result.code == 0, result
    return list(csv.DictReader(io.StringIO(result.out)))


def _header(result) -> list[str]:
    assert result.code == 0, result
    rows = list(csv.reader(io.StringIO(result.out)))
    assert rows, f"no header at all: {result!r}"
    return rows[0]


# ---------------------------------------------------------------------- empty csv
@pytest.fixture
def quiet(db_url):
    """One pending run that has no journal entries and never had an owner; one run with an owner."""
    with fencepost.open(db_url, clock=ManualClock(1_000_000)) as store:
        store.runs.create("idle", "{}")
        store.runs.create("owned", "{}")
        store.runs.claim_and_own("owned", store.runs.get("owned").snapshot(), A, store.clock.now_ms())
    return db_url


def test_feed_tail_csv_with_no_change_prints_its_header(run_cli, quiet):
    full = run_cli("--db", quiet, "feed", "tail", "--format", "csv")
    header = _header(full)
    assert header == ["run_id", "source", "revision", "deleted"]
    head = json.loads(run_cli("--db", quiet, "source", "show", "--json").out)["revision"]
    empty = run_cli("--db", quiet, "feed", "tail", "--from", str(head), "--format", "csv")
    assert empty.code == 0, empty
    assert empty.out.splitlines() == [",".join(header)], empty
    assert _csv(empty) == []
    labelled = run_cli("--db", f"only={quiet}", "feed", "tail", "--from", str(head), "--format", "csv")
    assert labelled.code == 0, labelled
    assert labelled.out.splitlines() == ["store," + ",".join(header)], labelled


def test_feed_tail_csv_header_is_the_same_with_changes_and_without(run_cli, quiet):
    """The header names the same columns in the same order whether or not a change follows it."""
    rows = _csv(run_cli("--db", quiet, "feed", "tail", "--format", "csv"))
    assert [r["run_id"] for r in rows] == ["idle", "owned"]


def test_journal_show_csv_of_an_empty_stream_prints_its_header(run_cli, quiet):
    full = run_cli("--db", quiet, "journal", "show", "owned", "--companion", "--format", "csv")
    header = _header(full)
    assert header[:2] == ["run_id", "seq"] and "payload" in header
    empty = run_cli("--db", quiet, "journal", "show", "idle", "--format", "csv")
    assert empty.code == 0, empty
    assert empty.out.splitlines() == [",".join(header)], empty


def test_journal_replay_csv_of_a_run_never_owned_prints_its_header(run_cli, quiet):
    full = run_cli("--db", quiet, "journal", "replay", "owned", "--format", "csv")
    header = _header(full)
    assert header[:2] == ["kind", "owner"] and "rule" in header and len(_csv(full)) == 1
    empty = run_cli("--db", quiet, "journal", "replay", "idle", "--format", "csv")
    assert empty.code == 0, empty
    assert empty.out.splitlines() == [",".join(header)], empty


# ---------------------------------------------------------------------- invisible characters
RLO_ID = "invoice-\u202e9876"  # shown raw, a terminal draws "invoice-" then "6789" reversed
HIDDEN = ["\u202e", "\u200b", "\u2066", "\u2069", "\ufeff", "\u200f", "\u00ad", "\u2028"]


@pytest.fixture
def invisible(db_url):
    with fencepost.open(db_url, clock=ManualClock(1_000_000)) as store:
        store.runs.create(RLO_ID, json.dumps({"flowName": "\u2066pay\u2069\u200b\ufeff"}))
        store.runs.create("zero\u200bwidth\u200f\u00ad\u2028", "{}")
    return db_url


def _no_hidden(text: str) -> None:
    for ch in HIDDEN:
        assert ch not in text, (f"U+{ord(ch):04X}", text)


COMMANDS = [["runs", "list"], ["runs", "show", RLO_ID], ["feed", "tail"], ["feed", "snapshot", RLO_ID],
            ["runs", "cancel", RLO_ID]]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_table_shows_invisible_format_characters_escaped(run_cli, invisible, args):
    result = run_cli("--db", invisible, *args)
    assert result.code == 0, result
    _no_hidden(result.out)
    assert "invoice-\\u202e9876" in result.out, result


def test_every_invisible_character_is_escaped_where_a_table_shows_it(run_cli, invisible):
    out = run_cli("--db", invisible, "runs", "list").out
    _no_hidden(out)
    assert "zero\\u200bwidth\\u200f\\xad\\u2028" in out, out
    assert "\\u2066pay\\u2069\\u200b\\ufeff" in out, out  # the flow column


def test_machine_formats_keep_invisible_characters_exactly(run_cli, invisible):
    doc = json.loads(run_cli("--db", invisible, "runs", "list", "--json").out)
    assert {r["run_id"] for r in doc["runs"]} == {RLO_ID, "zero\u200bwidth\u200f\u00ad\u2028"}
    rows = _csv(run_cli("--db", invisible, "runs", "list", "--format", "csv"))
    assert {r["run_id"] for r in rows} == {RLO_ID, "zero\u200bwidth\u200f\u00ad\u2028"}
    # One object a line ("\n"): U+2028 is text inside a JSON string (str.splitlines would cut there).
    lines = run_cli("--db", invisible, "feed", "tail", "--format", "jsonl").out.split("\n")[:-1]
    assert {json.loads(line)["run_id"] for line in lines} == {RLO_ID, "zero\u200bwidth\u200f\u00ad\u2028"}


def test_printable_escapes_format_characters_and_keeps_visible_text():
    from fencepost._printable import printable

    assert printable("a\u202eb") == "a\\u202eb"
    assert printable("\U000e0041tag") == "\\U000e0041tag"
    assert printable("\x1b[2J") == "\\x1b[2J"
    assert printable("ünïcødé 日本 tab\tline\n") == "ünïcødé 日本 tab\tline\n"


# ---------------------------------------------------------------------- csv booleans
@pytest.fixture
def with_deletion(db_url):
    with fencepost.open(db_url, clock=ManualClock(1_000_000)) as store:
        store.runs.create("kept", "{}")
        store.runs.create("gone", "{}")
        store.runs.delete("gone")
    return db_url


def test_csv_spells_booleans_as_json_does(run_cli, with_deletion):
    tail = _csv(run_cli("--db", with_deletion, "feed", "tail", "--format", "csv"))
    assert {r["run_id"]: r["deleted"] for r in tail} == {"kept": "false", "gone": "true"}
    snap = _csv(run_cli("--db", with_deletion, "feed", "snapshot", "kept", "gone", "--format", "csv"))
    assert [r["deleted"] for r in snap] == ["", "true"]
    verify = _csv(run_cli("--db", with_deletion, "journal", "verify", "--format", "csv"))
    assert verify[0]["ok"] == "true"
    delete = run_cli("--db", with_deletion, "runs", "delete", "kept", "--format", "csv")
    assert _csv(delete) == [{"run_id": "kept", "deleted": "true", "forced": "false"}]


def test_csv_follows_a_stream_with_the_same_spelling(run_cli, with_deletion):
    for args in (["feed", "tail"], ["journal", "replay", "--all"], ["journal", "verify"],
                 ["feed", "snapshot", "kept", "gone"]):
        out = run_cli("--db", with_deletion, *args, "--format", "csv").out
        assert "True" not in out and "False" not in out, (args, out)


# ---------------------------------------------------------------------- line ends in identifiers
@pytest.fixture
def look_alike(db_url):
    """Two runs whose ids a table showed alike: one holds a newline, the other a space there."""
    with fencepost.open(db_url, clock=ManualClock(1_000_000)) as store:
        store.runs.create("order\n17", "{}")
        store.runs.create("order 17", "{}")
        store.runs.create("tab\there", "{}")
    return db_url


def test_a_table_shows_a_line_end_in_an_id_escaped_not_as_a_space(run_cli, look_alike):
    """Piped, a table joined a cell's lines with a space, so ``order\\n17`` was shown as ``order 17``,
    the id of another run, and a tab looked like the column gap. Identifier cells now escape them."""
    lines = run_cli("--db", look_alike, "runs", "list").out.splitlines()
    ids = [line[:10] for line in lines[1:4]]
    assert sorted(ids) == sorted(["order\\x0a1", "order 17  ", "tab\\x09her"]), lines
    tail = run_cli("--db", look_alike, "feed", "tail").out.splitlines()
    assert [line.split("  ")[-1] for line in tail] == ["order\\x0a17", "order 17", "tab\\x09here"], tail
    shown = run_cli("--db", look_alike, "runs", "show", "order\n17").out
    assert "order\\x0a17" in shown and "order 17" not in shown, shown


def test_machine_formats_keep_line_ends_in_ids(run_cli, look_alike):
    rows = _csv(run_cli("--db", look_alike, "runs", "list", "--format", "csv"))
    assert [r["run_id"] for r in rows] == ["order\n17", "order 17", "tab\there"]


# ---------------------------------------------------------------------- wide characters
def test_a_piped_table_aligns_columns_by_display_width(run_cli, db_url):
    """Columns were padded by character count, so a row holding CJK characters (two terminal cells
    each) pushed its later columns right of the others'. Padding now counts terminal cells."""
    from rich.cells import cell_len

    with fencepost.open(db_url, clock=ManualClock(1_000_000)) as store:
        store.runs.create("注文-日本", "{}")
        store.runs.create("order-17", "{}")
        store.runs.create("ünïcødé", "{}")
    lines = run_cli("--db", db_url, "runs", "list").out.splitlines()[:4]
    starts = {cell_len(line[:line.index("pending" if "pending" in line else "status")]) for line in lines}
    assert len(starts) == 1, lines
