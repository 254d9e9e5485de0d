"""A builder process killed right after a rebuild's swap committed (for ``test_swap_lock``).

Usage: python -m tests.projections._swap_cleanup_kill_child SOURCE_URL TARGET_URL
Catches up, rotates the source's id and rebuilds; once the swap has committed, before the shadow's
old rows are emptied, prints ``swapped`` and waits to be killed.
"""

from __future__ import annotations

import sys
import time

import fencepost
from fencepost.projections import ProjectionBuilder, RunsByStatus


def main() -> None:
    store = fencepost.open(sys.argv[1])
    builder = ProjectionBuilder(store, sys.argv[2], RunsByStatus(), batch_size=5, lock_timeout=60)
    builder.catch_up()
    store.feed.rotate_source()

    def hang(*_args: object) -> None:
        print("swapped", flush=True)
        time.sleep(600)

    builder._tables.empty_shadow = hang  # type: ignore[method-assign]
    builder.rebuild()


if __name__ == "__main__":
    main()
