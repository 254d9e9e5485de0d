"""Credentials written as free text in diagnostics (a failure's message and traceback, a log line,
an error line) that the textual rules missed, each beside look-alikes that must be kept:

* ``auth=``, ``cookie=``, ``dsn=``, ``signature=``, ``pw=`` and ``pwd=`` assignments (the names the
  structural rule already treats as credentials in objects); the ``Authorization: Bearer`` and
  ``Authorization: Basic`` header forms are redacted exactly as before;
* percent-encoded assignments in URLs and query strings (``password%3Dx``, ``pwd%3Dx``), including
  a PostgreSQL URL's ``options=-c app.password=...`` in either encoding;
* well-known token shapes with an unambiguous prefix and length (Stripe, GitLab, npm, PyPI,
  SendGrid).

Every row is checked on the diagnostic path (``Redaction.diagnostic``), on the journal's payload
path (the textual rules apply to every string of a payload too), and for the fixed point (redacting
the result again changes nothing).
"""

from __future__ import annotations

import logging
import time

import msgspec
import pytest

import fencepost
from fencepost.journal.redaction import DEFAULT, REDACTED, REDACTED_API_KEY, REDACTED_TOKEN, is_sensitive_key
from fencepost.worker import Worker

SECRET = "hunter2Q9"
STRIPE_LIVE = "sk_live_" + "51H8aBcDeFgHiJkLmNoPqRsT"  # 24 after the prefix
STRIPE_TEST = "sk_test_" + "4eC39HqLyjWDarjtT1zdp7dc"
STRIPE_RESTRICTED = "rk_live_" + "51H8aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"
STRIPE_WEBHOOK = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # 32 after the prefix
GITLAB = "glpat-" + "xYz12AbC3dEf4GhI5jKl"  # 20 after the prefix
NPM = "npm_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3fG5"  # 36 after the prefix
PYPI = "pypi-AgEIcHlwaS5vcmc" + "CJDBiZjEyMzQ1Ni03ODkwLTQxMjMtYWJjZC1lZjAxMjM0NTY3ODkAAishsk"
SENDGRID = "SG." + "aBcDeFgHiJkLmNoPqRsTuV" + "." + "aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789_-aBcDe"  # 22 . 43

