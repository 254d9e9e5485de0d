"""Counters and spans through the OpenTelemetry API (seed ``observe-outcomes.md``).

No SDK is needed at run time: without one, the API's no-op (proxy) meter and tracer cost a few
attribute lookups. Wire an SDK ``MeterProvider``/``TracerProvider`` and the same handles report:

- ``flows_run_claims{op, outcome}`` for ``claim``, ``claim_and_own``, ``activate``,
  ``abandon_claim``, ``recover_claim`` and ``steal``;
- ``flows_run_heartbeats{outcome}`` for every fenced ownership heartbeat (``heartbeat``,
  ``heartbeat_many`` per run, ``reconfirm``);
- ``flows_run_transitions{outcome, to}`` for every owned transition, ``to`` as requested;
- ``flows_run_throughput``: +1 per terminal transition, after the outermost commit only.

``outcome`` is the result tag in snake case, or ``failure`` (an error) / ``interrupt`` (a
``BaseException`` such as ``KeyboardInterrupt``). Spans are named ``RunStore.<op>`` /
``AttemptStore.<op>`` (the seeds' camelCase names) and carry the identity, the acting host once the
inputs are validated, and ``outcome`` when they close.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import metrics, trace

from fencepost.runstore.outcomes import Outcome, snake_tag

_meter = metrics.get_meter("fencepost.runstore")
_tracer = trace.get_tracer("fencepost.runstore")

claims = _meter.create_counter("flows_run_claims", description="Ownership compare-and-swaps by op and outcome")
heartbeats = _meter.create_counter("flows_run_heartbeats", description="Fenced ownership heartbeats by outcome")
transitions = _meter.create_counter("flows_run_transitions", description="Owned transitions by outcome and target")
throughput = _meter.create_counter("flows_run_throughput", description="Runs settled in a terminal status")

_attr_cache: dict[tuple[Any, ...], dict[str, str]] = {}


def _attrs(key: tuple[Any, ...], build: Any) -> dict[str, str]:
    hit = _attr_cache.get(key)
    if hit is None:
        hit = _attr_cache[key] = build()
    return hit


class Op:
    """One observed store call: a span, plus the counter the call updates when it ends."""

    __slots__ = ("closed", "counter", "op", "span", "to")

    def __init__(self, name: str, counter: Any = None, op: str | None = None) -> None:
        self.span = _tracer.start_span(name)
        self.counter = counter
        self.op = op
        self.to: str | None = None
        self.closed = False

    def identity(self, **attributes: Any) -> None:
        """Record identity and acting-host attributes (call only after validation)."""
        span = self.span
        if span.is_recording():
            for key, value in attributes.items():
                span.set_attribute(key, value)

    def __enter__(self) -> Op:
        return self

    def done(self, outcome: Outcome | str) -> None:
        label = outcome if isinstance(outcome, str) else snake_tag(outcome)
        self._finish(label)

    def _finish(self, label: str) -> None:
        self.closed = True
        counter = self.counter
        if counter is not None:
            if counter is claims:
                attrs = _attrs(("c", self.op, label), lambda: {"op": self.op, "outcome": label})
            elif counter is transitions:
                to = self.to or "unknown"
                attrs = _attrs(("t", to, label), lambda: {"outcome": label, "to": to})
            else:
                attrs = _attrs(("h", label), lambda: {"outcome": label})
            counter.add(1, attrs)
            self.counter = None
        span = self.span
        if span.is_recording():
            span.set_attribute("outcome", label)
        span.end()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.closed:
            return
        if exc_type is None:
            self._finish("success")  # an operation without a domain outcome
            return
        self._finish("failure" if issubclass(exc_type, Exception) else "interrupt")


def count_heartbeats(counts: dict[str, int]) -> None:
    """Add one heartbeat per run of a batch, aggregated per outcome label."""
    for label, n in counts.items():
        heartbeats.add(n, _attrs(("h", label), lambda label=label: {"outcome": label}))
