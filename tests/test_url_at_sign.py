"""Defect (found by a review, PostgreSQL URLs; a SQLite URL has no authority to hold a password, and
one with a host is refused whole): a raw ``@`` in a URL's password leaked the rest of the password.
The URL parser splits the authority at the first ``@``, so ``postgres:p4ss@Wd-TAIL@127.0.0.1`` read as
the password ``p4ss`` on the host ``Wd-TAIL@127.0.0.1``: ``redact_url`` (and with it ``OpenError``, the
command line's ``Error:`` line and the console's ``/health.json``) showed ``postgres:***@Wd-TAIL@...``,
the driver's DEBUG loggers printed the "host", the error said the host name could not be resolved,
and the journal's ``url-credentials`` rule split the same way.

Now such a URL is refused before anything connects, with a message that says to write the ``@`` as
``%40`` and never echoes the URL; ``redact_url`` and the journal's textual rule mask the authority up
to its last ``@``.
"""

from __future__ import annotations

import logging
import pickle
import subprocess

import pytest

import fencepost
from fencepost._durable import holds_secret, parse_url, redact_url
from fencepost.journal.redaction import DEFAULT, REDACTED
from tests.cli.conftest import Result, assert_one_line_error, fencepost_exe

TAIL = "Wd-TAIL-SECRET"
URLS = [
    f"postgresql+psycopg://postgres:p4ss@{TAIL}@127.0.0.1:5432/test",
    f"postgresql://postgres:p4ss@{TAIL}@127.0.0.1/test?schema=t_at",
    f"postgres://app:a@b@{TAIL}@db.example.com:6543/prod",
]


@pytest.mark.parametrize("url", URLS)
def test_redact_url_masks_the_authority_up_to_its_last_at_sign(url: str) -> None:
    shown = redact_url(url)
    assert TAIL not in shown and "p4ss" not in shown, shown
    assert ":***@" in shown and shown.count("@") == 1, shown
    assert holds_secret(url)


def test_redact_url_of_an_ordinary_url_is_unchanged() -> None:
    assert redact_url("postgresql+psycopg://app:pw@db:5432/prod") == "postgresql+psycopg://app:***@db:5432/prod"
    assert redact_url("postgresql+psycopg://app:p%40ss@db/prod") == "postgresql+psycopg://app:***@db/prod"


@pytest.mark.parametrize("url", URLS)
def test_a_raw_at_sign_in_the_password_is_refused_before_connecting(url: str, caplog) -> None:
    with pytest.raises(ValueError) as refused:
        parse_url(url)
    assert "%40" in str(refused.value)
    with caplog.at_level(logging.DEBUG), pytest.raises(ValueError) as info:
        fencepost.open(url)
    err = info.value
    text = f"{err!s} {err!r} {pickle.dumps(err)!r} {err.__cause__!r} {err.__context__!r} {caplog.text}"
    assert TAIL not in text and "p4ss" not in text, text
    assert "%40" in str(err) and "resolve" not in str(err), str(err)


def test_the_cli_refuses_a_raw_at_sign_in_one_line_without_the_url(tmp_path) -> None:
    proc = subprocess.run([fencepost_exe(), "--db", URLS[0], "runs", "list"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    result = Result(proc)
    assert_one_line_error(result)
    assert TAIL not in proc.stderr + proc.stdout and "p4ss" not in proc.stderr + proc.stdout, proc.stderr
    assert "%40" in proc.stderr, proc.stderr


def test_the_journal_rule_masks_a_url_password_up_to_the_last_at_sign() -> None:
    text = f"fetch https://svc:p4ss@{TAIL}@api.example.com/v1 failed"
    assert DEFAULT.text(text) == f"fetch https://svc:{REDACTED}@api.example.com/v1 failed"
    # An ``@`` after the authority (in the query) is not the password's.
    assert DEFAULT.text("https://svc:pw@api.example.com?to=a@b.c") == (
        f"https://svc:{REDACTED}@api.example.com?to=a@b.c")
    assert DEFAULT.text("https://svc:pw@api.example.com/u/a@b") == f"https://svc:{REDACTED}@api.example.com/u/a@b"
