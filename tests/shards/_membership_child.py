"""A process that opens a shard set and stops at a chosen membership write (for test_membership_races.py).

Usage: python -m tests.shards._membership_child URLS_JSON GROW STOP [GO_FILE]

``URLS_JSON`` is a JSON list of URLs or a JSON object of name to URL (in member order); ``GROW`` is
``1`` or ``0``. ``STOP`` is ``0`` (no stop), ``after:K`` or ``before:K``: right after (or just
before) the K-th membership write of the open (a record or a founded mark, whichever store it is
on) the child prints ``paused`` and then waits: until
``GO_FILE`` exists when one is given (it then carries on), else until it is killed. The open's
child prints ``opening`` as it calls ``open_shards`` (imports done). The open's outcome is printed
last: ``ok <set_id> <generation>``, or ``refused <code> <detail>``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import fencepost
from fencepost.errors import FencepostError
from fencepost.shards import membership as ms


def _pause(go: str | None) -> None:
    print("paused", flush=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and (go is None or not os.path.exists(go)):
        time.sleep(0.01)


def _stopping(fn: Callable[..., Any], count: list[int], when: str, stop: int,
              go: str | None) -> Callable[..., Any]:
    def inner(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        if when == "before" and count[0] == stop:
            _pause(go)
        result = fn(*args, **kwargs)
        if when == "after" and count[0] == stop:
            _pause(go)
        return result

    return inner


def main() -> None:
    urls = json.loads(sys.argv[1])
    grow = sys.argv[2] == "1"
    go = sys.argv[4] if len(sys.argv) > 4 else None
    if sys.argv[3] != "0":
        when, k = sys.argv[3].split(":")
        count = [0]
        ms._record = _stopping(ms._record, count, when, int(k), go)  # type: ignore[assignment]
        ms._mark_founded = _stopping(ms._mark_founded, count, when, int(k), go)  # type: ignore[assignment]
    print("opening", flush=True)
    try:
        with fencepost.open_shards(urls, grow=grow) as shards:
            print(f"ok {shards.membership.set_id} {shards.membership.generation}", flush=True)
    except FencepostError as exc:
        print(f"refused {exc.code} {exc}", flush=True)


if __name__ == "__main__":
    main()
