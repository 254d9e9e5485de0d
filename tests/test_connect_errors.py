"""``Database.connect()`` (public through ``builder.target.connect()`` in the custom-projection
guide) raises fencepost's public ``PersistenceError`` when it gets no connection, never the
internal ``DbFailure``: the pool stayed full (``pool_exhausted``), or the store was closed while
the call waited. Both backends."""

from __future__ import annotations

import threading

import pytest

import fencepost
from fencepost import _durable
from fencepost._durable import DbFailure
from fencepost.errors import PersistenceError


def _one_connection(db_url: str) -> str:
    return db_url + ("&" if "?" in db_url else "?") + "pool_size=1"


def test_connect_on_a_full_pool_raises_the_public_pool_exhausted_error(db_url, monkeypatch):
    monkeypatch.setattr(_durable, "POOL_WAIT", 0.3)
    store = fencepost.open(_one_connection(db_url))
    try:
        held = store.db.connect()
        try:
            with pytest.raises(Exception) as caught:
                store.db.connect().close()
        finally:
            held.close()
    finally:
        store.close()
    err = caught.value
    assert isinstance(err, PersistenceError) and not isinstance(err, DbFailure), repr(err)
    assert (err.code, err.db_code, err.transient) == ("persistence_failed", "pool_exhausted", True)
    assert "pool_size" in str(err)


def test_connect_waiting_when_the_store_closes_raises_the_public_closed_error(db_url, monkeypatch):
    monkeypatch.setattr(_durable, "POOL_WAIT", 8.0)  # bounds the wait if close did not wake it
    store = fencepost.open(_one_connection(db_url))
    db = store.db
    entered = threading.Event()
    checkout = db._checkout

    def watched():
        if threading.current_thread().name == "waiter":
            entered.set()
        return checkout()

    monkeypatch.setattr(db, "_checkout", watched)
    caught: list[BaseException] = []

    def waiter() -> None:
        try:
            db.connect().close()
        except BaseException as exc:  # examined below
            caught.append(exc)

    held = db.connect()
    t = threading.Thread(target=waiter, name="waiter", daemon=True)
    try:
        t.start()
        assert entered.wait(5)
        store.close()
        t.join(10)
    finally:
        held.close()
        store.close()
    assert not t.is_alive()
    [err] = caught
    assert isinstance(err, PersistenceError) and not isinstance(err, DbFailure), repr(err)
    assert err.db_code == "closed" and "the store is closed" in str(err)
