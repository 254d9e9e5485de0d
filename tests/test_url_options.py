"""Database URL options: checked before anything is created, secrets in them never printed.

Found by a new-user walkthrough: a password given as ``?password=`` was printed in errors and on
the console's health page; an unknown option reached the driver (SQLite: ``open_failed``;
PostgreSQL: a misleading ``auth_failed``); ``busy_timeout_ms`` past 2**31-1 silently became 0
(no waiting at all); options of the other backend were silently ignored.
"""

from __future__ import annotations

import uuid

import pytest

import fencepost
from fencepost._durable import parse_url, redact_url
from tests.conftest import require_postgres

SECRET = "s3cret-Q-0123456789"


def _url(backend: str, tmp_path, query: str) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'not-yet' / 'flows.db'}?{query}"
    base = require_postgres().split("?")[0]
    return f"{base}?{query}"


def _refused(url: str) -> str:
    with pytest.raises(ValueError) as info:
        fencepost.open(url)
    text = f"{info.value!s} {info.value.__cause__!r} {info.value.__context__!r}"
    assert SECRET not in text
    return str(info.value)


# ------------------------------------------------------------------ secrets in the query
@pytest.mark.parametrize("key", ["password", "sslpassword", "oauth_client_secret"])
def test_a_password_in_the_query_is_masked_when_the_url_is_printed(key: str) -> None:
    url = f"postgresql+psycopg://someone@db.example:5432/app?{key}={SECRET}&sslmode=require"
    shown = redact_url(url)
    assert SECRET not in shown
    assert f"{key}=***" in shown and "sslmode=require" in shown and "someone@db.example" in shown


def test_a_password_both_in_the_authority_and_the_query_is_masked_twice() -> None:
    shown = redact_url(f"postgresql+psycopg://u:{SECRET}@h/app?password={SECRET}x")
    assert SECRET not in shown and shown.count("***") == 2


def test_an_open_that_fails_does_not_print_a_query_password() -> None:
    # Nothing listens on port 1: cannot_connect, whose message names the (masked) URL.
    with pytest.raises(fencepost.errors.FencepostError) as info:
        fencepost.open(f"postgresql+psycopg://nobody@127.0.0.1:1/test?password={SECRET}")
    assert SECRET not in str(info.value) and "password=***" in str(info.value)


def test_a_store_reports_its_url_with_the_query_password_masked(pg_url: str) -> None:
    store = fencepost.open(f"{pg_url}&password={SECRET}")
    try:
        assert SECRET not in store.db.where and "password=***" in store.db.where
    finally:
        store.close()


# ------------------------------------------------------------------ unknown and misplaced options
def test_an_unknown_option_is_refused_by_name_before_anything_is_created(backend: str, tmp_path) -> None:
    message = _refused(_url(backend, tmp_path, f"bogus={SECRET}"))
    assert "bogus" in message and "unknown" in message
    assert not (tmp_path / "not-yet").exists()


def test_an_unknown_option_with_an_odd_name_is_refused_without_naming_it(backend: str, tmp_path) -> None:
    message = _refused(_url(backend, tmp_path, f"{SECRET}+{SECRET}=1"))
    assert "unknown" in message


@pytest.mark.parametrize("option", ["synchronous=OFF", "checkpoints=writer"])
def test_a_sqlite_option_on_a_postgresql_url_is_refused(option: str) -> None:
    message = _refused(f"{require_postgres().split('?')[0]}?{option}")
    assert option.split("=")[0] in message and "SQLite" in message


def test_schema_on_a_sqlite_url_is_refused(tmp_path) -> None:
    message = _refused(_url("sqlite", tmp_path, "schema=app"))
    assert "schema" in message and "PostgreSQL" in message
    assert not (tmp_path / "not-yet").exists()


def test_a_postgresql_driver_option_is_still_accepted(pg_url: str) -> None:
    store = fencepost.open(f"{pg_url}&sslmode=disable&connect_timeout=5&application_name=probe")
    try:
        with store.db.engine.connect() as conn:
            name = conn.exec_driver_sql("SELECT current_setting('application_name')").scalar()
        assert name == "probe"
    finally:
        store.close()


