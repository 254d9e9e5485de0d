"""Gauges through the OpenTelemetry API: projection lag, change-feed position, worker in-flight runs.

Beside the run store's counters (``fencepost.runstore.metrics``) and, like them, free without an
SDK. Each gauge is an observable gauge whose callback reports the latest value every live
component set, so reading costs nothing on the hot path (a dict store under a lock):

- ``flows_projection_lag{projection}``: changes of the source not yet applied, as of the builder's
  last page (``head - applied revision``);
- ``flows_feed_position{source, follower}``: the revision a ``ChangeFeed.follow`` reader has
  reached (``follower`` tells several readers in one process apart);
- ``flows_worker_in_flight{host, pid, worker}``: runs a ``Worker`` holds and is running right now
  (``worker`` is the first 8 characters of its owner nonce).

A component removes its series when it stops (builder closed, follower left, worker stopped), so a
gauge never reports a value for something that is gone.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

_meter = metrics.get_meter("fencepost")


class Gauge:
    """One observable gauge: ``set`` a value per attribute set, ``discard`` it when the source is gone."""

    def __init__(self, name: str, description: str, unit: str = "1") -> None:
        self.name = name
        self._values: dict[tuple[tuple[str, Any], ...], int] = {}
        self._lock = threading.Lock()
        _meter.create_observable_gauge(name, callbacks=[self._observe], description=description, unit=unit)

    def set(self, value: int, **attributes: Any) -> None:
        """Record ``value`` as the current reading for ``attributes``."""
        key = tuple(sorted(attributes.items()))
        with self._lock:
            self._values[key] = value

    def discard(self, **attributes: Any) -> None:
        """Stop reporting ``attributes`` (its component stopped)."""
        with self._lock:
            self._values.pop(tuple(sorted(attributes.items())), None)

    def current(self) -> dict[tuple[tuple[str, Any], ...], int]:
        """A copy of every reading (for tests and diagnostics)."""
        with self._lock:
            return dict(self._values)

    def _observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            return [Observation(v, dict(k)) for k, v in self._values.items()]


projection_lag = Gauge("flows_projection_lag", "Source changes a projection has not applied yet")
feed_position = Gauge("flows_feed_position", "Revision a change-feed follower has reached")
worker_in_flight = Gauge("flows_worker_in_flight", "Runs a worker is running right now")

_followers = itertools.count(1)


def next_follower() -> str:
    """A process-unique label for one ``follow`` reader."""
    return f"follow-{next(_followers)}"
