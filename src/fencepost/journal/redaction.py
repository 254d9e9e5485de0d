"""Redaction on the journal write path (REFERENCE 3.6).

Every journal payload and meta passes through a ``Redaction`` before it is encoded, so credentials
never reach ``flows_journal_events``. Two layers:

* **structural**: the value under a sensitive key becomes ``"[REDACTED]"`` (integer token counters
  such as ``inputTokens`` are kept; ``tokenizer``, ``idempotencyKey``, ``publicKey`` are not
  sensitive), and the element after a credential flag in a list (``["--password", x]``);
* **textual**: rules rewrite credential-shaped text inside every string and key (URL passwords,
  bearer and basic tokens, JWTs, private-key blocks, vendor keys, ``KEY=value`` assignments ...).

The default rules are applied in passes until a pass changes nothing, so redacting a redacted value
is a no-op. Run state (``flows_runs.state_json``) and
attempt values (checkpoint, error, outcome, meta) are never redacted: resume re-reads them byte for byte.
"""

from __future__ import annotations

import bisect
import datetime as _dt
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fencepost._values import MAX_INT_DIGITS, SURE_BITS, int_digits_ok, text_problem

REDACTED = "[REDACTED]"
REDACTED_TOKEN = "[REDACTED_TOKEN]"
REDACTED_API_KEY = "[REDACTED_API_KEY]"
CIRCULAR = "[Circular]"
#: Container edges the redactor walks before it refuses the value.
MAX_DEPTH = 256
#: Nodes (values plus keys) one walk may visit.
MAX_NODES = 1_000_000
_FIXED_POINT_ROUNDS = 8
_CACHED_LENGTH = 256
_CACHE_SIZE = 4096


class RedactionError(ValueError):
    """The value could not be redacted (too deep, or a rule failed). Never carries the value."""


_LONG_INT = f"contains an integer of more than {MAX_INT_DIGITS} digits"


class NotDurable(RedactionError):
    """The value holds something JSON cannot carry (a set, NaN, NUL ...); ``str()`` names the rule only."""


# ----------------------------------------------------------------------------- sensitive keys
_SENSITIVE_SUFFIXES = (
    "auth", "authorization", "cookie", "apikey", "token", "password", "passwd", "pwd", "passphrase", "secret",
    "secretaccesskey", "credential", "dsn", "connection", "connectionstring", "connectionuri",
    "connectionurl", "secretkey", "privatekey", "sshkey", "signingkey", "signature", "encryptionkey",
    "session", "sessionkey", "accountkey", "accesskey", "masterkey",
)
_NON_ALNUM = re.compile(r"[^a-z0-9]+")
# ``key`` and ``pw`` name a credential as a separate word (``api_key``, ``DB_PW``), not inside one
# (``monkey``, ``mpw``).
_SEPARATE_WORD_KEY = re.compile(r"(?:^|[^A-Za-z0-9])(?:key|pw)$", re.IGNORECASE)
_key_cache: dict[str, bool] = {}


def _canonical_key(key: str) -> str:
    c = _NON_ALNUM.sub("", key.lower())
    return c[:-1] if c.endswith("s") else c


def is_sensitive_key(key: str) -> bool:
    """True when the value under ``key`` is a credential by name (``apiKey``, ``x-api-key``, ``tokens``)."""
    found = _key_cache.get(key)
    if found is None:
        canonical = _canonical_key(key)
        found = bool(_SEPARATE_WORD_KEY.search(key)) or canonical.endswith(_SENSITIVE_SUFFIXES)
        if len(_key_cache) < 4096:
            _key_cache[key] = found
    return found


def _is_token_counter(key: str, value: Any) -> bool:
    # ``inputTokens: 120`` counts tokens; ``token: 123456`` is one. Only the plural name with a
    # non-negative integer is a counter.
    return type(value) is int and value >= 0 and _NON_ALNUM.sub("", key.lower()).endswith("tokens")


# ----------------------------------------------------------------------------- textual rules
@dataclass(frozen=True)
class Rule:
    """A textual rule: every match of ``pattern`` is replaced.

    ``replacement`` is a ``re.sub`` template or a function of the match; ``None`` replaces the whole
    match with ``"[REDACTED]"``. Patterns always apply to every match (``re.sub`` is global).
    """

    id: str
    pattern: re.Pattern[str] | str
    replacement: str | Callable[[re.Match[str]], str] | None = None

    def apply(self, text: str) -> str:
        """Replace every match of this rule in ``text`` (one pass)."""
        pattern = self.pattern if isinstance(self.pattern, re.Pattern) else re.compile(self.pattern)
        return pattern.sub(REDACTED if self.replacement is None else self.replacement, text)


@dataclass(frozen=True)
class FunctionRule:
    """A textual rule implemented as a function (for what one regular expression cannot say in linear time)."""

    id: str
    function: Callable[[str], str]

    def apply(self, text: str) -> str:
        """Apply the function to ``text`` (one pass)."""
        return self.function(text)


TextRule = Rule | FunctionRule

#: The words a credential's name ends with in text (``NAME_KEY=value``, ``--api-token X``); the name
#: is then checked with ``is_sensitive_key``. ``auth``, ``cookie``, ``dsn``, ``signature`` and ``pw``
#: have no plural here: ``signatures=2`` and ``cookies=3`` are counts.
_SECRET_WORDS = ("key", "keys", "token", "tokens", "secret", "secrets", "password", "passwords", "passwd", "pwd",
                 "pw", "passphrase", "credential", "credentials", "auth", "cookie", "dsn", "signature")
