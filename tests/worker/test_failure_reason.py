"""Why a run failed is recorded with the settlement: type, message and a bounded traceback,
redacted like journal text, in the same transaction as the ``failed`` transition."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading

import msgspec
import pytest
from sqlalchemy.exc import IntegrityError

from fencepost.errors import RunStoreError
from fencepost.journal.owner import OwnerId
from fencepost.runstore.outcomes import Claimed, FenceLost, Transitioned
from fencepost.runstore.rows import RunFailure
from fencepost.worker import RunContext, Suspend, Worker

SECRET = "hunter2-sup3r-s3cret-value"


def _own(store, run_id: str, owner: OwnerId) -> None:
    row = store.runs.get(run_id)
    claimed = store.runs.claim(run_id, row.snapshot(), owner, store.clock.now_ms())
    assert isinstance(claimed, Claimed)
    store.runs.activate(run_id, owner, claimed.claimed_at_ms, row)


def _inner_step(n: int) -> None:
    raise ValueError(f"step {n} could not parse its input")


def test_a_raising_task_records_type_message_and_traceback(store):
    store.runs.create("boom", "{}")

    def fn(ctx: RunContext):
        _inner_step(3)

    stats = Worker(store, fn).run(until_idle=True)
    row = store.runs.get("boom")
    assert stats.failed == 1 and row.status == "failed"
    assert isinstance(row.failure, RunFailure)
    assert row.failure.type == "ValueError"
    assert row.failure.message == "step 3 could not parse its input"
    assert "_inner_step" in row.failure.traceback and "ValueError" in row.failure.traceback
    assert row.failure.traceback.startswith("Traceback")


def test_completed_and_cancelled_runs_carry_no_failure(store):
    store.runs.create("ok", "{}")
    Worker(store, lambda ctx: {"done": True}).run(until_idle=True)
    assert store.runs.get("ok").failure is None


def test_a_credential_in_the_message_or_traceback_never_lands_verbatim(store, raw):
    store.runs.create("leaky", "{}")

    def fn(ctx: RunContext):
        password = SECRET  # noqa: F841 - a local the traceback must not print either
        raise RuntimeError(f"connect postgresql://app:{SECRET}@db.internal/prod failed; password={SECRET}")

    Worker(store, fn).run(until_idle=True)
    stored = raw.exec_driver_sql("SELECT failure_json FROM flows_runs WHERE run_id = 'leaky'").scalar()
    assert stored is not None and SECRET not in stored
    row = store.runs.get("leaky")
    assert SECRET not in row.failure.message and "[REDACTED]" in row.failure.message
    assert SECRET not in row.failure.traceback
    assert row.failure.type == "RuntimeError"


def test_the_traceback_and_message_are_bounded(store):
    store.runs.create("deep", "{}")

    def ping(n: int) -> None:
        if n == 0:
            raise ValueError("x" * 100_000)
        pong(n - 1)

    def pong(n: int) -> None:  # alternating frames: Python cannot fold them into "repeated N times"
        ping(n - 1)

    Worker(store, lambda ctx: ping(400)).run(until_idle=True)
    f = store.runs.get("deep").failure
    assert len(f.message) <= RunFailure.MAX_MESSAGE
    assert len(f.traceback) <= RunFailure.MAX_TRACEBACK
    # The end of the traceback (the frame that raised, then the bounded message) is what is kept.
    assert f.traceback.startswith("...")
    assert 'raise ValueError("x" * 100_000)' in f.traceback
    assert f.traceback.rstrip("\n").endswith("xxx...") and "\nValueError: xxx" in f.traceback


def test_transition_owned_records_the_failure_only_with_the_failed_settlement(store):
    owner = OwnerId("h", 1, "n1")
    store.runs.create("r", "{}")
    _own(store, "r", owner)
    failure = RunFailure("KeyError", "'missing'", "Traceback (most recent call last):\nKeyError: 'missing'\n")
    with pytest.raises(RunStoreError) as err:
        store.runs.transition_owned("r", owner, "completed", failure=failure)
    assert err.value.code == "invalid_run" and "failure" in str(err.value)
    assert store.runs.get("r").status == "running"
    with pytest.raises(RunStoreError):
        store.runs.transition_owned("r", owner, "failed", failure={"type": "x"})  # not a RunFailure
    # A fenced-out writer records neither the settlement nor the failure.
    intruder = OwnerId("h", 2, "n2")
    assert isinstance(store.runs.transition_owned("r", intruder, "failed", failure=failure), FenceLost)
    assert store.runs.get("r").failure is None
    assert isinstance(store.runs.transition_owned("r", owner, "failed", failure=failure), Transitioned)
    row = store.runs.get("r")
    assert row.status == "failed" and row.failure == failure


def test_the_database_refuses_a_failure_on_a_run_that_did_not_fail(store, raw):
    store.runs.create("r", "{}")
    with pytest.raises(IntegrityError):
        raw.exec_driver_sql("""UPDATE flows_runs SET failure_json = '{"type":"x","message":"","traceback":""}'
                               WHERE run_id = 'r'""")
    raw.rollback()


def test_every_settlement_is_logged_with_the_run_id(store, caplog):
    store.runs.create("good", "{}")
    store.runs.create("bad", "{}")

    def fn(ctx: RunContext):
        if ctx.run_id == "bad":
            raise LookupError("no such thing")
        return {"ok": True}

    with caplog.at_level(logging.INFO, logger="fencepost.worker"):
        Worker(store, fn).run(until_idle=True)
    settled = {r.run_id: r for r in caplog.records if getattr(r, "run_id", None) and "settled" in r.getMessage()}
    assert set(settled) == {"good", "bad"}
    assert settled["good"].exc_info is None and "completed" in settled["good"].getMessage()
    bad = settled["bad"]
    assert bad.levelno == logging.WARNING and bad.exc_info is None and "LookupError" in bad.getMessage()
    assert "bad" in bad.getMessage() and "failed" in bad.getMessage()


def test_a_redaction_that_fails_is_a_clear_error_that_quotes_nothing_and_changes_nothing(store):
    from fencepost.journal.redaction import FunctionRule, Redaction

    def broken(text: str) -> str:
        raise RuntimeError(f"rule crashed on {text}")

    owner = OwnerId("h", 1, "n1")
    store.runs.create("direct", "{}")
    _own(store, "direct", owner)
    store.journal.redaction = Redaction(rules=[FunctionRule("broken", broken)])
    with pytest.raises(RunStoreError) as err:
        store.runs.transition_owned("direct", owner, "failed",
                                    failure=RunFailure("ValueError", SECRET, "Traceback\n"))
    assert "could not be redacted" in str(err.value) and SECRET not in str(err.value)
    assert err.value.__cause__ is None and err.value.__context__ is None
    row = store.runs.get("direct")
    assert row.status == "running" and row.failure is None


def _run_bounded(store, fn) -> Worker:
    """Run a worker until idle; stop it (and fail) if it is still busy after 20 s."""
    worker = Worker(store, fn, concurrency=1)
    stop = threading.Event()
    t = threading.Thread(target=worker.run, args=(stop,), kwargs={"until_idle": True})
    t.start()
    t.join(20)
    stop.set()
    t.join(20)
    assert not t.is_alive()
    return worker


class _Opaque:
    """Not JSON: msgspec cannot encode it."""


@pytest.mark.parametrize(("ending", "rule"), [
    (lambda ctx: _Opaque(), "Encoding objects of type"),
    (lambda ctx: {"text": "a\x00b"}, "its JSON text breaks a rule (string contains NUL)"),
    (lambda ctx: _raise(Suspend(_Opaque())), "Encoding objects of type"),
    (lambda ctx: _raise(Suspend({"text": "a\x00b"})), "its JSON text breaks a rule (string contains NUL)"),
], ids=["return-object", "return-nul", "suspend-object", "suspend-nul"])
def test_a_result_that_cannot_be_stored_settles_failed_saying_why(store, ending, rule):
    """A run function that returned (or suspended with) a value the store cannot hold left the run
    ``running`` with its lease dropped: the settlement raised inside the worker ("settling a run
    failed"), so every 30 s the lease expired, the run was taken over and the function ran again,
    forever (``--until-idle`` never ended). It now settles ``failed``, the reason recorded."""
    store.runs.create("bad-result", '{"step": 1}')
    ran: list[str] = []

    def fn(ctx: RunContext):
        ran.append(ctx.run_id)
        return ending(ctx)

    worker = _run_bounded(store, fn)
    row = store.runs.get("bad-result")
    assert row.status == "failed" and row.owner is None
    assert row.failure.type == "fencepost.worker.UnstorableResult"
    assert "cannot be stored" in row.failure.message and rule in row.failure.message
    assert row.state_json == '{"step": 1}'  # the last durable state is kept
    assert ran == ["bad-result"] and worker.stats.failed == 1


def test_a_coroutine_returned_by_the_run_function_settles_failed_naming_async_def(store):
    """A run function that returned a coroutine (an ``async def`` reached the worker some other
    way, e.g. a wrapper) fell into the same endless retake loop; it now settles ``failed``."""
    store.runs.create("coro", "{}")

    async def work(ctx):
        return {"ok": True}

    worker = _run_bounded(store, lambda ctx: work(ctx))
    row = store.runs.get("coro")
    assert row.status == "failed" and "coroutine" in row.failure.message
    assert worker.stats.failed == 1


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(), GeneratorExit()],
                         ids=["SystemExit", "KeyboardInterrupt", "GeneratorExit"])
def test_a_run_function_raising_a_base_exception_settles_failed(store, exc):
    """``sys.exit()`` in a run function (a BaseException, not an Exception) escaped the worker's
    handling: the run stayed ``running`` with its lease dropped and was run again after every
    lease expiry. It now settles ``failed`` like any other exception."""
    store.runs.create("exits", "{}")

    def fn(ctx: RunContext):
        raise exc

    worker = _run_bounded(store, fn)
    row = store.runs.get("exits")
    assert row.status == "failed" and row.failure.type == type(exc).__name__
    assert worker.stats.failed == 1


def _raise(exc: BaseException):
    raise exc


def _checkpoint_then_finish(state):
    def fn(ctx: RunContext):
        ctx.checkpoint(state)
        return {"finished": True}
    return fn


@pytest.mark.parametrize(("state", "rule"), [
    (_Opaque(), "Encoding objects of type"),
    ({"text": "a\x00b"}, "contains NUL"),
], ids=["object", "nul"])
def test_a_checkpoint_that_cannot_be_stored_settles_failed_as_unstorable(store, state, rule):
    """``ctx.checkpoint(value)`` with a value the store cannot hold raised msgspec's bare
    ``TypeError`` (or the store's ``RunStoreError`` for a NUL), so the run failed with a reason
    unlike the one a returned value gets; the guide promises ``UnstorableResult`` naming the rule,
    the last checkpoint kept. Both backends."""
    store.runs.create("bad-ckpt", '{"step": 1}')
    _run_bounded(store, _checkpoint_then_finish(state))
    row = store.runs.get("bad-ckpt")
    assert row.status == "failed" and row.failure.type == "fencepost.worker.UnstorableResult", row.failure
    assert "checkpoint" in row.failure.message and rule in row.failure.message
    assert row.state_json == '{"step": 1}'


def _assert_refused_unstorable(store, run_id: str) -> None:
    """The run settled ``failed`` with ``UnstorableResult`` naming the NaN rule, its last state
    (``{"step": 1}``) kept."""
    row = store.runs.get(run_id)
    assert row.status == "failed", (row.status, row.state_json)
    assert row.failure.type == "fencepost.worker.UnstorableResult", row.failure
    assert "NaN or an infinity" in row.failure.message
    assert row.state_json == '{"step": 1}'


@pytest.mark.parametrize("number", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("how", ["return", "suspend", "checkpoint"])
def test_a_non_finite_float_is_refused_not_stored_as_null(store, number, how):
    """JSON has no NaN or infinity: msgspec writes them as ``null``, so a run function returning
    ``{"ratio": nan}`` settled ``completed`` with ``{"ratio": null}``, the number silently lost
    (the store itself refuses ``NaN`` in state text). It now settles ``failed`` with
    ``UnstorableResult`` naming the rule, the last checkpoint kept. Both backends."""
    store.runs.create("nan", '{"step": 1}')
    value = {"metrics": [1.5, {"ratio": number}]}
    fn = {"return": lambda ctx: value, "suspend": lambda ctx: _raise(Suspend(value)),
          "checkpoint": _checkpoint_then_finish(value)}[how]
    _run_bounded(store, fn)
    _assert_refused_unstorable(store, "nan")


def test_null_and_finite_floats_still_store(store):
    store.runs.create("fine", "{}")
    _run_bounded(store, lambda ctx: {"a": None, "b": 1.5, "c": [None, -0.0, 1e308]})
    row = store.runs.get("fine")
    assert row.status == "completed" and json.loads(row.state_json) == {"a": None, "b": 1.5, "c": [None, -0.0, 1e308]}


@dataclasses.dataclass
class _Metrics:
    ratio: float


class _MetricsStruct(msgspec.Struct):
    ratio: float


@pytest.mark.parametrize("wrap", [_Metrics, _MetricsStruct], ids=["dataclass", "struct"])
@pytest.mark.parametrize("how", ["return", "checkpoint"])
def test_a_non_finite_float_inside_a_dataclass_or_struct_is_refused_too(store, wrap, how):
    """msgspec encodes dataclasses and Structs (the decisions promise they keep working), and writes
    a NaN field of one as ``null`` exactly as in a dict; the NaN check walked only dicts, lists,
    tuples and sets, so ``{"m": Metrics(nan)}`` still completed as ``{"m": {"ratio": null}}``, the
    number silently lost. It settles ``failed`` with ``UnstorableResult`` like the dict form. Both
    backends."""
    store.runs.create("nan-obj", '{"step": 1}')
    value = {"metrics": [wrap(float("nan"))]}
    fn = {"return": lambda ctx: value, "checkpoint": _checkpoint_then_finish(value)}[how]
    _run_bounded(store, fn)
    _assert_refused_unstorable(store, "nan-obj")


def test_a_finite_dataclass_result_still_stores(store):
    store.runs.create("fine-obj", "{}")
    _run_bounded(store, lambda ctx: {"m": _Metrics(0.5), "s": _MetricsStruct(2.0), "n": None})
    row = store.runs.get("fine-obj")
    assert row.status == "completed" and json.loads(row.state_json) == {"m": {"ratio": 0.5}, "s": {"ratio": 2.0},
                                                                        "n": None}
