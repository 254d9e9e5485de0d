"""A process killed in the middle of ``fencepost.open``'s migration pass (for ``test_migration_sigkill``).

Usage: python -m tests.faults._migrating URL
Opens the store at URL; once the pass has applied its first pending migration (inside the one
write transaction of the pass, not yet committed), prints ``migrating`` and waits to be killed.
"""

from __future__ import annotations

import sys
import time

import fencepost
from fencepost import _dialects


def main(url: str) -> None:
    calls = []

    def hang_on_second(cls_split):
        def split(self, script):
            calls.append(1)
            if len(calls) == 2:  # the first pending migration's statements have run
                print("migrating", flush=True)
                time.sleep(600)
            return cls_split(self, script)
        return split

    for cls in (_dialects.SqliteBackend, _dialects.PostgresBackend):
        cls.split_script = hang_on_second(cls.split_script)
    fencepost.open(url)
    print("finished", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
