"""``Authorization:`` inside text: status prose is kept, credentials are not.

A carried finding: a payload or meta string such as ``"authorization: denied"`` (a status message,
not a credential) was stored as ``"authorization: [REDACTED]"``, and ``"authorization: denied by
policy"`` as ``"authorization: denied [REDACTED_TOKEN]"``. The journal's redaction rules are
key and pattern based (REFERENCE 3.6: bearer, basic, assignment of a KEY/TOKEN/SECRET/PASSWORD/
CREDENTIAL name ...); under them such a sentence holds no secret. The header rule now leaves a
value that reads as plain words alone, and still redacts every value that carries a scheme we know
or anything shaped like a credential (digits, token punctuation, mixed case, a long word), and
every value that does not begin with a status word (a password may be a plain word).
"""

from __future__ import annotations

import json

import pytest

import fencepost
from fencepost.journal.redaction import DEFAULT, REDACTED, REDACTED_TOKEN

#: (id, text, redacted text): every credential is replaced.
REDACTED_CASES: list[tuple[str, str, str]] = [
    ("bearer", "Authorization: Bearer abcdefghijkl", f"Authorization: Bearer {REDACTED_TOKEN}"),
    ("bearer-lower", "authorization: bearer abcdefghijkl", f"authorization: bearer {REDACTED_TOKEN}"),
    ("basic-colon", "Authorization: Basic dXNlcjpwYXNz", f"Authorization: Basic {REDACTED_TOKEN}"),
    ("basic-equals", "authorization=Basic dXNlcjpwYXNz", f"authorization=Basic {REDACTED_TOKEN}"),
    ("token-scheme", "Authorization: Token hunter2XYZ", f"Authorization: Token {REDACTED_TOKEN}"),
    ("known-scheme-plain-word", "Authorization: Token letmein", f"Authorization: Token {REDACTED_TOKEN}"),
    ("known-scheme-lower", "authorization: apikey swordfish", f"authorization: apikey {REDACTED_TOKEN}"),
    ("digest", "Proxy-Authorization: Digest username=bob, response=abc",
     f"Proxy-Authorization: Digest {REDACTED_TOKEN}"),
    ("negotiate", "Authorization: Negotiate YIIabc", f"Authorization: Negotiate {REDACTED_TOKEN}"),
    ("bare-with-digits", "authorization: hunter2XYZ", f"authorization: {REDACTED}"),
    ("bare-hex", "Authorization: 0123456789abcdef", f"Authorization: {REDACTED}"),
    ("bare-mixed-case", "Authorization: sEcReTvAlUe", f"Authorization: {REDACTED}"),
    ("bare-all-caps", "Authorization: JBSWYDPEHPKPXPQR", f"Authorization: {REDACTED}"),
    ("bare-long-word", "authorization: abcdefghijklmnopqrst", f"authorization: {REDACTED}"),
    ("bare-token-chars", "authorization: abc.def_ghi", f"authorization: {REDACTED}"),
    ("unknown-scheme-credential", "Authorization: Custom abc123", f"Authorization: Custom {REDACTED_TOKEN}"),
    ("bare-plain-word", "authorization: letmein", f"authorization: {REDACTED}"),
    ("plain-words", "Authorization: correct horse battery", f"Authorization: correct {REDACTED_TOKEN}"),
    ("unknown-scheme-plain-word", "authorization: Custom swordfish", f"authorization: Custom {REDACTED_TOKEN}"),
    ("prose-then-credential", "authorization: denied, retry with hunter2XYZ", f"authorization: {REDACTED}"),
    ("in-a-sentence", "sent Authorization: Bearer abcdefghijkl upstream",
     f"sent Authorization: Bearer {REDACTED_TOKEN}"),
]

#: (id, text): status prose after ``authorization:`` holds no secret and is kept as written.
KEPT_CASES: list[tuple[str, str]] = [
    ("denied", "authorization: denied"),
    ("denied-capitalised", "Authorization: Denied"),
    ("failed", "authorization: failed"),
    ("denied-by-policy", "status: authorization: denied by policy"),
    ("denied-parenthesised", "authorization: denied (expired)"),
    ("sentence", "Authorization: required for this project."),
    ("proxy", "proxy-authorization: missing"),
    ("header-block-prose", "HTTP/1.1 401\r\nauthorization: denied\r\nRetry-After: never"),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in REDACTED_CASES], ids=[c[0] for c in REDACTED_CASES])
def test_authorization_credentials_are_redacted(text: str, expected: str) -> None:
    assert DEFAULT(text) == expected
    assert DEFAULT({"status": text}) == {"status": expected}
    assert DEFAULT(expected) == expected  # redacting twice is redacting once


@pytest.mark.parametrize("text", [c[1] for c in KEPT_CASES], ids=[c[0] for c in KEPT_CASES])
def test_authorization_status_prose_is_kept(text: str) -> None:
    assert DEFAULT(text) == text
    assert DEFAULT({"meta": {"status": text}}) == {"meta": {"status": text}}


def test_a_member_named_authorization_is_still_redacted_whatever_it_holds() -> None:
    """The key rule is unchanged: the value under an ``authorization`` member is redacted even
    when it is a plain word."""
    assert DEFAULT({"authorization": "denied"}) == {"authorization": REDACTED}
    assert DEFAULT('{"authorization": "denied"}') == f'{{"authorization": "{REDACTED}"}}'


def test_stored_entry_keeps_the_status_and_loses_the_credential(store: fencepost.Store) -> None:
    """Through the journal's write path on each backend: the status message is stored as written,
    the credential beside it is not."""
    store.runs.create("r-1", "{}")
    store.journal.append_unfenced("r-1", "http.call", {"status": "authorization: denied by policy",
                                                       "request": "Authorization: Bearer abcdefghijkl"},
                                  source_id="engine", meta={"status": "authorization: denied"})
    stored = store.db.read(lambda c: c.exec_driver_sql(
        "SELECT payload_json, meta_json FROM flows_journal_events").one())
    assert "abcdefghijkl" not in stored[0] + stored[1]
    assert json.loads(stored[0]) == {"status": "authorization: denied by policy",
                                     "request": f"Authorization: Bearer {REDACTED_TOKEN}"}
    assert json.loads(stored[1]) == {"status": "authorization: denied"}


def test_a_second_header_inside_the_prose_is_not_swallowed() -> None:
    """One header match runs to the end of the line: prose followed by another header line on the
    same line must not let that header's credential through with it."""
    assert DEFAULT("authorization: denied Authorization: Token letmein") == f"authorization: denied {REDACTED_TOKEN}"
    assert "letmein" not in DEFAULT("authorization: denied, resend with token letmein")
