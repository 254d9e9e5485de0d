"""Credential shapes the journal's redaction missed, one case per shape.

Each case was stored verbatim in the journal before: ``pwd``/``passwd`` names, HTTP header lines
inside text (``Authorization: Token ...``, ``Cookie: a=...``), header pairs as lists, name/value
records (``{"name": "password", "value": ...}``), a URL with an empty user (``redis://:pw@host``),
query strings with several credentials (the whole tail was swallowed, or the second kept), JSON
text carrying a name/value record, Python-repr text (``{'password': 'x'}``).
"""

from __future__ import annotations

import json
import subprocess

import pytest

import fencepost
from fencepost.journal.redaction import DEFAULT, REDACTED, REDACTED_TOKEN
from tests.cli.conftest import fencepost_exe
from tests.journal.conftest import rows

S = "hunter2XYZ"  # the secret every leaking case carries

LEAKS: list[tuple[str, object, object]] = [
    # --- pwd / passwd names
    ("key-pwd", {"pwd": S}, {"pwd": REDACTED}),
    ("key-passwd", {"passwd": S}, {"passwd": REDACTED}),
    ("key-db_pwd", {"DB_PWD": S}, {"DB_PWD": REDACTED}),
    ("key-user_passwd", {"user_passwd": S}, {"user_passwd": REDACTED}),
    ("text-pwd", f"pwd={S}", f"pwd={REDACTED}"),
    ("text-passwd", f"passwd: {S}", f"passwd: {REDACTED}"),
    ("odbc-pwd", f"Server=db;Uid=sa;Pwd={S};", f"Server=db;Uid=sa;Pwd={REDACTED};"),
    ("flag-pwd", f"mysql --pwd {S}", f"mysql --pwd {REDACTED}"),
    ("flag-list-passwd", ["mysql", "--passwd", S], ["mysql", "--passwd", REDACTED]),
    # --- HTTP header lines inside text
    ("header-token-scheme", f"Authorization: Token {S}", f"Authorization: Token {REDACTED_TOKEN}"),
    ("header-no-scheme", f"authorization: {S}", f"authorization: {REDACTED}"),
    ("header-digest", f"Proxy-Authorization: Digest username=bob, response={S}",
     f"Proxy-Authorization: Digest {REDACTED_TOKEN}"),
    ("header-in-curl", f"curl -H 'Authorization: Token {S}' https://x",
     f"curl -H 'Authorization: Token {REDACTED_TOKEN}' https://x"),
    ("header-block", f"GET / HTTP/1.1\r\nAuthorization: Token {S}\r\nHost: x\r\n",
     f"GET / HTTP/1.1\r\nAuthorization: Token {REDACTED_TOKEN}\r\nHost: x\r\n"),
    ("cookie-header", f"Cookie: theme=dark; auth={S}", f"Cookie: theme={REDACTED}; auth={REDACTED}"),
    ("cookie-in-curl", f'curl -H "Cookie: a={S}" https://x', f'curl -H "Cookie: a={REDACTED}" https://x'),
    ("set-cookie-attributes", f"set-cookie: id={S}; Path=/; Max-Age=60; Secure",
     f"set-cookie: id={REDACTED}; Path=/; Max-Age=60; Secure"),
    # --- header pairs as lists (requests/ASGI/HAR style)
    ("header-pairs", {"headers": [["Authorization", f"Bearer {S}"], ["Cookie", f"a={S}"], ["Accept", "*/*"]]},
     {"headers": [["Authorization", REDACTED], ["Cookie", REDACTED], ["Accept", "*/*"]]}),
    ("header-tuples", {"headers": [("X-Api-Key", S), ("Host", "x")]},
     {"headers": [["X-Api-Key", REDACTED], ["Host", "x"]]}),
    # --- name/value records
    ("name-value", {"name": "password", "value": S}, {"name": "password", "value": REDACTED}),
    ("key-value", [{"key": "api_token", "value": S}], [{"key": "api_token", "value": REDACTED}]),
    ("aws-name-value", {"Name": "DB_PASSWORD", "Value": S}, {"Name": "DB_PASSWORD", "Value": REDACTED}),
    ("k8s-env", {"env": [{"name": "PGPASSWORD", "value": S}, {"name": "HOME", "value": "/root"}]},
     {"env": [{"name": "PGPASSWORD", "value": REDACTED}, {"name": "HOME", "value": "/root"}]}),
    ("name-value-nested", {"name": "credentials", "value": {"user": "u", "pass": S}},
     {"name": "credentials", "value": REDACTED}),
    ("har-header", {"name": "Cookie", "value": f"sid={S}"}, {"name": "Cookie", "value": REDACTED}),
    # --- URLs
    ("url-empty-user", f"redis://:{S}@cache:6379/0", f"redis://:{REDACTED}@cache:6379/0"),
    ("query-two-tokens", f"https://x.test/cb?token={S}&access_token={S}&page=2",
     f"https://x.test/cb?token={REDACTED}&access_token={REDACTED}&page=2"),
    ("query-after-dsn", f"postgresql://app@db/main?password={S}&sslmode=require",
     f"postgresql://app@db/main?password={REDACTED}&sslmode=require"),
    ("query-aws-presigned", f"https://b.s3.test/k?X-Amz-Credential={S}&X-Amz-Date=20240101&X-Amz-Signature={S}",
     f"https://b.s3.test/k?X-Amz-Credential={REDACTED}&X-Amz-Date=20240101&X-Amz-Signature={REDACTED}"),
    ("query-azure-sas", f"https://a.blob.test/c/b?sv=2022-11-02&sig={S}", f"https://a.blob.test/c/b?sv=2022-11-02&sig={REDACTED}"),
    # --- text that is JSON, or a Python repr
    ("json-text-pwd", {"body": json.dumps({"pwd": S})}, {"body": json.dumps({"pwd": REDACTED})}),
    ("json-text-name-value", {"body": json.dumps({"name": "password", "value": S})},
     {"body": json.dumps({"name": "password", "value": REDACTED})}),
    ("json-text-key-value", json.dumps([{"key": "api_token", "value": S}], separators=(",", ":")),
     json.dumps([{"key": "api_token", "value": REDACTED}])),
    ("json-text-flag-list", json.dumps(["deploy", "--password", S]), json.dumps(["deploy", "--password", REDACTED])),
    ("json-text-header-pairs", json.dumps({"headers": [["Cookie", f"a={S}"]]}),
     json.dumps({"headers": [["Cookie", REDACTED]]})),
    ("repr-password", f"{{'password': '{S}', 'user': 'bob'}}", f"{{'password': '{REDACTED}', 'user': 'bob'}}"),
    ("repr-pwd", f"{{'pwd': '{S}'}}", f"{{'pwd': '{REDACTED}'}}"),
    # --- a value holding a quote: Python writes it in the other quotes, or escapes it; JSON escapes it
    ("repr-double-quoted-value", f"got {{'password': \"it's {S}\"}}", f"got {{'password': \"{REDACTED}\"}}"),
    ("repr-escaped-quote", f"got {{'password': 'it\\'s \"{S}\"', 'user': 'bob'}}",
     f"got {{'password': '{REDACTED}', 'user': 'bob'}}"),
    ("json-in-text-escaped-quote", f'body: {{"password": "a\\"{S}", "note": "say \\"hi\\""}}',
     f'body: {{"password": "{REDACTED}", "note": "say \\"hi\\""}}'),
    ("json-in-text-escaped-twice", "body: " + json.dumps(f'{{"password": "a\\"{S}"}}')[1:-1],
     "body: " + json.dumps(f'{{"password": "{REDACTED}"}}')[1:-1]),
    # --- bytes
    ("bytes-value", {"data": f"password={S}".encode()}, {"data": "[bytes 19 bytes]"}),
    ("bytes-under-sensitive-key", {"password": S.encode()}, {"password": REDACTED}),
    ("bytes-header-pair", {"headers": [(b"authorization", f"Bearer {S}".encode())]},
     {"headers": [["[bytes 13 bytes]", "[bytes 17 bytes]"]]}),
    ("bytearray-memoryview", {"a": bytearray(S.encode()), "b": memoryview(S.encode())},
     {"a": "[bytearray 10 bytes]", "b": "[memoryview 10 bytes]"}),
]

