"""The Python snippets in docs/concepts/journal.md run as written, and the page's lists of names
(replay's rules, the redaction's textual rules) and its statement count stay true of the code."""

from __future__ import annotations

import inspect
import re

from sqlalchemy import event

from fencepost import OwnerId
from fencepost.journal import replay
from fencepost.journal.redaction import DEFAULT_RULES
from tests._docs import DOCS, run_snippets

DOC = DOCS / "concepts" / "journal.md"


def test_journal_page_snippets_run() -> None:
    run_snippets(DOC, "journal_doc")


def _replay_rules() -> set[str]:
    source = inspect.getsource(replay)
    found = set(replay._DETAILS)
    for pattern in (r'rule="(\w+)"', r'violate\(\w+, "(\w+)"', r'rules=\("(\w+)",\)', r'rules\.append\("(\w+)"\)'):
        found.update(re.findall(pattern, source))
    return found


def test_the_page_names_every_rule_replay_can_report() -> None:
    rules = _replay_rules()
    assert {"two_owners", "expired_without_claim", "chain_broken", "malformed_fact"} <= rules  # the scan works
    text = DOC.read_text(encoding="utf-8")
    assert sorted(r for r in rules if f"`{r}`" not in text) == []


def test_the_page_names_every_default_textual_rule() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert sorted(rule.id for rule in DEFAULT_RULES if f"`{rule.id}`" not in text) == []


def test_a_fenced_append_sends_two_statements_with_the_built_in_strategy(store) -> None:
    """The page's "Storage and speed": one head lookup (carrying the fence check) and one insert, on
    both backends (PostgreSQL's BEGIN with the writer lock, sent as one string, is not counted)."""
    owner = OwnerId("host-a", 1, "nonce-a")
    store.runs.create("r", "{}")
    store.runs.claim_and_own("r", store.runs.get("r"), owner, store.clock.now_ms())
    store.journal.append("r", "warm", {}, owner=owner, source_id="app")
    sent: list[str] = []

    def count(_conn, _cursor, statement, parameters, _context, _many):
        if "pg_advisory_xact_lock" not in statement:
            sent.append(statement)
        return statement, parameters

    event.listen(store.db.engine, "before_cursor_execute", count, retval=True)
    try:
        store.journal.append("r", "step", {"n": 1}, owner=owner, source_id="app")
    finally:
        event.remove(store.db.engine, "before_cursor_execute", count)
    assert [s.split()[0].upper() for s in sent] == ["SELECT", "INSERT"], sent
