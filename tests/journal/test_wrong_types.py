"""Issue 10 defect 4: every public journal entry point refuses a wrong type with ``JournalError``.

A list, dict or set where an identifier belongs (unhashable), an ``OwnerId`` whose fields are not
the types they claim, a non-callable ``transact`` body, a non-iterable ``event_types``: each is
``invalid_event`` naming the field, never a raw ``TypeError``, and nothing is written. Assigning
anything but a ``Redaction`` to ``journal.redaction`` is refused at the assignment.
"""

from __future__ import annotations

import pytest

import fencepost
from fencepost.errors import JournalError
from fencepost.journal import NewEntry, OwnerId, Redaction, head, ownership_history, replay_all, verify
from tests.journal.conftest import A, hold, rows

WRONG = [["a"], {"a": 1}, {"a"}, bytearray(b"a"), 1.5, None]
WRONG_IDS = [pytest.param(v, id=type(v).__name__) for v in WRONG]
BAD_OWNERS = [
    pytest.param(OwnerId(["h"], 1, "n"), "host_id", id="host-list"),
    pytest.param(OwnerId("h", [1], "n"), "pid", id="pid-list"),
    pytest.param(OwnerId("h", 1, {"n"}), "nonce", id="nonce-set"),
    pytest.param(OwnerId({"h": 1}, {1: 2}, {"n"}), "pid", id="all-unhashable"),
    pytest.param(OwnerId("h", 1.0, "n"), "pid", id="pid-float"),
]


def _refused(fn, field: str) -> JournalError:
    with pytest.raises(JournalError) as info:
        fn()
    assert info.value.code == "invalid_event"
    assert field in info.value.detail
    return info.value


@pytest.mark.parametrize("value", WRONG_IDS)
@pytest.mark.parametrize("field", ["run_id", "event_type", "source_id"])
def test_append_refuses_wrong_typed_identifiers(store: fencepost.Store, field: str, value) -> None:
    """Defect 4: ``append`` / ``append_unfenced`` / ``append_many`` / ``tx.append`` with a list, dict,
    set ... as an identifier raise ``invalid_event`` naming the field, and write nothing."""
    hold(store, "r", A)
    j = store.journal
    args = {"run_id": "r", "event_type": "t", "source_id": "s"}
    args[field] = value
    r, t, s = args["run_id"], args["event_type"], args["source_id"]
    _refused(lambda: j.append(r, t, {}, owner=A, source_id=s), field)
    _refused(lambda: j.append_unfenced(r, t, {}, source_id=s), field)
    _refused(lambda: j.append_many(r, [NewEntry(t, {})], owner=A, source_id=s), field)
    _refused(lambda: j.append_many_unfenced(r, [NewEntry("ok", {}), NewEntry(t, {})], source_id=s), field)
    _refused(lambda: j.transact(lambda tx: tx.append(r, t, {}, owner=A, source_id=s)), field)
    _refused(lambda: j.transact(lambda tx: tx.append_unfenced(r, t, {}, source_id=s)), field)
    _refused(lambda: j.transact(lambda tx: tx.append_many_unfenced(r, [NewEntry(t, {})], source_id=s)), field)
    assert rows(store) == []
    # The same journal still appends.
    assert j.append("r", "t", {}, owner=A, source_id="s").seq == 0


@pytest.mark.parametrize("value", WRONG_IDS)
def test_append_refuses_wrong_typed_source_seq_and_dedupe(store: fencepost.Store, value) -> None:
    j = store.journal
    if value is None:  # None is the default source_seq
        _refused(lambda: j.append_unfenced("r", "t", {}, source_id="s", dedupe=value), "dedupe")
        return
    _refused(lambda: j.append_unfenced("r", "t", {}, source_id="s", source_seq=value), "source_seq")
    _refused(lambda: j.append_unfenced("r", "t", {}, source_id="s", dedupe=value), "dedupe")
    _refused(lambda: j.append_many_unfenced("r", [NewEntry("t", {}, None, value)], source_id="s"), "source_seq")
    assert rows(store) == []


@pytest.mark.parametrize(("owner", "field"), BAD_OWNERS)
def test_fenced_appends_refuse_owner_with_wrong_typed_fields(store: fencepost.Store, owner: OwnerId,
                                                            field: str) -> None:
    """Defect 4: an ``OwnerId`` with unhashable or wrong-typed fields is ``invalid_event`` naming the field."""
    hold(store, "r", A)
    j = store.journal
    _refused(lambda: j.append("r", "t", {}, owner=owner, source_id="s"), field)
    _refused(lambda: j.append_many("r", [NewEntry("t", {})], owner=owner, source_id="s"), field)
    _refused(lambda: j.transact(lambda tx: tx.append("r", "t", {}, owner=owner, source_id="s")), field)
    _refused(lambda: j.transact(lambda tx: tx.append_many("r", [NewEntry("t", {})], owner=owner, source_id="s")),
             field)
    assert rows(store) == []


