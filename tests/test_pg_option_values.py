"""A PostgreSQL URL whose libpq option VALUES make the connection fail is reported honestly.

libpq reports these failures (an authentication method ``require_auth`` does not know, SSL required from a server
without it, a session attribute the server lacks, a server setting it does not know) without a
SQLSTATE, like a refused role. The open must not blame credentials or rights the server accepts:
the code is ``open_failed`` and the diagnosis names the option names the failure depends on,
never their values nor the password.
"""

from __future__ import annotations

import os
import subprocess

import psycopg
import pytest
from sqlalchemy import make_url

import fencepost
from fencepost import OpenError
from fencepost._durable import Database
from tests.cli.conftest import Result, assert_one_line_error, fencepost_exe
from tests.conftest import require_postgres

SECRET = "secret-pw-Opt-91"


def _url(query: str, **parts: str) -> str:
    """The test server's URL with a password (trust auth ignores it), ``parts`` set, and ``query``."""
    base = make_url(require_postgres().split("?")[0]).set(password=SECRET, **parts)
    return f"{base.render_as_string(hide_password=False)}?{query}"


def _open_fails(url: str, *, readonly: bool = False) -> OpenError:
    with pytest.raises(OpenError) as err:
        fencepost.open(url, readonly=readonly).close()
    exc = err.value
    assert exc.method == "open" and exc.__cause__ is None
    assert SECRET not in f"{exc} {exc!r}"
    return exc


def _server_has_ssl() -> bool:
    url = make_url(require_postgres().split("?")[0])
    with psycopg.connect(host=url.host, port=url.port or 5432, user=url.username, dbname=url.database,
                         connect_timeout=5) as conn:
        return conn.execute("SHOW ssl").fetchone()[0] == "on"


# Each query makes libpq fail although the server accepts the same URL without it. (A numeric
# option that is no number, ``connect_timeout=abc``, or a word option given another word,
# ``sslmode=bogus``, never gets this far: tests/test_url_options.py.)
BAD_VALUES = {
    "require_auth-bogus": ("require_auth=bogus", ["require_auth"]),
    "target_session_attrs-standby": ("target_session_attrs=standby", ["target_session_attrs"]),
    "options-unknown-setting": ("options=-c%20fencepost_no_such_setting%3D1", ["options"]),
}


@pytest.mark.parametrize("readonly", [False, True])
@pytest.mark.parametrize("case", list(BAD_VALUES), ids=list(BAD_VALUES))
def test_a_bad_option_value_is_open_failed_not_a_credentials_problem(case: str, readonly: bool) -> None:
    query, _names = BAD_VALUES[case]
    exc = _open_fails(_url(query), readonly=readonly)
    assert (exc.code, exc.db_code) == ("open_failed", None), str(exc)


@pytest.mark.parametrize("readonly", [False, True])
@pytest.mark.parametrize("case", list(BAD_VALUES), ids=list(BAD_VALUES))
def test_a_bad_option_value_is_not_transient(case: str, readonly: bool) -> None:
    """Waiting never cures a URL option the driver or server refuses: ``transient`` is False, so a
    caller that retries transient failures (a worker host, a follow loop) stops at once instead of
    waiting for ever. Defect: libpq reports these without a SQLSTATE, as a lost connection, and the
    open took that for a transient failure. PostgreSQL only: a SQLite URL's options are all
    fencepost's own, checked (``ValueError``) before anything connects."""
    query, _names = BAD_VALUES[case]
    exc = _open_fails(_url(query), readonly=readonly)
    assert (exc.code, exc.transient) == ("open_failed", False), str(exc)


@pytest.mark.parametrize("query", ["", "require_auth=bogus"])
def test_nothing_listening_stays_cannot_connect_and_transient(query: str) -> None:
    """The transient kind stays transient, a bad option beside it or not: nothing listens on port 1
    (the server may come up). The other transient refusals (no free slot, starting up or shutting
    down) are proven against a real server in tests/faults/test_open_server_refusals.py."""
    exc = _open_fails(_url(query, port="1"))
    assert (exc.code, exc.transient) == ("cannot_connect", True), str(exc)


def test_ssl_required_from_a_server_without_ssl_is_open_failed() -> None:
    if _server_has_ssl():
        pytest.skip("the test server supports SSL")
    exc = _open_fails(_url("sslmode=require"))
    assert (exc.code, exc.db_code) == ("open_failed", None), str(exc)


def test_the_diagnosis_names_the_options_the_failure_depends_on_never_their_values() -> None:
    url = _url("application_name=innocent-app&require_auth=bogus&target_session_attrs=standby&keepalives=1")
    db = Database(url)
    try:
        code, note, _ = db.backend.explain_connect(db.engine)
    finally:
        db.dispose()
    assert code == "open_failed"
    assert note is not None and "require_auth" in note and "target_session_attrs" in note
    assert "application_name" not in note and "keepalives" not in note  # they do not matter
    for value in ("bogus", "standby", "innocent-app", SECRET):
        assert value not in note


@pytest.mark.parametrize("case", list(BAD_VALUES), ids=list(BAD_VALUES))
def test_each_diagnosis_names_its_option(case: str) -> None:
    query, names = BAD_VALUES[case]
    db = Database(_url(query))
    try:
        code, note, _ = db.backend.explain_connect(db.engine)
    finally:
        db.dispose()
    assert code == "open_failed" and note is not None
    assert all(name in note for name in names), note


def test_an_unknown_role_is_still_auth_failed_with_a_bad_option_beside_it() -> None:
    # Credentials are a problem here: the server refuses the role with or without the option.
    exc = _open_fails(_url("require_auth=bogus", username="fencepost_no_such_role"))
    assert exc.code == "auth_failed"


def test_good_options_do_not_hide_a_missing_database_or_an_unknown_role() -> None:
    query = "sslmode=disable&connect_timeout=5&application_name=probe"
    exc = _open_fails(_url(query, database="fencepost_no_such_db"))
    assert exc.code == "database_missing" and "fencepost_no_such_db" in str(exc)
    exc = _open_fails(_url(query, username="fencepost_no_such_role"))
    assert exc.code == "auth_failed"


def test_a_refused_port_with_a_bad_option_is_still_cannot_connect() -> None:
    exc = _open_fails(_url("require_auth=bogus", port="1"))
    assert exc.code == "cannot_connect"


@pytest.mark.parametrize("query", ["require_auth=bogus", "target_session_attrs=standby"])
def test_the_cli_reports_a_bad_option_value_on_one_line(query: str) -> None:
    url = _url(query)
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    proc = subprocess.run([fencepost_exe(), "--db", url, "runs", "list"], capture_output=True, text=True,
                          env={**env, "COLUMNS": "200"}, timeout=60)
    result = Result(proc)
    assert_one_line_error(result)
    assert result.code == 1, result
    assert "open_failed" in result.err, result
    assert "auth_failed" not in result.err and "permission_denied" not in result.err
    option = query.split("=", 1)[0]
    assert f"fails with the URL option {option} and succeeds without it" in result.err, result
    assert SECRET not in result.err and SECRET not in result.out
