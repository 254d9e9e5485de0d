"""A worker process over a shard set that meets a FencepostError ends with one ``Error:`` line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import fencepost

TASK = textwrap.dedent("""
    import glob, os

    def work(ctx):
        for path in glob.glob(os.environ["H_GONE"] + "*"):
            os.remove(path)
""")


def _worker_process(urls: dict[str, str], tmp_path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "htask.py").write_text(TASK)
    code = ("from fencepost.cli.worker import worker_process\n"
            f"worker_process({urls!r}, 'htask:work', 1, True, None, None, None, import_dir={str(tmp_path)!r})\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "H_GONE": "/nonexistent", **env}, cwd=tmp_path)


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_worker_process_refused_by_open_shards_prints_one_error_line(make_db_url, tmp_path):
    """Defect (found by a review, SQLite and PostgreSQL): a worker process whose ``open_shards`` was
    refused (here a member's database missing) died with a full traceback. Now it prints one
    ``Error:`` line and exits 1."""
    a, b = make_db_url(), make_db_url()
    fencepost.open_shards({"a": a, "b": b}).close()
    line = _one_error_line(_worker_process({"a": a, "b": make_db_url()}, tmp_path))
    assert "membership_mismatch" in line
    assert "@" not in line or "***" in line


def test_a_member_file_removed_under_the_worker_names_its_shard(tmp_path):
    """Defect (found by a review, SQLite only: a removed database file exists only there): a worker
    process over a set whose member's SQLite file was removed died with a traceback, and the error's
    text did not name the shard. Now it prints one ``Error:`` line naming shard b, and exits 1."""
    urls = {"a": f"sqlite:///{tmp_path / 'a.db'}", "b": f"sqlite:///{tmp_path / 'b.db'}"}
    with fencepost.open_shards(urls) as shards:
        for i in range(6):
            shards.runs.create(f"r{i}", "{}")
    line = _one_error_line(_worker_process(urls, tmp_path, H_GONE=str(tmp_path / "b.db")))
    assert "shard b" in line
    assert "deleted or replaced" in line
