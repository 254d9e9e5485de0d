"""A run the sweep activated but could not hold or start is given back at once, and the sweep goes on.

Defect: inside ``run()``'s sweep, when holding a just-activated run, or starting its function, raised,
the run stayed ``running`` under this worker's name while nothing in the process held or ran it, until
its lease lapsed (30 s after the activation; never, under a ``ManualClock`` that stands still). A
failing start also left the sweep, and ``run()`` with it, so the worker died; a failing hold stopped
the sweep (or ended the worker when it was the sweep's first run). Now the run is parked
``suspended`` (claimable again, from its last checkpoint; this worker leaves it for
``SUSPEND_BACKOFF_S`` as after a ``Suspend``), the error is logged naming the run, and the sweep
takes its other runs. Injected with a monkeypatched ``_start`` / ``Supervisor.hold`` that raises
once for one run of three; both backends, real store otherwise.
"""

from __future__ import annotations

import logging
import threading

import pytest

from fencepost.journal import companion_stream
from fencepost.worker import Worker

BOUND_S = 6  # the given-back run is taken again after its 1 s rest; a stranded one never is


def _facts(store, run_id: str) -> list[str]:
    page = store.journal.entries(companion_stream(run_id))
    return [e.event_type.rsplit(".", 1)[-1] for e in page.entries]


@pytest.mark.parametrize("failing", ["start", "hold"])
def test_a_run_that_cannot_be_started_is_given_back_and_the_sweep_goes_on(store, caplog, failing):
    ids = ("r1", "r2", "r3")
    for r in ids:
        store.runs.create(r, "{}")
    ran: list[str] = []
    worker = Worker(store, lambda ctx: ran.append(ctx.run_id), concurrency=3)
    failed: list[str] = []

    def fail_once(run_id: str) -> None:
        if run_id == "r2" and not failed:
            failed.append(run_id)
            raise RuntimeError(f"{failing} broke")

    if failing == "start":
        real_start = worker._start

        def start(pool, row, lease):
            fail_once(row.run_id)
            return real_start(pool, row, lease)

        worker._start = start
    else:
        real_hold = worker.supervisor.hold

        def hold(run_id, **kwargs):
            fail_once(run_id)
            return real_hold(run_id, **kwargs)

        worker.supervisor.hold = hold

    sweeps: list[tuple[list[str], str]] = []  # (what each sweep that met the failure took, r2's status after it)
    real_sweep = worker._sweep

    def sweep(limit, start=None, **options):
        before = len(failed)
        taken = real_sweep(limit, start, **options)
        if len(failed) > before:
            sweeps.append((sorted(r.run_id for r in taken), store.runs.get("r2").status))
        return taken

    worker._sweep = sweep
    stop = threading.Event()
    outcome: list = []

    def body() -> None:
        try:
            outcome.append(worker.run(stop, until_idle=True))
        except BaseException as exc:  # the defect: the failure ended the worker
            outcome.append(exc)

    with caplog.at_level(logging.INFO, logger="fencepost.worker"):
        t = threading.Thread(target=body, daemon=True)
        t.start()
        t.join(BOUND_S)
        stop.set()
        t.join(BOUND_S)

    assert failed == ["r2"]
    assert outcome and not isinstance(outcome[0], BaseException), outcome
    # The sweep that met the failure took the other two runs, and gave r2 back at once.
    assert sweeps == [(["r1", "r3"], "suspended")], sweeps
    # r2 was taken again later (after its rest) and run once; every run completed once.
    assert sorted(ran) == ["r1", "r2", "r3"]
    assert [store.runs.get(r).status for r in ids] == ["completed"] * 3
    assert _facts(store, "r2")[-6:] == ["claimed", "activated", "released", "claimed", "activated", "released"]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("r2" in m and "RuntimeError" in m for m in errors), errors
    assert outcome[0].completed == 3
