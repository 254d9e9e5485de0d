"""A builder process for the SIGKILL test: catch up forever until killed.

Usage: python -m tests.projections._crash_child SOURCE_URL TARGET_URL BATCH_SIZE
Prints ``ready`` once it holds the builder lock, then loops on ``catch_up``.
"""

from __future__ import annotations

import sys
import time

import fencepost
from fencepost.projections import ProjectionBuilder
from tests.projections._counting import CountingRunsByStatus


def main() -> None:
    source_url, target_url, batch_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = fencepost.open(source_url)
    builder = ProjectionBuilder(store, target_url, CountingRunsByStatus(), batch_size=batch_size, lock_timeout=60)
    builder._acquire()  # the lock, waiting for a killed predecessor's to vanish
    print("ready", flush=True)
    while True:
        builder.catch_up()
        time.sleep(0.002)


if __name__ == "__main__":
    main()
