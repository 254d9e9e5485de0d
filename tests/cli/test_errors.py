"""The error boundary: bad input and unreachable databases give one line and a non-zero exit."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.cli.conftest import assert_one_line_error, fencepost_exe

# Each command runs through fencepost.cli.main in this interpreter (see run_cli in conftest.py).
pytestmark = pytest.mark.cli_in_process

READ_COMMANDS = [
    ["runs", "list"],
    ["runs", "show", "r1"],
    ["journal", "show", "r1"],
    ["journal", "verify"],
    ["journal", "replay", "r1"],
    ["feed", "tail"],
    ["feed", "snapshot", "r1"],
    ["source", "show"],
    ["projection", "status"],
]


def test_unknown_option_is_a_one_line_usage_error(run_cli):
    result = run_cli("runs", "list", "--bogus")
    assert_one_line_error(result)
    assert result.code == 2
    assert "--bogus" in result.err


def test_unknown_command_is_a_one_line_usage_error(run_cli):
    result = run_cli("nonsense")
    assert_one_line_error(result)
    assert result.code == 2


def test_bad_choice_and_bad_integer_are_refused_before_opening_anything(run_cli, tmp_path):
    assert_one_line_error(run_cli("runs", "list", "--status", "sleeping"))
    assert_one_line_error(run_cli("runs", "list", "--limit", "zero"))
    assert not (tmp_path / ".flows").exists()


def test_missing_argument_is_a_usage_error(run_cli):
    result = run_cli("runs", "show")
    assert_one_line_error(result)
    assert result.code == 2


@pytest.mark.parametrize("args", READ_COMMANDS, ids=[" ".join(a) for a in READ_COMMANDS])
def test_read_command_on_a_missing_database_fails_and_creates_nothing(run_cli, tmp_path, args):
    result = run_cli(*args)
    assert_one_line_error(result)
    assert result.code == 1
    assert not (tmp_path / ".flows").exists()


def test_missing_database_named_by_env_var_is_an_error(run_cli, tmp_path):
    db = tmp_path / "elsewhere" / "x.db"
    result = run_cli("runs", "list", env={"FENCEPOST_DB": f"sqlite:///{db}"})
    assert_one_line_error(result)
    assert not db.exists() and not db.parent.exists()


def test_unreachable_postgresql_url_is_one_line(run_cli):
    started = time.monotonic()
    result = run_cli("--db", "postgresql+psycopg://nobody:secret-pw@127.0.0.1:1/none", "runs", "list")
    assert_one_line_error(result)
    assert "secret-pw" not in result.err
    assert time.monotonic() - started < 30


def test_unreachable_postgresql_url_on_a_write_command_is_one_line(run_cli):
    result = run_cli("--db", "postgresql+psycopg://nobody:secret-pw@127.0.0.1:1/none", "init")
    assert_one_line_error(result)
    assert "secret-pw" not in result.err


def test_a_password_given_as_a_query_option_is_never_printed(run_cli):
    result = run_cli("--db", "postgresql+psycopg://nobody@127.0.0.1:1/none?password=secret-pw", "runs", "list")
    assert_one_line_error(result)
    assert "secret-pw" not in result.err and "password=***" in result.err


@pytest.mark.parametrize("target", ["postgresql+psycopg://u:pw@127.0.0.1:port/x", "sqlite:///t.db?synchronous=bad",
                                    "sqlite:///t.db?bogus=1"])
def test_a_bad_target_url_is_a_usage_error_that_creates_nothing(run_cli, tmp_path, target):
    db = tmp_path / "flows.db"
    result = run_cli("--db", f"sqlite:///{db}", "projection", "status", "--target", target)
    assert_one_line_error(result)
    assert result.code == 2 and "--target:" in result.err and "pw@" not in result.err
    assert not db.exists()


@pytest.mark.parametrize("command", ["run", "rebuild", "status"])
def test_an_unreachable_projection_target_says_cannot_connect(run_cli, tmp_path, command):
    """The driver's own exception text reached the user (exit 1, "OperationalError: ... Connection refused")."""
    db = tmp_path / "flows.db"
    assert run_cli("--db", f"sqlite:///{db}", "init").code == 0
    result = run_cli("--db", f"sqlite:///{db}", "projection", command,
                     "--target", "postgresql+psycopg://nobody:secret-pw@127.0.0.1:1/none")
    assert_one_line_error(result)
    assert result.code == 1
    assert "cannot_connect" in result.err and "projection target" in result.err, result.err
    assert "secret-pw" not in result.err and "OperationalError" not in result.err


