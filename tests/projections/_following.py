"""A projection builder following its source on a thread, as a service runs it (``run(stop)``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Following:
    """``builder.run(stop)`` on a thread while the ``with`` block runs; ``failure`` holds what it
    raised. Leaving the block sets ``stop`` and joins the thread."""

    def __init__(self, builder: Any) -> None:
        self.builder = builder
        self.stop = threading.Event()
        self.failure: list[BaseException] = []
        self.thread = threading.Thread(target=self._follow)

    def _follow(self) -> None:
        try:
            self.builder.run(self.stop)
        except BaseException as exc:
            self.failure.append(exc)

    def __enter__(self) -> Following:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=20)

    def wait(self, done: Callable[[], bool], timeout: float = 20.0) -> bool:
        """Poll ``done`` until it holds, the builder failed, or ``timeout`` seconds passed."""
        deadline = time.monotonic() + timeout
        while not done() and not self.failure and time.monotonic() < deadline:
            time.sleep(0.05)
        return done()
