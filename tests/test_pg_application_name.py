"""A PostgreSQL URL's own application name wins over fencepost's default, however it is spelled.

fencepost names its sessions ``fencepost`` (and a follower's LISTEN session ``fencepost-follow-
<schema>``) only so that they can be told apart in ``pg_stat_activity``; nothing of fencepost looks
them up by name. A user's ``?application_name=NAME`` replaced the default on the store's own
connections but not on a follower's LISTEN session, and ``?options=-c application_name=NAME`` lost
everywhere: fencepost's name, sent as a connection keyword, overrides a setting of ``options``. Each
spelling now names every session of the store, as does ``PGAPPNAME`` (libpq's own order).
PostgreSQL only: SQLite has no sessions and no application name.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

import fencepost
from tests.conftest import require_postgres


def _sessions(name: str) -> list[str]:
    """The last statement of every session named ``name`` on the server (seen from outside)."""
    engine = create_engine(require_postgres(), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return [r[0] for r in conn.execute(
                text("SELECT query FROM pg_stat_activity WHERE application_name = :a"), {"a": name})]
    finally:
        engine.dispose()


def _names_of(store: fencepost.Store) -> tuple[str, str]:
    """The name of the store's own session, and that of its follower's LISTEN session."""
    own = store.db.read(lambda conn: conn.exec_driver_sql("SELECT current_setting('application_name')").scalar())
    stop = threading.Event()
    follow = store.feed.follow(stop=stop, poll_interval=60)
    worker = threading.Thread(target=lambda: [None for _ in follow], daemon=True)
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the LISTEN session connects in a thread of its own
            for name in (own, f"fencepost-follow-{store.db.schema}"[:63]):
                if any(q.startswith("LISTEN") for q in _sessions(name)):
                    return own, name
            time.sleep(0.02)
        raise AssertionError("no LISTEN session of the follower within 10 s")
    finally:
        stop.set()
        worker.join(10)
        assert not worker.is_alive()


SPELLINGS = {
    "keyword": "application_name={name}",
    "keyword with a space": "application_name=my%20{name}",
    "options -c": "options=" + urllib.parse.quote("-c application_name={name}", safe="{}"),
    "options -c joined, any case": "options=" + urllib.parse.quote("-cAPPLICATION_NAME={name}", safe="{}"),
    "options --": "options=" + urllib.parse.quote("--application-name={name}", safe="{}"),
}


@pytest.mark.parametrize("spelling", SPELLINGS.values(), ids=SPELLINGS.keys())
def test_the_urls_application_name_names_every_session_of_the_store(pg_url: str, spelling: str) -> None:
    name = f"app-{uuid.uuid4().hex[:12]}"
    expected = f"my {name}" if spelling.startswith("application_name=my%20") else name
    with fencepost.open(f"{pg_url}&{spelling.format(name=name)}") as store:
        assert _names_of(store) == (expected, expected)


def test_pgappname_names_the_sessions_where_the_url_does_not(pg_url: str, monkeypatch) -> None:
    name = f"env-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("PGAPPNAME", name)
    with fencepost.open(pg_url) as store:
        assert _names_of(store) == (name, name)
    other = f"url-{uuid.uuid4().hex[:12]}"
    with fencepost.open(f"{pg_url}&application_name={other}") as store:  # the URL's name wins over it
        assert _names_of(store) == (other, other)


def test_without_a_name_fencepost_names_its_sessions(pg_url: str, monkeypatch) -> None:
    monkeypatch.delenv("PGAPPNAME", raising=False)
    with fencepost.open(f"{pg_url}&options=" + urllib.parse.quote("-c statement_timeout=0")) as store:
        assert _names_of(store) == ("fencepost", f"fencepost-follow-{store.db.schema}"[:63])


@pytest.mark.parametrize(("options", "named"), [
    ("-c application_name=a", True),
    ("-capplication_name=a", True),
    ("--application-name=a", True),
    ("-ec Application_Name=a", True),
    ("-c statement_timeout=0 -c application_name=a", True),
    ("-c myapp.label=application_name", False),
    ("-c statement_timeout=0", False),
])
def test_fencepost_leaves_its_name_out_only_where_options_set_one(options: str, named: bool) -> None:
    """Read as the server reads ``options``: only a switch whose setting is ``application_name``
    (any case, ``-`` for ``_``) names the session; a value that only mentions it does not."""
    from fencepost._durable import pg_session_name

    assert pg_session_name({"options": options}, "fencepost") == ({} if named else {
        "fallback_application_name": "fencepost"})
    assert pg_session_name({"fallback_application_name": "mine"}, "fencepost") == {}
    assert pg_session_name({"application_name": "mine"}, "fencepost") == {"fallback_application_name": "fencepost"}
