"""The worker refuses bad arguments at once, naming the argument, before it claims anything.

A worker built with ``fn=None`` used to claim every pending run and settle each one ``failed``
(``'NoneType' object is not callable`` recorded as the run's failure); other bad arguments failed
deep inside ``run()`` with raw ``AttributeError``/``TypeError``. Every case here leaves a pending
run pending and untouched. Both backends.
"""

from __future__ import annotations

import threading

import pytest

from fencepost.journal import companion_stream
from fencepost.journal.owner import OwnerId
from fencepost.worker import Worker


def _fn(ctx):
    return {"done": True}


async def _async_fn(ctx):
    return {"done": True}


def _pending(store) -> tuple:
    store.runs.create("keep", '{"n": 1}')
    return _seen(store)


def _seen(store) -> tuple:
    row = store.runs.get("keep")
    return row, store.feed.position(), len(store.journal.entries(companion_stream("keep")).entries)


@pytest.mark.parametrize(("field", "kwargs"), [
    ("fn", {"fn": None}),
    ("fn", {"fn": "not callable"}),
    ("fn", {"fn": _async_fn}),  # it would return a coroutine the worker never awaits
    ("store", {"store": None}),
    ("store", {"store": "sqlite:///x.db"}),
    ("owner", {"owner": "me"}),
    ("owner", {"owner": OwnerId("", 1, "n")}),
    ("concurrency", {"concurrency": "4"}),
    ("concurrency", {"concurrency": 0}),
    ("concurrency", {"concurrency": -2}),
    ("concurrency", {"concurrency": 2.0}),
    ("concurrency", {"concurrency": True}),
    ("run_prefix", {"run_prefix": 5}),
    ("run_prefix", {"run_prefix": ""}),
    ("run_prefix", {"run_prefix": "a\x00b"}),
    ("liveness", {"liveness": "lease"}),
])
def test_the_constructor_refuses_a_bad_argument_naming_it(store, field, kwargs):
    before = _pending(store)
    args = {"store": store, "fn": _fn, **kwargs}
    s, fn = args.pop("store"), args.pop("fn")
    with pytest.raises(ValueError, match=rf"^{field} ") as caught:
        Worker(s, fn, **args)
    assert "NoneType" not in str(caught.value)
    assert _seen(store) == before


@pytest.mark.parametrize(("field", "call"), [
    ("stop", lambda w: w.run("x", until_idle=True)),
    ("stop", lambda w: w.run(5, until_idle=True)),
    ("until_idle", lambda w: w.run(until_idle="yes")),
    ("limit", lambda w: w.take("5")),
    ("limit", lambda w: w.take(0)),
    ("limit", lambda w: w.take(-1)),
    ("limit", lambda w: w.take(1.5)),
])
def test_run_and_take_refuse_a_bad_argument_before_any_claim(store, field, call):
    before = _pending(store)
    worker = Worker(store, _fn)
    with pytest.raises(ValueError, match=rf"^{field} "):
        call(worker)
    assert _seen(store) == before
    assert worker.stats.claimed == 0


def test_good_arguments_still_work(store):
    _pending(store)
    owner = OwnerId("host-a", 1, "nonce-a")
    stop = threading.Event()
    worker = Worker(store, _fn, owner=owner, concurrency=1, run_prefix="ke", liveness=lambda o, c: False)
    assert [r.run_id for r in worker.take(1)] == ["keep"]
    # ``run`` settles what ``take`` handed it only through its own loop; a fresh worker picks up the rest.
    store.runs.create("keep2", '{"n": 2}')
    stats = Worker(store, _fn, run_prefix="keep2").run(stop, until_idle=True)
    assert stats.completed == 1 and store.runs.get("keep2").status == "completed"


@pytest.mark.parametrize("limit", [2**63, 10**30])
def test_a_limit_past_any_sql_integer_takes_what_there_is(store, limit):
    """``take(limit)`` and ``concurrency`` accept any integer >= 1, but a limit past 64 bits reached
    the candidate query as its LIMIT and raised a raw ``OverflowError`` (SQLite) or a driver error
    (PostgreSQL) from inside the sweep. "Up to ``limit``" with more than there can be rows takes every
    run there is. Both backends."""
    _pending(store)
    assert [r.run_id for r in Worker(store, _fn).take(limit)] == ["keep"]
    store.runs.create("keep2", '{"n": 2}')
    stats = Worker(store, _fn, concurrency=limit, run_prefix="keep2").run(until_idle=True)
    assert stats.completed == 1 and store.runs.get("keep2").status == "completed"


def _no_argument():
    return {}


def _two_arguments(ctx, extra):
    return {}


def _keyword_only(*, ctx):
    return {}


@pytest.mark.parametrize("fn", [_no_argument, _two_arguments, _keyword_only], ids=lambda f: f.__name__)
def test_a_function_that_cannot_take_the_run_context_is_refused_before_any_run_is_failed(store, fn):
    """``def work():`` (or one wanting a second argument) passed the checks, then every run the
    worker took was settled ``failed`` with ``TypeError: work() takes 0 positional arguments but 1
    was given``: a slip in the signature failed the whole queue. It is refused when the worker is
    built, naming ``fn``, and the pending run stays untouched."""
    before = _pending(store)
    with pytest.raises(ValueError, match=r"^fn must accept one positional argument, the run's RunContext"):
        Worker(store, fn)
    assert _seen(store) == before


class _Callable:
    def __call__(self, ctx):
        return {}


@pytest.mark.parametrize("fn", [_fn, lambda ctx, retries=3: {}, lambda *args: {}, _Callable(), print],
                         ids=["plain", "default", "varargs", "callable-object", "builtin"])
def test_a_function_that_takes_the_run_context_is_accepted(store, fn):
    Worker(store, fn)


_DEFAULT_SECRET = "sk-live-0123456789abcdef"


def _wants_more(ctx, extra, token: str = _DEFAULT_SECRET, *, dsn="postgresql://app:pw@db/prod"):
    return {}


def test_the_signature_refusal_names_the_parameters_never_their_default_values(store):
    """The refusal quoted ``inspect.signature(fn)`` whole, default values and annotations included,
    so a credential kept as a default (``token="sk-live-..."``, a DSN with its password) was printed
    in the error and, through ``--task``, on the terminal. It names the parameters only. Both
    backends (the store plays no part; the ``store`` fixture builds the worker)."""
    with pytest.raises(ValueError) as info:
        Worker(store, _wants_more)
    message = str(info.value)
    assert "(ctx, extra, token, *, dsn)" in message, message
    assert _DEFAULT_SECRET not in message and "pw@" not in message and "str" not in message.split("(it takes")[1]
