"""``/health.json`` over several stores is a 503 only when a store is down for an outage.

Defect: over several stores, ``/health.json`` answered 503 (with ``retry-after``) whenever no store
answered, even when no store was out of reach: every store's read failing on a stored value that
cannot be decoded (``decode_failed``) is no outage that waiting cures, and over one store the same
failure is a 500. It is now a 503 only when at least one store is down for an outage reason, else a
500 as over one store. The failures are injected into the console's health read (a real
undecodable value in every store at once is not what is under test). Both backends.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import fencepost
from fencepost.errors import PersistenceError
from fencepost.ui import create_app, views
from fencepost.ui.server import UiServer

DECODE = PersistenceError("decode_failed", "console", "a stored value cannot be decoded")
OUTAGE = PersistenceError("read_failed", "console", "the database did not answer")


def _health(urls: Any, failures: dict[str, PersistenceError], monkeypatch) -> httpx.Response:
    real = views.health

    def failing(store: Any, hub: Any, name: str | None = None) -> dict[str, Any]:
        exc = failures.get(name or "")
        if exc is not None:
            raise exc
        return real(store, hub, name)

    monkeypatch.setattr(views, "health", failing)
    with UiServer(create_app(urls, tick=0.2, poll_interval=0.5)) as console:
        return httpx.get(console.url + "/health.json", timeout=10)


@pytest.fixture
def urls(make_db_url) -> dict[str, str]:
    made = {"a": make_db_url(), "b": make_db_url()}
    for url in made.values():
        fencepost.open(url).close()
    return made


def test_no_store_answering_for_an_undecodable_value_is_a_500_not_a_503(urls, monkeypatch):
    got = _health(urls, {"a": DECODE, "b": DECODE}, monkeypatch)
    assert got.status_code == 500, got.text
    assert "retry-after" not in got.headers
    assert {n: s["error"] for n, s in got.json()["stores"].items()} == {"a": "decode_failed", "b": "decode_failed"}


def test_no_store_answering_with_one_out_of_reach_is_a_503(urls, monkeypatch):
    got = _health(urls, {"a": DECODE, "b": OUTAGE}, monkeypatch)
    assert got.status_code == 503, got.text
    assert "retry-after" in got.headers
    assert {n: s["error"] for n, s in got.json()["stores"].items()} == {"a": "decode_failed", "b": "read_failed"}


def test_one_store_undecodable_is_a_500_as_before(urls, monkeypatch):
    got = _health(urls["a"], {"": DECODE}, monkeypatch)
    assert got.status_code == 500, got.text