@pytest.mark.parametrize("args", [["demo", "--speed", "nan"], ["demo", "--timeout", "nan", "--runs", "10"],
                                  ["demo", "--timeout", "inf"],
                                  ["projection", "run", "--follow", "--interval", "nan"]],
                         ids=["speed-nan", "timeout-nan", "timeout-inf", "interval-nan"])
def test_a_number_that_is_not_finite_is_a_usage_error_before_anything_opens(run_cli, tmp_path, args):
    """nan passed click's range checks: --interval nan printed status lines without pause, --speed
    nan failed with a ValueError, --timeout nan created the demo's runs and left them pending."""
    db = tmp_path / "flows.db"
    result = run_cli("--db", f"sqlite:///{db}", *args, timeout=30)
    assert_one_line_error(result)
    assert result.code == 2 and "must be a finite number" in result.err, result
    assert not db.exists()


TYPED_VALUES = [
    (["runs", "list", "--created-after", "1969-01-01"], "--created-after"),
    (["runs", "list", "--created-after", "9007199254740992"], "--created-after"),
    (["runs", "list", "--created-before", "99999999999999999999999"], "--created-before"),
    (["runs", "list", "--flow", ""], "--flow"),
    (["runs", "create", "x", "--state", "{bad"], "--state"),
    (["runs", "create", "x", "--state", ""], "--state"),
    (["runs", "retry", "x", "--new-id", ""], "--new-id"),
    # The journal's companion-stream namespace: no run can have such an id (exit 1, invalid_run, before).
    (["runs", "create", "flows.companion/x"], "reserved companion-stream prefix"),
    (["runs", "retry", "x", "--new-id", "flows.companion/x"], "--new-id"),
    (["journal", "show", "x", "--after", "99999999999999999999999"], "--after"),
    (["feed", "tail", "--from", "99999999999999999999999"], "--from"),
    (["feed", "tail", "--from", "99"], "--from 99 is ahead of the newest revision (1)"),
    (["feed", "tail", "--from", "0", "--from", "1"], "--from was given 2 times"),
    (["feed", "snapshot", ""], "RUN_IDS"),
    (["runs", "show", ""], "RUN_ID"),
    (["runs", "cancel", ""], "RUN_ID"),
    (["runs", "delete", ""], "RUN_ID"),
    (["journal", "show", ""], "RUN_ID"),
    (["journal", "replay", ""], "RUN_ID"),
]


@pytest.mark.parametrize(("args", "names"), TYPED_VALUES, ids=[" ".join(a) for a, _ in TYPED_VALUES])
def test_a_typed_value_the_store_would_refuse_is_a_usage_error_naming_the_option(run_cli, tmp_path, args, names):
    """These reached the library and failed with exit 1 and the library's field name
    (created_after_ms, state_json, position.revision ...), or a code such as invalid_run."""
    url = f"sqlite:///{tmp_path / 'flows.db'}"
    assert run_cli("--db", url, "init").code == 0
    assert run_cli("--db", url, "runs", "create", "r1").code == 0
    before = run_cli("--db", url, "runs", "list", "--json").out
    result = run_cli("--db", url, *args)
    assert_one_line_error(result)
    assert result.code == 2 and names in result.err, result
    assert run_cli("--db", url, "runs", "list", "--json").out == before


NOT_ASCII_DIGITS = [
    (["runs", "list", "--created-after", "\u00b2"], "--created-after"),
    (["runs", "list", "--created-before", "\uff11\uff12"], "--created-before"),
    (["feed", "tail", "--from", "\u00b2"], "--from"),
    (["feed", "tail", "--from", "\u0660"], "--from"),
    (["runs", "list", "--created-after", "9" * 5000], "--created-after"),
    (["feed", "tail", "--from", "9" * 5000], "--from"),
]


@pytest.mark.parametrize(("args", "names"), NOT_ASCII_DIGITS, ids=["superscript", "fullwidth", "from-superscript",
                                                                   "from-arabic-indic", "5000-digits",
                                                                   "from-5000-digits"])
def test_a_number_in_other_digits_is_a_usage_error_naming_the_option(run_cli, tmp_path, args, names):
    """str.isdigit() admits superscripts and other scripts' digits: "\u00b2" then failed in int() with
    "Error: ValueError: invalid literal for int() with base 10: '\u00b2'" (exit 1, the value echoed),
    and fullwidth or Arabic-Indic digits were read as numbers. Only ASCII digits are a number now.
    5000 digits failed the same way (Python's limit on converting long digit strings)."""
    url = f"sqlite:///{tmp_path / 'flows.db'}"
    assert run_cli("--db", url, "init").code == 0
    assert run_cli("--db", url, "runs", "create", "r1").code == 0
    result = run_cli("--db", url, *args)
    assert_one_line_error(result)
    assert result.code == 2 and names in result.err, result
    assert "ValueError" not in result.err and args[-1] not in result.err, result


