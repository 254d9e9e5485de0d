"""A PostgreSQL server that refuses a connection says why, by the code it sent, not as a refused login.

libpq reports a refused connection without its SQLSTATE, so ``fencepost.open`` asks the server
itself (the protocol's startup exchange) when the first connection fails. The faults are real: a
private server started with ``max_connections`` so small that the test holds every slot, and a host
name under ``.invalid``, which never resolves (no network needed). PostgreSQL only: SQLite has no
server, no connection slots and no host name.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import make_url

import fencepost
from fencepost import OpenError, RunStoreError
from tests.changefeed.test_follow_server_restart import PrivateServer, started_private
from tests.cli.conftest import assert_one_line_error
from tests.faults.conftest import assert_value_free

pytestmark = pytest.mark.slow
SECRET = "pw-Secret-77"
MAX_CONNECTIONS = 4  # one of them kept for superusers: a plain role is refused once three are taken


class SmallServer(PrivateServer):
    """A private server with ``MAX_CONNECTIONS`` slots, one reserved for superusers."""

    def start(self) -> None:
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                f"-c max_connections={MAX_CONNECTIONS} -c superuser_reserved_connections=1")
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "log"), "-w", "start")


@pytest.fixture
def small_server() -> Iterator[SmallServer]:
    with started_private(SmallServer, "fencepost-pg-slots", "the connection-slot tests") as server:
        with psycopg.connect(_conninfo(server), autocommit=True) as conn:
            conn.execute("CREATE ROLE app LOGIN")
            conn.execute("GRANT CREATE ON DATABASE postgres TO app")
        yield server


def _conninfo(server: SmallServer) -> str:
    return f"host=127.0.0.1 port={server.port} user=postgres dbname=postgres"


def _hold(server: SmallServer, n: int) -> list[psycopg.Connection]:
    """Take ``n`` connection slots as the superuser (released by closing them)."""
    return [psycopg.connect(_conninfo(server)) for _ in range(n)]


def _url(server: SmallServer, user: str = "postgres") -> str:
    return make_url(server.url).set(username=user, password=SECRET).render_as_string(hide_password=False)


def _open_fails(url: str) -> OpenError:
    with pytest.raises(OpenError) as err:
        fencepost.open(url).close()
    exc = err.value
    assert exc.__cause__ is None
    assert_value_free(exc)
    assert SECRET not in str(exc)
    return exc


def _release(held: list[psycopg.Connection]) -> None:
    for conn in held:
        conn.close()


def test_a_server_with_no_free_slot_is_cannot_connect_53300_and_transient(small_server: SmallServer) -> None:
    """Every slot taken: refused before any login is checked. Not ``auth_failed``: waiting cures it."""
    held = _hold(small_server, MAX_CONNECTIONS)
    try:
        for user in ("postgres", "app"):
            exc = _open_fails(_url(small_server, user))
            assert (exc.code, exc.db_code, exc.transient) == ("cannot_connect", "53300", True), exc
            assert "no free connection slot" in str(exc) and "retry" in str(exc), exc
    finally:
        _release(held)
    # The same URL opens once a slot is free (a closed session's slot is free once its server
    # process has exited, a moment after the close).
    from tests.conftest import eventually
    assert eventually(lambda: _connects_as(small_server, "app"), timeout=10)
    fencepost.open(_url(small_server, "app")).close()


def _connects_as(server: SmallServer, user: str) -> bool:
    try:
        psycopg.connect(f"host=127.0.0.1 port={server.port} user={user} dbname=postgres", connect_timeout=5).close()
    except psycopg.OperationalError:
        return False
    return True


def test_a_slot_freed_while_the_refusal_is_diagnosed_lets_the_open_through(small_server: SmallServer,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen in a CI run: every slot was taken when the open first connected, and a session ended
    before the diagnosis asked the server why. The diagnosis then found the credentials let into
    a maintenance database and the named database there, and concluded ``permission_denied``
    (not transient: a worker host gives up) for a database the role may use. Now the open connects
    again after such a diagnosis and goes on when it can. The race is made certain: the slots are
    released just before the diagnosis runs, and the diagnosis waits until a plain role gets in."""
    from fencepost._dialects import PostgresBackend
    from tests.conftest import eventually

    fencepost.open(_url(small_server, "app")).close()  # the store exists: only connecting is at stake
    held = _hold(small_server, MAX_CONNECTIONS)
    diagnosed = []
    explain = PostgresBackend.explain_connect

    def freed_first(self: PostgresBackend, engine: Any) -> Any:
        _release(held)
        assert eventually(lambda: _connects_as(small_server, "app"), timeout=10)
        diagnosed.append(True)
        return explain(self, engine)

    monkeypatch.setattr(PostgresBackend, "explain_connect", freed_first)
    try:
        store = fencepost.open(_url(small_server, "app"))
    finally:
        _release(held)
    try:
        assert diagnosed, "the open's first connection was not refused: nothing was diagnosed"
        store.runs.create("after-the-race", "{}")
        assert store.runs.get("after-the-race").status == "pending"
    finally:
        store.close()


