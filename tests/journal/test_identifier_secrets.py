"""Issue 10 defect 5: credential-shaped identifiers never reach ``flows_journal_events``.

Payload and meta are redacted on the write path, but ``event_type``, ``source_id`` and ``run_id``
(which also make up the stored ``event_id``) are identifiers: redacting them would merge distinct
streams and break idempotency, so an append whose identifier the journal's redaction would rewrite
is refused with ``invalid_event`` naming the field and the rule, never the value.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

import fencepost
from fencepost.errors import JournalError
from fencepost.journal import NewEntry, Redaction, Rule
from tests.journal.conftest import A, hold, rows

SECRETS = [
    pytest.param("sk-live-4f9a1c7e2b8d6f3a0e5c", "api-key", id="api-key"),
    pytest.param("ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8", "github-token", id="github"),
    pytest.param("AKIAIOSFODNN7EXAMPLE", "aws-access-key", id="aws"),
    pytest.param("Bearer abcdef0123456789", "bearer-token", id="bearer"),
    pytest.param("https://user:hunter2@db.example/x", "url-credentials", id="url"),
    pytest.param("password=hunter2", "assignment", id="assignment"),
    pytest.param("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl", "jwt", id="jwt"),
]


def _stored_text(store: fencepost.Store) -> str:
    sql = ("SELECT run_id, event_id, source_id, event_type, payload_json, meta_json FROM flows_journal_events")
    return "\n".join("\t".join(r) for r in store.db.read(lambda c: [tuple(x) for x in c.execute(text(sql))]))


@pytest.mark.parametrize(("secret", "rule"), SECRETS)
@pytest.mark.parametrize("field", ["event_type", "source_id", "run_id"])
def test_credential_shaped_identifier_is_refused(store: fencepost.Store, field: str, secret: str,
                                                 rule: str) -> None:
    """Defect 5: every append path refuses the identifier (``invalid_event``, field and rule named,
    value absent from the message) and nothing lands in the journal table."""
    args = {"run_id": "r", "event_type": "t", "source_id": "s"}
    args[field] = f"x.{secret}" if field != "run_id" else secret
    r, t, s = args["run_id"], args["event_type"], args["source_id"]
    hold(store, r, A)
    j = store.journal
    calls = [
        lambda: j.append(r, t, {}, owner=A, source_id=s),
        lambda: j.append_unfenced(r, t, {}, source_id=s),
        lambda: j.append_many(r, [NewEntry("ok", {}), NewEntry(t, {})], owner=A, source_id=s),
        lambda: j.append_many_unfenced(r, [NewEntry(t, {})], source_id=s),
        lambda: j.transact(lambda tx: tx.append(r, t, {}, owner=A, source_id=s)),
        lambda: j.transact(lambda tx: tx.append_unfenced(r, t, {}, source_id=s)),
    ]
    for call in calls:
        with pytest.raises(JournalError) as info:
            call()
        assert info.value.code == "invalid_event"
        assert field in info.value.detail and rule in info.value.detail
        assert secret not in str(info.value)
    assert rows(store) == []
    assert secret not in _stored_text(store)


@pytest.mark.parametrize("name", [
    "token.refreshed", "session-started", "api.key-rotated", "password-reset.requested", "auth",
    "flows.engine.run-decision", "sk-8", "tokenizer", "user@example.com",
])
def test_ordinary_identifiers_with_credential_words_are_kept(store: fencepost.Store, name: str) -> None:
    """Names that merely contain a credential word are not credential-shaped and append as given."""
    hold(store, name, A)
    store.journal.append(name, name, {}, owner=A, source_id=name)
    (entry,) = store.journal.entries(name).entries
    assert (entry.run_id, entry.event_type, entry.source_id) == (name, name, name)


def test_custom_rules_decide_what_is_credential_shaped(store: fencepost.Store) -> None:
    """The journal's own redaction is the detector: custom rules refuse what they would rewrite."""
    store.journal.redaction = Redaction(rules=[Rule("internal-ticket", r"TICKET-\d+")])
    with pytest.raises(JournalError) as info:
        store.journal.append_unfenced("r", "seen.TICKET-42", {}, source_id="s")
    assert "internal-ticket" in info.value.detail and "event_type" in info.value.detail
    store.journal.append_unfenced("r", "sk-live-4f9a1c7e2b8d6f3a0e5c", {}, source_id="s")  # not a custom rule
    assert len(rows(store)) == 1


def test_noop_redaction_stores_identifiers_as_given(store: fencepost.Store) -> None:
    """``Redaction.noop()`` is the explicit opt-out for identifiers too."""
    store.journal.redaction = Redaction.noop()
    store.journal.append_unfenced("r", "password=hunter2", {}, source_id="s")
    assert "password=hunter2" in _stored_text(store)
