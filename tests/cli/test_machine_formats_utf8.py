"""JSON and CSV output is UTF-8 whatever encoding the interpreter gave stdout: with
``PYTHONIOENCODING=ascii`` a run id holding non-ASCII text made ``--json``/``jsonl``/``csv`` fail
with a ``UnicodeEncodeError`` (a CSV part-way through its rows). Both backends; the listing and the
change stream (``feed tail``) both write through the same writers."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fencepost

SRC = str(Path(fencepost.__file__).parents[1])
RUN = "café-☃-𝄞"


def _cli(db_url: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONIOENCODING": "ascii",
           "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "fencepost", "--db", db_url, *args], env=env,
                          capture_output=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("command", [["runs", "list"], ["feed", "tail"]])
@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv"])
def test_machine_formats_are_utf8_under_an_ascii_stdout(db_url, command, fmt):
    with fencepost.open(db_url) as store:
        store.runs.create("plain-1", "{}")
        store.runs.create(RUN, '{"note": "naïve"}')
        store.runs.create("plain-2", "{}")
    done = _cli(db_url, *command, "--format", fmt)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    text = done.stdout.decode("utf-8")  # UTF-8, whole
    if fmt == "json":
        document = json.loads(text)
        ids = [r["run_id"] for r in (document["runs"] if isinstance(document, dict) else document)]
    elif fmt == "csv":
        ids = [row["run_id"] for row in csv.DictReader(io.StringIO(text))]
    else:
        ids = [json.loads(line)["run_id"] for line in text.splitlines()]
    assert sorted(ids) == sorted(["plain-1", RUN, "plain-2"])