# A whole name (a possessive run) that ends with one of the words: one lookbehind per word at the end
# of the run, so each name is scanned once (a ``[...]*(?:word|...)`` pattern backtracks through it).
_ENDS_IN_SECRET_WORD = "(?:" + "|".join(f"(?<={w})" for w in _SECRET_WORDS) + ")"
# ``value`` forms: a quoted string (double, single, backtick) or a run without spaces, ``;`` or ``,``.
_VALUE = r"""(?:"(?:[^"\\\n]|\\.)*"|'[^'\n]*'|`[^`\n]*`|[^\s;,'"`]+)"""
# An assignment's value that is an authentication scheme and its credential (``api_key=Basic
# dXNl...``): both are the value, or the credential after the scheme word would be left readable.
# A credential an earlier rule already replaced (``[REDACTED_TOKEN]``) is left as that rule wrote it.
_SCHEME_VALUE = (r"(?:(?i:basic|bearer|digest|token|negotiate|ntlm|apikey|api-key|jwt|sharedkey)[ \t]+"
                 r"(?!\[REDACTED)[^\s;,'\"`]+|" + _VALUE + ")")


_COOKIE_HEADER_NAME = re.compile(r"(?:^|[^A-Za-z0-9_])(?:set-)?cookie$", re.IGNORECASE)
# Where a value ends inside a URL: ``&`` or ``#``, and, percent-encoded (once or twice), ``&``, ``#``
# or a space (``options=-c%20a%3Dx%20-c%20b%3Dy``).
_URL_VALUE_END = re.compile(r"[&#]|%(?:25)?(?:26|23|20)")


_HEX = frozenset("0123456789abcdefABCDEF")


def _is_escape_before(text: str, i: int) -> bool:
    """``text[i - 3:i]`` is a percent-escape (``%2F``): the name at ``i`` is inside a URL."""
    return i >= 3 and text[i - 3] == "%" and text[i - 2] in _HEX and text[i - 1] in _HEX


def _is_counter(key: str, value: str) -> bool:
    return value.isdigit() and _NON_ALNUM.sub("", key.lower()).endswith("tokens")  # ``max_tokens=4096``


def _assignment_name(m: re.Match[str]) -> bool:
    key, sep = m.group(1), m.group(2)
    # A ``Cookie:`` line is ``cookie-header``'s: it redacts each value and keeps the cookie names.
    return is_sensitive_key(key) and not (":" in sep and _COOKIE_HEADER_NAME.search(key))


def _assignment(m: re.Match[str], value: str) -> str | None:
    key, sep = m.group(1), m.group(2)
    if value == REDACTED or _is_counter(key, value):
        return None
    if "://" in value and _NON_ALNUM.sub("", key.lower()).endswith("dsn"):
        # ``dsn=postgresql://app:pw@db/prod``: the URL rules redact its password and credential
        # parameters; the host and database stay readable.
        return None
    rest = ""
    if _is_escape_before(m.string, m.start(1)):
        # ``?options=-c%20app.password=x&sslmode=require``: the value ends with its URL parameter.
        end = _URL_VALUE_END.search(value)
        if end is not None:
            value, rest = value[:end.start()], value[end.start():]
            if not value or value == REDACTED:
                return None
    return f"{key}{sep}{REDACTED}{rest}"


def _encoded_assignment(m: re.Match[str], value: str) -> str | None:
    # ``password%3Dx`` in a URL or a query string: the value up to the next (encoded) ``&``, ``#``
    # or space.
    if value == REDACTED or _is_counter(m.group(1), value):
        return None
    return f"{m.group(1)}{m.group(2)}{REDACTED}"


def _name_value_rule(name: re.Pattern[str], value: re.Pattern[str], is_credential: Callable[[re.Match[str]], bool],
                     replace: Callable[[re.Match[str], str], str | None],
                     needed: Callable[[str], bool] | None = None) -> Callable[[str], str]:
    """A rule body for ``NAME=value`` forms: ``name`` matches a name and its separator, ``value`` the
    value after it, read only for a credential's name (``is_credential``); ``replace`` gives the
    text for the name, separator and value (``None`` keeps them). The value of any other name is
    not consumed: a credential inside it is still found (``monkey=password=x``), and each value
    is read once (linear time). ``needed`` is a quick test a text must pass to be searched at all."""

    def apply(text: str) -> str:
        if needed is not None and not needed(text):
            return text
        out: list[str] = []
        i = 0
        for m in name.finditer(text):
            if m.start() < i or not is_credential(m):
                continue
            v = value.match(text, m.end())
            if v is None:
                continue
            new = replace(m, v.group(0))
            if new is None:
                new = text[m.start():v.end()]
            out.append(text[i:m.start()])
            out.append(new)
            i = v.end()
        if not out:
            return text
        out.append(text[i:])
        return "".join(out)

    return apply


def _flag(m: re.Match[str]) -> str:
    dashes, name, sep, value = m.group(1), m.group(2), m.group(3), m.group(4)
    if not is_sensitive_key(name):
        return m.group(0)
    if value.isdigit() and _NON_ALNUM.sub("", name.lower()).endswith("tokens"):
        return m.group(0)
    return f"{dashes}{name}{sep}{REDACTED}"


# A quoted string as Python's repr or JSON writes one (double or single quotes, backslash escapes).
_QUOTED = r"""(?:"(?:[^"\\\n]|\\.){0,4096}"|'(?:[^'\\\n]|\\.){0,4096}')"""
_NAME_MEMBER_WORDS = "name|Name|NAME|key|Key|KEY|header|field|variable|param|parameter"
_VALUE_MEMBER_WORDS = "value|Value|VALUE|val"


def _quoted_value(m: re.Match[str]) -> str:
    # A (name, value) pair or record: the value when the quoted name is a credential's.
    name, value = m.group("name")[1:-1], m.group("value")
    quote = value[-1]
    if not is_sensitive_key(name) or value[value.index(quote) + 1:-1] == REDACTED:
        return m.group(0)
    if _is_counter(name, value[value.index(quote) + 1:-1]):
        return m.group(0)
    return m.string[m.start(0):m.start("value")] + f"{quote}{REDACTED}{quote}" + m.string[m.end("value"):m.end(0)]


def _xml_element(m: re.Match[str]) -> str:
    value = m.group("value")
    if not is_sensitive_key(m.group("name")) or value.strip() in ("", REDACTED) or _is_counter(m.group("name"), value):
        return m.group(0)
    return m.string[m.start(0):m.start("value")] + REDACTED + m.string[m.end("value"):m.end(0)]


