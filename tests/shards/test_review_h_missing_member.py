"""A recorded member whose database is missing is named as such, not as a store to grow the set by."""

from __future__ import annotations

import pytest

import fencepost
from fencepost.shards import ShardError


def test_a_member_whose_database_is_missing_is_named_and_to_be_restored(make_db_url):
    """Defect (found by a review, SQLite and PostgreSQL): opening a set whose member b's database
    is missing said "shard #1 is not a member of this set ... grow the set to add a store", though
    b is a recorded member and growing is the wrong remedy. Now the error names shard #1 and member
    b, says no database is there and to restore it; nothing is created."""
    a, b = make_db_url(), make_db_url()
    fencepost.open_shards({"a": a, "b": b}).close()
    missing = make_db_url()
    with pytest.raises(ShardError) as caught:
        fencepost.open_shards({"a": a, "b": missing})
    text = str(caught.value)
    assert caught.value.code == "membership_mismatch"
    assert "shard #1" in text and "member b" in text
    assert "no database" in text and "restore" in text
    assert "grow" not in text
    with pytest.raises(fencepost.FencepostError):
        fencepost.open(missing, readonly=True)


def test_an_extra_store_keeps_the_grow_advice(make_db_url):
    """The grow advice stays for a store the set does not record (a third, new store given)."""
    a, b = make_db_url(), make_db_url()
    fencepost.open_shards({"a": a, "b": b}).close()
    with pytest.raises(ShardError, match="grow") as caught:
        fencepost.open_shards({"a": a, "b": b, "c": make_db_url()})
    assert "restore" not in str(caught.value)