#: (id, text, redacted text): every credential is replaced, the text around it kept.
REDACTED_CASES: list[tuple[str, str, str]] = [
    # ---- assignments of a credential name
    ("auth", f"connect failed: auth={SECRET} host=db", f"connect failed: auth={REDACTED} host=db"),
    ("auth-colon", f"auth: {SECRET}", f"auth: {REDACTED}"),
    ("auth-suffix", f"basic_auth={SECRET}", f"basic_auth={REDACTED}"),
    ("x-auth-header", f"X-Auth: {SECRET}", f"X-Auth: {REDACTED}"),
    ("auth-basic-scheme", "auth: Basic dXNlcjpwYXNz", f"auth: {REDACTED} {REDACTED_TOKEN}"),
    ("auth-bearer-scheme", "auth=Bearer abcdefghijkl", f"auth={REDACTED} {REDACTED_TOKEN}"),
    ("cookie", f"cookie={SECRET}; path=/", f"cookie={REDACTED}; path=/"),
    ("cookie-suffix", f"session_cookie={SECRET}", f"session_cookie={REDACTED}"),
    ("dsn", f"bad dsn={SECRET} given", f"bad dsn={REDACTED} given"),
    ("dsn-url-password", f"dsn=postgresql://app:{SECRET}@db/prod", f"dsn=postgresql://app:{REDACTED}@db/prod"),
    ("dsn-url-parameter", f"DATABASE_DSN=postgresql://db/prod?password={SECRET}&sslmode=require",
     f"DATABASE_DSN=postgresql://db/prod?password={REDACTED}&sslmode=require"),
    ("dsn-quoted", f'dsn="host=db password={SECRET}"', f"dsn={REDACTED}"),
    ("signature", f"upload failed: signature={SECRET}", f"upload failed: signature={REDACTED}"),
    ("signature-header", f"X-Hub-Signature: sha256={SECRET}", f"X-Hub-Signature: {REDACTED}"),
    ("pw", f"login pw={SECRET} user=bob", f"login pw={REDACTED} user=bob"),
    ("pw-upper", f"DB_PW={SECRET}", f"DB_PW={REDACTED}"),
    ("pw-dotted", f"app.pw: {SECRET}", f"app.pw: {REDACTED}"),
    ("pwd", f"login pwd={SECRET} user=bob", f"login pwd={REDACTED} user=bob"),
    # ---- a scheme and its credential as an assignment's value: both are the value (the
    # credential after ``Basic`` was left readable)
    ("api-key-basic-scheme", "api_key=Basic dXNlcjpwYXNzd29yZA== rest", f"api_key={REDACTED} rest"),
    ("token-bearer-scheme", f"token: Bearer {SECRET}xyz next", f"token: {REDACTED} {REDACTED_TOKEN} next"),
    # ---- Azure connection strings: the account key and the shared access key
    ("azure-account-key",
     f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={SECRET}+ab/cd==;EndpointSuffix=core.windows.net",
     f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={REDACTED};EndpointSuffix=core.windows.net"),
    ("azure-shared-access-key",
     f"Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey={SECRET}=",
     f"Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey={REDACTED}"),
    ("master-key", f"cosmos MasterKey={SECRET}", f"cosmos MasterKey={REDACTED}"),
    ("flag-dsn", f"tool --dsn {SECRET}", f"tool --dsn {REDACTED}"),
    # ---- a look-alike name's value is still read: the credential inside it is found
    ("inside-pw-look-alike", f"mpw=password={SECRET}", f"mpw=password={REDACTED}"),
    ("inside-key-look-alike", f"monkey=api_key={SECRET}", f"monkey=api_key={REDACTED}"),
    ("flag-pw", f"tool --pw {SECRET}", f"tool --pw {REDACTED}"),
    # ---- percent-encoded
    ("encoded-password-param", f"GET /login?user=a&password%3D{SECRET}&x=1",
     f"GET /login?user=a&password%3D{REDACTED}&x=1"),
    ("encoded-in-encoded-url", f"next=%2Flogin%3Fpassword%3D{SECRET}%26page%3D2",
     f"next=%2Flogin%3Fpassword%3D{REDACTED}%26page%3D2"),
    ("encoded-pwd", f"pwd%3D{SECRET}", f"pwd%3D{REDACTED}"),
    ("encoded-lowercase", f"token%3d{SECRET}", f"token%3d{REDACTED}"),
    ("encoded-twice", f"password%253D{SECRET}%2526a%253D1", f"password%253D{REDACTED}%2526a%253D1"),
    ("encoded-value-chars", f"password%3D{SECRET}%21%40x%20next", f"password%3D{REDACTED}%20next"),
    ("encoded-after-question", f"?password%3D{SECRET}", f"?password%3D{REDACTED}"),
    ("encoded-key-after-escape", f"a%2Fkey={SECRET}", f"a%2Fkey={REDACTED}"),
    ("encoded-pw-after-space", f"-c%20pw={SECRET}", f"-c%20pw={REDACTED}"),
    # ---- PostgreSQL ``options`` in an open error line
    ("pg-options-plain", f'connection to "postgresql://app@db:5432/shop?options=-c app.password={SECRET}" failed',
     f'connection to "postgresql://app@db:5432/shop?options=-c app.password={REDACTED}" failed'),
    ("pg-options-encoded-space", f"postgresql://app@db/shop?options=-c%20app.password={SECRET}&sslmode=require",
     f"postgresql://app@db/shop?options=-c%20app.password={REDACTED}&sslmode=require"),
    ("pg-options-encoded", f"open failed: postgresql://app@db/shop?options=-c%20app.pw%3D{SECRET}&sslmode=require",
     f"open failed: postgresql://app@db/shop?options=-c%20app.pw%3D{REDACTED}&sslmode=require"),
    ("pg-options-encoded-password", f"postgresql://app@db/shop?options=-c%20app.password%3D{SECRET}",
     f"postgresql://app@db/shop?options=-c%20app.password%3D{REDACTED}"),
    ("pg-options-two", f"?options=-c%20statement_timeout%3D5000%20-c%20app.secret%3D{SECRET}",
     f"?options=-c%20statement_timeout%3D5000%20-c%20app.secret%3D{REDACTED}"),
    ("pg-keywords-quoted-options", f"host=db options='-c app.pw={SECRET}' dbname=shop",
     f"host=db options='-c app.pw={REDACTED}' dbname=shop"),
    # ---- token shapes
    ("stripe-live", f"stripe error for key {STRIPE_LIVE}.", f"stripe error for key {REDACTED_API_KEY}."),
    ("stripe-test", f"({STRIPE_TEST})", f"({REDACTED_API_KEY})"),
    ("stripe-restricted", STRIPE_RESTRICTED, REDACTED_API_KEY),
    ("stripe-webhook-secret", f"secret {STRIPE_WEBHOOK} rejected", f"secret {REDACTED_API_KEY} rejected"),
    ("gitlab", f"clone with {GITLAB} failed", f"clone with {REDACTED} failed"),
    ("npm", f"//registry.npmjs.org/:_authToken={NPM}", f"//registry.npmjs.org/:_authToken={REDACTED}"),
    ("npm-bare", f"npm token {NPM} expired", f"npm token {REDACTED} expired"),
    ("pypi", f"upload with {PYPI} refused", f"upload with {REDACTED} refused"),
    ("sendgrid", f"mail: {SENDGRID}", f"mail: {REDACTED}"),
]

#: (id, text): look-alikes of the forms above, kept as written.
KEPT_CASES: list[tuple[str, str]] = [
    ("author", "author=Bob"),
    ("shared-access-key-name", "SharedAccessKeyName=RootManageSharedAccessKey"),
    ("account-name", "AccountName=acct"),
    ("basic-in-prose", "monkey=Basic words here"),
    ("authority", "authority=example.com"),
    ("authored", "authored: Bob, 2024"),
    ("authenticated", "authenticated=true"),
    ("auth-method", "auth_method=scram-sha-256"),
    ("oauth-version", "oauth_version=1.0"),
    ("auth-prose", "the auth service is down"),
    ("authorization-bearer", f"Authorization: Bearer {REDACTED_TOKEN}"),
    ("dsn-count", "dsn_count=3"),
    ("dsn-prose", "check the DSN and retry"),
    ("dsn-url-without-secret", "dsn=postgresql://app@db/prod?sslmode=require"),
    ("signatures-count", "signatures=2"),
    ("signature-valid", "signature_valid=false"),
    ("signature-version", "signature_version=4"),
    ("signature-prose", "the signature did not match"),
    ("cookies-count", "cookies=3"),
    ("cookiejar", "cookiejar=/tmp/jar.txt"),
    ("cookie-prose", "cookie policy accepted"),
    ("pw-in-word", "mpw=3 kpw=4 pwm=5"),
    ("pwned", "pwned=0"),
    ("pw-prose", "pw reset link sent"),
    ("encoded-page", "?q=a%3Db&page%3D2"),
    ("encoded-monkey", "monkey%3Dbanana"),
    ("encoded-author", "next=%2Fbooks%3Fauthor%3DBob"),
    ("encoded-counter", "max_tokens%3D4096"),
    ("encoded-passwordless", "passwordless%3Dtrue"),
    ("encoded-redirect", "https%3A%2F%2Fexample.com%2Fcallback"),
    ("pg-options-harmless", "postgresql://app@db/shop?options=-c%20statement_timeout%3D5000&sslmode=require"),
    ("pg-options-search-path", "options=-c search_path=shop"),
    ("stripe-publishable", "pk_live_51H8aBcDeFgHiJkLmNoPqRsT"),
    ("stripe-short", "sk_live_mode and sk_test_helpers"),
    ("stripe-in-word", "task_test_abcdefghijklmnopqrstuvwx"),
    ("whsec-short", "whsec_short"),
    ("gitlab-short", "glpat-short"),
    ("npm-env", "npm_config_cache=/tmp/npm npm_package_version=1.2.3"),
    ("npm-short", "npm_abcdefghij"),
    ("pypi-other", "pypi-simple-index"),
    ("sendgrid-short", "SG.example.com"),
    ("english", "The author signed with a cookie-cutter signature; the authority's DSN count is 3."),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in REDACTED_CASES], ids=[c[0] for c in REDACTED_CASES])