def _flag_list(m: re.Match[str]) -> str:
    name, value = m.group("name"), m.group("value")[1:-1]
    if not is_sensitive_key(name) or (value.isdigit() and _NON_ALNUM.sub("", name.lower()).endswith("tokens")):
        return m.group(0)
    return m.group(0)[: m.start("value") - m.start(0)] + REDACTED


_JSON_MEMBER = re.compile(r'(?P<q>\\{0,7}"|\')(?P<key>[A-Za-z0-9_.\-]{1,128})(?P=q)(?P<sep>\s*:\s*)')
_OPENERS = {"{": "}", "[": "]"}


def _embedded_json(text: str) -> str:
    # ``{"apiToken":"x"}`` inside text, at any escaping depth, and the Python repr form
    # ``{'apiToken': 'x'}``; a container opened by a credential name (``"credentials": {...}``) is
    # replaced whole. A scanner, not one regex: the value end depends on the escaping depth of the
    # key's quote.
    if '"' not in text and "'" not in text:
        return text
    out: list[str] = []
    i = 0
    for m in _JSON_MEMBER.finditer(text):
        if m.start() < i or not is_sensitive_key(m.group("key")):
            continue
        q = m.group("q")
        start = m.end()
        if q == "'" and text.startswith('"', start):
            q = '"'  # Python's repr quotes a value holding ``'`` with ``"``: ``{'password': "it's"}``
        if text.startswith(q, start):
            end = _quoted_end(text, start + len(q), q)
            if end < 0:
                continue
            value = text[start + len(q):end - len(q)]
            if value == REDACTED:
                continue
            out.append(text[i:start])
            out.append(f"{q}{REDACTED}{q}")
            i = end
        elif start < len(text) and text[start] in _OPENERS:
            end = _container_end(text, start)
            out.append(text[i:start])
            out.append(f"{q}{REDACTED}{q}")
            i = end
        else:
            n = re.match(r"-?\d[\d.eE+-]*|true|false", text[start:start + 64])
            if n is None or (n.group(0).isdigit() and m.group("key").lower().endswith("tokens")):
                continue
            out.append(text[i:start])
            out.append(f"{q}{REDACTED}{q}")
            i = start + n.end()
    if not out:
        return text
    out.append(text[i:])
    return "".join(out)


def _quoted_end(text: str, start: int, q: str) -> int:
    """The end of the quoted value whose text begins at ``start`` (just past its closing ``q``), or -1.

    ``q`` is a quote after ``k`` backslashes (``"``, ``'``, ``\\"``, ``\\\\\\"`` ...: the escaping
    depth). A quote inside the value is escaped once more than ``q`` (``\\"`` in ``"..."``,
    ``\\\\\\"`` in ``\\"...\\"``), a backslash doubled: the closing quote is the first one whose
    run of backslashes has ``k`` plus a multiple of ``2 * (k + 1)`` of them.
    """
    k = len(q) - 1
    mark = q[-1]
    p = text.find(mark, start)
    while p >= 0:
        r = p
        while r > start and text[r - 1] == "\\":
            r -= 1
        run = p - r
        if run >= k and (run - k) % (2 * (k + 1)) == 0:
            return p + 1
        p = text.find(mark, p + 1)
    return -1


def _container_end(text: str, start: int) -> int:
    depth = 0
    in_string = False
    k = start
    while k < len(text):
        ch = text[k]
        if in_string:
            if ch == "\\":
                k += 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return k + 1
        k += 1
    return len(text)


