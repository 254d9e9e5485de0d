"""The part of a URL between ``//`` and the path: a SQLite URL has none, a PostgreSQL port is 1..65535.

Found by a new-user walkthrough.

- ``sqlite://flows.db`` (two slashes, the common slip for ``sqlite:///flows.db``) was refused as "an
  in-memory SQLite URL cannot be shared; use fencepost.testing": the parser reads ``flows.db`` as a
  host and no path, and the user, who asked for a file, was told about memory and test helpers.
  ``sqlite://localhost/flows.db`` escaped as SQLAlchemy's ``ArgumentError``, several lines long, an
  unexpected error (exit 1) on the command line. Both are now a ``ValueError`` naming the two
  SQLite forms, never the value (it may hold a password), with nothing created. SQLite only: a
  PostgreSQL URL's host is its server.
- A PostgreSQL port out of range in the URL's authority (``@host:99999/db``, ``:0``, ``:-1``) went
  to the driver: ``cannot_connect`` "no server accepts connections there" (or "its host name could
  not be resolved" for ``-1``; ``:0`` silently meant the default port), so ``fencepost worker`` and
  ``fencepost ui`` waited for the server forever, while the same port given as ``?port=99999`` was
  refused at once. Now both are refused alike, before anything connects. PostgreSQL only: a SQLite
  URL has no port (refused above).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

import fencepost
from tests.cli.conftest import Result, assert_one_line_error, fencepost_exe
from tests.conftest import drop_schema, require_postgres, store_exists

SECRET = "s3cret-Q-0123456789"
TWO_SLASHES = ["sqlite://flows.db", "sqlite://localhost/flows.db", f"sqlite://u:{SECRET}@localhost/flows.db",
               "sqlite://localhost:99/flows.db", "sqlite://data/flows.db"]


def _env() -> dict[str, str]:
    """This process's environment (``PYTHONPATH`` names the code under test) without ``FENCEPOST_DB``."""
    return {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}


def _sqlite_refused(url: str, readonly: bool = False) -> str:
    with pytest.raises(ValueError) as info:
        fencepost.open(url, readonly=readonly)
    text = f"{info.value!s} {info.value.__cause__!r} {info.value.__context__!r}"
    assert SECRET not in text, text
    return str(info.value)


