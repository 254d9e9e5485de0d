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


def main() -> None:
    target_url, batch_size = sys.argv[1], int(sys.argv[2])
    sources = {}
    for arg in sys.argv[3:]:
        name, url = arg.split("=", 1)
        sources[name] = fencepost.open(url)
    builder = ProjectionBuilder(sources, target_url, CountingShares(), batch_size=batch_size, lock_timeout=60)
    print("started", flush=True)
    builder._acquire()  # the lock, waiting for a killed predecessor's to vanish
    print("ready", flush=True)
    while True:
        builder.catch_up()
        time.sleep(0.002)


if __name__ == "__main__":
    main()