def test_runs_create_from_stdin_refuses_a_state_option_it_would_ignore(tmp_path):
    url = f"sqlite:///{tmp_path / 'flows.db'}"
    result = subprocess.run([fencepost_exe(), "--db", url, "runs", "create", "-", "--state", '{"x": 1}'],
                            input='{"run_id": "n8"}\n', capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--state does not apply" in result.stderr, result
    assert not (tmp_path / "flows.db").exists()


def test_unsupported_url_scheme_is_one_line(run_cli):
    assert_one_line_error(run_cli("--db", "mysql://x/y", "runs", "list"))


def test_a_file_that_is_not_a_database_is_one_line(run_cli, tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    assert_one_line_error(run_cli("--db", f"sqlite:///{junk}", "runs", "list"))


def test_bad_task_reference_for_worker_is_a_usage_error(run_cli):
    result = run_cli("worker", "--task", "no_such_module:fn")
    assert_one_line_error(result)
    assert result.code == 2


def test_read_commands_never_migrate_an_empty_database(run_cli, tmp_path):
    import sqlite3

    path = tmp_path / "empty.db"
    sqlite3.connect(path).close()
    result = run_cli("--db", f"sqlite:///{path}", "runs", "list")
    assert_one_line_error(result)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0


def test_projection_status_is_read_only_on_a_target_never_built(run_cli, tmp_path):
    import json
    import sqlite3

    assert run_cli("init").code == 0
    result = run_cli("projection", "status", "--json")
    assert result.code == 0, result
    assert json.loads(result.out)["source"] is None
    with sqlite3.connect(tmp_path / ".flows" / "flows.db") as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE name LIKE 'projection%'")]
    assert names == []


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_projection_status_on_a_missing_target_database_names_the_target(run_cli, tmp_path, backend):
    """A SQLite target file that is not there was reported as the store's ("Store.open: no database
    at ...; create it with `fencepost init`"), advice that makes a store of the read model's file."""
    from tests.conftest import require_postgres

    assert run_cli("init").code == 0
    if backend == "sqlite":
        target = f"sqlite:///{tmp_path / 'read-model.db'}"
    else:
        target = require_postgres().rsplit("/", 1)[0] + "/fencepost_no_such_database"
    result = run_cli("projection", "status", "--target", target)
    assert_one_line_error(result)
    assert result.code == 1
    assert "database_missing: Projection.status: projection target: no database at" in result.err, result.err
    assert "Store.open" not in result.err and "fencepost init" not in result.err
    if backend == "sqlite":
        assert "fencepost projection run --target" in result.err
    assert not (tmp_path / "read-model.db").exists()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_projection_status_on_a_missing_target_file_or_schema_is_an_error_and_creates_nothing(
        run_cli, tmp_path, backend):
    """A PostgreSQL --target naming a schema that is not there reported a projection never built
    (exit 0, the whole source as lag), where a SQLite file that is not there is ``database_missing``:
    a mistyped schema looked like a real read model. Both are an error naming the target, masked."""
    from tests.conftest import drop_schema, require_postgres, store_exists

    assert run_cli("init").code == 0
    if backend == "sqlite":
        target = f"sqlite:///{tmp_path / 'read-model.db'}"
    else:
        base = require_postgres()
        target = base.replace("://postgres@", "://postgres:hunter2@") + "?schema=t_no_such_read_model"
        drop_schema(base, "t_no_such_read_model")
    for name in ("runs_by_status", "ownership_history"):
        for fmt in ("table", "json"):
            result = run_cli("projection", "status", "--name", name, "--target", target, "--format", fmt)
            assert_one_line_error(result)
            assert result.code == 1, result
            assert "database_missing: Projection.status: projection target: no " in result.err, result.err
            assert "fencepost projection run --target" in result.err, result.err
            assert result.out == ""
            if backend == "postgresql":
                assert "schema t_no_such_read_model" in result.err, result.err
                assert "hunter2" not in result.err and "postgres:***@" in result.err, result.err
    assert not store_exists(target)


@pytest.mark.parametrize("command", ["run", "rebuild"])
def test_projection_run_and_rebuild_create_a_missing_target_file_or_schema(run_cli, db_url, make_db_url, command):
    """``projection run`` and ``rebuild`` build the read model where --target says, creating the
    SQLite file or the PostgreSQL schema; status then reads it (exit 0)."""
    import json

    from tests.conftest import store_exists

    assert run_cli("--db", db_url, "init").code == 0
    assert run_cli("--db", db_url, "runs", "create", "r1").code == 0
    target = make_db_url()
    assert not store_exists(target)
    result = run_cli("--db", db_url, "projection", command, "--target", target)
    assert result.code == 0, result
    assert store_exists(target)
    status = run_cli("--db", db_url, "projection", "status", "--target", target, "--json")
    assert status.code == 0, status
    assert json.loads(status.out)["lag"] == 0


@pytest.mark.parametrize("args", [["runs", "cancel", "r1"], ["source", "rotate"]], ids=["runs cancel", "source rotate"])
def test_write_commands_on_a_missing_database_do_not_create_one(run_cli, tmp_path, args):
    result = run_cli(*args)
    assert_one_line_error(result)
    assert not (tmp_path / ".flows").exists()


@pytest.mark.parametrize("option", ["checkpoints=sometimes", "synchronous=sometimes", "busy_timeout_ms=soon",
                                    "pool_size=lots"])
def test_a_bad_url_option_is_a_usage_error_that_creates_nothing(run_cli, tmp_path, option):
    db = tmp_path / "not-yet" / "flows.db"
    result = run_cli("--db", f"sqlite:///{db}?{option}", "init")
    assert_one_line_error(result)
    name, value = option.split("=")
    assert result.code == 2 and f"--db: {name}" in result.err and value not in result.err
    assert not db.parent.exists()


@pytest.mark.parametrize("option", ["connect_timeout=abc", "keepalives_idle=soon", "port=abc", "keepalives=x"])
@pytest.mark.parametrize("command", [("init",), ("runs", "list"), ("runs", "create", "r1")])
def test_a_bad_libpq_number_is_a_usage_error_that_connects_to_nothing(run_cli, option, command):
    """``connect_timeout=abc`` exited 1 (``open_failed`` after trying to connect) and ``port=abc``
    in the query exited 1 with SQLAlchemy's ``ArgumentError``; every other bad URL option is a
    usage error (exit 2) naming it, checked before anything connects."""
    from tests.conftest import require_postgres, store_exists

    url = f"{require_postgres()}?schema=t_never_made_cli_walk&{option}"
    result = run_cli("--db", url, *command)
    assert_one_line_error(result)
    name, value = option.split("=")
    assert result.code == 2 and f"--db: {name} must be" in result.err and value not in result.err, result
    assert not store_exists(url)


def test_a_bad_url_is_a_usage_error_naming_which_db(run_cli, tmp_path):
    result = run_cli("--db", f"sqlite:///{tmp_path / 'a.db'}", "--db", "mysql://x/y", "runs", "list")
    assert_one_line_error(result)
    assert result.code == 2 and "--db #2: unsupported database URL scheme" in result.err


@pytest.mark.parametrize("command", [("init",), ("runs", "list"), ("journal", "verify")])
def test_a_bad_option_in_fencepost_db_is_a_usage_error_naming_it(run_cli, tmp_path, command):
    db = tmp_path / "not-yet" / "flows.db"
    result = run_cli(*command, env={"FENCEPOST_DB": f"sqlite:///{db}?checkpoints=sometimes"})
    assert_one_line_error(result)
    assert result.code == 2 and "$FENCEPOST_DB: checkpoints" in result.err and "sometimes" not in result.err
    assert not db.parent.exists()


def test_help_still_works_under_a_bad_fencepost_db(run_cli, tmp_path):
    result = run_cli("runs", "--help", env={"FENCEPOST_DB": f"sqlite:///{tmp_path / 'x.db'}?checkpoints=sometimes"})
    assert result.code == 0 and "Usage:" in result.out


def test_projection_run_interval_without_follow_is_a_usage_error(run_cli, tmp_path):
    """--interval without --follow was silently ignored (a single catch-up prints one result): the
    user who meant to follow got one catch-up and an exit."""
    db = tmp_path / "flows.db"
    result = run_cli("--db", f"sqlite:///{db}", "projection", "run", "--interval", "5")
    assert_one_line_error(result)
    assert result.code == 2 and "--interval needs --follow" in result.err, result
    assert not db.exists()


def test_an_unexpected_error_at_the_boundary_is_shown_redacted(monkeypatch, capsys):
    """The CLI's last-resort boundary printed an unexpected exception's first line as it was: a
    message quoting a credential (``password=...``) or a terminal escape reached the screen. It now
    goes through the redaction run failures get, escaped, with its type kept."""
    from fencepost import cli
    from fencepost.cli import _common

    def broken(*args, **kwargs):
        raise RuntimeError("connect failed: password=hunter2XYZ \x1b[2J")

    monkeypatch.setattr(_common.CliContext, "store", broken)
    with pytest.raises(SystemExit) as ended:
        cli.main(["runs", "list"])
    assert ended.value.code == 1
    err = capsys.readouterr().err
    assert "RuntimeError" in err and "connect failed" in err, err
    assert "hunter2XYZ" not in err and "\x1b" not in err, err
