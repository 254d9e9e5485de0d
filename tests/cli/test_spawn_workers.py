"""Worker processes are never left behind: when one of several fails to start, the ones already
started are stopped before the error reaches the caller (who never got their handles)."""

from __future__ import annotations

import multiprocessing.context

import pytest

import fencepost
from fencepost.cli.worker import spawn_workers


def test_a_worker_that_fails_to_start_stops_those_already_started(db_url, tmp_path, monkeypatch):
    fencepost.open(db_url).close()
    (tmp_path / "idle_task.py").write_text("def work(ctx):\n    return None\n")
    monkeypatch.chdir(tmp_path)
    started: list[multiprocessing.context.SpawnProcess] = []
    real_start = multiprocessing.context.SpawnProcess.start

    def start(self: multiprocessing.context.SpawnProcess) -> None:
        if len(started) == 1:
            raise OSError(24, "Too many open files")  # what a second fork hits at the fd limit
        real_start(self)
        started.append(self)

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", start)
    try:
        with pytest.raises(OSError, match="Too many open files"):
            spawn_workers(db_url, 3, task="idle_task:work")
        assert len(started) == 1
        # Without --until-idle the first worker would sweep forever: it must have been stopped.
        assert started[0].exitcode is not None
    finally:
        for p in started:  # a leftover would keep this test process from ever exiting
            if p.is_alive():
                p.kill()
                p.join()
