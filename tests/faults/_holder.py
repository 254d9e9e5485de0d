"""A writer process that holds the write lock until told to go on (or until it is killed).

Run as ``python -m tests.faults._holder <url> <run_id>``. Inside one ``store.journal.transact`` it
creates ``run_id`` with a journal entry, prints ``holding <backend pid or 0>``, and on its first
attempt waits for a line on stdin; then it finishes the transaction and prints ``done <attempts>``.
"""

from __future__ import annotations

import sys

import fencepost


def main(url: str, run_id: str) -> None:
    store = fencepost.open(url)
    attempts = []

    def body(tx):
        attempts.append(1)
        store.runs.create(run_id, '{"held": true}')
        tx.append_unfenced(run_id, "made", {"n": 1}, source_id="fault-suite")
        pid = 0
        if store.db.backend.name == "postgresql":
            pid = int(tx.conn.exec_driver_sql("SELECT pg_backend_pid()").scalar())
        if len(attempts) == 1:
            print(f"holding {pid}", flush=True)
            sys.stdin.readline()
        tx.conn.exec_driver_sql("SELECT 1")

    store.journal.transact(body)
    print(f"done {len(attempts)}", flush=True)
    store.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
