"""A table never shows one run id so that it reads as another, on SQLite and PostgreSQL.

Tables escaped control and invisible format characters, but not the other characters a terminal
shows as something they are not: unusual spaces (U+3000 IDEOGRAPHIC SPACE, U+00A0 NO-BREAK SPACE,
U+2007 FIGURE SPACE look like the space of ``order 17``), private-use and unassigned code points
(drawn as blanks, boxes or a font's own glyph) and lone surrogates. A backslash was shown as itself,
so a run id holding the four characters ``\\x1b`` read exactly like one holding ESC, escaped. Tables
(piped and on a terminal), ``feed tail`` lines and the sentences of the ``runs`` commands now escape
every character Python does not call printable (but tab and line ends in free text), and an
identifier's backslash as ``\\\\``. ``json``, ``jsonl`` and ``csv`` keep the exact text.
"""

from __future__ import annotations

import csv
import io
import json

import pytest

import fencepost
from fencepost.clock import ManualClock
from tests.cli.conftest import on_a_terminal

# Each command runs through fencepost.cli.main in this interpreter (see run_cli in conftest.py).
pytestmark = pytest.mark.cli_in_process


# Each id beside the way a table shows it; every one of them looked like "order 17" or another id.
SHOWN = {
    "order 17": "order 17",
    "order\u300017": "order\\u300017",
    "order\u00a017": "order\\xa017",
    "order\u200717": "order\\u200717",
    "pay\ue000": "pay\\ue000",  # private use
    "pay\u0378": "pay\\u0378",  # unassigned
    "esc\x1b": "esc\\x1b",
    "esc\\x1b": "esc\\\\x1b",  # a literal backslash: never read as the escaped ESC above
}
RAW = [ch for ch in "\u3000\u00a0\u2007\ue000\u0378\x1b"]


@pytest.fixture
def lookalikes(db_url):
    with fencepost.open(db_url, clock=ManualClock(1_000_000)) as store:
        for run_id in SHOWN:
            store.runs.create(run_id, json.dumps({"flowName": "flow\u3000name"}))
    return db_url


def _shown_ids(out: str) -> list[str]:
    return [line.split("  ")[0] for line in out.splitlines() if "pending" in line]


def test_a_piped_table_shows_every_id_distinctly(run_cli, lookalikes):
    out = run_cli("--db", lookalikes, "runs", "list").out
    for ch in RAW:
        assert ch not in out, (f"U+{ord(ch):04X}", out)
    assert sorted(_shown_ids(out)) == sorted(SHOWN.values()), out
    assert "flow\\u3000name" in out, out  # free text: escaped too


@pytest.mark.parametrize("run_id", list(SHOWN), ids=lambda i: ascii(i))
def test_feed_tail_and_runs_show_escape_the_same_way(run_cli, lookalikes, run_id):
    tail = run_cli("--db", lookalikes, "feed", "tail").out.splitlines()
    assert SHOWN[run_id] in [line.split("  ")[-1] for line in tail], tail
    shown = run_cli("--db", lookalikes, "runs", "show", run_id)
    assert shown.code == 0, shown
    assert f"\nrun_id               {SHOWN[run_id]}\n" in shown.out, shown


def test_a_table_on_a_terminal_shows_every_id_distinctly(lookalikes):
    text = on_a_terminal("--db", lookalikes, "runs", "list")
    for ch in RAW[:-1]:  # not ESC: the terminal's own styles use it
        assert ch not in text, (f"U+{ord(ch):04X}", text)
    for shown in SHOWN.values():
        assert shown in text, (shown, text)


def test_the_sentences_of_runs_commands_show_the_id_as_tables_do(run_cli, db_url):
    """``runs create`` printed ``created <id>`` with the id's newline raw: two lines, the second an id."""
    assert run_cli("--db", db_url, "init").code == 0
    for run_id, shown in [("a\\b", "a\\\\b"), ("order\n17", "order\\x0a17"), ("x\u3000y", "x\\u3000y")]:
        created = run_cli("--db", db_url, "runs", "create", run_id)
        assert created.out == f"created {shown}\n", created
        deleted = run_cli("--db", db_url, "runs", "delete", run_id)
        assert deleted.out == f"deleted {shown}\n", deleted


def test_machine_formats_keep_the_exact_ids(run_cli, lookalikes):
    doc = json.loads(run_cli("--db", lookalikes, "runs", "list", "--json").out)
    assert sorted(r["run_id"] for r in doc["runs"]) == sorted(SHOWN)
    rows = list(csv.DictReader(io.StringIO(run_cli("--db", lookalikes, "runs", "list", "--format", "csv").out)))
    assert sorted(r["run_id"] for r in rows) == sorted(SHOWN)
    lines = run_cli("--db", lookalikes, "feed", "tail", "--format", "jsonl").out.split("\n")[:-1]
    assert sorted(json.loads(line)["run_id"] for line in lines) == sorted(SHOWN)


def test_a_piped_table_stays_aligned(run_cli, lookalikes):
    from rich.cells import cell_len

    lines = run_cli("--db", lookalikes, "runs", "list").out.splitlines()[:9]
    starts = {cell_len(line[:line.index("pending" if "pending" in line else "status")]) for line in lines}
    assert len(starts) == 1, lines


def test_printable_escapes_what_python_does_not_call_printable():
    from fencepost._printable import one_line, printable

    assert printable("a\u3000b\u00a0c\u2007d e") == "a\\u3000b\\xa0c\\u2007d e"
    assert printable("\ue000\U000f0000\u0378") == "\\ue000\\U000f0000\\u0378"
    assert printable("bad\udcffbyte") == "bad\\udcffbyte"  # a surrogateescape'd byte
    assert printable("C:\\dir\ttab\n") == "C:\\dir\ttab\n"  # free text keeps its backslashes
    assert one_line("C:\\dir\t") == "C:\\\\dir\\x09"


def test_json_and_csv_output_survive_a_lone_surrogate(capsys):
    """msgspec refuses to encode a lone surrogate (UnicodeEncodeError) and a strict UTF-8 stdout
    refuses to write one; the store holds none, but text from elsewhere (an argument decoded with
    surrogateescape) may. JSON writes it as the escape ``\\udcff``, which decodes to the same text;
    CSV, which has no escape, writes the same six characters; a table shows it escaped."""
    from fencepost.cli._output import Column, Output

    record = {"run_id": "bad\udcffbyte"}
    Output("json").record(record)
    assert json.loads(capsys.readouterr().out) == record
    Output("jsonl").rows([record], [])
    assert json.loads(capsys.readouterr().out) == record
    Output("csv").rows([record], [])
    assert capsys.readouterr().out == "run_id\nbad\\udcffbyte\n"
    Output("table").rows([record], [Column("run_id", "run_id", wrap=False)])
    assert capsys.readouterr().out == "run_id\nbad\\udcffbyte\n"
