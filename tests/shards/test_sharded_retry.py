"""``ShardSet.runs.retry``: the same call, outcomes and errors as ``RunStore.retry``, the new round
created on the lineage's shard (the placement rule of a run created with a ``lineage_id``), its id
checked on every shard.

Defect: a shard set's ``runs`` had no ``retry`` (``AttributeError``), although a retry is what a
failed run on a set needs as much as on one store.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import fencepost
from fencepost.errors import RunAlreadyExists, RunStoreError
from fencepost.journal.owner import OwnerId
from fencepost.runstore import RunSnapshot
from fencepost.runstore.outcomes import Transitioned

ME = OwnerId("host-a", 1, "nonce-1")


def _placed_on(shards: fencepost.ShardSet, name: str, prefix: str) -> str:
    return next(f"{prefix}{i}" for i in range(1000) if shards.place(f"{prefix}{i}") == name)


def _failed(runs, run_id: str, state: str = '{"at":1}') -> None:
    runs.create(run_id, "{}")
    runs.claim_and_own(run_id, RunSnapshot("pending", None, None), ME, 1_000)
    assert isinstance(runs.transition_owned(run_id, ME, "failed", state_json=state), Transitioned)


def _entry_types(shards: fencepost.ShardSet, run_id: str) -> list[str]:
    return [e.event_type for e in shards.journal.entries(run_id).entries]


def test_retry_creates_the_round_on_the_lineage_shard(shard_urls: Callable[[int], list[str]]) -> None:
    with fencepost.open_shards(shard_urls(3)) as shards:
        # A lineage whose default round ids are placed on other shards than the lineage's own.
        root = next(f"job{i}" for i in range(1000)
                    if shards.place(f"job{i}") != shards.place(f"job{i}.retry-1")
                    and shards.place(f"job{i}") != shards.place(f"job{i}.retry-2"))
        home = shards.place(root)
        _failed(shards.runs, root)
        row = shards.runs.retry(root)
        assert (row.run_id, row.status, row.lineage_id, row.round_ordinal, row.parent_run_id, row.state_json) == (
            f"{root}.retry-1", "pending", root, 1, root, '{"at":1}')
        assert shards.locate(row.run_id) == home
        assert shards[home].runs.get(row.run_id) == row
        assert "flows.run-store.retried" in _entry_types(shards, root)
        # Retried again from a later round (its own id also placed elsewhere): the next round, same shard.
        shards.runs.claim_and_own(row.run_id, RunSnapshot("pending", None, None), ME, 2_000)
        shards.runs.transition_owned(row.run_id, ME, "failed", state_json='{"at":2}')
        second = shards.runs.retry(row.run_id)
        assert (second.run_id, second.round_ordinal, second.parent_run_id, second.state_json) == (
            f"{root}.retry-2", 2, row.run_id, '{"at":2}')
        assert shards.locate(second.run_id) == home
        assert [r.run_id for r in shards.runs.lineage(root)] == [root, row.run_id, second.run_id]
    with fencepost.open_shards(shard_urls(1)) as single:  # one shard: the store's own retry
        _failed(single.runs, "solo")
        assert single.runs.retry("solo").run_id == "solo.retry-1"


def test_retry_with_a_new_id_placed_elsewhere(shard_urls: Callable[[int], list[str]]) -> None:
    with fencepost.open_shards(shard_urls(2)) as shards:
        root = _placed_on(shards, "shard-0", "a")
        new = _placed_on(shards, "shard-1", "b")
        _failed(shards.runs, root)
        row = shards.runs.retry(root, new_run_id=new)
        assert (row.run_id, row.lineage_id, row.round_ordinal) == (new, root, 1)
        assert shards.locate(new) == "shard-0"
        assert shards["shard-0"].runs.get(new).run_id == new


def test_retry_refuses_as_one_store_does(shard_urls: Callable[[int], list[str]]) -> None:
    with fencepost.open_shards(shard_urls(2)) as shards, fencepost.open(shard_urls(1)[0]) as one:
        root = _placed_on(shards, "shard-0", "a")
        taken = _placed_on(shards, "shard-1", "t")  # an id another shard holds
        for runs in (shards.runs, one.runs):
            _failed(runs, root)
            runs.create(taken, "{}")
        answers = []
        for runs in (shards.runs, one.runs):
            found = []
            for call in (lambda r=runs: r.retry(root, new_run_id=taken),
                         lambda r=runs: r.retry("nope"),
                         lambda r=runs: r.retry(""),
                         lambda r=runs: r.retry(root, new_run_id=""),
                         lambda r=runs: r.retry(root, new_run_id="flows.companion/x")):
                with pytest.raises(RunStoreError) as err:
                    call()
                found.append((type(err.value), err.value.code, str(err.value)))
            answers.append(found)
        assert answers[0] == answers[1]
        assert answers[0][0][0] is RunAlreadyExists
        # Live latest round: refused, as one store refuses it.
        for runs in (shards.runs, one.runs):
            runs.retry(root)
        live = []
        for runs in (shards.runs, one.runs):
            with pytest.raises(RunStoreError) as err:
                runs.retry(root)
            live.append((err.value.code, str(err.value)))
        assert live[0] == live[1] and live[0][0] == "refused"


def test_retry_refuses_an_id_held_by_another_shard_with_nothing_created(
        shard_urls: Callable[[int], list[str]]) -> None:
    with fencepost.open_shards(shard_urls(2)) as shards:
        root = next(f"j{i}" for i in range(1000) if shards.place(f"j{i}") == "shard-0"
                    and shards.place(f"j{i}.retry-1") == "shard-1")
        _failed(shards.runs, root)
        shards.runs.create(f"{root}.retry-1", "{}")  # an unrelated run took the default id, on shard-1
        with pytest.raises(RunAlreadyExists) as err:
            shards.runs.retry(root)
        assert err.value.code == "constraint"
        assert [r.run_id for r in shards.runs.lineage(root)] == [root]
        # Another id: the round goes through, on the lineage's shard.
        assert shards.runs.retry(root, new_run_id=f"{root}.again").run_id == f"{root}.again"
        assert shards["shard-0"].runs.get(f"{root}.again").lineage_id == root
        # An id whose history is on another shard (a deleted run's journal stream stays there) is
        # refused too: the round would split that id's stream across two shards.
        shards.runs.delete(f"{root}.retry-1")
        shards.runs.claim_and_own(f"{root}.again", RunSnapshot("pending", None, None), ME, 3_000)
        shards.runs.transition_owned(f"{root}.again", ME, "failed")
        with pytest.raises(RunStoreError) as err:
            shards.runs.retry(root, new_run_id=f"{root}.retry-1")
        assert err.value.code == "refused" and "shard-1" in str(err.value)
        assert [r.run_id for r in shards.runs.lineage(root)] == [root, f"{root}.again"]