_KEY_HEADER = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
_KEY_FOOTER = re.compile(r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
_KEY_BODY = re.compile(r"(?:[ \t]*\r?\n)?(?:[ \t]*[A-Za-z0-9+/=:_-]{4,}[ \t]*(?:\r?\n|$))+")


def _private_key_blocks(text: str) -> str:
    # Linear in the text: every footer is found once, each header takes the next footer after it;
    # a header without a footer takes only the base64 body lines that follow it.
    if "PRIVATE KEY" not in text:
        return text
    footers = [(f.start(), f.end()) for f in _KEY_FOOTER.finditer(text)]
    starts = [s for s, _ in footers]
    out: list[str] = []
    i = 0
    for h in _KEY_HEADER.finditer(text):
        if h.start() < i:
            continue
        k = bisect.bisect_left(starts, h.end())
        if k < len(footers):
            end = footers[k][1]
        else:
            body = _KEY_BODY.match(text, h.end())
            if body is None:
                continue
            end = body.end()
            if text[end - 1:end] == "\n":
                end -= 2 if text[end - 2:end] == "\r\n" else 1
        out.append(text[i:h.start()])
        out.append(REDACTED)
        i = end
    if not out:
        return text
    out.append(text[i:])
    return "".join(out)


_A = re.ASCII
_I = re.IGNORECASE | re.ASCII

# ``Authorization: <scheme> <credentials>`` and ``Cookie: a=1; b=2`` as header lines inside text. The
# value runs to the end of the line, or to a quote or backslash (a header quoted in a command line,
# an escaped line break in JSON text).
_HEADER_VALUE = r"""([^\r\n"'\\]+)"""
_AUTH_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9!#$%&*+.^_`|~\-]*)[ \t]+(?=\S)", _A)


#: Authentication schemes (the HTTP registry's and common vendor ones): what follows one of them is a
#: credential even when it reads as a plain word (``Token letmein``).
_KNOWN_SCHEMES = frozenset({
    "basic", "bearer", "digest", "dpop", "gnap", "hoba", "mutual", "negotiate", "ntlm", "oauth", "privatetoken",
    "scram-sha-1", "scram-sha-256", "vapid", "concealed", "token", "apikey", "api-key", "key", "ssws", "jwt",
    "hmac", "aws4-hmac-sha256", "kerberos", "splunk", "googlelogin", "sharedkey", "sharedaccesssignature",
    "signature", "otp", "session",
})
# A plain word of status prose: lowercase or Capitalised letters, at most 15 of them, with the
# punctuation of a sentence around it. Digits, token punctuation (``. _ - / + = ~``), inner capitals
# or a longer word make a value credential-shaped.
_PROSE_WORD = re.compile(r"[(\[]?[A-Za-z][a-z]{0,14}[)\],.;:!?]*", _A)


#: How status prose after ``authorization:`` begins. A value that begins otherwise stays redacted
#: even as plain words: a password may be one (``authorization: letmein``).
_STATUS_WORDS = frozenset({
    "absent", "accepted", "denied", "disabled", "enabled", "error", "expired", "failed", "forbidden", "granted",
    "invalid", "missing", "needed", "no", "none", "not", "ok", "pending", "refused", "rejected", "required",
    "revoked", "succeeded", "unauthorized",
})


def _is_status_prose(body: str) -> bool:
    """``denied``, ``denied by policy``, ``Required for this project.``: a status word first, then
    plain words only, none of them a scheme we know or another ``authorization`` (whose value this
    match would swallow)."""
    words = body.split()
    if not words or words[0].lower().strip("()[],.;:!?") not in _STATUS_WORDS:
        return False
    for w in words:
        if not _PROSE_WORD.fullmatch(w):
            return False
        bare = w.lower().strip("()[],.;:!?")
        if bare in _KNOWN_SCHEMES or bare.endswith("authorization"):
            return False
    return True


def _authorization_header(m: re.Match[str]) -> str:
    name, sep, value = m.group(1), m.group(2), m.group(3)
    body = value.rstrip()
    if not body or body == REDACTED or _is_status_prose(body):
        return m.group(0)
    tail = value[len(body):]
    scheme = _AUTH_SCHEME.match(body)
    if scheme is None:
        return f"{name}{sep}{REDACTED}{tail}"
    return f"{name}{sep}{scheme.group(1)} {REDACTED_TOKEN}{tail}"


#: ``Set-Cookie`` attributes: their values are not cookie values.
_COOKIE_ATTRIBUTES = frozenset({"path", "domain", "expires", "max-age", "samesite", "priority", "version",
                                "comment", "httponly", "secure", "partitioned"})


def _cookie_pair(segment: str) -> str:
    stripped = segment.lstrip()
    lead = segment[:len(segment) - len(stripped)]
    name, eq, value = stripped.partition("=")
    if not eq:
        if not stripped.strip() or stripped.strip().lower() in _COOKIE_ATTRIBUTES or stripped.strip() == REDACTED:
            return segment
        return f"{lead}{REDACTED}"
    if name.strip().lower() in _COOKIE_ATTRIBUTES or value in ("", REDACTED):
        return segment
    return f"{lead}{name}={REDACTED}"


def _cookie_header(m: re.Match[str]) -> str:
    name, sep, value = m.group(1), m.group(2), m.group(3)
    body = value.rstrip()
    if not body:
        return m.group(0)
    return name + sep + ";".join(_cookie_pair(part) for part in body.split(";")) + value[len(body):]


_SESSION_NAME = re.compile(r"[A-Za-z0-9_\-]*sess(?:ion)?(?:[_-]?id)?|sid|sig", _I)


def _query_parameter(m: re.Match[str]) -> str:
    # ``?token=x&access_token=y``: each credential parameter's value up to the next ``&`` or ``#``,
    # the other parameters kept. ``sig`` is the signature of a shared-access URL.
    name, value = m.group(2), m.group(3)
    if value == REDACTED or not (is_sensitive_key(name) or _SESSION_NAME.fullmatch(name)):
        return m.group(0)
    if value.isdigit() and _NON_ALNUM.sub("", name.lower()).endswith("tokens"):
        return m.group(0)
    return f"{m.group(1)}{name}={REDACTED}"


DEFAULT_RULES: tuple[TextRule, ...] = (
    FunctionRule("private-key-block", _private_key_blocks),
    # The password runs to the authority's last ``@`` (a raw ``@`` in it: ``svc:p4ss@word@host``);
    # an ``@`` after a ``/``, ``?`` or ``#`` is past the authority.
    Rule("url-credentials", re.compile(
        r"([A-Za-z][A-Za-z0-9+.\-]{0,31}://[^\s:/@]{0,256}):[^\s@/]{1,1024}(?:@[^\s@/?#]{0,1024})*@", _A),
        rf"\1:{REDACTED}@"),
    # ``<password>x</password>``, ``<ns:ApiKey type="x">x</ns:ApiKey>``: an XML element's text.
    Rule("xml-element", re.compile(
        rf"<(?P<tag>(?:[A-Za-z_][A-Za-z0-9_.\-]*+:)?(?P<name>[A-Za-z0-9_.\-]++){_ENDS_IN_SECRET_WORD})"
        r"(?P<attrs>[ \t][^<>]*)?>(?P<value>[^<]+)</(?P=tag)>", _I), _xml_element),
    Rule("authorization-header",
         re.compile(r"\b((?:proxy-)?authorization)([ \t]*:[ \t]*)" + _HEADER_VALUE, _I), _authorization_header),
    Rule("cookie-header", re.compile(r"\b((?:set-)?cookie2?)([ \t]*:[ \t]*)" + _HEADER_VALUE, _I), _cookie_header),
    Rule("query-parameter",
         re.compile(r"""([?&])([A-Za-z0-9_.\-]{1,128})=([^&#\s"'<>\\]+)""", _A), _query_parameter),
    Rule("bearer-token", re.compile(r"\b(Bearer)[ \t]+(?!\[REDACTED)[A-Za-z0-9\-._~+/]{4,}+=*", _I),
         rf"\1 {REDACTED_TOKEN}"),
    Rule("basic-authorization",
         # ``authorization`` after a word boundary (as before), ``auth`` after no letter or digit
         # (``basic_auth: Basic ...``); both begin with ``auth``, which keeps the search fast.
         re.compile(r"(auth(?:(?<=\bauth)orization|(?<![A-Za-z0-9]auth))[\"']?\s*[:=]\s*[\"']?Basic)[ \t]+"
                    r"(?!\[REDACTED)[A-Za-z0-9+/]{4,}+=*", _I),
         rf"\1 {REDACTED_TOKEN}"),
    Rule("jwt", re.compile(
        r"(?<![A-Za-z0-9])eyJ[A-Za-z0-9_\-]{5,4096}+\.[A-Za-z0-9_\-]{1,16384}+\.[A-Za-z0-9_\-]{0,4096}+"
        r"(?![A-Za-z0-9_\-]|\.[A-Za-z0-9_\-])", _A), REDACTED_TOKEN),
    Rule("github-token", re.compile(r"(?<![A-Za-z0-9_])gh[pousr]_[A-Za-z0-9]{20,}+", _A), REDACTED),
    Rule("github-fine-grained-token", re.compile(r"(?<![A-Za-z0-9_])github_pat_[A-Za-z0-9_]{20,}+", _A), REDACTED),
    Rule("aws-access-key", re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])", _A), REDACTED),
    Rule("slack-token", re.compile(r"(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9\-]{10,}+", _A), REDACTED),
    Rule("google-api-key", re.compile(r"(?<![A-Za-z0-9])AIza[A-Za-z0-9_\-]{35,}+", _A), REDACTED),
    Rule("api-key", re.compile(r"(?<![A-Za-z0-9_\-])(?:sk|pk)-[A-Za-z0-9_\-]{8,}+", _A), REDACTED_API_KEY),
    # Secret and restricted keys (``sk_live_``, ``rk_test_`` ...) and webhook signing secrets; the
    # publishable ``pk_live_`` key is public by design.
    Rule("stripe-key", re.compile(
        r"(?<![A-Za-z0-9_])(?:[sr]k_(?:live|test)_[A-Za-z0-9]{24,}+|whsec_[A-Za-z0-9+/]{32,}+=*)", _A),
        REDACTED_API_KEY),
    Rule("gitlab-token", re.compile(r"(?<![A-Za-z0-9_])glpat-[A-Za-z0-9_\-]{20,}+", _A), REDACTED),
    Rule("npm-token", re.compile(r"(?<![A-Za-z0-9_])npm_[A-Za-z0-9]{36}(?![A-Za-z0-9])", _A), REDACTED),
    Rule("pypi-token", re.compile(
        r"(?<![A-Za-z0-9_\-])pypi-(?:AgEIcHlwaS5vcmc|AgENdGVzdC5weXBpLm9yZw)[A-Za-z0-9_\-]{50,}+", _A), REDACTED),
    Rule("sendgrid-key", re.compile(
        r"(?<![A-Za-z0-9_.\-])SG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}(?![A-Za-z0-9_\-])", _A), REDACTED),
    Rule("cookie-session-assignment",
         re.compile(r"(?<![A-Za-z0-9_\-?&])([A-Za-z0-9_\-]*sess(?:ion)?(?:[_-]?id)?|sid)=[^;\s,]+", _I),
         rf"\1={REDACTED}"),
    # ``{'name': 'PGPASSWORD', 'value': 'x'}`` (a Python repr, or JSON inside longer text): the
    # record's value, before ``embedded-json-credential`` may mask the name (``key`` is a credential
    # name on its own).
    Rule("name-value-record", re.compile(
        rf"""(?P<q>['"])(?:{_NAME_MEMBER_WORDS})(?P=q)[ \t]*:[ \t]*(?P<name>{_QUOTED})[ \t]*,[ \t]*"""
        rf"""(?P<r>['"])(?:{_VALUE_MEMBER_WORDS})(?P=r)[ \t]*:[ \t]*(?P<value>{_QUOTED})""", _A), _quoted_value),
    # ``[('user', 'bob'), ('password', 'x')]``: a Python repr of (name, value) pairs (``parse_qsl``,
    # header lists).
    Rule("name-value-pair", re.compile(
        rf"""[(\[][ \t]*(?P<name>{_QUOTED})[ \t]*,[ \t]*(?P<value>b?{_QUOTED})[ \t]*[)\]]""", _A),
        _quoted_value),
    FunctionRule("embedded-json-credential", _embedded_json),
    # The value is never another flag: ``--monkey --password x`` must leave ``--password x`` for its
    # own match (a consumed flag is never looked at again).
    Rule("cli-flag", re.compile(
        rf"(?<![A-Za-z0-9_\-])(--?)([A-Za-z0-9_\-]++)(?=[ \t]){_ENDS_IN_SECRET_WORD}([ \t]+)(?!-)({_VALUE})", _I),
        _flag),
    # The same in a quoted argument list (``Command '['deploy', '--token', 'x']' returned ...``).
    Rule("cli-flag-list", re.compile(
        rf"""(?P<q>['"])--?(?P<name>[A-Za-z0-9_\-]++){_ENDS_IN_SECRET_WORD}(?P=q),[ \t]*(?!['"]-)"""
        r"""(?P<value>'[^'\n]*'|"[^"\n]*")""", _I), _flag_list),
    # ``password%3Dx``, ``pwd%253Dx`` (encoded twice): a name at the start of a word or after a
    # percent-escape (``?next=%2Flogin%3Fpassword%3Dx``, ``options=-c%20app.pw%3Dx``).
    FunctionRule("url-encoded-assignment", _name_value_rule(
        re.compile(r"(?:(?<![A-Za-z0-9_.\-%])|(?<=%[0-9A-Fa-f]{2}))([A-Za-z0-9_.\-]++)(?=%(?:25)?3[Dd])"
                   rf"{_ENDS_IN_SECRET_WORD}(%(?:25)?3[Dd])", _I),
        re.compile(r"""(?:[^%&#\s"'<>\\;,]++|%(?!(?:25)?(?:26|23|20)))++""", _A),
        lambda m: is_sensitive_key(m.group(1)), _encoded_assignment, lambda text: "3D" in text or "3d" in text)),
    # A name at the start of a word, or after a percent-escape (``-c%20app.pw=x`` in a URL); after
    # ``?`` and ``&`` it is a query parameter (``query-parameter``). ``=>`` (a Perl, PHP or Ruby
    # hash) and ``:=`` separate a name from its value too: neither ``>`` nor ``=`` is the value.
    FunctionRule("assignment", _name_value_rule(
        re.compile(r"(?:(?<![A-Za-z0-9_.\-?&%])|(?<=%[0-9A-Fa-f]{2})|(?<=%)(?![0-9A-Fa-f]{2}))(?<!://)"
                   rf"([A-Za-z0-9_.\-]++)(?=[ \t]*[:=]){_ENDS_IN_SECRET_WORD}([ \t]*(?:=>|:=|[:=])[ \t]*)", _I),
        re.compile(_SCHEME_VALUE, _A), _assignment_name, _assignment)),
)

