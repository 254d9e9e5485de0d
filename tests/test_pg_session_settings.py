"""PostgreSQL session settings a role (or the URL) gives fencepost's connections.

Each test makes a login role of its own with one setting (``ALTER ROLE ... SET``, as a DBA would),
opens a store as that role in a fresh schema, and drops both afterwards. PostgreSQL only: these are
the server's settings.

- ``idle_session_timeout``: the server ends a kept connection left idle past it (57P05); the next
  call reconnects and retries instead of failing, and a projection builder's lock session (idle
  between batches by design) is not ended by it.
- ``idle_in_transaction_session_timeout``: the server ends a session whose transaction idled past
  it (25P03), rolling the transaction back: the write is retried on a new connection, also when the
  COMMIT is what met it (the transaction did not commit: the outcome is known).
- ``session_replication_role = replica``: PostgreSQL then fires none of the store's triggers; a
  writable store refuses to open rather than write without them.
- ``statement_timeout``: it bounds the caller's statements, not fencepost's wait for its own write
  lock, which ``busy_timeout_ms`` bounds.
- ``client_encoding``: fencepost's connections always talk UTF8, whatever the role says; a URL
  asking for another client encoding is refused naming the option.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from sqlalchemy import make_url

import fencepost
from fencepost import OpenError
from fencepost._durable import DbFailure
from tests.conftest import drop_schema, require_postgres


def _server() -> dict[str, object]:
    url = make_url(require_postgres().split("?")[0])
    return {"host": url.host, "port": url.port or 5432, "user": url.username, "dbname": url.database,
            "connect_timeout": 10}


def _admin(sql: str) -> None:
    with psycopg.connect(autocommit=True, **_server()) as conn:  # type: ignore[arg-type]
        conn.execute(sql)


@pytest.fixture
def role() -> Iterator[Callable[..., str]]:
    """``make(**settings)``: a new login role with those settings, and a URL of a fresh schema as it.
    The role may create the schema (CREATE on the database) and nothing more."""
    made: list[tuple[str, str]] = []
    database = str(_server()["dbname"])

    def make(**settings: str) -> str:
        name = f"fp_{uuid.uuid4().hex[:10]}"
        schema = f"t_{uuid.uuid4().hex[:16]}"
        made.append((name, schema))
        _admin(f'CREATE ROLE {name} LOGIN; GRANT CREATE, CONNECT ON DATABASE "{database}" TO {name}')
        for key, value in settings.items():
            _admin(f"ALTER ROLE {name} SET {key} = '{value}'")
        url = make_url(require_postgres().split("?")[0]).set(username=name)
        return f"{url.render_as_string(hide_password=False)}?schema={schema}"

    yield make
    base = require_postgres()
    for name, schema in made:
        drop_schema(base, schema)
        _admin(f'DROP OWNED BY {name}; REVOKE ALL ON DATABASE "{database}" FROM {name}; DROP ROLE {name}')


def _pid(store: fencepost.Store, *, write: bool) -> int:
    query = "SELECT pg_backend_pid()"
    fn = store.db.write if write else store.db.read
    return int(fn(lambda c: c.exec_driver_sql(query).scalar()))


# ------------------------------------------------------------------ idle_session_timeout (57P05)
def test_a_connection_the_server_ended_while_idle_is_replaced_and_the_call_retried(role) -> None:
    url = role(idle_session_timeout="300ms")
    with fencepost.open(url) as store:
        store.runs.create("a", "{}")
        reader, writer = _pid(store, write=False), _pid(store, write=True)
        time.sleep(0.8)  # past the timeout: the server ended both kept connections
        assert store.runs.get("a").run_id == "a"
        store.runs.create("b", "{}")
        assert store.runs.get("b").run_id == "b"
        assert (_pid(store, write=False), _pid(store, write=True)) != (reader, writer)
        time.sleep(0.8)
        assert [r.run_id for r in store.feed.list_runs().runs] == ["a", "b"]


def test_a_worker_whose_function_idles_past_it_between_checkpoints_settles_the_run(role) -> None:
    from fencepost.worker import Worker

    url = role(idle_session_timeout="300ms")
    with fencepost.open(url) as store:
        store.runs.create("job", "{}")

        def work(ctx):
            for i in range(2):
                time.sleep(0.6)
                ctx.checkpoint({"i": i})
            return {"done": True}

        stats = Worker(store, work, concurrency=1).run(until_idle=True)
        row = store.runs.get("job")
        assert row.status == "completed", (stats, row.failure)


def test_a_projection_builders_lock_is_not_ended_by_it(role) -> None:
    from fencepost.errors import ProjectionError
    from fencepost.projections import ProjectionBuilder, RunsByStatus

    url = role(idle_session_timeout="300ms")
    plain = require_postgres() + f"&schema={make_url(url).query['schema']}" if "?" in require_postgres() \
        else require_postgres() + f"?schema={make_url(url).query['schema']}"
    with fencepost.open(url) as store:
        store.runs.create("a", "{}")
        with ProjectionBuilder(store, url, RunsByStatus()) as first:
            first.catch_up()
            time.sleep(0.8)  # the builder is idle, its lock session with it
            # Another builder of the name, on a session without the timeout, is still refused.
            with fencepost.open(plain) as other, pytest.raises(ProjectionError) as caught:
                with ProjectionBuilder(other, plain, RunsByStatus()) as second:
                    second.catch_up()
            assert caught.value.code == "builder_busy"
            store.runs.create("b", "{}")
            first.catch_up()


# ------------------------------------------------------------------ idle_in_transaction_session_timeout (25P03)
@pytest.mark.parametrize("where", ["body", "commit"])
def test_a_transaction_the_server_ended_while_idle_in_it_is_retried_once_committed(role, where: str) -> None:
    url = role(idle_in_transaction_session_timeout="300ms")
    with fencepost.open(url) as store:
        store.runs.create("a", "{}")
        tries: list[int] = []

        def body(conn) -> int:
            tries.append(1)
            if len(tries) == 1 and where == "body":
                conn.exec_driver_sql("SELECT 1")
                time.sleep(0.8)  # idle in the transaction past the timeout: the server ends it
            conn.exec_driver_sql(
                "UPDATE flows_runs SET state_json = %(s)s WHERE run_id = 'a'", {"s": '{"n": 1}'})
            if len(tries) == 1 and where == "commit":
                time.sleep(0.8)  # the statement ran; the COMMIT finds the session ended
            return len(tries)

        assert store.db.write(body, alone=True) == 2
        assert store.runs.get("a").state_json == '{"n": 1}'


def test_a_grouped_commit_that_met_it_runs_each_call_again_alone(role) -> None:
    """Defect (carried in the notes since the group commit work): a write handed to group commit
    whose shared COMMIT met 25P03 failed as ``transient`` although the server had rolled the
    transaction back, so nothing of it committed and the call could simply run again, as a single
    write is. Now every call of that group runs again alone (each with its own retries): here the
    leader and the member that idled both commit, exactly once."""
    url = role(idle_in_transaction_session_timeout="300ms")
    with fencepost.open(url) as store:
        assert store.db._group is not None
        store.runs.create("a", "{}")
        store.runs.create("b", "{}")
        tries = {"a": 0, "b": 0}

        def leader(conn) -> int:
            tries["a"] += 1
            conn.exec_driver_sql("UPDATE flows_runs SET state_json = state_json || ' ' WHERE run_id = 'a'")
            deadline = time.monotonic() + 30
            while tries["a"] == 1 and store.db._group._waiting < 1:
                assert time.monotonic() < deadline, "the member never queued"
                time.sleep(0.001)
            return tries["a"]

        def member(conn) -> int:
            tries["b"] += 1
            conn.exec_driver_sql("UPDATE flows_runs SET state_json = state_json || ' ' WHERE run_id = 'b'")
            if tries["b"] == 1:
                time.sleep(0.8)  # the group's transaction idles past the timeout: its COMMIT meets 25P03
            return tries["b"]

        outcomes: dict[str, object] = {}

        def call(name: str, fn) -> None:
            try:
                outcomes[name] = store.db.write(fn)
            except BaseException as exc:
                outcomes[name] = exc

        first = threading.Thread(target=call, args=("a", leader))
        first.start()
        deadline = time.monotonic() + 30
        while tries["a"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        second = threading.Thread(target=call, args=("b", member))
        second.start()
        first.join(60)
        second.join(60)
        assert outcomes == {"a": 2, "b": 2}, outcomes
        # Each UPDATE appended one space per committed run of its body: exactly one committed.
        assert (store.runs.get("a").state_json, store.runs.get("b").state_json) == ("{} ", "{} ")


# ------------------------------------------------------------------ session_replication_role
def test_a_role_whose_sessions_fire_no_triggers_is_refused_at_open(role) -> None:
    url = role(session_replication_role="replica")
    with pytest.raises(OpenError) as caught:
        fencepost.open(url).close()
    err = caught.value
    assert (err.code, err.db_code) == ("open_failed", "session_replication_role"), str(err)
    assert "session_replication_role" in str(err) and "trigger" in str(err)
    assert err.transient is False
    with psycopg.connect(**_server()) as conn:  # type: ignore[arg-type]
        schema = make_url(url).query["schema"]
        assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None


def test_a_store_whose_role_is_set_so_later_is_refused_and_opens_read_only(role) -> None:
    url = role()
    with fencepost.open(url) as store:
        store.runs.create("a", "{}")
    _admin(f"ALTER ROLE {make_url(url).username} SET session_replication_role = 'replica'")
    with pytest.raises(OpenError) as caught:
        fencepost.open(url).close()
    assert caught.value.db_code == "session_replication_role"
    with fencepost.open(url, readonly=True) as reader:  # fires no trigger either way
        assert reader.runs.get("a").run_id == "a"


# ------------------------------------------------------------------ statement_timeout
def _hold_write_lock(url: str, seconds: float) -> tuple[threading.Thread, threading.Event]:
    """Another writer of the store's schema holding the write lock ``seconds``."""
    schema = make_url(url).query["schema"]
    held = threading.Event()

    def hold() -> None:
        with psycopg.connect(**_server()) as conn:  # type: ignore[arg-type]
            conn.execute(f"SELECT pg_advisory_xact_lock(hashtextextended('{schema}', 2099))")
            held.set()
            time.sleep(seconds)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    return thread, held


