"""A builder process fed by several stores, for the SIGKILL test: catch up forever until killed.

Usage: python -m tests.projections._several_crash_child TARGET_URL BATCH_SIZE NAME=URL [NAME=URL ...]
Prints ``started`` once its stores are open (it then waits on the builder lock), ``ready`` once it
holds the lock, then loops on ``catch_up``.
"""

from __future__ import annotations

import sys
import time

import fencepost
from fencepost.projections import ProjectionBuilder
from tests.projections._several import CountingShares


class SlowShadowShares(CountingShares):
    """Each shadow page takes at least 20 ms, so a rebuild lasts long enough for the test to kill it
    inside (on an idle machine a rebuild of this size would otherwise finish between two polls)."""

    def apply_batch(self, target, updates):  # type: ignore[no-untyped-def]
        super().apply_batch(target, updates)
        if target.shadow:
            time.sleep(0.02)


def main() -> None:
    target_url, batch_size = sys.argv[1], int(sys.argv[2])
    sources = {}
    for arg in sys.argv[3:]:
        name, url = arg.split("=", 1)
        sources[name] = fencepost.open(url)
    builder = ProjectionBuilder(sources, target_url, SlowShadowShares(), batch_size=batch_size, lock_timeout=60)
    print("started", flush=True)
    builder._acquire()  # the lock, waiting for a killed predecessor's to vanish
    print("ready", flush=True)
    while True:
        builder.catch_up()
        time.sleep(0.002)


if __name__ == "__main__":
    main()