_PASSWORD_OPTION = r"-p|-pw|-P|-a|--pass"
_NOT_A_PASSWORD = ("-", "/", "./", "../", "~/")


def _password_option(m: re.Match[str]) -> str:
    value = m.group("value")
    bare = value.strip("'\"")
    if not bare or bare.startswith(_NOT_A_PASSWORD) or bare.isdigit():
        # Another option, a number (``-P 3306`` is a port) or a path (``mkdir -p /var/lib/app``).
        return m.group(0)
    return m.group(0)[: m.start("value") - m.start(0)] + REDACTED


#: Extra textual rules for diagnostic text only (failure messages and tracebacks, log lines, error
#: lines): command lines quoted in an error. Too eager for payloads (``-p 2`` there is data).
DIAGNOSTIC_RULES: tuple[TextRule, ...] = (
    # ``mysql -p secret``, ``redis-cli -a secret``, ``--pass=secret``; a number or another option is kept.
    Rule("password-option", re.compile(
        rf"(?<![A-Za-z0-9_\-])(?:{_PASSWORD_OPTION})(?:[ \t]+|=)(?!-)(?P<value>{_VALUE})", _A), _password_option),
    # The same in a quoted argument list: ``['mysql', '-p', 'secret']``.
    Rule("password-option-list", re.compile(
        rf"""(?P<q>['"])(?:{_PASSWORD_OPTION})(?P=q),[ \t]*(?P<value>'[^'\n]*'|"[^"\n]*")""", _A),
        _password_option),
    # ``openssl ... -passin pass:secret`` (also ``-passout``, ``-pass``).
    Rule("openssl-pass", re.compile(r"(?<![A-Za-z0-9_\-])(-pass(?:in|out)?[ \t]+pass:)[^\s'\"]+", _A),
         rf"\1{REDACTED}"),
    # ``mysql -psecret`` (the password joined to ``-p``, as the MySQL and MariaDB clients take it),
    # on a line that runs one of those clients.
    Rule("mysql-joined-password", re.compile(
        r"(\b(?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlshow|mariadb|mariadb-dump|mariadb-admin)\b"
        r"[^\n]*?[ \t'\"]-p)[^\s'\"]+", _A), rf"\1{REDACTED}"),
    # ``curl -u user:secret``, ``--user=user:secret``: the user is kept.
    Rule("user-password-option", re.compile(
        r"(?<![A-Za-z0-9_\-])(-u|--user)([ \t]+|=)(['\"]?)([^\s:'\"]+):[^\s'\"]+", _A), rf"\1\2\3\4:{REDACTED}"),
)

