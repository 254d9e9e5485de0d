"""A builder process fed by several stores, for the SIGKILL test: catch up forever until killed.

Usage: python -m tests.projections._several_crash_child TARGET_URL BATCH_SIZE [hang-in-rebuild] NAME=URL ...
Prints ``started`` once its stores are open (it then waits on the builder lock), ``ready`` once it
holds the lock, then loops on ``catch_up``. With ``hang-in-rebuild`` it stops inside its second
shadow page (the first one committed, the second one's rows written, uncommitted) until killed.
"""

from __future__ import annotations

import sys
import time

import fencepost
from fencepost.projections import ProjectionBuilder
from tests.projections._several import CountingShares


class SlowShadowShares(CountingShares):
    """Each shadow page takes at least 20 ms, so a rebuild lasts a while (on an idle machine a
    rebuild of this size would otherwise finish between two polls of the test). With ``hang`` the
    second shadow page never ends: a test that saw the first one committed kills the process
    inside the rebuild however late it gets to it."""

    def __init__(self, hang: bool = False) -> None:
        super().__init__()
        self.hang = hang
        self.shadow_pages = 0

    def apply_batch(self, target, updates):  # type: ignore[no-untyped-def]
        super().apply_batch(target, updates)
        if target.shadow:
            self.shadow_pages += 1
            time.sleep(600 if self.hang and self.shadow_pages >= 2 else 0.02)


def main() -> None:
    target_url, batch_size = sys.argv[1], int(sys.argv[2])
    rest = sys.argv[3:]
    hang = bool(rest) and rest[0] == "hang-in-rebuild"
    sources = {}
    for arg in rest[1:] if hang else rest:
        name, url = arg.split("=", 1)
        sources[name] = fencepost.open(url)
    builder = ProjectionBuilder(sources, target_url, SlowShadowShares(hang), batch_size=batch_size, lock_timeout=60)
    print("started", flush=True)
    builder._acquire()  # the lock, waiting for a killed predecessor's to vanish
    print("ready", flush=True)
    while True:
        builder.catch_up()
        time.sleep(0.002)


if __name__ == "__main__":
    main()
