"""A worker process killed in the middle of its sweep (for ``test_worker_sweep_sigkill``).

Usage: python -m tests.faults._sweeping URL
Runs a worker (concurrency 4) whose functions never return. Its sweep activates one run (which
starts running, held by the heartbeats) and claims a second; just before that second activation it
prints ``sweeping <activated run> <claimed run>`` and waits to be killed.
"""

from __future__ import annotations

import sys
import time

import fencepost
from fencepost.worker import Worker


def main(url: str) -> None:
    store = fencepost.open(url)
    runs = store.runs
    original = runs.activate
    activated: list[str] = []

    def activate(run_id, *args, **kwargs):
        if len(activated) == 1:
            print(f"sweeping {activated[0]} {run_id}", flush=True)
            time.sleep(600)
        outcome = original(run_id, *args, **kwargs)
        activated.append(run_id)
        return outcome

    runs.activate = activate  # type: ignore[method-assign]
    Worker(store, lambda ctx: time.sleep(600), concurrency=4).run()


if __name__ == "__main__":
    main(sys.argv[1])