def test_an_option_given_twice_is_refused_as_given_twice(backend: str, tmp_path) -> None:
    query = "schema=a&schema=b" if backend == "postgresql" else "synchronous=FULL&synchronous=OFF"
    message = _refused(_url(backend, tmp_path, query))
    assert "more than once" in message


def test_a_bad_schema_is_refused_when_the_url_is_parsed() -> None:
    # Checked with the other options, so the CLI reports it as a usage error (exit 2).
    with pytest.raises(ValueError, match="schema must match"):
        parse_url("postgresql+psycopg://u@h/db?schema=BAD")


@pytest.mark.parametrize("url", ["postgresql+psycopg://u@h/db?schema=", "postgresql+psycopg://u@h/db?sslmode=require&schema=",
                                 "sqlite:///x.db?synchronous=", "sqlite:///x.db?busy_timeout_ms=&checkpoints=writer"])
def test_a_fencepost_option_given_without_a_value_is_refused_not_taken_as_the_default(url: str) -> None:
    """The URL parser drops ``?schema=``: the store opened the default schema without a word."""
    with pytest.raises(ValueError, match="is given without a value"):
        parse_url(url)


# ------------------------------------------------------------------ busy_timeout_ms range
@pytest.mark.parametrize("value", ["2147483648", "4294967296", "99999999999999999999"])
def test_a_busy_timeout_past_sqlites_range_is_refused_not_turned_into_zero(backend: str, tmp_path, value: str) -> None:
    """PostgreSQL's ``lock_timeout``, which carries the option there, has the same limit."""
    message = _refused(_url(backend, tmp_path, f"busy_timeout_ms={value}"))
    assert "busy_timeout_ms" in message and "2147483647" in message
    assert not (tmp_path / "not-yet").exists()


def test_the_largest_busy_timeout_is_kept(tmp_path) -> None:
    path = tmp_path / "f.db"
    store = fencepost.open(f"sqlite:///{path}?busy_timeout_ms=2147483647")
    try:
        store.db.write(lambda conn: None)
        conn = store.db._slot(True).conn.connection.driver_connection
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 2147483647
    finally:
        store.close()


def test_a_driver_option_the_driver_takes_more_than_once_is_left_to_it() -> None:
    parsed, options = parse_url("postgresql+psycopg://u@/db?host=a.example:5432&host=b.example:5433&schema=app")
    assert parsed.query["host"] == ("a.example:5432", "b.example:5433") and options == {"schema": "app"}


# ------------------------------------------------------------------ a SQLite path ending in a slash
@pytest.mark.parametrize("tail", ["data/", "data/?synchronous=NORMAL"])
def test_a_sqlite_url_naming_a_directory_is_refused_not_made_into_a_file(tmp_path, monkeypatch, tail: str) -> None:
    """``sqlite:///data/`` names a directory; the store was created as a file called ``data``."""
    monkeypatch.chdir(tmp_path)
    message = _refused(f"sqlite:///{tail}")
    assert "directory" in message and "flows.db" in message
    assert list(tmp_path.iterdir()) == []


