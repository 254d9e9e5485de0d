"""Canary secrets, planted wherever a user might put one, never surface where they do not belong.

One realistic flow per backend: a store opened with a password in its URL; runs whose state, checkpoints
and attempt values carry typical secret fields; journal appends with secret-looking payloads; failure
reasons given to ``transition_owned``; a worker whose task raises with a secret in its message; a
projection onto a target whose URL has a password; a follower over the feed; the CLI with ``--db``
carrying a password (also its error paths and ``--json`` outputs). Then every sink is searched:

- spans (names, attributes, events, status), metric attributes, every log record of every logger at
  DEBUG (message, args, exception text), every exception raised to the caller (``str``, ``repr`` and
  the whole formatted chain a ``log.exception`` would print), CLI stdout and stderr: no canary at all;
- the database, read raw, every column of every table: canaries only where the documentation says the
  value is stored as given (``flows_runs.state_json`` and the attempt values in ``flows_attempts``),
  never in the journal, the failure record or anywhere else; and the URL password nowhere;
- ``runs show`` / ``runs list`` print a run's state as recorded (documented): the state's canaries
  may appear there and only there.

PostgreSQL here is trust-authenticated, so a password in the URL is accepted and ignored: a canary.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import threading
import traceback
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Text, cast, column, create_engine, inspect, select, table
from sqlalchemy.pool import NullPool

import fencepost
from fencepost import OwnerId, RunFailure
from fencepost.projections import ProjectionBuilder
from fencepost.projections.builtin import RunsByStatus
from fencepost.runstore.rows import Attempt
from fencepost.worker import Worker
from tests.cli.conftest import fencepost_exe
from tests.conftest import drop_schema, require_postgres

# Each canary is unique text, so a hit names the value that leaked.
URL_PASSWORD = "CnryUrlPw7741"
PASSWORD = "CnryPassw0rd5512"
API_KEY = "sk-cnry0a1b2c3d4e5f6g7h8i9j"
TOKEN = "CnryTok9f3e2d1c0b"
BEARER = "CnryBearer.eyJ1.x8Zq"
CONN_PASSWORD = "CnryConnPw3390"
AWS_KEY = "AKIACNRY7Q2W9E4R1T6Y"
AWS_SECRET = "CnryAwsSecret/wJalrXUtnFEMIK7MDENGbPxRfiCY"
TASK_PASSWORD = "CnryTaskPw2218"
REASON_TOKEN = "CnryReasonTok4406"
PROJECTION_PASSWORD = "CnryProjPw8853"
CLI_PASSWORD = "CnryCliPw6617"
OPTION_SECRET = "CnryOptTok1290"
#: A server setting carrying a credential in the URL's ``options`` (libpq's ``-c name=value``).
OPTIONS = f"options=-c%20app.api_token%3D{OPTION_SECRET}"

#: In a run's state and attempt values: stored as given (documented), shown by runs show/list.
STATE_CANARIES = (PASSWORD, API_KEY, TOKEN, BEARER, CONN_PASSWORD, AWS_KEY, AWS_SECRET)
#: Never stored and never shown anywhere.
EVERYWHERE_ELSE = (URL_PASSWORD, TASK_PASSWORD, REASON_TOKEN, PROJECTION_PASSWORD, CLI_PASSWORD, OPTION_SECRET)
ALL = STATE_CANARIES + EVERYWHERE_ELSE

#: Where the documentation says a value is stored as given ("run state and attempt values are never
#: redacted"): the run's state, and the values of its step attempts.
VERBATIM_COLUMNS = {
    ("flows_runs", "state_json"),
    ("flows_attempts", "checkpoint_json"),
    ("flows_attempts", "outcome_json"),
    ("flows_attempts", "error_json"),
    ("flows_attempts", "meta_json"),
}


def secret_state(step: int) -> dict[str, Any]:
    """Run state as users write it: credentials under the usual names and inside free text."""
    return {
        "step": step,
        "password": PASSWORD,
        "api_key": API_KEY,
        "token": TOKEN,
        "headers": {"Authorization": f"Bearer {BEARER}"},
        "database": f"postgresql://app:{CONN_PASSWORD}@db.internal:5432/prod",
        "aws": {"aws_access_key_id": AWS_KEY, "aws_secret_access_key": AWS_SECRET},
        "note": f"AWS_ACCESS_KEY_ID={AWS_KEY} token={TOKEN}",
    }


def with_password(url: str, password: str) -> str:
    """``url`` (a PostgreSQL test URL) with ``password`` for its user."""
    scheme, rest = url.split("://", 1)
    userinfo, host = rest.split("@", 1)
    return f"{scheme}://{userinfo.split(':', 1)[0]}:{password}@{host}"


# ----------------------------------------------------------------------------- sinks
_RECORD_FIELDS = {*logging.LogRecord("", 0, "", 0, "", None, None).__dict__, "message", "asctime"}


class Capture(logging.Handler):
    """Every record of every logger, at DEBUG."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.lock2 = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self.lock2:
            self.records.append(record)

    def texts(self, *, result_rows: bool = False) -> Iterator[tuple[str, str]]:
        """Each record's text; ``result_rows``: only SQLAlchemy's DEBUG records of the rows a query
        returned (which show stored values as stored: a run's state), else every other record."""
        formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
        for r in list(self.records):
            is_row = r.name.startswith("sqlalchemy.engine") and r.levelno == logging.DEBUG and r.msg == "Row %r"
            if is_row != result_rows:
                continue
            where = f"log {r.name}:{r.levelname}"
            yield where, formatter.format(r)  # message with args, plus exc_text/stack_info if any
            yield where, repr(r.args) + repr(r.msg)
            for k, v in vars(r).items():
                if k not in _RECORD_FIELDS:
                    yield f"{where} extra {k}", repr(v)