# A string whose lowercased text contains none of these cannot match a default rule: skip the rules
# entirely. Searched in ``text.lower()``: a case-sensitive search of lowercase words is several times
# faster than an IGNORECASE one, and this search runs on every string the rules have not cached.
_DEFAULT_TRIGGER = re.compile(
    r"://|bearer|basic|eyj|private key|sk-|pk-|gh[pousr]_|github_pat_|akia|asia|xox|aiza|sess|sid="
    r"|k_live_|k_test_|whsec_|glpat-|npm_|pypi-|sg\."
    r"|key|token|secret|passw|pw|passphrase|credential|auth|cookie|dsn|connection|signature|sig="
)
_FLAG_ELEMENT = re.compile(r"^--?([A-Za-z][A-Za-z0-9_\-]*)$")


def _is_credential_flag(item: str) -> bool:
    """``--password``, ``--no-auth`` as a list element: the element after it is a credential, unless
    it is itself a credential flag (``["--no-auth", "--token", x]``: ``x`` is the one to redact)."""
    m = _FLAG_ELEMENT.match(item)
    return bool(m and is_sensitive_key(m.group(1)))
#: A record ``{"name": "password", "value": x}`` (environment lists, HAR headers, AWS and
#: Kubernetes shapes): the member holding the value, and the members that name it.
_VALUE_MEMBERS = ("value", "Value", "VALUE", "val")
_NAME_MEMBERS = ("name", "Name", "NAME", "key", "Key", "KEY", "header", "field", "variable", "param", "parameter")


def _name_value(d: dict[Any, Any]) -> tuple[str, str, bool] | None:
    """``(value member, name member, whether the name is a credential's)`` of a name/value record."""
    for vk in _VALUE_MEMBERS:
        if dict.__contains__(d, vk):
            for nk in _NAME_MEMBERS:
                name = dict.get(d, nk)
                if type(name) is str:
                    return vk, nk, is_sensitive_key(name) and not _is_token_counter(name, dict.__getitem__(d, vk))
            return None
    return None




class _Walk:
    """Per-call walk state (the redactor itself is shared between threads)."""

    __slots__ = ("nodes", "path")

    def __init__(self) -> None:
        self.nodes = 0
        self.path: set[int] = set()