def test_the_cli_refuses_it_as_a_usage_error_and_creates_nothing(tmp_path) -> None:
    import os
    import subprocess

    from tests.cli.conftest import fencepost_exe

    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    done = subprocess.run([fencepost_exe(), "--db", "sqlite:///data/", "init"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert done.stderr.startswith("Error: --db: ") and "directory" in done.stderr
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ option text that is not name=value
def test_a_question_mark_in_a_sqlite_path_is_refused_not_taken_as_a_truncated_path(tmp_path) -> None:
    """``sqlite:///.../we?ird.db``: the text after ``?`` was dropped (no ``=``), and the store was
    created at ``.../we``."""
    message = _refused(f"sqlite:///{tmp_path / 'x' / 'we'}?ird.db")
    assert "name=value" in message and "%3F" in message
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("after_a_valid_option", [False, True])
def test_option_text_without_an_equals_sign_is_refused_without_quoting_it(backend: str, tmp_path,
                                                                         after_a_valid_option: bool) -> None:
    valid = "synchronous=FULL&" if backend == "sqlite" else "connect_timeout=5&"
    message = _refused(_url(backend, tmp_path, f"{valid if after_a_valid_option else ''}{SECRET}"))
    assert "name=value" in message
    assert not (tmp_path / "not-yet").exists()


def test_a_question_mark_written_as_percent_3f_is_part_of_the_path(tmp_path) -> None:
    (tmp_path / "x").mkdir()
    store = fencepost.open(f"sqlite:///{tmp_path / 'x' / 'we'}%3Fird.db")
    store.close()
    assert (tmp_path / "x" / "we?ird.db").exists() and not (tmp_path / "x" / "we").exists()


# ------------------------------------------------------------------ pool_size
@pytest.mark.parametrize("value", ["0", "-1", "abc", "1.5", "1001", "99999999999999999999", "\u00b2"])
def test_a_bad_pool_size_is_refused_by_name_before_anything_is_created(backend: str, tmp_path, value: str) -> None:
    """A store's pool had a fixed 32 connections; ``pool_size`` sets it, and a value that is not a
    whole number of connections in range is refused naming the option, never the value or the
    URL's password."""
    if backend == "sqlite":
        url = _url("sqlite", tmp_path, f"pool_size={value}")
    else:
        base = require_postgres().split("?")[0].replace("postgres@", f"postgres:{SECRET}@", 1)
        url = f"{base}?schema=t_{uuid.uuid4().hex[:16]}&pool_size={value}"
    message = _refused(url)
    assert "pool_size" in message and "1..1000" in message
    assert value not in message.replace("1..1000", "")
    if backend == "sqlite":
        assert not (tmp_path / "not-yet").exists()
    else:
        from tests.conftest import store_exists
        assert not store_exists(url)


def test_pool_size_applies_to_both_backends() -> None:
    assert parse_url("sqlite:///x.db?pool_size=5")[1] == {"pool_size": "5"}
    parsed, options = parse_url("postgresql+psycopg://u@h/db?pool_size=64&schema=app")
    assert options == {"pool_size": "64", "schema": "app"} and "pool_size" not in parsed.query


def test_pool_size_bounds_transactions_in_progress(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pool_size=2``: two threads inside transactions hold both connections; a third call waits
    for one (``POOL_WAIT``, shortened here) and then fails, naming the limit and the option."""
    import threading
    import time

    from fencepost import _durable

    monkeypatch.setattr(_durable, "POOL_WAIT", 1.0, raising=False)
    store = fencepost.open(f"{db_url}{'&' if '?' in db_url else '?'}pool_size=2")
    try:
        store.runs.create("shared", "{}")
        release = threading.Event()
        inside = threading.Semaphore(0)
        results: list[object] = []

        def hold(conn: object) -> None:
            inside.release()
            release.wait(20)

        def holder() -> None:
            try:
                store.db.read(hold)
                results.append("ok")
            except Exception as exc:  # reported below
                results.append(repr(exc))

        holders = [threading.Thread(target=holder, daemon=True) for _ in range(2)]
        for t in holders:
            t.start()
        try:
            assert all(inside.acquire(timeout=20) for _ in holders)
            started = time.monotonic()
            with pytest.raises(fencepost.FencepostError) as caught:
                store.runs.get("shared")
            waited = time.monotonic() - started
        finally:
            release.set()
            for t in holders:
                t.join(20)
        assert results == ["ok", "ok"]
        err = caught.value
        assert err.code == "persistence_failed" and err.transient is True
        assert getattr(err, "db_code", None) == "pool_exhausted"
        assert "all 2 connections" in str(err) and "pool_size" in str(err)
        assert 0.9 <= waited < 10
        assert store.runs.get("shared").run_id == "shared"  # a connection is free again
    finally:
        store.close()


# ------------------------------------------------------------------ libpq's numeric options
LIBPQ_NUMBERS = ["connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
                 "tcp_user_timeout", "port"]


@pytest.mark.parametrize("name", LIBPQ_NUMBERS)
@pytest.mark.parametrize("value", ["abc", "1.5", "10s", "99999999999999999999", "\u00b2"])
def test_a_libpq_number_that_is_not_one_is_refused_by_name_before_connecting(name: str, value: str) -> None:
    """``connect_timeout=abc`` reached libpq and failed as ``open_failed`` after a connection
    attempt (``port=abc`` in the query as an unmapped SQLAlchemy ``ArgumentError``), where every
    other bad option is a ``ValueError`` naming it before anything connects or is created."""
    base = require_postgres().split("?")[0].replace("postgres@", f"postgres:{SECRET}@", 1)
    url = f"{base}?schema=t_{uuid.uuid4().hex[:16]}&{name}={value}"
    message = _refused(url)
    assert message.startswith(f"{name} must be") and value not in message, message
    from tests.conftest import store_exists
    assert not store_exists(url)


@pytest.mark.parametrize("query", ["connect_timeout=5", "connect_timeout=0", "connect_timeout=-1", "keepalives=0",
                                   "keepalives_idle=30&keepalives_interval=10&keepalives_count=3",
                                   "tcp_user_timeout=10000",
                                   # the word options (checked below)
                                   "sslmode=disable", "sslmode=prefer&gssencmode=disable",
                                   "channel_binding=prefer", "target_session_attrs=any",
                                   "target_session_attrs=read-write&load_balance_hosts=random",
                                   "sslnegotiation=postgres&sslcertmode=allow"])
def test_a_libpq_number_or_word_is_still_accepted(pg_url: str, query: str) -> None:
    store = fencepost.open(f"{pg_url}&{query}")
    try:
        store.db.write(lambda conn: None)
    finally:
        store.close()


# ------------------------------------------------------------------ libpq's word options
LIBPQ_CHOICES = {"sslmode": "require", "gssencmode": "prefer", "channel_binding": "disable",
                 "sslnegotiation": "postgres", "sslcertmode": "allow", "target_session_attrs": "read-write",
                 "load_balance_hosts": "random"}


@pytest.mark.parametrize("name", sorted(LIBPQ_CHOICES))
@pytest.mark.parametrize("value", ["bogus", "REQUIRE", "Read-Write", "disable ", SECRET])
def test_a_libpq_word_option_given_another_word_is_refused_by_name_before_connecting(name: str, value: str) -> None:
    """``sslmode=bogus`` reached libpq and failed as ``open_failed`` after a connection attempt
    (exit 1 from the CLI, as if the server had refused), where every other bad option is a
    ``ValueError`` naming it before anything connects or is created. libpq compares these words
    case-sensitively, so ``REQUIRE`` is refused too; the value is never repeated."""
    base = require_postgres().split("?")[0].replace("postgres@", f"postgres:{SECRET}@", 1)
    url = f"{base}?schema=t_{uuid.uuid4().hex[:16]}&{name}={value}"
    message = _refused(url)
    assert message.startswith(f"{name} must be one of ") and LIBPQ_CHOICES[name] in message, message
    assert value not in message, message
    from tests.conftest import store_exists
    assert not store_exists(url)


def test_the_cli_refuses_a_bad_sslmode_as_a_usage_error() -> None:
    """Seen by a new user: ``--db '...?sslmode=bogus'`` exited 1 with ``open_failed`` after trying to
    connect; it is a usage error (exit 2) naming the option and the words it takes."""
    import os
    import subprocess

    from tests.cli.conftest import fencepost_exe

    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    url = f"{require_postgres().split('?')[0]}?sslmode=bogus"
    done = subprocess.run([fencepost_exe(), "--db", url, "runs", "list"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert done.stderr == ("Error: --db: sslmode must be one of disable, allow, prefer, require, "
                           "verify-ca, verify-full\n"), done.stderr


def test_ports_in_the_query_are_checked_each() -> None:
    parse_url("postgresql+psycopg://u@/db?host=a,b&port=5432,5433")
    parse_url("postgresql+psycopg://u@/db?host=a&port=5432")
    for bad in ("0", "65536", "5432,x", "5432,", "-1"):
        with pytest.raises(ValueError, match=r"^port must be"):
            parse_url(f"postgresql+psycopg://u@/db?host=a,b&port={bad}")


# ------------------------------------------------------------------ a schema chosen through search_path
@pytest.mark.parametrize("options", ["-csearch_path%3Dreadmodel", "-c%20search_path%3Dreadmodel",
                                     "--search-path%3Dreadmodel", "-c%20SEARCH_PATH%3Dreadmodel,public"])
def test_a_search_path_in_the_options_is_refused_naming_schema_not_silently_replaced(pg_url: str, options: str) -> None:
    """``?options=-csearch_path=readmodel``, the usual way to pick a schema with libpq or
    SQLAlchemy, was passed to the driver and then overridden: fencepost sets the search path to
    its own schema (``fencepost`` by default) on every connection, so ``fencepost init`` made the
    store in schema ``fencepost`` and a read command said "no schema fencepost", with nothing
    saying why the URL's schema was not used. Refused as a URL option error (``ValueError``, a
    usage error on the command line), naming ``schema=`` and never the value, before anything
    is created. PostgreSQL only: a SQLite URL has no search path."""
    base, _, _query = pg_url.partition("?")
    for url in (f"{base}?options={options}", f"{pg_url}&options={options}"):
        with pytest.raises(ValueError) as caught:
            parse_url(url)
        message = str(caught.value)
        assert "search_path" in message and "?schema=" in message and "readmodel" not in message, message
    with pytest.raises(ValueError):  # the fixture's schema: a store made there by mistake is dropped
        fencepost.open(f"{pg_url}&options={options}")
    # Other settings in options stay the driver's business.
    parsed, _ = parse_url(f"{base}?options=-cstatement_timeout%3D5000")
    assert parsed.query["options"] == "-cstatement_timeout=5000"
    with fencepost.open(f"{pg_url}&options=-cstatement_timeout%3D5000") as store:
        with store.db.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT current_setting('statement_timeout')").scalar() == "5s"


# The libpq ``options`` value is split as the server splits it (whitespace; a backslash takes the
# next character literally) and read as the server reads its switches (``-c NAME=VALUE``,
# ``-cNAME=VALUE``, ``--NAME=VALUE``, no-argument switches grouped before them, ``-`` and ``_``
# alike in NAME, NAME case-insensitive).
SEARCH_PATH_SET = {
    "attached": "-csearch_path=app",
    "separate": "-c search_path=app",
    "long-dashes": "--search-path=app",
    "long-underscore": "--search_path=app",
    "upper-with-dash": "-c SEARCH-PATH=app",
    "mixed-case": "-c Search_Path=app",
    "grouped-after-flag": "-ecsearch_path=app",
    "after-a-flag": "-e -c search_path=app",
    "tab-separated": "-c\tsearch_path=app",
    "after-another-setting": "-c statement_timeout=5000 -c search_path=app",
    "escaped-value": "-c search_path=a\\ b",
    "escaped-letter-in-name": "-c sea\\rch_path=app",
    "no-value": "-c search_path",
    "leading-space": "  --search-path=app  ",
}
SEARCH_PATH_NOT_SET = {
    "in-a-value": "-c application_name=search-path-svc",
    "value-is-the-word": "-c application_name=search_path",
    "custom-setting": "-c myapp.search_path=x",
    "longer-name": "--search-path-hint=x",
    "escaped-space-in-name": "-c\\ search_path=app",  # NAME " search_path": the server refuses it
    "argument-of-another-switch": "-S search_path=app",  # work_mem's value, not a setting's name
    "after-end-of-switches": "-- -csearch_path=app",
}


@pytest.mark.parametrize("options", list(SEARCH_PATH_SET.values()), ids=list(SEARCH_PATH_SET))
def test_every_form_of_a_search_path_switch_in_the_options_is_refused(options: str) -> None:
    """Each way the server's switch parser reads as setting ``search_path`` is refused by name,
    never quoting the value. PostgreSQL only: a SQLite URL has no ``options``."""
    from urllib.parse import quote

    base = require_postgres().split("?")[0]
    with pytest.raises(ValueError) as caught:
        parse_url(f"{base}?options={quote(options, safe='')}")
    message = str(caught.value)
    assert "search_path" in message and "?schema=" in message and "app" not in message, message


@pytest.mark.parametrize("options", list(SEARCH_PATH_NOT_SET.values()), ids=list(SEARCH_PATH_NOT_SET))
def test_options_naming_search_path_only_in_a_value_are_the_drivers(options: str) -> None:
    """``?options=-c application_name=search-path-svc`` was refused as setting ``search_path``:
    the check looked for the words anywhere in the value. Only a switch whose setting NAME is
    ``search_path`` is refused now; the rest goes to the driver unchanged. PostgreSQL only."""
    from urllib.parse import quote

    base = require_postgres().split("?")[0]
    parsed, _ = parse_url(f"{base}?options={quote(options, safe='')}")
    assert parsed.query["options"] == options


def test_options_mentioning_search_path_in_values_reach_the_server(pg_url: str) -> None:
    """The false refusal's case end to end: the store opens, and a setting whose value says
    search-path reaches the session. PostgreSQL only."""
    fencepost.open(f"{pg_url}&options=-c%20application_name%3Dsearch-path-svc").close()
    with fencepost.open(f"{pg_url}&options=-c%20myapp.label%3Dsearch-path-svc") as store:
        with store.db.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT current_setting('myapp.label')").scalar() == "search-path-svc"


# ------------------------------------------------------------------ a driver option given twice
DRIVER_TWICE = {"sslmode": "disable&sslmode=require", "application_name": "a&application_name=b",
                "connect_timeout": "5&connect_timeout=6", "hostaddr": "127.0.0.1&hostaddr=127.0.0.1",
                "options": "-c%20a.x%3D1&options=-c%20a.y%3D2", "dbname": "test&dbname=test",
                "password": f"{SECRET}&password={SECRET}x", "sslpassword": f"x&sslpassword={SECRET}"}


@pytest.mark.parametrize("key", list(DRIVER_TWICE))
def test_a_driver_option_given_twice_is_refused_by_name_before_connecting(key: str) -> None:
    """``?sslmode=disable&sslmode=require`` reached the driver as a pair, which it read as one
    value (``"('disable', 'require')"``): ``open_failed`` at best, and a session silently named
    ``('a', 'b')`` for ``application_name``. PostgreSQL only: these are libpq's keywords (a SQLite
    URL refuses any option but fencepost's own, whose repetition is refused on both backends)."""
    base = require_postgres().split("?")[0]
    assert _refused(f"{base}?{key}={DRIVER_TWICE[key]}") == f"{key} is given more than once"


def _hosts_url(pg_url: str, query: str, authority: str = "") -> str:
    """``pg_url`` with ``authority`` for its host and port, ``query`` added to its options (in
    both, ``H`` and ``P`` stand for the test server's host and port)."""
    import re

    from sqlalchemy.engine import make_url

    url = make_url(pg_url)
    host, port = url.host or "127.0.0.1", str(url.port or 5432)
    given = authority.replace("H", host).replace("P", port)
    bare = re.sub(r"@[^/]*/", lambda _: f"@{given}/", url.render_as_string(hide_password=False), count=1)
    return f"{bare}&{query.replace('H', host).replace('P', port)}"


@pytest.mark.parametrize("query", ["host=H&host=H", "host=H:P&host=H:P", "host=H:P&host=H",
                                   "host=H,H&port=P&port=P"])
def test_the_driver_options_given_several_times_that_libpq_takes_still_reach_the_server(pg_url: str,
                                                                                       query: str) -> None:
    """The keywords SQLAlchemy hands libpq as its lists, and no others: several ``host`` options
    (joined with commas, a ``:port`` in each taken out), and several ``port`` options beside one
    ``host`` option naming as many hosts. PostgreSQL only: libpq's keywords."""
    fencepost.open(_hosts_url(pg_url, query)).close()


# ------------------------------------------------------------------ hosts and ports, every way given
# (URL authority, query) -> what the refusal says. Each of these reached SQLAlchemy's own multi-line
# ArgumentError, or libpq a host "name:port" it cannot resolve (a transient cannot_connect waited on
# for ever), or silently lost the authority's port (the store opened on the default port).
HOSTS_PORTS_REFUSED = {
    "one host:port and a port": ("", "host=h1:5432&port=5432", "give the port one way only"),
    "one host: and a port": ("", "host=h1:&port=5432", "give the port one way only"),
    "host:ports and a port": ("", "host=h1:5432&host=h2:5433&port=5432", "give the ports one way only"),
    "hosts and a port": ("", "host=h1&host=h2&port=5432", "give the ports one way only"),
    "hosts and ports": ("", "host=h1&host=h2&port=5432,5433", "give the ports one way only"),
    "hosts and port twice": ("", "host=h1&host=h2&port=5432&port=5433", "give the ports one way only"),
    "host list and one port": ("", "host=h1,h2&port=5432", "2 hosts and 1 port"),
    "host and two ports": ("", "host=h1&port=5432,5433", "1 host and 2 ports"),
    "host and port twice": ("", "host=h1&port=5432&port=5433", "1 host and 2 ports"),
    "no host and two ports": ("h1", "port=5432,5433", "1 host and 2 ports"),
    "no host and port twice": ("h1", "port=5432&port=5433", "1 host and 2 ports"),
    "port twice with lists": ("", "host=h1,h2,h3&port=5432,5433&port=5434", "one port each"),
    "host list with ports": ("", "host=h1:5432,h2:5433", "in the port option"),
    "host list with one port": ("", "host=h1:5432,h2&port=5432,5433", "in the port option"),
    "a list among hosts": ("", "host=h1,h2&host=h3", "one host each"),
    "authority port, host list": (":5433", "host=h1,h2", "the URL's host:port"),
    "authority port, hosts": (":5433", "host=h1&host=h2", "the URL's host:port"),
    "authority port, a host without": (":5433", "host=h1:5432&host=h2", "the URL's host:port"),
    # A name SQLAlchemy does not split at its colon (an underscore, as in a container's name):
    # libpq was handed the host name "my_db:5432" (cannot_connect, transient, waited on for ever).
    "one host_name:port": ("", "host=my_db:5432", "give the port in the port option"),
    "one host_name:port and a port": ("", "host=my_db:5432&port=5432", "give the port one way only"),
    "host list with a host_name:port": ("", "host=my_db:5432,h2&port=5432,5433", "in the port option"),
}


@pytest.mark.parametrize("case", list(HOSTS_PORTS_REFUSED))
def test_hosts_and_ports_given_in_ways_that_cannot_work_together_are_refused_clearly(case: str) -> None:
    """``?host=h1:5432&host=h2:5433&port=5432`` ended in SQLAlchemy's multi-line ``ArgumentError``;
    ``?host=h1:5432&port=5432`` handed libpq the host name ``h1:5432``. Each such URL is refused
    before anything connects, one line saying how to give the ports. PostgreSQL only: hosts and
    ports are PostgreSQL URL forms (a SQLite URL has no host)."""
    authority, query, says = HOSTS_PORTS_REFUSED[case]
    with pytest.raises(ValueError) as info:
        parse_url(f"postgresql+psycopg://u@{authority}/db?{query}")
    assert says in str(info.value) and "\n" not in str(info.value)


HOSTS_PORTS_ACCEPTED = {
    "host and port": ("", "host=H&port=P"), "host:port": ("", "host=H:P"), "host:": ("", "host=H:"),
    "host list and ports": ("", "host=H,H&port=P,P"), "host list": ("", "host=H,H"),
    "host list, port twice": ("", "host=H,H&port=P&port=P"), "hosts": ("", "host=H&host=H"),
    "host:ports": ("", "host=H:P&host=H:P"), "host:port and host": ("", "host=H:P&host=H"),
    "authority and port": ("H:P", "port=P"), "authority port, host": (":P", "host=H"),
    "authority host, host": ("nowhere.invalid", "host=H&port=P"),
    "authority port, host:ports": (":1", "host=H:P&host=H:P"), "authority port, ports": (":1", "host=H,H&port=P,P"),
}


@pytest.mark.parametrize("case", list(HOSTS_PORTS_ACCEPTED))
def test_hosts_and_ports_given_one_way_reach_the_server(pg_url: str, case: str) -> None:
    """Every way of giving hosts and ports that SQLAlchemy and libpq read as meant still opens the
    store; a query's host or port replaces the authority's, as libpq's own URLs have it.
    PostgreSQL only: hosts and ports are PostgreSQL URL forms."""
    authority, query = HOSTS_PORTS_ACCEPTED[case]
    fencepost.open(_hosts_url(pg_url, query, authority)).close()


@pytest.mark.parametrize("query", ["sslmode=disable&sslmode=require", "host=h1:5432&host=h2:5433&port=5432"])
def test_the_cli_refuses_hosts_ports_and_driver_options_given_twice_as_usage_errors(query: str) -> None:
    """PostgreSQL only: driver options and hosts are PostgreSQL URL forms."""
    import os
    import subprocess

    from tests.cli.conftest import fencepost_exe

    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    url = f"{require_postgres().split('?')[0]}?{query}"
    done = subprocess.run([fencepost_exe(), "--db", url, "runs", "list"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert done.stderr.startswith("Error: --db: ") and done.stderr.count("\n") == 1