def test_slots_taken_again_while_the_refusal_is_diagnosed_stay_cannot_connect(small_server: SmallServer,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The other way round: the server had a free slot when the diagnosis first asked it, and none
    by the time the diagnosis tried the credentials, which then got in nowhere. That read as
    ``auth_failed`` (not transient) for a role that may log in; the diagnosis now asks the server
    once more before blaming the credentials. Made certain: the slots stay taken, and the first
    startup probe is answered as if one were free."""
    import fencepost._dialects as dialects

    fencepost.open(_url(small_server, "app")).close()
    probe, probes = dialects._pg_refusal, []

    def free_at_first(kwargs: Any) -> Any:
        probes.append(True)
        return None if len(probes) == 1 else probe(kwargs)

    monkeypatch.setattr(dialects, "_pg_refusal", free_at_first)
    held = _hold(small_server, MAX_CONNECTIONS)
    try:
        exc = _open_fails(_url(small_server, "app"))
    finally:
        _release(held)
    assert (exc.code, exc.db_code, exc.transient) == ("cannot_connect", "53300", True), exc
    assert len(probes) >= 2, probes


def test_the_slots_kept_for_superusers_refuse_a_plain_role_as_53300(small_server: SmallServer) -> None:
    """All but the reserved slot taken: the server refuses a plain role after its login (trust)
    succeeded, still with 53300, and a superuser still gets in."""
    held = _hold(small_server, MAX_CONNECTIONS - 1)
    try:
        exc = _open_fails(_url(small_server, "app"))
        assert (exc.code, exc.db_code, exc.transient) == ("cannot_connect", "53300", True), exc
        assert "no free connection slot" in str(exc), exc
    finally:
        _release(held)


def test_the_cli_says_no_free_slot_with_the_code(small_server: SmallServer, run_cli) -> None:
    fencepost.open(_url(small_server)).close()  # migrated, so the read command only needs to connect
    held = _hold(small_server, MAX_CONNECTIONS)
    try:
        result = run_cli("--db", _url(small_server, "app"), "runs", "list")
    finally:
        _release(held)
    assert_one_line_error(result)
    assert "no free connection slot" in result.err and "[53300]" in result.err, result
    assert "authentication" not in result.err and SECRET not in result.err, result


def test_no_free_slot_while_a_store_is_open_is_transient(small_server: SmallServer) -> None:
    """A store already open that needs a new connection (its pooled ones dropped) while every slot
    is taken fails its write as transient, so the worker waits it out, and the next write succeeds."""
    store = fencepost.open(_url(small_server, "app"))
    try:
        store.db.dispose()  # the next call opens a new connection
        held = _hold(small_server, MAX_CONNECTIONS)
        try:
            with pytest.raises(RunStoreError) as err:
                store.runs.create("r1", "{}")
            assert (err.value.code, err.value.transient) == ("persistence_failed", True), err.value
            assert_value_free(err.value)
        finally:
            _release(held)
        store.runs.create("r1", "{}")
        assert store.runs.get("r1").run_id == "r1"
    finally:
        store.close()


def _fill(server: SmallServer) -> list[psycopg.Connection]:
    """Take every connection slot left, the superusers' one too (bounded by ``MAX_CONNECTIONS``)."""
    held: list[psycopg.Connection] = []
    try:
        for _ in range(MAX_CONNECTIONS):
            held.append(psycopg.connect(_conninfo(server), connect_timeout=5))
    except psycopg.OperationalError:
        pass
    return held


def test_no_free_slot_for_a_new_thread_of_an_open_store_says_so(small_server: SmallServer) -> None:
    """A store already open, whose new thread's first call needs a new connection while the server
    is full, fails that call as transient, saying the server has no free connection slot (and its
    code, 53300), not that a connection was lost: none was ever made. Defect: libpq reports the
    refusal without its SQLSTATE, which read as "the connection to the server was lost". A thread
    started afterwards, with a slot free again, succeeds."""
    store = fencepost.open(_url(small_server, "app"))
    try:
        held = _fill(small_server)
        try:
            assert len(held) < MAX_CONNECTIONS  # the store holds at least one slot itself
            caught: list[BaseException] = []

            def first_call() -> None:
                try:
                    store.runs.create("r1", "{}")
                except BaseException as exc:  # handed to the test thread
                    caught.append(exc)

            thread = threading.Thread(target=first_call)
            thread.start()
            thread.join(timeout=60)
            assert not thread.is_alive() and len(caught) == 1, caught
            err = caught[0]
            assert isinstance(err, RunStoreError), repr(err)
            assert (err.code, err.transient, err.db_code) == ("persistence_failed", True, "53300"), err
            assert "no free connection slot" in str(err) and "lost" not in str(err), err
            assert_value_free(err)
            assert SECRET not in str(err)
        finally:
            _release(held)
        thread = threading.Thread(target=store.runs.create, args=("r2", "{}"))
        thread.start()
        thread.join(timeout=60)
        assert store.runs.get("r2").run_id == "r2"
    finally:
        store.close()


def test_a_server_shutting_down_is_cannot_connect_57p03_and_transient(small_server: SmallServer) -> None:
    """A smart shutdown waits for the sessions left and refuses new ones meanwhile (57P03)."""
    held = _hold(small_server, 1)
    try:
        small_server._run("pg_ctl", "-D", str(small_server.data), "-m", "smart", "-W", "stop")
        deadline = time.monotonic() + 30
        while True:  # the postmaster takes the signal asynchronously
            with pytest.raises(OpenError) as err:
                fencepost.open(_url(small_server, "app")).close()
            if err.value.db_code == "57P03" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        exc = err.value
        assert (exc.code, exc.db_code, exc.transient) == ("cannot_connect", "57P03", True), exc
        assert "shutting down" in str(exc) and SECRET not in str(exc), exc
    finally:
        _release(held)


def test_an_unresolvable_host_says_so() -> None:
    """``.invalid`` never resolves (RFC 2606), so no network is needed; no server is asked."""
    url = f"postgresql+psycopg://postgres:{SECRET}@no-such-host.invalid/test"
    exc = _open_fails(url)
    assert (exc.code, exc.db_code) == ("cannot_connect", None), exc
    assert "host name could not be resolved" in str(exc), exc
    assert "no server accepts connections" not in str(exc), exc


def test_the_cli_says_an_unresolvable_host_could_not_be_resolved(run_cli) -> None:
    result = run_cli("--db", f"postgresql+psycopg://postgres:{SECRET}@no-such-host.invalid/test", "runs", "list")
    assert_one_line_error(result)
    assert "host name could not be resolved" in result.err and SECRET not in result.err, result


def test_a_server_reached_by_a_socket_named_in_the_query_is_asked_itself(small_server: SmallServer) -> None:
    """``?host=<socket directory>&port=`` (the form SQLAlchemy documents for a Unix socket) leaves
    the URL's own host and port empty: the diagnosis must ask the server the driver connects to,
    not the default socket's (another server there, or none, would answer for it)."""
    url = f"postgresql+psycopg://app:{SECRET}@/postgres?host={small_server.root}&port={small_server.port}"
    fencepost.open(url).close()
    held = _hold(small_server, MAX_CONNECTIONS)
    try:
        exc = _open_fails(url)
        assert (exc.code, exc.db_code, exc.transient) == ("cannot_connect", "53300", True), exc
    finally:
        _release(held)


def test_a_refused_login_at_a_hostaddr_is_not_an_unresolvable_host(small_server: SmallServer) -> None:
    """With ``?hostaddr=`` libpq connects to that address and never resolves the host name (kept
    for TLS checks): a refused login there is ``auth_failed``, not a host name that does not
    resolve (``cannot_connect``, transient, which a worker would wait out for ever)."""
    url = (f"postgresql+psycopg://no_such_role:{SECRET}@no-such-host.invalid:{small_server.port}/postgres"
           "?hostaddr=127.0.0.1")
    exc = _open_fails(url)
    assert (exc.code, exc.transient) == ("auth_failed", False), exc
    assert "could not be resolved" not in str(exc), exc