class Redaction:
    """Scrub credentials from a JSON-like value; the journal applies it to every payload and meta.

    ``Redaction()`` is the default (structural rules plus ``DEFAULT_RULES``); ``Redaction(rules=...)``
    *replaces* the textual rules (``rules=[]`` keeps only the structural ones);
    ``Redaction.noop()`` is the explicit opt-out. Call it (``redaction(value)``) to get a redacted
    copy; the input is never modified.

    Values are copied into plain JSON shapes on the way: ``dict``/``list``/``tuple``/``str``/``int``
    subclasses become ``dict``/``list``/``str``/``int`` (read through the base type, never through an
    override), ``datetime``/``date`` become ISO strings, bytes become a named marker,
    a cycle becomes ``"[Circular]"``. Anything JSON cannot carry (a set, NaN, a NUL or lone surrogate,
    a non-string key) raises ``NotDurable``; nesting deeper than ``max_depth`` raises
    ``RedactionError``. Neither message holds the value.
    """

    def __init__(self, rules: Iterable[TextRule] | None = None, *, max_depth: int = MAX_DEPTH,
                 structural: bool = True, max_nodes: int = MAX_NODES) -> None:
        if type(max_depth) is not int or max_depth < 1:
            raise ValueError("max_depth must be a positive integer")
        self.max_nodes = max_nodes
        self.rules: tuple[TextRule, ...] = DEFAULT_RULES if rules is None else tuple(rules)
        self.max_depth = max_depth
        self.structural = structural
        self._trigger = _DEFAULT_TRIGGER if rules is None else None
        self.enabled = True
        # Strings and keys repeat a lot (statuses, step names, member names): remember what short
        # ones became. Only strings that passed the durable-text check are cached.
        self._strings: dict[str, str] = {}
        self._keys: dict[str, tuple[str, bool]] = {}
        self._structural: Redaction | None = None  # custom rules: the walk of a JSON text string

    @classmethod
    def noop(cls) -> Redaction:
        """The explicit opt-out: values are stored as given (still checked as durable values)."""
        r = cls(rules=(), structural=False)
        r.enabled = False
        return r

    def __call__(self, value: Any) -> Any:
        """Return a redacted copy of ``value``."""
        if not self.enabled:
            return value
        return self._walk(value, 0, _Walk())

    def text(self, text: str) -> str:
        """Apply the textual rules to one string.

        The default rules are applied in passes until a pass changes nothing (each is built to
        reach that fixed point, so redacting redacted text is a no-op); custom rules are applied
        once each, in order, because a custom replacement may itself match its pattern.
        """
        if not self.rules:
            return text
        if self._trigger is None:
            for rule in self.rules:
                text = rule.apply(text)
            return text
        if self._trigger.search(text.lower()) is None:
            return text
        for _ in range(_FIXED_POINT_ROUNDS):
            new = text
            for rule in self.rules:
                new = rule.apply(new)
            if new == text:
                return new
            text = new
        return text

    def diagnostic(self, text: str) -> str:
        """Redact one piece of diagnostic text (a failure's message or traceback, a log line, an
        error line): the textual rules, then, with the default rules, ``DIAGNOSTIC_RULES`` for
        command lines quoted in an error. ``Redaction.noop()`` keeps the text; custom rules are
        applied as they are (they replace the defaults here too)."""
        if not self.enabled:
            return text
        return self._command_lines(self.text(text))

    def _command_lines(self, text: str) -> str:
        """``DIAGNOSTIC_RULES`` on text the textual rules already redacted (default rules only)."""
        if self._trigger is _DEFAULT_TRIGGER:
            for rule in DIAGNOSTIC_RULES:
                text = rule.apply(text)
        return text

    def _key(self, key: str) -> tuple[str, bool]:
        """What ``key`` becomes, and whether the value under it is a credential by name."""
        found = self._keys.get(key)
        if found is None:
            problem = text_problem(key)
            if problem:
                raise NotDurable(f"key {problem}")
            found = (key if self.text(key) == key else REDACTED, self.structural and is_sensitive_key(key))
            if len(key) <= _CACHED_LENGTH:
                if len(self._keys) >= _CACHE_SIZE:
                    self._keys.clear()
                self._keys[key] = found
        return found

    def _string(self, value: str) -> str:
        found = self._strings.get(value)
        if found is None:
            problem = text_problem(value)
            if problem:
                raise NotDurable(f"string {problem}")
            found = self._json_text(value) if value[:1] in ("{", "[") else None
            if found is None:
                found = self.text(value)
            if len(value) <= _CACHED_LENGTH:
                if len(self._strings) >= _CACHE_SIZE:
                    self._strings.clear()
                self._strings[value] = found
        return found

    def _json_text(self, value: str) -> str | None:
        """A string that is a JSON object or array is redacted as the value it encodes.

        ``None`` when ``value`` is not JSON text (or could not be walked): the textual rules apply.
        Unchanged text is returned as it was; changed text is re-encoded (``json.dumps``).
        """
        if not self.structural or len(value) < 2:
            return None
        first, last = value[0], value[-1]  # JSON text with surrounding blanks is left to the text rules
        if not ((first == "{" and last == "}") or (first == "[" and last == "]")):
            return None
        if self._trigger is not None and self._trigger.search(value.lower()) is None:
            return None
        # Custom rules may be written for the JSON text itself (``"ssn": "..."``): the walk is then
        # structural only, and the rules run once on the whole text after it.
        walker = self if self._trigger is not None or not self.rules else self._structural_only()
        try:
            parsed = json.loads(value)
            out = walker._walk(parsed, 0, _Walk())
        except (ValueError, RecursionError):  # RedactionError is a ValueError
            return None
        result = value if out == parsed else json.dumps(out, ensure_ascii=False)
        return result if walker is self else self.text(result)

    def _structural_only(self) -> Redaction:
        found = self._structural
        if found is None:
            found = self._structural = Redaction(rules=(), max_depth=self.max_depth, max_nodes=self.max_nodes)
        return found

    def _walk(self, value: Any, depth: int, st: _Walk) -> Any:
        # One walk both redacts and checks durability, so the journal's write path walks once.
        st.nodes += 1
        if st.nodes > self.max_nodes:
            raise NotDurable(f"exceeds the node limit of {self.max_nodes}")
        t = type(value)
        if t is str:
            return self._string(value)
        if t is int:
            if value.bit_length() > SURE_BITS and not int_digits_ok(value):
                raise NotDurable(_LONG_INT)
            return value
        if value is None or t is bool:
            return value
        if t is float:
            if not math.isfinite(value):
                raise NotDurable("contains a non-finite number")
            return value
        if t is dict or t is list or isinstance(value, (dict, list, tuple)):
            if depth >= self.max_depth:
                raise RedactionError(f"redaction depth exceeds {self.max_depth}")
            ident = id(value)
            if ident in st.path:
                return CIRCULAR
            st.path.add(ident)
            try:
                if t is dict or isinstance(value, dict):
                    return self._walk_dict(value, depth, st)
                return self._walk_list(value, depth, st)
            finally:
                st.path.discard(ident)
        if isinstance(value, str):
            return self._walk(str.__str__(value), depth, st)
        if isinstance(value, _dt.datetime | _dt.date | _dt.time):
            return value.isoformat()
        if isinstance(value, bytes | bytearray | memoryview):
            return f"[{type(value).__name__} {memoryview(value).nbytes} bytes]"
        if isinstance(value, int) and not isinstance(value, bool):
            # Through the base type: a subclass's own __int__ may lie.
            return self._walk(int.__int__(value), depth, st)
        raise NotDurable(f"holds a value of type {t.__name__}, which is not durable")

    def _walk_dict(self, value: dict[Any, Any], depth: int, st: _Walk) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        keys, strings = self._keys, self._strings
        record = None
        if self.structural and ("value" in value or "Value" in value or "VALUE" in value or "val" in value
                                if type(value) is dict else True):
            record = _name_value(value)
        for k, v in dict.items(value):
            if type(k) is not str:
                raise NotDurable("has a key that is not a string")
            new_key, sensitive = keys.get(k) or self._key(k)
            if record is not None:
                if k == record[0] and record[2]:
                    sensitive = True
                elif k == record[1]:
                    sensitive = False  # ``{"key": "region", "value": ...}``: the record's name
            if sensitive and not _is_token_counter(k, v):
                st.nodes += 2
                out[new_key] = REDACTED
                continue
            # Scalars inline: most members are short strings and numbers.
            t = type(v)
            if t is str:
                st.nodes += 2
                out[new_key] = strings.get(v) or self._string(v)
            elif (t is int and v.bit_length() <= SURE_BITS) or t is bool or v is None or (
                    t is float and math.isfinite(v)):
                st.nodes += 2
                out[new_key] = v
            else:
                st.nodes += 1
                out[new_key] = self._walk(v, depth + 1, st)
        if st.nodes > self.max_nodes:
            raise NotDurable(f"exceeds the node limit of {self.max_nodes}")
        return out

    def _walk_list(self, value: list[Any] | tuple[Any, ...], depth: int, st: _Walk) -> list[Any]:
        items = list.__iter__(value) if isinstance(value, list) else tuple.__iter__(value)
        out: list[Any] = []
        redact_next = False
        for item in items:
            if redact_next and type(item) is str and not _is_credential_flag(item):
                out.append(REDACTED)
                redact_next = False
                continue
            redact_next = False
            new = self._walk(item, depth + 1, st)
            t = type(item)
            if ((t is list or t is tuple) and len(item) == 2 and type(item[0]) is str and self.structural
                    and is_sensitive_key(item[0]) and not _is_token_counter(item[0], item[1]) and new != CIRCULAR):
                # ``["Authorization", "Bearer x"]`` in a list: a (name, value) pair, such as a header.
                new[1] = REDACTED
            out.append(new)
            if self.structural and t is str:
                redact_next = _is_credential_flag(item)
        return out


    def fact(self, value: Any) -> Any:
        """Redact the payload or meta of one of the run store's own consensus facts.

        The structural fields of a fact (``FACT_FIELDS``: the run id, the owner triples, the
        timestamps and the evidence the store decided on) are identifiers and readings the store
        already keeps verbatim in its run rows; rewriting one would corrupt the ownership history
        (a run id ``sk-learn-train-001`` is not an API key). They are kept as given when they have
        their structural shape (a string, an integer, null, or an ``{hostId, pid, nonce}`` owner);
        every other member, and a structural field of any other shape, is redacted as usual.
        """
        if not self.enabled:
            return value
        if type(value) is not dict:
            return self(value)
        kept: dict[str, Any] = {}
        rest: dict[Any, Any] = {}
        for k, v in value.items():
            if k in FACT_FIELDS and _structural(v):
                kept[k] = v
            else:
                rest[k] = v
        out = self(rest)
        for k, v in kept.items():
            if type(v) is str:
                problem = text_problem(v)
                if problem:
                    raise NotDurable(f"string {problem}")
            elif type(v) is dict:
                for part in (v["hostId"], v["nonce"]):
                    problem = text_problem(part)
                    if problem:
                        raise NotDurable(f"string {problem}")
                v = dict(v)
            out[k] = v
        return out