def test_free_text_credentials_are_redacted(text: str, expected: str) -> None:
    assert DEFAULT.diagnostic(text) == expected
    assert DEFAULT({"line": text}) == {"line": expected}
    assert DEFAULT.diagnostic(expected) == expected  # redacting twice is redacting once


@pytest.mark.parametrize("text", [c[1] for c in KEPT_CASES], ids=[c[0] for c in KEPT_CASES])
def test_free_text_look_alikes_are_kept(text: str) -> None:
    assert DEFAULT.diagnostic(text) == text
    assert DEFAULT({"line": text}) == {"line": text}


@pytest.mark.parametrize(
    ("text", "expected"),
    [("Authorization: Bearer abcdefghijkl", f"Authorization: Bearer {REDACTED_TOKEN}"),
     ("Authorization: Basic dXNlcjpwYXNz", f"Authorization: Basic {REDACTED_TOKEN}"),
     ("authorization=Basic dXNlcjpwYXNz", f"authorization=Basic {REDACTED_TOKEN}"),
     ("Proxy-Authorization: Basic dXNlcjpwYXNz", f"Proxy-Authorization: Basic {REDACTED_TOKEN}"),
     ("cookie: a=1; b=2", f"cookie: a={REDACTED}; b={REDACTED}"),
     ("Set-Cookie: id=abc; Path=/", f"Set-Cookie: id={REDACTED}; Path=/")],
    ids=["bearer", "basic", "basic-equals", "proxy-basic", "cookie-header", "set-cookie-header"],
)
def test_header_lines_are_redacted_as_before(text: str, expected: str) -> None:
    """The header rules keep their scheme word and cookie names: adding ``auth`` and ``cookie``
    as assignment names must not turn ``Authorization: Basic`` or ``Cookie: a=1`` into
    ``[REDACTED]`` whole."""
    assert DEFAULT.diagnostic(text) == expected