@pytest.mark.parametrize("readonly", [False, True])
@pytest.mark.parametrize("url", TWO_SLASHES)
def test_a_sqlite_url_with_two_slashes_names_the_file_forms(url: str, readonly: bool, tmp_path: Path,
                                                            monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    message = _sqlite_refused(url, readonly)
    assert "\n" not in message, message
    assert "in-memory" not in message and "fencepost.testing" not in message, message
    assert "sqlite:///relative/path.db" in message and "sqlite:////absolute/path.db" in message, message
    assert "flows.db" not in message and "localhost" not in message, message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_an_in_memory_sqlite_url_still_says_so(url: str) -> None:
    assert "in-memory" in _sqlite_refused(url)


def test_the_cli_refuses_a_two_slash_sqlite_url_as_a_usage_error(tmp_path: Path) -> None:
    for url in TWO_SLASHES:
        for command in (["init"], ["runs", "list"], ["projection", "run", "--target", url]):
            args = command if command[0] == "projection" else ["--db", url, *command]
            env = _env()
            if command[0] == "projection":
                env["FENCEPOST_DB"] = f"sqlite:///{tmp_path / 'absent.db'}"
            proc = subprocess.run([fencepost_exe(), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=60)
            result = Result(proc)
            assert_one_line_error(result)
            assert result.code == 2, (args, result)
            assert "sqlite:///relative/path.db" in result.err and SECRET not in result.err, result
            assert list(tmp_path.iterdir()) == [], (args, list(tmp_path.iterdir()))


BAD_PORTS = ["0", "65536", "99999", "-1"]


def _pg_with_port(port: str) -> tuple[str, str]:
    base = require_postgres().split("?")[0].replace("postgres@", f"postgres:{SECRET}@", 1)
    scheme, _, rest = base.partition("://")
    auth, _, path = rest.partition("/")
    credentials, _, hostport = auth.rpartition("@")
    host = hostport.rsplit(":", 1)[0] if not hostport.endswith("]") else hostport
    schema = f"t_{uuid.uuid4().hex[:16]}"
    return f"{scheme}://{credentials}@{host}:{port}/{path}?schema={schema}", schema


@pytest.mark.parametrize("readonly", [False, True])
@pytest.mark.parametrize("port", BAD_PORTS)
def test_a_postgresql_port_out_of_range_in_the_url_is_refused_by_name(port: str, readonly: bool) -> None:
    url, schema = _pg_with_port(port)
    try:
        with pytest.raises(ValueError) as info:
            fencepost.open(url, readonly=readonly)
        text = f"{info.value!s} {info.value.__cause__!r} {info.value.__context__!r}"
        assert str(info.value).startswith("port must be an integer in 1..65535"), text
        assert SECRET not in text and port not in str(info.value).replace("1..65535", ""), text
        assert not store_exists(url)
    finally:
        drop_schema(require_postgres(), schema)


def test_a_postgresql_port_in_range_in_the_url_still_opens() -> None:
    from sqlalchemy.engine import make_url

    url, schema = _pg_with_port(str(make_url(require_postgres()).port or 5432))
    try:
        with fencepost.open(url) as store:
            store.db.write(lambda conn: None)
    finally:
        drop_schema(require_postgres(), schema)


@pytest.mark.parametrize("command", [["runs", "list"], ["worker", "-n", "1", "--task", "json:dumps", "--until-idle"],
                                     ["ui", "--port", "0"]])
def test_the_cli_refuses_an_out_of_range_port_at_once_instead_of_waiting(command: list[str], tmp_path: Path) -> None:
    """The worker and the console wait for a server that does not answer (``cannot_connect``): a
    port no server can have made them wait forever. The timeout bounds the wait that was."""
    url, schema = _pg_with_port("99999")
    try:
        proc = subprocess.run([fencepost_exe(), "--db", url, *command], cwd=tmp_path, capture_output=True, text=True,
                              timeout=30, env=_env())
        assert proc.returncode == 2, (proc.returncode, proc.stderr)
        assert proc.stderr.startswith("Error: --db: port must be an integer in 1..65535"), proc.stderr
        assert SECRET not in proc.stderr and "Traceback" not in proc.stderr
        assert not store_exists(url)
    finally:
        drop_schema(require_postgres(), schema)



def _pg_with_host_option(*hosts: str) -> tuple[str, str]:
    """The test server's URL with its host and port moved into ``?host=`` options (SQLAlchemy's
    multihost forms: ``host=h:p`` once, or ``host=h1:p1&host=h2:p2``)."""
    base = require_postgres().split("?")[0].replace("postgres@", f"postgres:{SECRET}@", 1)
    scheme, _, rest = base.partition("://")
    auth, _, path = rest.partition("/")
    credentials = auth.rpartition("@")[0]
    schema = f"t_{uuid.uuid4().hex[:16]}"
    given = "&".join(f"host={h}" for h in hosts)
    return f"{scheme}://{credentials}@/{path}?{given}&schema={schema}", schema


def _server_host_port() -> tuple[str, int]:
    from sqlalchemy.engine import make_url

    parsed = make_url(require_postgres())
    return str(parsed.host or "127.0.0.1"), int(parsed.port or 5432)


@pytest.mark.parametrize("readonly", [False, True])
@pytest.mark.parametrize("ports", [("99999",), ("0",), ("65536",), (None, "99999"), ("abc", None)])
def test_a_port_in_the_host_option_is_checked_as_the_urls_own(ports: tuple[str | None, ...], readonly: bool) -> None:
    """PostgreSQL only (a SQLite URL takes no host). The walkthrough's fix refused a port out of range
    in ``@host:port`` and in ``?port=``, but not in SQLAlchemy's other spelling, ``?host=h:port``: that
    was still a transient ``cannot_connect`` ("no server accepts connections there") that the worker
    and the console wait on forever (``:0`` silently meant the default port), and a port that is no
    number among several hosts escaped as SQLAlchemy's ``ArgumentError`` quoting the ports. Now each
    is the same ``ValueError`` by name, before anything connects. ``None``: the test server's port."""
    host, good = _server_host_port()
    url, schema = _pg_with_host_option(*(f"{host}:{good if p is None else p}" for p in ports))
    try:
        with pytest.raises(ValueError) as info:
            fencepost.open(url, readonly=readonly)
        text = f"{info.value!s} {info.value.__cause__!r} {info.value.__context__!r}"
        assert str(info.value).startswith("port must be an integer in 1..65535"), text
        assert "host=" in str(info.value), text  # names where the port was given
        bad = next(p for p in ports if p is not None)
        assert SECRET not in text and bad not in str(info.value).replace("1..65535", ""), text
        assert not store_exists(url)
    finally:
        drop_schema(require_postgres(), schema)


@pytest.mark.parametrize("several", [False, True])
def test_a_port_in_range_in_the_host_option_still_opens(several: bool) -> None:
    host, good = _server_host_port()
    url, schema = _pg_with_host_option(*[f"{host}:{good}"] * (2 if several else 1))
    try:
        with fencepost.open(url) as store:
            store.db.write(lambda conn: None)
    finally:
        drop_schema(require_postgres(), schema)


def test_the_cli_refuses_a_host_options_port_out_of_range_as_a_usage_error(tmp_path: Path) -> None:
    host, _ = _server_host_port()
    url, schema = _pg_with_host_option(f"{host}:99999")
    try:
        proc = subprocess.run([fencepost_exe(), "--db", url, "runs", "list"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=30, env=_env())
        assert proc.returncode == 2, (proc.returncode, proc.stderr)
        assert proc.stderr.startswith("Error: --db: port must be an integer in 1..65535"), proc.stderr
        assert SECRET not in proc.stderr and "Traceback" not in proc.stderr
    finally:
        drop_schema(require_postgres(), schema)


@pytest.mark.parametrize("readonly", [False, True])
@pytest.mark.parametrize("hosts", [("::1", "{h}:{p}"), ("[::1]:{p}", "{h}:{p}"), ("{h}:{p}", "::1:{p}"), ("[::1]:{p}",),
                                   ("[::1]",)], ids=["bare", "bracketed", "bare-second", "one-bracketed", "brackets"])
def test_an_ipv6_address_in_a_host_option_is_refused_instead_of_misread(hosts: tuple[str, ...], readonly: bool) -> None:
    """PostgreSQL only (a SQLite URL takes no host). SQLAlchemy splits each of several ``?host=``
    options at every colon, so an IPv6 address among them was cut up: ``host=::1&host=h:p`` handed
    libpq an empty first host, and the store (and its follower's LISTEN session) silently connected
    through the default Unix socket instead of ``::1``; a bracketed address became a host name no
    resolver knows, a transient ``cannot_connect`` the worker and console wait on forever. Now each
    is a ``ValueError`` naming the form that works (``host=H1,H2&port=P1,P2``), before anything connects."""
    host, good = _server_host_port()
    url, schema = _pg_with_host_option(*(h.format(h=host, p=good) for h in hosts))
    try:
        with pytest.raises(ValueError) as info:
            fencepost.open(url, readonly=readonly)
        text = f"{info.value!s} {info.value.__cause__!r} {info.value.__context__!r}"
        assert str(info.value).startswith("an IPv6 address in a host option"), text
        assert "host=H1,H2&port=P1,P2" in str(info.value) and "::1" not in str(info.value), text
        assert SECRET not in text
        assert not store_exists(url)
    finally:
        drop_schema(require_postgres(), schema)


def test_an_ipv6_address_among_hosts_given_as_one_option_still_opens() -> None:
    """The form the refusal names: several hosts in one option, their ports in ``port`` (the
    reachable server first: this test server may not listen on ``::1``)."""
    host, good = _server_host_port()
    url, schema = _pg_with_host_option(f"{host},::1")
    url = url.replace("&schema=", f"&port={good},{good}&schema=")
    try:
        with fencepost.open(url) as store:
            store.db.write(lambda conn: None)
            assert store.db.read(lambda conn: conn.exec_driver_sql("SELECT inet_server_addr()").scalar()) is not None
    finally:
        drop_schema(require_postgres(), schema)
