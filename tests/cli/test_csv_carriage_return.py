"""CSV output quotes a cell holding a lone carriage return, so one record stays one CSV row.

Defect (found by a review, both backends): a run id holding ``\\r`` was written unquoted
(``cr\\rx,<source>,1,false``): ``csv.reader`` read it as two rows (``feed tail``, ``feed snapshot``),
and ``runs list --format csv`` failed to parse at all. The csv module quotes only the line
terminator's characters (``\\n`` here); a row with a carriage return is now quoted whole.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess

import pytest

import fencepost
from tests.cli.conftest import fencepost_exe


@pytest.mark.parametrize("args", [["feed", "tail"], ["feed", "snapshot", "cr\rx", "plain"], ["runs", "list"]])
def test_a_cell_with_a_carriage_return_stays_in_its_row(db_url, tmp_path, args) -> None:
    with fencepost.open(db_url) as store:
        store.runs.create("cr\rx", "{}")
        store.runs.create("plain", "{}")
    # The bytes as written: a text-mode capture would turn the CR into a line feed.
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    proc = subprocess.run([fencepost_exe(), "--db", db_url, *args, "--format", "csv"], capture_output=True,
                          cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.reader(io.StringIO(proc.stdout.decode(), newline="")))
    header, records = rows[0], rows[1:]
    assert len(records) == 2, rows
    ids = [r[header.index("run_id")] for r in records]
    assert sorted(ids) == ["cr\rx", "plain"], ids
    assert all(len(r) == len(header) for r in records)