KEPT: list[tuple[str, object]] = [
    ("keyboard", "keyboard"),
    ("tokenizer", {"tokenizer": "cl100k", "text": "tokenizer=cl100k"}),
    ("monkey", "monkey=banana"),
    ("turkey", "turkey=roast"),
    ("author", "author=alice"),
    ("prose-password", "the password is wrong"),
    ("prose-passwd", "edit the passwd file"),
    ("prose-authorization", "Authorization failed for user bob"),
    ("token-bucket", "token bucket refilled"),
    ("counter-assignment", "max_tokens=4096 and ?max_tokens=4096"),
    ("query-plain", "https://example.test/search?q=a=b&page=2&code=US"),
    ("name-value-plain", {"name": "HOME", "value": "/root"}),
    ("key-value-plain", [{"key": "region", "value": "eu-west-1"}]),
    ("name-value-counter", {"name": "maxTokens", "value": 4096}),
    ("two-word-tags", {"tags": ["auth", "login"]}),
    ("pairs-plain", [["status", "ok"], ["Accept", "*/*"]]),
    ("json-text-plain", '{"name":"HOME","value":"/root"}'),
    ("json-like-broken", '{"name": "password", "value": '),
]


@pytest.mark.parametrize(("value", "expected"), [c[1:] for c in LEAKS], ids=[c[0] for c in LEAKS])
def test_credential_shape_is_redacted(value: object, expected: object) -> None:
    """The secret never survives; the rest of the value is kept as it was."""
    out = DEFAULT(value)
    assert out == expected
    assert S not in json.dumps(out)


