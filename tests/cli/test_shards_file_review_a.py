"""Defect (found by a review, any backend): ``fencepost --shards FILE`` read the whole file with no
bound. ``--shards /dev/zero`` never returned while its memory grew by gigabytes, and a 3 MB file
was read whole before it was refused. Now at most 1 MiB is read: a larger file (by its size when it
is a regular file, before anything is read) or a stream that goes on past the bound is a one-line
usage error (exit 2) naming ``--shards`` and the bound, never the contents. A pipe (``--shards
<(...)``, a FIFO) of a few lines still works. Reading the file is the same whatever the stores'
backend, so the stores here are SQLite files."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import fencepost
from tests.cli.conftest import assert_one_line_error

BOUND = 1 << 20
SECRET = "SECRET-in-the-shard-file"


def _store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    with fencepost.open(url) as store:
        store.runs.create("r1", "{}")
    return url


def _assert_refused_as_too_large(result) -> None:
    assert result.code == 2, result
    assert_one_line_error(result)
    assert "--shards" in result.err and str(BOUND) in result.err, result
    assert SECRET not in result.err and SECRET not in result.out, result


def test_an_endless_character_device_is_refused_promptly(run_cli_subprocess):
    result = run_cli_subprocess("--shards", "/dev/zero", "runs", "list", timeout=30)
    _assert_refused_as_too_large(result)


@pytest.mark.cli_in_process
def test_a_file_past_the_bound_is_refused_by_its_size(run_cli, tmp_path):
    path = tmp_path / "big.txt"
    path.write_text("# " + SECRET + "a" * (3_000_000) + "\n")
    result = run_cli("--shards", str(path), "runs", "list")
    _assert_refused_as_too_large(result)
    assert str(path.stat().st_size) in result.err, result  # a regular file: its size is named


@pytest.mark.cli_in_process
def test_a_file_of_many_comment_lines_past_the_bound_is_refused(run_cli, tmp_path):
    url = _store(tmp_path)
    path = tmp_path / "stores.txt"
    path.write_text(f"a={url}\n" + f"# {SECRET}\n" * (BOUND // 20))
    _assert_refused_as_too_large(run_cli("--shards", str(path), "runs", "list"))


@pytest.mark.cli_in_process
def test_a_file_of_exactly_the_bound_still_reads(run_cli, tmp_path):
    url = _store(tmp_path)
    line = f"a={url}\n"
    path = tmp_path / "stores.txt"
    path.write_text(line + "#" * (BOUND - len(line.encode()) - 1) + "\n")
    assert path.stat().st_size == BOUND
    result = run_cli("--shards", str(path), "runs", "list")
    assert result.code == 0 and "r1" in result.out, result


@pytest.mark.cli_in_process
def test_a_pipe_of_a_few_lines_still_reads(run_cli, tmp_path):
    url = _store(tmp_path)
    fifo = tmp_path / "stores.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "w") as fh:
            fh.write(f"# the stores\na={url}\n")

    writer = threading.Thread(target=write)
    writer.start()
    try:
        result = run_cli("--shards", str(fifo), "runs", "list")
    finally:
        writer.join(timeout=10)
    assert result.code == 0 and "r1" in result.out, result


@pytest.mark.cli_in_process
def test_an_endless_pipe_is_refused_past_the_bound(run_cli, tmp_path):
    fifo = tmp_path / "stores.fifo"
    os.mkfifo(fifo)
    stop = threading.Event()

    def write() -> None:
        try:
            with open(fifo, "w") as fh:
                while not stop.is_set():
                    fh.write(f"# {SECRET}\n" * 1000)
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        result = run_cli("--shards", str(fifo), "runs", "list")
    finally:
        stop.set()
        writer.join(timeout=10)
    _assert_refused_as_too_large(result)