@pytest.mark.parametrize("value", [["a"], {"a": 1}, "not-an-owner", None])
def test_fenced_append_refuses_an_owner_that_is_not_an_ownerid(store: fencepost.Store, value) -> None:
    _refused(lambda: store.journal.append("r", "t", {}, owner=value, source_id="s"), "owner")


@pytest.mark.parametrize("value", [None, 1, ["a"], "text"])
def test_transact_refuses_a_body_that_is_not_callable(store: fencepost.Store, value) -> None:
    _refused(lambda: store.journal.transact(value), "fn")


@pytest.mark.parametrize("value", [1, 1.5, object()])
def test_entries_refuses_event_types_that_are_not_a_collection(store: fencepost.Store, value) -> None:
    _refused(lambda: store.journal.entries("r", event_types=value), "event_types")


@pytest.mark.parametrize("value", WRONG_IDS)
def test_entries_refuses_wrong_typed_arguments(store: fencepost.Store, value) -> None:
    j = store.journal
    _refused(lambda: j.entries(value), "run_id")
    if value is not None:
        _refused(lambda: j.entries("r", after=value), "after")
        _refused(lambda: j.entries("r", event_types=[value]), "event_types")
    _refused(lambda: j.entries("r", limit=value), "limit")


@pytest.mark.parametrize("value", [*WRONG, "\ud800", ""], ids=lambda v: type(v).__name__ + repr(v)[:4])
def test_ownership_history_refuses_a_run_id_that_is_not_an_identifier(store: fencepost.Store, value) -> None:
    _refused(lambda: ownership_history(store, value), "run_id")


@pytest.mark.parametrize("value", [lambda v: v, None, "default", {"rules": []}, Redaction])
def test_assigning_anything_but_a_redaction_is_refused(store: fencepost.Store, value) -> None:
    """Defect 4: ``journal.redaction = <function>`` raises ``JournalError`` at the assignment (not an
    ``AttributeError`` at the next append), and the journal keeps its redaction and keeps working."""
    j = store.journal
    before = j.redaction
    with pytest.raises(JournalError) as info:
        j.redaction = value
    assert info.value.code == "invalid_event"
    assert "redaction" in info.value.detail
    assert j.redaction is before
    j.append_unfenced("r", "t", {"token": "x"}, source_id="s")
    assert "[REDACTED]" in rows(store)[0][4]


def test_assigning_a_redaction_still_works(store: fencepost.Store) -> None:
    j = store.journal
    j.redaction = Redaction.noop()
    j.append_unfenced("r", "t", {"token": "x"}, source_id="s")
    assert '"x"' in rows(store)[0][4]
    with pytest.raises(JournalError):
        fencepost.journal.Journal(store, redaction=lambda v: v)  # type: ignore[arg-type]


AUDITS = {
    "verify": lambda s: verify(s),
    "head": lambda s: head(s),
    "ownership_history": lambda s: ownership_history(s, "r-1"),
    "replay_all": lambda s: replay_all(s),
}


@pytest.mark.parametrize("name", sorted(AUDITS))
def test_audit_functions_refuse_what_is_not_a_store(store: fencepost.Store, name: str) -> None:
    """An auditor who hands ``verify``/``head``/``ownership_history``/``replay_all`` a database URL
    (the CLI takes one), ``None`` or the store's ``journal`` got ``AttributeError: 'str' object has
    no attribute 'db'``. Each is now ``invalid_event`` naming ``store`` and the type given, never the
    value (a URL can hold a password); the real store still answers. Both backends run it, though
    the refusal happens before any database is touched."""
    secret_url = "postgresql+psycopg://auditor:hunter2-pw@db.internal/flows"
    for wrong in (secret_url, None, store.journal, store.db):
        err = _refused(lambda wrong=wrong: AUDITS[name](wrong), "store")
        assert "hunter2" not in str(err) and "hunter2" not in repr(err)
        assert type(wrong).__name__ in err.detail
    AUDITS[name](store)


@pytest.mark.parametrize("name", sorted(AUDITS))
def test_audit_functions_given_a_shard_set_say_to_audit_each_shard(make_db_url, name: str) -> None:
    """A service on a shard set handed its ``ShardSet`` to ``verify``/``ownership_history`` (as it
    hands it to ``Worker`` and ``ProjectionBuilder``) and was told only "store must be a fencepost
    Store, not ShardSet". Each shard has its own journal, so the refusal now says to pass one shard's
    store, and how to find the run's. Both backends run it, though it is refused before any read."""
    with fencepost.open_shards([make_db_url(), make_db_url()]) as shards:
        err = _refused(lambda: AUDITS[name](shards), "store")
        assert "ShardSet" in err.detail and "shards[name]" in err.detail and "store_for" in err.detail
        AUDITS[name](shards["shard-0"])
