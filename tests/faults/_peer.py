"""Another process that writes to a store on command: proof that no lock is left held.

Run as ``python -m tests.faults._peer <url>``. It opens the store once, prints ``ready``, then for
each ``<run_id>`` line on stdin creates that run and prints one JSON line: ``{"ok": true,
"elapsed": seconds}`` or ``{"ok": false, "error": "<class> <code> <db_code>"}``. ``elapsed`` is
measured inside this process, from the command's arrival to the write's return.
"""

from __future__ import annotations

import json
import sys
import time

import fencepost


def main(url: str) -> None:
    store = fencepost.open(url)
    print("ready", flush=True)
    for line in sys.stdin:
        run_id = line.strip()
        if not run_id:
            continue
        started = time.monotonic()
        try:
            store.runs.create(run_id, "{}")
        except fencepost.FencepostError as exc:
            reply = {"ok": False, "error": f"{type(exc).__name__} {exc.code} {getattr(exc, 'db_code', None)}"}
        else:
            reply = {"ok": True, "elapsed": time.monotonic() - started}
        print(json.dumps(reply), flush=True)
    store.close()


if __name__ == "__main__":
    main(sys.argv[1])
