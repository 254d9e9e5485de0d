"""Defect (found by a review, SQLite and PostgreSQL): common credential shapes passed the textual
rules or were half redacted, and reached stored run failures, logs, ``runs show`` and the console:

- ``password => x`` (and ``password := x``): the ``>`` (``=``) was taken as the value, ``x`` kept;
- ``<password>x</password>``: an XML element was not a credential shape;
- ``[('user', 'bob'), ('password', 'x')]``: a Python repr of (name, value) pairs was kept;
- ``{'name': 'PGPASSWORD', 'value': 'x'}`` as a Python repr (or JSON inside longer text) was kept,
  though the same record as a whole JSON text was redacted, and ``{"key": "DB_PASSWORD",
  "val": "x"}`` masked the name and kept the value.

Now each redacts the value. (A YAML value on the next line, or a YAML block scalar, is not handled:
it is not one line of text the rules can read without a YAML parser.)
"""

from __future__ import annotations

import pytest

from fencepost.journal.redaction import DEFAULT, REDACTED
from fencepost.worker import Worker

R = REDACTED


@pytest.mark.parametrize(("text", "expected"), [
    ("password => hunter2A", f"password => {R}"),
    ("{:api_key => 'hunter2A', :user => 'bob'}", f"{{:api_key => {R}, :user => 'bob'}}"),
    ("password := hunter2A", f"password := {R}"),
    ("SOAP fault: <password>hunter2B</password> <user>bob</user>",
     f"SOAP fault: <password>{R}</password> <user>bob</user>"),
    ('<ns:ApiKey type="x">hunter2B</ns:ApiKey>', f'<ns:ApiKey type="x">{R}</ns:ApiKey>'),
    ("bad params: [('user', 'bob'), ('password', 'hunter2C')]", f"bad params: [('user', 'bob'), ('password', '{R}')]"),
    ('headers [("Authorization", "Bearer hunter2C"), ("Accept", "*/*")]', None),
    ("env record {'name': 'PGPASSWORD', 'value': 'hunter2D'}", f"env record {{'name': 'PGPASSWORD', 'value': '{R}'}}"),
    ('got {"key": "DB_PASSWORD", "val": "hunter2D"} from env', None),
    ("{'Name': 'api_token', 'Value': \"it's-hunter2D\"}", f"{{'Name': 'api_token', 'Value': \"{R}\"}}"),
])
def test_the_value_is_redacted(text: str, expected: str | None) -> None:
    for out in (DEFAULT.text(text), DEFAULT.diagnostic(text), DEFAULT({"m": text})["m"]):
        assert "hunter2" not in out, out
        if expected is not None:
            assert out == expected
        assert DEFAULT.text(out) == out  # a fixed point


@pytest.mark.parametrize("text", [
    "x => y", "monkey => banana", "<user>bob</user>", "<token_count>5</token_count>",
    "[('user', 'bob'), ('tokens', 3)]", "{'name': 'region', 'value': 'eu-west-1'}", "a := b",
    "[('mode', 'password')]",
])
def test_what_is_not_a_credential_is_kept(text: str) -> None:
    assert DEFAULT.text(text) == text


def test_a_structural_record_with_a_val_member_redacts_the_value() -> None:
    assert DEFAULT({"key": "DB_PASSWORD", "val": "hunter2E"}) == {"key": "DB_PASSWORD", "val": R}
    assert DEFAULT({"key": "region", "val": "eu"}) == {"key": "region", "val": "eu"}


MESSAGES = {
    "r-arrow": "password => hunter2F",
    "r-xml": "SOAP fault: <password>hunter2G</password>",
    "r-tuple": "bad params: [('user', 'bob'), ('password', 'hunter2H')]",
    "r-repr": "env record {'name': 'PGPASSWORD', 'value': 'hunter2I'}",
}


def _fail_with(ctx):
    raise RuntimeError(MESSAGES[ctx.run_id])


def test_a_run_failure_keeps_none_of_these_secrets(store):
    for run_id in MESSAGES:
        store.runs.create(run_id, "{}")
    assert Worker(store, _fail_with).run(until_idle=True).failed == len(MESSAGES)
    for run_id in MESSAGES:
        failure = store.runs.get(run_id).failure
        assert failure is not None and "hunter2" not in failure.message and "hunter2" not in failure.traceback
