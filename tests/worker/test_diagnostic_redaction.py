"""Diagnostic text (a failed run's stored message and traceback, the worker's log lines, the
command line's one-line errors) is redacted with the default rules plus rules for command lines:
password options (``-p``/``-pw``/``-P``/``-a``/``--pass`` and a value), ``-passin pass:...`` and
``curl -u user:password`` (UPSTREAM-TESTS B7 LF-03). A run function's exception often quotes the
command it ran (``subprocess.CalledProcessError``). Look-alikes (``scp -P 2222``,
``mysql -h db -P 3306``, ``sort -u``, ``cc -pthread``) are kept. Every store test runs on SQLite and
PostgreSQL."""

from __future__ import annotations

import logging
import re

import msgspec
import pytest

from fencepost.cli._output import redacted_first_line
from fencepost.journal.redaction import DEFAULT, Redaction, Rule, redact_diagnostics
from fencepost.worker import Worker

SECRET = "S3cretValue9"
LEAKY = [
    f"mysql -u root -p {SECRET}",
    f"tool -pw {SECRET}",
    f"tool -P {SECRET}",
    f"redis-cli -a {SECRET}",
    f"x --pass {SECRET}",
    f"openssl rsa -passin pass:{SECRET}",
    f"curl -u bob:{SECRET} https://example.test/",
    f"Command '['mysql', '-u', 'root', '-p', '{SECRET}']' returned non-zero exit status 1.",
    f"Authorization: Token {SECRET}",
    f"https://bob:{SECRET}@example.test/x",
    f"https://s3.example.test/o?X-Amz-Signature={SECRET}&a=1",
    # The password joined to ``-p``, as the MySQL and MariaDB clients take it (found by a secrets hunt).
    f"mysql -uroot -p{SECRET} shop",
    f"Command '['mysqldump', '-uroot', '-p{SECRET}', 'shop']' returned non-zero exit status 2.",
    f"mariadb -h db -p{SECRET}",
]
KEPT = ["scp -P 2222 a b", "mysql -h db -P 3306", "sort -u", "cc -pthread", "mysql -u root -p",
        "mkdir -p /var/lib/app", "cp -a ./build out", "install -p ../lib/x.so dst", "mkdir -p ~/cache",
        "mysql -h db -P3306 -u root -p", "gcc -pthread -o mysql main.c"]


@pytest.mark.parametrize("line", LEAKY)
def test_diagnostic_rules_hide_command_line_passwords_and_reach_a_fixed_point(line: str) -> None:
    """LF-03: each form loses its secret; redacting the result again changes nothing."""
    once = DEFAULT.diagnostic(line)
    assert SECRET not in once, once
    assert DEFAULT.diagnostic(once) == once


@pytest.mark.parametrize("line", KEPT)
def test_diagnostic_rules_leave_look_alikes_alone(line: str) -> None:
    """LF-03: options that carry no password are kept."""
    assert DEFAULT.diagnostic(line) == line


def test_payload_redaction_is_unchanged_by_the_diagnostic_rules() -> None:
    """The extra rules are for diagnostics only: a journal payload's ``-p 2`` style text is kept."""
    assert DEFAULT({"cmd": "tool -p page2"}) == {"cmd": "tool -p page2"}
    assert Redaction.noop().diagnostic(f"tool -p {SECRET}") == f"tool -p {SECRET}"


def test_a_failed_runs_stored_failure_and_log_lines_hide_command_line_passwords(store, caplog) -> None:
    """LF-03 through the worker: the run function raises with the command lines in its message;
    the stored failure (message and traceback) and every worker log record are free of the secret,
    and the command line's one-line error too."""
    store.runs.create("r", "{}")
    message = "\n".join(LEAKY + KEPT)  # one per line: a header rule takes the rest of its line

    def fn(ctx):
        raise RuntimeError(message)

    with caplog.at_level(logging.INFO, logger="fencepost.worker"):
        stats = Worker(store, fn).run(until_idle=True)
    assert stats.failed == 1
    row = store.runs.get("r")
    failure = msgspec.structs.asdict(row.failure)
    for text in (failure["message"], failure["traceback"]):
        assert SECRET not in text
        assert all(k in text for k in KEPT)
    for record in caplog.records:
        assert SECRET not in record.getMessage()
    assert SECRET not in redacted_first_line(RuntimeError(message), "")


def test_a_custom_rule_is_applied_once_to_a_failure(store) -> None:
    """Custom rules are applied once each, in order (their replacement may match their own
    pattern), on diagnostic text as on payloads. A failure's message and traceback were redacted
    twice: the store's redaction, then ``Redaction.diagnostic`` applying the textual rules again
    ("acct 1234" became "acct [acct] [acct]")."""
    rule = Rule("tag-accounts", re.compile(r"acct"), "acct [acct]")
    store.journal.redaction = Redaction(rules=[rule])
    assert store.journal.redaction({"m": "acct 1234"}) == {"m": "acct [acct] 1234"}
    store.runs.create("r", "{}")

    def fn(ctx):
        raise RuntimeError("acct 1234")

    assert Worker(store, fn).run(until_idle=True).failed == 1
    failure = store.runs.get("r").failure
    assert failure.message == "acct [acct] 1234"
    assert "RuntimeError: acct [acct] 1234\n" in failure.traceback and "[acct] [acct]" not in failure.traceback
    assert redact_diagnostics(store.journal.redaction, {"message": "acct 1"}) == {"message": "acct [acct] 1"}
