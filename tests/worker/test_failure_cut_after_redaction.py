"""A run's failure is redacted before it is cut to its limits, never after.

Defect (found by a secrets hunt, both backends): ``RunFailure.from_exception`` cut the message to
its first 2000 characters and the traceback to its last 8000 before the store (and the worker's log
line) redacted them. A cut landing inside a secret took away what made it recognisable: the
``@host`` after ``postgresql://app:PASSWORD`` (the message's cut), the ``pass`` of ``password=``
(the traceback's), and the rest was stored in ``failure_json`` and logged verbatim (9 of 250
traceback cuts and 1 of 35 message cuts kept the whole secret). Now ``from_exception`` cuts only far
past the limits, and the store (and the log line) redacts first, then cuts to the limits; the
traceback's final ``Type: message`` lines are still cut like the message, so the frames stay.
Each test sweeps the cut across the secret.
"""

from __future__ import annotations

import logging

from fencepost.journal.owner import OwnerId
from fencepost.runstore.outcomes import Claimed
from fencepost.runstore.rows import RunFailure
from fencepost.worker import RunContext, Worker

SECRET = "S3CRET-CANARY-91"


def _message_cut(pad: int) -> Exception:
    return RuntimeError("x" * pad + f" could not connect to postgresql://app:{SECRET}@db.internal:5432/prod")


def _traceback_cut(pad: int) -> Exception:
    try:
        try:
            raise ValueError(f"config dump: password={SECRET} " + "z" * pad)
        except ValueError as inner:
            raise RuntimeError("job failed") from inner
    except RuntimeError as exc:
        return exc


def _pieces(text: str) -> bool:
    """Whether ``text`` holds the secret or a recognisable piece of it."""
    return SECRET in text or SECRET[:8] in text or SECRET[-8:] in text


def test_a_failure_cut_across_a_secret_never_keeps_it(store):
    owner = OwnerId("h", 1, "n")
    cases = [_message_cut(p) for p in range(1940, 1976, 3)] + [_traceback_cut(p) for p in range(7500, 7800, 15)]
    leaks = []
    for i, exc in enumerate(cases):
        failure = RunFailure.from_exception(exc)  # as given to the store: not redacted yet
        run_id = f"r{i}"
        store.runs.create(run_id, "{}")
        row = store.runs.get(run_id)
        claimed = store.runs.claim(run_id, row.snapshot(), owner, store.clock.now_ms())
        assert isinstance(claimed, Claimed)
        store.runs.activate(run_id, owner, claimed.claimed_at_ms, row)
        store.runs.transition_owned(run_id, owner, "failed", failure=failure)
        stored = store.runs.get(run_id).failure
        assert len(stored.message) <= RunFailure.MAX_MESSAGE and len(stored.traceback) <= RunFailure.MAX_TRACEBACK
        leaks += [(i, f) for f in ("message", "traceback") if _pieces(getattr(stored, f))]
    assert leaks == []


def test_the_worker_neither_stores_nor_logs_a_secret_its_cut_would_split(store, caplog):
    pads = {f"m{p}": ("message", p) for p in range(1946, 1970, 4)}
    pads |= {f"t{p}": ("traceback", p) for p in range(7560, 7760, 40)}
    for run_id in pads:
        store.runs.create(run_id, "{}")

    def fn(ctx: RunContext) -> None:
        kind, pad = pads[ctx.run_id]
        raise _message_cut(pad) if kind == "message" else _traceback_cut(pad)

    caplog.set_level(logging.DEBUG, logger="fencepost")
    stats = Worker(store, fn).run(until_idle=True)
    assert stats.failed == len(pads)
    for run_id in pads:
        failure = store.runs.get(run_id).failure
        assert not _pieces(failure.message) and not _pieces(failure.traceback), run_id
    assert [r.getMessage()[:80] for r in caplog.records if _pieces(r.getMessage())] == []
