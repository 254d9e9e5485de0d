"""A store the console waits for watches only its own engines' connections, on both backends.

An open attempt must know when it has a connection to its database (closing the console waits for
such an attempt, and returns at once for one still waiting for a server that never answers:
``tests/ui/test_close_attempt.py``). It learned it from a ``connect`` listener registered on
SQLAlchemy's ``Pool`` class, so once the console had tried to open a store, every pool of the
process, an embedding application's own included, ran fencepost's listener on each new
connection. The listener is now registered on each engine the attempt's open builds, and on no
other.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

import fencepost
from fencepost.errors import OpenError
from fencepost.ui import awaited
from tests.conftest import require_postgres


def _fencepost_listeners(listeners: object) -> list[str]:
    """fencepost's functions among a pool's ``connect`` listeners (those of its class included)."""
    return [f"{fn.__module__}.{fn.__qualname__}" for fn in listeners  # type: ignore[attr-defined]
            if getattr(fn, "__module__", "").startswith("fencepost")]


def test_an_open_attempt_listens_to_its_own_engine_not_to_every_pool(
        db_url: str, backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fencepost.open(db_url).close()  # created and migrated: the attempt finds it answering
    error = OpenError("cannot_connect", "open", "the database did not answer")
    error.transient = True
    store = awaited.AwaitedStore(db_url, error)
    monkeypatch.setattr(awaited, "RETRY_S", 0.0)
    try:
        deadline = time.monotonic() + 10
        while store.opened is None and time.monotonic() < deadline:
            try:
                store.feed  # noqa: B018 - an access, as a request makes: starts an attempt
            except OpenError:
                time.sleep(0.05)
        assert store.opened is not None, "the store never opened"
        assert store._reached, "the attempt did not see its own connection"
        # The application's own engine, made after the console's attempt ran.
        app_url = f"sqlite:///{tmp_path / 'app.db'}" if backend == "sqlite" else require_postgres()
        engine = create_engine(app_url)
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            assert _fencepost_listeners(engine.pool.dispatch.connect) == []
        finally:
            engine.dispose()
    finally:
        store.close()