def test_a_statement_timeout_does_not_cut_the_wait_for_the_write_lock(role) -> None:
    url = role()
    # Migrated first, and a timeout above what opening needs (its catalog checks on a new
    # connection) but far below the other writer's hold of the lock.
    fencepost.open(url).close()
    _admin(f"ALTER ROLE {make_url(url).username} SET statement_timeout = '250ms'")
    with fencepost.open(url) as store:
        thread, _ = _hold_write_lock(url, 1.0)
        started = time.monotonic()
        store.runs.create("a", "{}")
        assert time.monotonic() - started >= 0.8
        thread.join()
        # The session's own setting still bounds the caller's statements in the transaction.
        assert store.db.write(lambda c: c.exec_driver_sql("SHOW statement_timeout").scalar()) == "250ms"
        with pytest.raises(DbFailure) as caught:
            store.db.write(lambda c: c.exec_driver_sql("SELECT pg_sleep(0.6)"), alone=True)
        assert caught.value.code == "57014"


def test_busy_timeout_ms_bounds_that_wait(role) -> None:
    url = role()
    fencepost.open(url).close()
    _admin(f"ALTER ROLE {make_url(url).username} SET statement_timeout = '250ms'")
    with fencepost.open(url + "&busy_timeout_ms=700") as store:
        thread, _ = _hold_write_lock(url, 3.0)
        started = time.monotonic()
        with pytest.raises(fencepost.RunStoreError) as caught:
            store.runs.create("a", "{}")
        took = time.monotonic() - started
        thread.join()
        assert caught.value.db_code == "55P03" and caught.value.transient, str(caught.value)  # type: ignore[attr-defined]
        assert 0.6 <= took < 2.0, took


