"""A process whose threads write through group commit until it is killed.

Run as ``python -m tests.faults._group_writer <url> <prefix>``. It opens the store, prints
``ready``, then four threads each loop: one ``journal.transact`` that creates ``<prefix>-<t>-<i>``,
appends its ``made`` entry and (every other call) deletes the thread's run two calls back, so groups
hold creates, entries and tombstones together. After each COMMIT returns, the thread prints the run
id it made (the parent counts these acknowledged writes).
"""

from __future__ import annotations

import sys
import threading

import fencepost


def main(url: str, prefix: str) -> None:
    store = fencepost.open(url)
    out = threading.Lock()
    print("ready", flush=True)

    def work(t: int) -> None:
        i = 0
        while True:
            run_id = f"{prefix}-{t}-{i}"
            gone = f"{prefix}-{t}-{i - 2}" if i >= 2 and i % 2 == 0 else None

            def body(tx, run_id=run_id, gone=gone, i=i):
                store.runs.create(run_id, f'{{"n": {i}}}')
                tx.append_unfenced(run_id, "made", {"n": i}, source_id=f"writer-{t}")
                if gone is not None:
                    store.runs.delete(gone)

            store.journal.transact(body)
            with out:
                print(run_id, flush=True)
            i += 1

    threads = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
