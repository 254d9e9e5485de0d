"""A process stopped in the middle of ``fencepost.open``'s migration pass (for ``test_migration_sigkill``).

Usage: python -m tests.faults._migrating URL
Opens the store at URL; once the pass has applied its first pending migration (inside the one
write transaction of the pass, not yet committed), prints ``migrating <backend pid or 0>`` and waits
for a line on stdin (or to be killed); then it goes on, and prints ``finished <ledger size>`` once
the open returned, or ``failed <code>``.
"""

from __future__ import annotations

import sys

from sqlalchemy import event
from sqlalchemy.engine import Engine

import fencepost
from fencepost import _dialects


def main(url: str) -> None:
    calls = []
    backend = [0]

    @event.listens_for(Engine, "after_cursor_execute")
    def remember(conn, cursor, statement, params, context, executemany) -> None:
        info = getattr(cursor.connection, "info", None)
        backend[0] = int(getattr(info, "backend_pid", 0) or 0)

    def hang_on_second(cls_split):
        def split(self, script):
            calls.append(1)
            if len(calls) == 2:  # the first pending migration's statements have run
                print(f"migrating {backend[0]}", flush=True)
                sys.stdin.readline()
            return cls_split(self, script)
        return split

    for cls in (_dialects.SqliteBackend, _dialects.PostgresBackend):
        cls.split_script = hang_on_second(cls.split_script)
    try:
        store = fencepost.open(url)
    except fencepost.OpenError as exc:
        print(f"failed {exc.code}", flush=True)
        return
    from fencepost._migrations import applied

    print(f"finished {len(applied(store.db))}", flush=True)
    store.close()


if __name__ == "__main__":
    main(sys.argv[1])
