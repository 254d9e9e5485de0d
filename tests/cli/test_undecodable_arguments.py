"""Command-line text that is not UTF-8 is a usage error naming the option, never a raw exception.

A shell passes the bytes it is given; Python hands an argument holding bytes that are not UTF-8
to the program as text with lone surrogates. Such text reached the CLI's last-resort boundary as
``UnicodeEncodeError: 'utf-8' codec can't encode character '\\udcff' in position 52`` (exit 1),
naming the offending character and its position in the value: for a ``--db`` URL, a byte of the
password and where it is. Each case must now exit 2 with one line naming the option, the
offending byte and its neighbours nowhere on stderr, and nothing written.
"""

from __future__ import annotations

import os
import subprocess

import pytest

import fencepost
from tests.cli.conftest import Result, assert_one_line_error, fencepost_exe

BAD = b"\xff"  # never valid in UTF-8


def _run(*args: str | bytes, cwd) -> Result:
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    proc = subprocess.run([fencepost_exe(), *args], capture_output=True, cwd=cwd, env=env, timeout=60)
    proc.stdout = proc.stdout.decode("utf-8", "backslashreplace")
    proc.stderr = proc.stderr.decode("utf-8", "backslashreplace")
    return Result(proc)


def _assert_usage_error_without_the_value(result: Result, option: str) -> None:
    assert_one_line_error(result)
    assert result.code == 2, result
    assert option in result.err, result
    for shown in ("\\udcff", "\\xff", "\udcff", "\xff", "position", "Unicode", "TypeError"):
        assert shown not in result.err, result


def test_runs_create_state_that_is_not_utf8_is_a_usage_error(db_url, tmp_path):
    fencepost.open(db_url).close()
    result = _run("--db", db_url, "runs", "create", "r1", "--state", b'{"note": "caf' + BAD + b'"}', cwd=tmp_path)
    _assert_usage_error_without_the_value(result, "--state")
    with fencepost.open(db_url, readonly=True) as store:
        assert store.feed.count_runs() == 0


@pytest.mark.parametrize("where", ["password", "user", "option"])
def test_a_postgresql_url_that_is_not_utf8_is_a_usage_error_naming_db(where, tmp_path):
    """PostgreSQL only: libpq takes its connection string as UTF-8, so such a URL can never connect.
    A SQLite URL names a file, and a file name may hold any bytes (it is opened as given)."""
    urls = {
        "password": b"postgresql+psycopg://postgres:s3cr" + BAD + b"t@127.0.0.1:5432/test",
        "user": b"postgresql+psycopg://post" + BAD + b"gres@127.0.0.1:5432/test",
        "option": b"postgresql+psycopg://postgres@127.0.0.1:5432/test?application_name=a" + BAD,
    }
    result = _run("--db", urls[where], "runs", "list", cwd=tmp_path)
    _assert_usage_error_without_the_value(result, "--db")
    assert "s3cr" not in result.err


def test_open_refuses_a_postgresql_url_that_is_not_utf8_without_quoting_it():
    """PostgreSQL only (as above); the library's own refusal, which the CLI's rests on."""
    url = "postgresql+psycopg://postgres:s3cr\udcfft@127.0.0.1:5432/test"
    with pytest.raises(ValueError) as info:
        fencepost.open(url)
    text = f"{info.value!s} {info.value!r} {info.value.__context__!r}"
    assert "s3cr" not in text and "\udcff" not in text and "UTF-8" in str(info.value)


def test_ui_host_that_is_not_utf8_is_a_usage_error(db_url, tmp_path):
    """No database is reached: the host is refused before anything listens (SQLite store only)."""
    fencepost.open(db_url).close()
    result = _run("--db", db_url, "ui", "--port", "0", "--host", b"local" + BAD, cwd=tmp_path)
    _assert_usage_error_without_the_value(result, "--host")


def test_init_of_a_sqlite_path_that_is_not_utf8_names_it_with_the_bytes_escaped(tmp_path):
    """A SQLite file name may hold any bytes, so ``init`` creates it; its line printed
    ``created <unparseable database URL>``. It now shows the path as the URL renders every other
    byte that is not plain ASCII (percent-encoded), the undecodable byte as ``%FF``. SQLite only: a
    PostgreSQL URL that is not UTF-8 is refused as a usage error (above)."""
    path = os.fsencode(tmp_path) + b"/store-" + BAD + b".db"
    result = _run(b"--db", b"sqlite:///" + path, b"init", cwd=tmp_path)
    assert result.code == 0, result
    assert "unparseable" not in result.out, result
    assert f"created sqlite:///{tmp_path}/store-%FF.db (" in result.out, result
    assert os.path.exists(path)


def test_redact_url_escapes_undecodable_bytes_and_still_masks_the_password():
    from fencepost._durable import redact_url

    bad = os.fsdecode(b"x" + BAD)
    assert redact_url(f"sqlite:////tmp/{bad} %.db") == "sqlite:////tmp/x%FF %25.db"
    assert redact_url(f"postgresql://u:secret@h/{bad}?sslpassword=s2") == \
        "postgresql://u:***@h/x%FF?sslpassword=***"


def test_runs_list_flow_that_is_not_utf8_is_a_usage_error(db_url, tmp_path):
    """Found by an input hunt: ``--flow`` with bytes that are not UTF-8 reached the store and exited 1
    (``invalid_options ... flow_name contains a lone surrogate``) where a run id's exit 2."""
    fencepost.open(db_url).close()
    result = _run("--db", db_url, "runs", "list", "--flow", b"a" + BAD, cwd=tmp_path)
    _assert_usage_error_without_the_value(result, "--flow")