@pytest.mark.parametrize("value", [c[1] for c in KEPT], ids=[c[0] for c in KEPT])
def test_harmless_shape_is_kept(value: object) -> None:
    """Words that merely contain a credential word, counters and plain records are not rewritten."""
    assert DEFAULT(value) == json.loads(json.dumps(value))


@pytest.mark.parametrize("value", [c[1] for c in LEAKS] + [c[1] for c in KEPT],
                         ids=[c[0] for c in LEAKS] + [c[0] for c in KEPT])
def test_redacting_twice_is_redacting_once(value: object) -> None:
    """Idempotence: the stored form passes through the redactor unchanged."""
    once = DEFAULT(value)
    assert DEFAULT(once) == once


def test_stored_entry_and_journal_show_carry_no_secret(store: fencepost.Store, db_url: str) -> None:
    """Every shape above appended as one payload (and one meta): neither the stored row nor the
    ``journal show --json`` output holds the secret, and the output is the redacted value."""
    payload = {f"case{i}": c[1] for i, c in enumerate(LEAKS)}  # the ids name credentials: not as keys
    store.runs.create("r-1", "{}")
    store.journal.append_unfenced("r-1", "http.call", payload, source_id="engine",
                                  meta={"request": f"Authorization: Token {S}", "env": [{"name": "pwd", "value": S}]})
    (row,) = rows(store, "r-1")
    stored = store.db.read(lambda c: c.exec_driver_sql(
        "SELECT payload_json, meta_json FROM flows_journal_events").one())
    assert S not in row[4] and all(S not in cell for cell in stored)
    shown = subprocess.run([fencepost_exe(), "--db", db_url, "journal", "show", "r-1", "--json"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert S not in shown.stdout + shown.stderr
    (entry,) = json.loads(shown.stdout)["entries"]
    assert entry["payload"] == {f"case{i}": c[2] for i, c in enumerate(LEAKS)}
    assert entry["meta"] == {"request": f"Authorization: Token {REDACTED_TOKEN}",
                             "env": [{"name": "pwd", "value": REDACTED}]}
