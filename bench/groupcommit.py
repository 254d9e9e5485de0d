"""Group commit on against off: 8 threads of one process appending fenced entries on one store.

Run: ``.venv/bin/python bench/groupcommit.py [--pg postgresql+psycopg://postgres@127.0.0.1:5432/test] [--reps 5]``

For SQLite with ``synchronous`` FULL, NORMAL and OFF (and PostgreSQL with ``--pg``), two stores are
opened side by side, one with ``group_commit=True`` (the default) and one with ``group_commit=False``,
and the same threaded append run (``table.py``'s "8 threads" row) goes through each in turn for
``--reps`` reps. Printed: the median rate of each and the median of the per-rep ratios (on / off).
Nothing is asserted: timing is for reading, never for CI.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fencepost
import table
from _pg import ScratchSchemas


def _appends(url: str, group_commit: bool) -> table.FencepostAppends:
    """``table.FencepostAppends`` on a store opened with the given ``group_commit``."""
    real_open = fencepost.open
    fencepost.open = lambda u, **kw: real_open(u, group_commit=group_commit, **kw)  # type: ignore[assignment]
    try:
        return table.FencepostAppends(url)
    finally:
        fencepost.open = real_open  # type: ignore[assignment]


def compare(label: str, on_url: str, off_url: str, reps: int, n: int) -> None:
    on, off = _appends(on_url, True), _appends(off_url, False)
    try:
        a, b = [], []
        for rep in range(reps):
            pair = [(on, a), (off, b)] if rep % 2 == 0 else [(off, b), (on, a)]
            for appends, into in pair:
                into.append(appends.threaded(n)[0])
        ratio = statistics.median(x / y for x, y in zip(a, b, strict=True))
        print(f"{label}: on {statistics.median(a):,.0f} appends/s, off {statistics.median(b):,.0f} appends/s, "
              f"median ratio on/off {ratio:.2f}x", flush=True)
    finally:
        on.close()
        off.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg", default=None, help="PostgreSQL URL (postgresql+psycopg://...) for the second backend")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--appends", type=int, default=200, help="appends per thread per rep")
    args = ap.parse_args()
    print(f"{table.THREADS} threads appending; group commit on vs off", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for sync in ("FULL", "NORMAL", "OFF"):
            compare(f"sqlite {sync}", f"sqlite:///{tmp}/on-{sync}.db?synchronous={sync}",
                    f"sqlite:///{tmp}/off-{sync}.db?synchronous={sync}", args.reps, args.appends)
    if args.pg:
        with ScratchSchemas(args.pg) as pg:
            compare("postgresql", pg.new()[1], pg.new()[1], args.reps, args.appends)


if __name__ == "__main__":
    main()