# ------------------------------------------------------------------ client_encoding
@pytest.mark.parametrize("encoding", ["SQL_ASCII", "LATIN1"])
def test_the_roles_client_encoding_is_overridden_with_utf8(role, encoding: str) -> None:
    url = role(client_encoding=encoding)
    with fencepost.open(url) as store:
        store.runs.create("job-€", '{"who": "Zoë 😀"}')
        assert store.runs.get("job-€").state_json == '{"who": "Zoë 😀"}'
        assert [r.run_id for r in store.feed.list_runs().runs] == ["job-€"]
        assert store.db.read(lambda c: c.exec_driver_sql("SHOW client_encoding").scalar()) == "UTF8"


def test_the_environments_client_encoding_is_overridden_too(role, monkeypatch) -> None:
    monkeypatch.setenv("PGCLIENTENCODING", "LATIN1")
    with fencepost.open(role()) as store:
        store.runs.create("job-€", "{}")
        assert store.runs.get("job-€").run_id == "job-€"


@pytest.mark.parametrize("query", ["client_encoding=LATIN1", "client_encoding=SQL_ASCII",
                                   "options=-c%20client_encoding%3DSQL_ASCII",
                                   "options=--client-encoding%3Dlatin1", "client_encoding=auto"])
def test_a_url_asking_for_another_client_encoding_is_refused_naming_the_option(query: str) -> None:
    with pytest.raises(ValueError) as caught:
        fencepost.open(f"postgresql+psycopg://someone@127.0.0.1:1/db?{query}")
    message = str(caught.value)
    assert "client_encoding" in message and "UTF8" in message
    for value in ("LATIN1", "SQL_ASCII", "latin1", "auto"):
        assert value not in message


@pytest.mark.parametrize("value", ["UTF8", "utf8", "UTF-8", "unicode"])
def test_a_url_asking_for_utf8_is_accepted(role, value: str) -> None:
    with fencepost.open(role() + f"&client_encoding={value}") as store:
        store.runs.create("job-€", "{}")
