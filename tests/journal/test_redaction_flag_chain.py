"""Defect (found by a review, SQLite and PostgreSQL): a credential flag right after another flag whose
name ends in a credential word was never redacted. The ``cli-flag`` rule matched ``--monkey`` (it ends
in ``key``) and took ``--password`` as its value; the value was given back unchanged (it is another
flag), but the match had consumed it, so ``--password hunter2A`` was never looked at. In a list,
``["deploy", "--no-auth", "--token", "x"]`` masked the flag ``--token`` and kept ``x``. The secret
reached stored run failures, the worker's log line, ``runs show`` and the console.

Now a flag is never taken as another flag's value: the value after the credential flag is redacted,
in text, in diagnostics and in lists, and the flags themselves are kept.
"""

from __future__ import annotations

import pytest

from fencepost.journal.redaction import DEFAULT, REDACTED, redact_diagnostics
from fencepost.worker import Worker

CHAINS = [
    ("backup --monkey --password hunter2A", "backup --monkey --password [REDACTED]"),
    ("deploy --no-auth --token hunter2B", "deploy --no-auth --token [REDACTED]"),
    ("login --use-token --api-key hunter2C", "login --use-token --api-key [REDACTED]"),
    ("run -x-key --db-password 'hunter2D'", "run -x-key --db-password [REDACTED]"),
]


@pytest.mark.parametrize(("text", "expected"), CHAINS)
def test_a_credential_flag_after_a_flag_is_redacted_in_text(text, expected):
    assert DEFAULT.text(text) == expected
    assert DEFAULT.diagnostic(text) == expected
    assert DEFAULT({"cmd": text}) == {"cmd": expected}
    assert redact_diagnostics(DEFAULT, {"message": text}) == {"message": expected}


def test_the_control_and_a_flag_value_that_is_not_a_flag_are_unchanged():
    assert DEFAULT.text("--verbose --password x") == f"--verbose --password {REDACTED}"
    # A non-credential flag's value, and a credential flag followed by a plain flag, stay readable.
    assert DEFAULT.text("--monkey banana --verbose") == "--monkey banana --verbose"
    assert DEFAULT.text("--no-auth --verbose") == "--no-auth --verbose"


@pytest.mark.parametrize(("items", "expected"), [
    (["deploy", "--no-auth", "--token", "hunter2E"], ["deploy", "--no-auth", "--token", REDACTED]),
    (["backup", "--monkey", "--password", "hunter2F"], ["backup", "--monkey", "--password", REDACTED]),
    (["--api-key", "--token", "hunter2G"], ["--api-key", "--token", REDACTED]),
    (["--password", "hunter2H", "--verbose"], ["--password", REDACTED, "--verbose"]),
])
def test_a_credential_flag_after_a_credential_flag_is_redacted_in_a_list(items, expected):
    assert DEFAULT(items) == expected
    assert DEFAULT({"argv": tuple(items)}) == {"argv": expected}


def test_a_credential_flag_in_a_quoted_argument_list_is_redacted():
    # ``subprocess.CalledProcessError`` quotes the argument list this way.
    text = "Command '['deploy', '--no-auth', '--token', 'hunter2I', '--max-tokens', '40']' returned 1"
    assert DEFAULT.text(text) == (
        f"Command '['deploy', '--no-auth', '--token', {REDACTED}, '--max-tokens', '40']' returned 1")


def _fail_with(ctx):
    raise RuntimeError(MESSAGES[ctx.run_id])


MESSAGES = {
    "r-monkey": "deploy failed: tool --monkey --password hunter2A",
    "r-noauth": "deploy failed: tool --no-auth --token hunter2B",
    "r-list": "deploy failed: ['deploy', '--no-auth', '--token', 'hunter2E']",
}


def test_a_run_failure_keeps_no_secret_after_a_flag_chain(store):
    for run_id in MESSAGES:
        store.runs.create(run_id, "{}")
    assert Worker(store, _fail_with).run(until_idle=True).failed == len(MESSAGES)
    for run_id in MESSAGES:
        failure = store.runs.get(run_id).failure
        assert failure is not None
        for secret in ("hunter2A", "hunter2B", "hunter2E"):
            assert secret not in failure.message and secret not in failure.traceback
    assert "--monkey --password [REDACTED]" in store.runs.get("r-monkey").failure.message
