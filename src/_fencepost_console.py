"""The ``fencepost`` console script: Ctrl-C while the package is still importing exits 130, quietly.

Importing ``fencepost.cli`` takes a second or more on a loaded machine, and the interpreter's own
Ctrl-C handling would print a ``KeyboardInterrupt`` traceback from wherever the import was. This
module lives outside the package (importing anything under ``fencepost`` runs the package's
``__init__``, which is most of that import), so its handler is in place before any of it runs.
"""

from __future__ import annotations

import os
import signal


def _interrupted(signum: int, frame: object) -> None:
    # Nothing is written or open yet, so nothing is lost by not unwinding: an exception raised here
    # could be swallowed by whatever module was importing ("Exception ignored in ...").
    os._exit(130)


def main() -> None:
    """Import the command line with Ctrl-C exiting 130, then run it with its own Ctrl-C handling."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.SIG_IGN:  # started with Ctrl-C ignored (nohup, a background job): still so
        signal.signal(signal.SIGINT, _interrupted)
    from fencepost.cli import main as run

    signal.signal(signal.SIGINT, previous)
    run()