#: Members of a consensus fact's payload and meta that ``Redaction.fact`` keeps verbatim.
FACT_FIELDS = frozenset({
    "runId", "owner", "grantedAtMs", "heartbeatAtMs", "holder", "holderHeartbeatAtMs", "cutoffMs",
    "evidence", "observer", "cause",
})


def _structural(v: Any) -> bool:
    t = type(v)
    if v is None or t is str or (t is int):
        return True
    if t is dict and set(v) == {"hostId", "pid", "nonce"}:
        return type(v["hostId"]) is str and type(v["nonce"]) is str and type(v["pid"]) is int
    return False


DEFAULT = Redaction()
NOOP = Redaction.noop()

__all__ = [
    "CIRCULAR",
    "DEFAULT",
    "DEFAULT_RULES",
    "FACT_FIELDS",
    "MAX_DEPTH",
    "MAX_NODES",
    "NOOP",
    "REDACTED",
    "REDACTED_API_KEY",
    "REDACTED_TOKEN",
    "FunctionRule",
    "NotDurable",
    "Redaction",
    "RedactionError",
    "Rule",
    "is_sensitive_key",
]


def redact_diagnostics(redaction: Any, fields: dict[str, Any]) -> Any:
    """``redaction(fields)`` (string fields of diagnostic text), then, when ``redaction`` is an
    enabled ``Redaction``, its command-line rules on each string field (as ``Redaction.diagnostic``,
    without applying the textual rules a second time: a custom rule is applied once): the one path
    failures, log lines and error lines are redacted by. Whatever ``redaction`` raises or returns is
    the caller's to check."""
    out = redaction(fields)
    if isinstance(redaction, Redaction) and redaction.enabled and type(out) is dict:
        out = {k: redaction._command_lines(v) if type(v) is str else v for k, v in out.items()}
    return out