@pytest.mark.parametrize("key", ["pw", "PW", "db_pw", "DB-PW", "app.pw"])
def test_a_pw_member_is_a_credential_by_name(key: str) -> None:
    """``pw`` is a credential name as a whole word; inside a longer word (``mpw``) it is not."""
    assert is_sensitive_key(key)
    assert DEFAULT({key: SECRET}) == {key: REDACTED}


@pytest.mark.parametrize("key", ["mpw", "kpw", "pwm", "pwned"])
def test_pw_inside_a_word_is_not_a_credential_name(key: str) -> None:
    assert not is_sensitive_key(key)


def test_a_failed_runs_stored_failure_holds_none_of_the_free_text_forms(store: fencepost.Store, caplog) -> None:
    """Through the worker: the run function raises with every form in its message; the stored
    failure (message and traceback) and the worker's log records hold none of the secrets, and
    every look-alike is still readable."""
    secrets = [SECRET, STRIPE_LIVE, STRIPE_TEST, STRIPE_RESTRICTED, STRIPE_WEBHOOK, GITLAB, NPM, PYPI, SENDGRID]
    forms = [c[1] for c in REDACTED_CASES if "Basic" not in c[1] and "Bearer" not in c[1]]
    kept = [c[1] for c in KEPT_CASES if "Bearer" not in c[1]]
    message = "\n".join(forms + kept)  # one per line: a header rule takes the rest of its line
    store.runs.create("r", "{}")

    def fn(ctx):
        raise RuntimeError(message)

    with caplog.at_level(logging.INFO, logger="fencepost.worker"):
        assert Worker(store, fn).run(until_idle=True).failed == 1
    failure = msgspec.structs.asdict(store.runs.get("r").failure)
    for text in (failure["message"], failure["traceback"]):
        for secret in secrets:
            assert secret not in text
    for line in kept:  # the message is cut at 2,000 characters, the traceback (8,000) holds it all
        assert line in failure["traceback"]
    for record in caplog.records:
        for secret in secrets:
            assert secret not in record.getMessage()


def test_the_new_forms_run_in_linear_time() -> None:
    """Each hostile input well under 2 s of this process's CPU (a quadratic scan of these costs
    minutes): names whose values hold more names, percent-escapes, long names and token prefixes."""
    cases = [
        "monkey=" * 40_000 + "x",
        "dsn=" * 40_000 + "x://",
        "mpw=" * 40_000,
        "password%3D" * 40_000,
        "monkey%3D" * 40_000 + "x",
        "%2F" * 60_000 + "pw=x",
        "a" * 100_000 + "pw=x",
        "%" * 100_000,
        "sk_live_" * 20_000,
        "SG." + "a" * 22 + "." * 50_000,
        "npm_" + "a" * 100_000,
    ]
    for text in cases:
        start = time.process_time()
        DEFAULT.diagnostic(text)
        assert time.process_time() - start < 2.0, text[:40]