@pytest.fixture
def logs() -> Iterator[Capture]:
    root = logging.getLogger()
    handler = Capture()
    # Every logger, the libraries' own too (SQLAlchemy sets "sqlalchemy" to WARNING on import).
    named = [logging.getLogger(n) for n in ("sqlalchemy", "sqlalchemy.engine", "sqlalchemy.pool", "psycopg")]
    named += [v for v in logging.root.manager.loggerDict.values() if isinstance(v, logging.Logger)]
    levels = {lg: lg.level for lg in [root, *named]}
    root.addHandler(handler)
    for lg in levels:
        lg.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        for lg, level in levels.items():
            lg.setLevel(level)


def telemetry_texts(otel: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for s in otel["exporter"].get_finished_spans():
        where = f"span {s.name}"
        yield where, s.name
        yield where, repr(dict(s.attributes or {}))
        yield where, repr(s.status.description)
        for e in s.events:
            yield f"{where} event {e.name}", e.name + repr(dict(e.attributes or {}))
        for link in s.links:
            yield f"{where} link", repr(dict(link.attributes or {}))
    data = otel["reader"].get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for dp in m.data.data_points:
                    yield f"metric {m.name}", m.name + repr(dict(dp.attributes or {}))


def exception_texts(exc: BaseException) -> list[str]:
    """What a caller could print of ``exc``: str, repr, args and the whole chain as logged."""
    return [str(exc), repr(exc), repr(exc.args), "".join(traceback.format_exception(exc))]


def hits(pairs: Any, canaries: tuple[str, ...]) -> list[str]:
    return sorted({f"{where}: {c}" for where, t in pairs for c in canaries if c in t})


def every_text_cell(url: str) -> dict[tuple[str, str], list[str]]:
    """Every column of every table of the store at ``url``, each cell as text, read raw."""
    if url.startswith("sqlite"):
        engine = create_engine(url.split("?", 1)[0], poolclass=NullPool)
        schema = None
    else:
        base, schema = url.split("?schema=", 1)
        schema = schema.split("&", 1)[0]
        engine = create_engine(base, poolclass=NullPool)
    found: dict[tuple[str, str], list[str]] = {}
    try:
        with engine.connect() as conn:
            insp = inspect(conn)
            for name in insp.get_table_names(schema=schema):
                cols = [c["name"] for c in insp.get_columns(name, schema=schema)]
                stmt = select(*[cast(column(c), Text) for c in cols]).select_from(table(name, schema=schema))
                for row in conn.execute(stmt):
                    for c, value in zip(cols, row, strict=True):
                        if value is not None:
                            found.setdefault((name, c), []).append(value)
    finally:
        engine.dispose()
    return found


# ----------------------------------------------------------------------------- the flow
A = OwnerId("host-canary", 4242, "nonce-canary")


def _task(ctx: Any) -> Any:
    if ctx.state.get("explode"):
        raise ConnectionError(f"could not reach billing: password={TASK_PASSWORD} "
                              f"dsn=postgresql://billing:{TASK_PASSWORD}@billing.internal/db")
    ctx.checkpoint(secret_state(2))
    return secret_state(3)


class Errors:
    """Collects every exception the flow provokes (each is expected), for the search."""

    def __init__(self) -> None:
        self.raised: list[BaseException] = []

    @contextlib.contextmanager
    def expect(self, *types: type[BaseException]) -> Iterator[None]:
        try:
            yield
        except types as exc:
            self.raised.append(exc)
        else:
            raise AssertionError(f"expected one of {types}")


def library_flow(url: str, target: str, bad_target: str, bad_url: str, errors: Errors) -> None:
    with fencepost.open(url) as store:
        # Runs with secret state, claimed, checkpointed, settled failed with a reason quoting secrets.
        store.runs.create("canary-1", json.dumps(secret_state(0)))
        row = store.runs.get("canary-1")
        store.runs.claim_and_own("canary-1", row, A, store.clock.now_ms())
        store.runs.heartbeat("canary-1", A, store.clock.now_ms())
        store.runs.transition_owned("canary-1", A, "running", json.dumps(secret_state(1)))
        now = store.clock.now_ms()
        started = Attempt("canary-1", "step-1", 1, "running", started_at_ms=now,
                          checkpoint=secret_state(1), meta={"tool": "http"})
        store.attempts.put(started, A)
        store.attempts.finish(Attempt("canary-1", "step-1", 1, "succeeded", started_at_ms=now,
                                      finished_at_ms=now + 1, checkpoint=secret_state(1),
                                      outcome={"value": f"answered with token={TOKEN}"}, meta={"tool": "http"}), A)
        j = store.journal
        j.append("canary-1", "tool.call", {"api_key": API_KEY, "password": PASSWORD, "url": "https://api.example/v1",
                                           "headers": [["Authorization", f"Bearer {BEARER}"]]},
                 owner=A, source_id="engine", meta={"note": f"Authorization: Bearer {BEARER}"})
        j.append("canary-1", "log", {"line": f"connecting to postgresql://app:{CONN_PASSWORD}@db/prod "
                                             f"with AWS_SECRET_ACCESS_KEY={AWS_SECRET} key {AWS_KEY}"},
                 owner=A, source_id="engine")
        j.append_unfenced("canary-1", "audit", {"token": TOKEN, "text": f"token={REASON_TOKEN}"}, source_id="auditor")
        failure = RunFailure("billing.Refused", f"refused: password={REASON_TOKEN} api_key={API_KEY}",
                             f'Traceback (most recent call last):\n  File "x.py", line 1\n'
                             f"ConnectionError: Authorization: Bearer {BEARER} token={REASON_TOKEN}\n")
        store.runs.transition_owned("canary-1", A, "failed", failure=failure)

        # Bad input on every write path, each quoting a secret: an error naming fields, nothing echoed.
        with errors.expect(fencepost.RunAlreadyExists):
            store.runs.create("canary-1", json.dumps(secret_state(0)))
        with errors.expect(fencepost.RunStoreError, ValueError):
            store.runs.create("canary-bad", '{"password": "' + PASSWORD + '", "token": ' + TOKEN + "}")
        with errors.expect(fencepost.RunStoreError, ValueError):
            store.runs.create("canary-nan", '{"api_key": "' + API_KEY + '", "n": NaN}')
        with errors.expect(fencepost.JournalError):
            j.append_unfenced("canary-1", "log", {"password": PASSWORD, "bad": {TOKEN}}, source_id="auditor")
        with errors.expect(fencepost.JournalError):
            j.append_unfenced("canary-1", f"token={TOKEN}", {}, source_id="auditor")
        with errors.expect(fencepost.AttemptStoreError, ValueError):
            store.attempts.put(Attempt("canary-1", "step-2", 1, "running", started_at_ms=now,
                                       checkpoint={"password": PASSWORD, "n": float("nan")}), A)
        with errors.expect(fencepost.RunStoreError, ValueError):
            store.runs.transition_owned("canary-1", A, "completed", '{"token": "' + TOKEN + '"')

        # A worker: one run raises with a secret in its message, another checkpoints and completes.
        store.runs.create("canary-w1", json.dumps({"explode": True, **secret_state(0)}))
        store.runs.create("canary-w2", json.dumps(secret_state(0)))
        stats = Worker(store, _task, concurrency=2).run(until_idle=True)
        assert stats.failed == 1 and stats.completed == 1, stats

        # A follower over the feed, and a projection onto a target whose URL carries a password.
        stop = threading.Event()
        seen = []
        for change in store.feed.follow(stop=stop, poll_interval=0.05):
            seen.append(change)
            if len(seen) >= 3:
                stop.set()
        builder = ProjectionBuilder(store, target, RunsByStatus())
        try:
            builder.catch_up()
        finally:
            builder.close()
        with errors.expect(fencepost.ProjectionError, fencepost.OpenError, ValueError):
            b = ProjectionBuilder(store, bad_target, RunsByStatus(), lock_timeout=0)
            try:
                b.catch_up()
            finally:
                b.close()

    # Opening a store that is not there, with a password in its URL.
    with errors.expect(fencepost.OpenError):
        fencepost.open(bad_url).close()


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``fencepost ARGV`` in this process (its logs and spans are captured too)."""
    from fencepost.cli import main

    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def cli_flow(urls: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path) -> tuple[list, list]:
    """Every command a user runs on the store; ``(shows state, shows no state)`` lists of outputs."""
    url, bad_url = urls["cli"], urls["cli_bad"]
    db = ["--db", url]
    state = json.dumps(secret_state(9))
    shows_state, no_state = [], []

    def run(args: list[str], *, expect: int | None = 0, state_shown: bool = False) -> None:
        code, out, err = cli(args, capsys)
        if expect is not None:
            assert code == expect, (args[2:], code, err[-500:])
        else:
            assert code != 0, (args[2:], out[-500:])
        label = " ".join(a if len(a) < 40 else a[:20] + "..." for a in args[2:])
        (shows_state if state_shown else no_state).append((label, out))
        no_state.append((label + " (stderr)", err))

    run([*db, "init"])
    run([*db, "runs", "create", "cli-1", "--state", state, "--json"], state_shown=True)
    run([*db, "runs", "create", "cli-1", "--state", state], expect=None)  # already exists
    run([*db, "runs", "create", "cli-bad", "--state", '{"password": "' + PASSWORD + '", "token": ' + TOKEN + "}"],
        expect=None)
    for fmt in (["--json"], ["--format", "csv"], []):  # where the failure record and payloads show
        run([*db, "runs", "list", *fmt], state_shown=True)
        run([*db, "runs", "show", "canary-1", *fmt], state_shown=True)
        run([*db, "journal", "show", "canary-1", *fmt])
    for fmt in (["--format", "jsonl"], []):
        run([*db, "feed", "tail", *fmt])
        run([*db, "feed", "snapshot", "canary-1", "cli-1", *fmt])
        run([*db, "source", "show", *fmt])
        run([*db, "migrations", "status", *fmt])
    run([*db, "journal", "verify", "--json"])
    run([*db, "journal", "replay", "canary-1", "--json"])
    run([*db, "runs", "cancel", "cli-1", "--json"])
    run([*db, "runs", "list", "--bogus-option"], expect=2)
    run(["--db", bad_url, "runs", "list", "--json"], expect=1)
    run(["--db", bad_url, "init"], expect=1)
    # Projections onto a target whose URL has a password, a reachable one and one that is not.
    run([*db, "projection", "run", "--target", urls["target"], "--no-progress", "--json"])
    run([*db, "projection", "status", "--target", urls["target"], "--json"])
    run([*db, "projection", "status", "--target", urls["target"]])
    run([*db, "projection", "run", "--target", urls["cli_bad"], "--no-progress", "--json"], expect=1)
    # Several stores from a --shards file (where the documentation says passwords belong).
    shards = tmp_path / "stores.txt"
    shards.write_text(f"main={url}\n")
    run(["--shards", str(shards), "runs", "list", "--json"], state_shown=True)
    run(["--shards", str(shards), "journal", "show", "canary-1", "--json"])
    shards.write_text(f"main={url}\nother={bad_url}\n")
    run(["--shards", str(shards), "runs", "list", "--json"], expect=None)
    return shows_state, no_state


def cli_subprocess(url: str, bad_url: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The real executable (in parallel: each takes a second to start), error paths included, the
    rest of the commands run in this process: ``(shows state, shows no state)`` outputs."""
    env = {k: v for k, v in os.environ.items() if k not in ("FENCEPOST_DB", "FENCEPOST_DEBUG")}
    shows_state, no_state = [], []
    cases = (
        (["--db", bad_url, "runs", "show", "x"], {"FENCEPOST_DEBUG": "1"}),  # with the traceback
        (["runs", "list", "--json", "--bogus"], {"FENCEPOST_DB": bad_url}),
    )
    procs = [subprocess.Popen([fencepost_exe(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**env, **extra}) for args, extra in cases]
    for (args, _), proc in zip(cases, procs, strict=True):
        out, err = proc.communicate(timeout=60)
        label = f"subprocess {' '.join(args[2:] or args)}"
        (shows_state if args[-3:] == ["runs", "list", "--json"] else no_state).append((f"{label} stdout", out))
        no_state.append((f"{label} stderr", err))
    return shows_state, no_state


# ----------------------------------------------------------------------------- the test
@pytest.fixture
def urls(backend: str, tmp_path) -> Iterator[dict[str, str]]:
    """The store, projection target, unreachable store and CLI store URLs, passwords in them on PostgreSQL."""
    if backend == "sqlite":
        yield {
            "store": f"sqlite:///{tmp_path / 'flows.db'}",
            "target": f"sqlite:///{tmp_path / 'views.db'}",
            "bad_target": f"sqlite:///{tmp_path / 'views.db'}/not-a-dir/x.db",
            "bad": f"sqlite:///{tmp_path / 'flows.db'}/inside-a-file.db",
            "cli": f"sqlite:///{tmp_path / 'flows.db'}",
            "cli_bad": f"postgresql+psycopg://app:{CLI_PASSWORD}@127.0.0.1:1/test?{OPTIONS}",
        }
        return
    base = require_postgres()
    schemas = ["t_" + os.urandom(8).hex() for _ in range(2)]
    store = with_password(base, URL_PASSWORD) + f"?schema={schemas[0]}&{OPTIONS}"
    yield {
        "store": store,
        "target": with_password(base, PROJECTION_PASSWORD) + f"?schema={schemas[1]}",
        "bad_target": with_password(base, PROJECTION_PASSWORD).replace(":5432/", ":1/") + f"?schema={schemas[1]}",
        "bad": with_password(base, URL_PASSWORD).replace(":5432/", ":1/") + f"?schema={schemas[0]}&{OPTIONS}",
        "cli": with_password(base, CLI_PASSWORD) + f"?schema={schemas[0]}&{OPTIONS}",
        "cli_bad": with_password(base, CLI_PASSWORD).replace(":5432/", ":1/") + f"?schema={schemas[0]}&{OPTIONS}",
    }
    for schema in schemas:
        drop_schema(base, schema)


def test_no_canary_leaves_its_place(urls: dict[str, str], otel, logs: Capture, capsys, tmp_path) -> None:
    otel["exporter"].clear()
    errors = Errors()
    library_flow(urls["store"], urls["target"], urls["bad_target"], urls["bad"], errors)
    shows_state, no_state = cli_flow(urls, capsys, tmp_path)
    sub_state, sub = cli_subprocess(urls["cli"], urls["cli_bad"])

    # Logs first: the raw reads below are this test's own (SQLAlchemy logs the rows it reads at DEBUG).
    leaks = hits(logs.texts(), ALL)
    leaks += hits(logs.texts(result_rows=True), EVERYWHERE_ELSE)
    assert any(r.name == "fencepost.worker" for r in logs.records)
    assert any(r.name.startswith("sqlalchemy.engine") for r in logs.records)
    leaks += hits(telemetry_texts(otel), ALL)
    leaks += hits(((f"raised {type(e).__name__}", t) for e in errors.raised for t in exception_texts(e)), ALL)
    leaks += hits(((f"cli {w}", t) for w, t in no_state), ALL)
    leaks += hits(((f"cli {w}", t) for w, t in shows_state), EVERYWHERE_ELSE)
    leaks += hits(sub, ALL)
    leaks += hits(sub_state, EVERYWHERE_ELSE)
    cells = every_text_cell(urls["store"])
    leaks += hits(((f"db {t}.{c}", v) for (t, c), vs in cells.items() if (t, c) not in VERBATIM_COLUMNS
                   for v in vs), ALL)
    leaks += hits(((f"db {t}.{c}", v) for (t, c), vs in cells.items() if (t, c) in VERBATIM_COLUMNS
                   for v in vs), EVERYWHERE_ELSE)
    if not urls["target"].startswith("sqlite"):
        leaks += hits(((f"target {t}.{c}", v) for (t, c), vs in every_text_cell(urls["target"]).items()
                       for v in vs), ALL)
    assert not leaks, "\n".join(leaks)

    # The searches looked at something: each sink saw the flow, the documented places hold the state.
    assert len(errors.raised) >= 9
    assert any(s.name.startswith("RunStore.") for s in otel["exporter"].get_finished_spans())
    assert any(PASSWORD in out for _, out in shows_state)  # runs show prints the state as recorded
    assert all(PASSWORD in v for v in cells[("flows_runs", "state_json")] if "canary" in v or "step" in v)
    journal = "\n".join(cells[("flows_journal_events", "payload_json")] + cells[("flows_journal_events", "meta_json")])
    assert "[REDACTED]" in journal and "[REDACTED_TOKEN]" in journal
    failure = "\n".join(cells[("flows_runs", "failure_json")])
    assert "password=[REDACTED]" in failure and "billing.Refused" in failure
    assert "[REDACTED]" in failure and "ConnectionError" in failure
    assert any("Error:" in t for w, t in sub if w.endswith("stderr"))


def test_documented_rule_state_stored_as_given_journal_redacted(db_url: str) -> None:
    """The documented split, exactly: state and attempt values byte for byte; the journal's copy redacted."""
    state = json.dumps(secret_state(0))
    with fencepost.open(db_url) as store:
        store.runs.create("r", state)
        store.runs.claim_and_own("r", store.runs.get("r"), A, store.clock.now_ms())
        store.journal.append("r", "tool.call", secret_state(0), owner=A, source_id="engine")
        assert store.runs.get("r").state_json == state
        payload = store.journal.entries("r", after=None, limit=10).entries[0].payload
    assert payload["password"] == "[REDACTED]" and payload["api_key"] == "[REDACTED]"
    assert payload["database"] == "postgresql://app:[REDACTED]@db.internal:5432/prod"
    assert payload["aws"]["aws_secret_access_key"] == "[REDACTED]"
    assert not hits([("payload", json.dumps(payload))], ALL)



def test_statement_parameters_stay_out_of_sqlalchemys_info_log(db_url: str, tmp_path, logs: Capture) -> None:
    """With ``sqlalchemy.engine`` at INFO (``echo=True`` in effect), SQLAlchemy logs each statement with
    its parameters unless the engine hides them. The values a store sends through SQLAlchemy (run ids,
    a flow name it projects, a cursor) are user data: they must not reach that log."""
    canary_run = "run-" + PASSWORD
    flow = "flow-" + PASSWORD
    engine_log = logging.getLogger("sqlalchemy.engine")
    engine_log.setLevel(logging.INFO)
    with fencepost.open(db_url) as store:
        store.runs.create(canary_run, json.dumps({"flowName": flow}))
        assert store.runs.get(canary_run) is not None
        target = f"sqlite:///{tmp_path / 'views.db'}"
        with ProjectionBuilder(store, target, RunsByStatus()) as builder:
            builder.catch_up()
        assert list(store.feed.iter_runs())
    infos = [r for r in logs.records if r.name.startswith("sqlalchemy.engine") and r.levelno == logging.INFO]
    assert infos, "SQLAlchemy logged no statement at INFO: the check saw nothing"
    leaked = [r.getMessage() for r in infos if PASSWORD in r.getMessage()]
    assert not leaked, leaked[:3]
