"""Creating one run id at once from several processes, on both backends: exactly one creation wins.

A run created with a ``parent_run_id`` or ``lineage_id`` goes to its anchor's shard, one created
without either to the shard its id is placed on. Every creation of an id is decided under the write
lock of the shard the id is placed on, so creations of one id racing with different anchors (or one
with and one without) end with the id on exactly one shard, the others refused by that shard as a
duplicate (``RunAlreadyExists``). Two creations that each need the other's shards (one id placed on
``A`` created on ``B``, another placed on ``B`` created on ``A``) take the locks in member order and
never wait for each other crosswise.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

import fencepost
from fencepost.shards.placement import place
from tests.conftest import race_processes

from . import _create_workers as w

ROUNDS = 16
REFUSED = ("refused", "RunAlreadyExists:constraint")
# Far below the stores' wait for a lock (busy_timeout_ms, 10 s): a creation that waited for another
# one crosswise would only finish (or fail) after it.
PROMPT_S = 4.0
CROSSING_ROUNDS = 8  # crossed, each round would wait out the 10 s: the test still ends within the race's timeout


def _placed_on(names: tuple[str, ...], shard: str, prefix: str, count: int) -> list[str]:
    """``count`` ids starting with ``prefix`` that are placed on ``shard``."""
    found = [f"{prefix}-{i}" for i in range(10_000) if place(f"{prefix}-{i}", names) == shard]
    assert len(found) >= count
    return found[:count]


def _anchors(urls: list[str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """Found the set on ``urls`` and create, on every shard, a run to anchor creations on (a root
    named after the shard): the member names and the anchor of each shard."""
    with fencepost.open_shards(urls) as shards:
        roots = {name: _placed_on(shards.names, name, f"root-{name}", 1)[0] for name in shards.names}
        for name, root in roots.items():
            shards.runs.create(root, "{}")
            assert shards.locate(root) == name
        return shards.names, roots


def _holders(urls: list[str], run_ids: list[str]) -> dict[str, list[str]]:
    """Every shard holding each of ``run_ids`` (a fresh open: nothing remembered)."""
    held: dict[str, list[str]] = {rid: [] for rid in run_ids}
    with fencepost.open_shards(urls) as shards:
        for name, store in shards.items():
            for rid in run_ids:
                try:
                    store.runs.get(rid)
                except fencepost.RunStoreError as exc:
                    assert exc.code == "not_found_row", exc
                    continue
                held[rid].append(name)
    return held


def _race(urls: list[str], plans: list[list[tuple[str, dict[str, Any]]]], *,
          pause: float = 0.0) -> list[list[tuple[str, str, float]]]:
    """Run ``plans`` (one per process, a creation per round), every round at once; each process's
    outcomes. ``pause``: seconds each lone write of the processes waits with its lock taken."""
    results, _ = race_processes(w.create_rounds, lambda i: (urls, i, plans[i], pause), len(plans), timeout=150)
    assert all(r[0] == "done" for r in results), results
    by_process = {r[1]: r[2] for r in results}
    return [by_process[i] for i in range(len(plans))]


def _one_winner(urls: list[str], run_ids: list[str], outcomes: list[list[tuple[str, str, float]]],
                homes: list[set[str]]) -> None:
    """Each round's id was created exactly once, on a shard of that round's ``homes`` and on no
    other shard, and every other creation of it was refused as a duplicate."""
    held = _holders(urls, run_ids)
    split = {rid: shards for rid, shards in held.items() if len(shards) != 1}
    won = Counter(r for per in outcomes for r, o in enumerate(per) if o[0] == "ok")
    twice = {run_ids[r]: n for r, n in won.items() if n != 1}
    assert not split and not twice and len(won) == len(run_ids), (
        f"{len(split)} of {len(run_ids)} ids on two shards, {len(twice)} created twice: {split} {twice}")
    for r, rid in enumerate(run_ids):
        assert held[rid][0] in homes[r], (rid, held[rid], homes[r])
        assert sorted(per[r][:2] for per in outcomes) == sorted([("ok", ""), *[REFUSED] * (len(outcomes) - 1)])


@pytest.mark.slow
def test_one_id_created_at_once_with_and_without_an_anchor_is_created_once(shard_urls) -> None:
    """Round after round, one process creates an id with an anchor on one shard (a parent, or a
    lineage root) while another creates it without one: its id is placed on the other shard. Half
    the rounds the anchor's shard comes first in member order, half the placed shard."""
    urls = shard_urls(2)
    names, roots = _anchors(urls)
    ids: list[str] = []
    anchored: list[tuple[str, dict[str, Any]]] = []
    plain: list[tuple[str, dict[str, Any]]] = []
    homes: list[set[str]] = []
    for r in range(ROUNDS):
        anchor, placed = (names[0], names[1]) if r % 2 == 0 else (names[1], names[0])
        rid = _placed_on(names, placed, f"both-{r}", 1)[0]
        kwargs: dict[str, Any] = ({"parent_run_id": roots[anchor]} if r % 4 < 2 else
                                  {"lineage_id": roots[anchor], "round_ordinal": r + 1})
        ids.append(rid)
        anchored.append((rid, kwargs))
        plain.append((rid, {}))
        homes.append({anchor, placed})
    outcomes = _race(urls, [anchored, plain])
    _one_winner(urls, ids, outcomes, homes)


@pytest.mark.slow
def test_one_id_created_at_once_with_parents_on_different_shards_is_created_once(shard_urls) -> None:
    """Three shards; the id is placed on one of them, and three processes create it at once: with a
    parent on each of the two other shards, and without a parent."""
    urls = shard_urls(3)
    names, roots = _anchors(urls)
    ids: list[str] = []
    plans: list[list[tuple[str, dict[str, Any]]]] = [[], [], []]
    homes: list[set[str]] = []
    for r in range(ROUNDS):
        placed = names[r % 3]
        first, second = (n for n in names if n != placed)
        rid = _placed_on(names, placed, f"forks-{r}", 1)[0]
        ids.append(rid)
        plans[0].append((rid, {"parent_run_id": roots[first]}))
        plans[1].append((rid, {"parent_run_id": roots[second]}))
        plans[2].append((rid, {}))
        homes.append(set(names))
    outcomes = _race(urls, plans)
    _one_winner(urls, ids, outcomes, homes)


@pytest.mark.slow
def test_one_id_created_at_once_without_anchors_is_created_once(shard_urls) -> None:
    """Two processes create the same id at once, neither with an anchor: it is created once, on its
    placed shard."""
    urls = shard_urls(3)
    names, _ = _anchors(urls)
    ids = [f"plain-{r}" for r in range(ROUNDS)]
    plan: list[tuple[str, dict[str, Any]]] = [(rid, {}) for rid in ids]
    outcomes = _race(urls, [plan, plan])
    _one_winner(urls, ids, outcomes, [{place(rid, names)} for rid in ids])


@pytest.mark.slow
def test_creations_whose_placed_and_anchor_shards_cross_do_not_wait_for_each_other(shard_urls) -> None:
    """At the same moment, one process creates an id placed on shard A with a parent on shard B, the
    other an id placed on B with a parent on A. Each needs both shards' write locks; taken in member
    order, neither waits for the other crosswise (which would last the stores' 10 s wait for a
    lock): both are created, on their parents' shards, promptly. Each lock is held a little longer
    (20 ms) than it would be, so that locks taken in opposite orders would cross every round."""
    urls = shard_urls(2)
    names, roots = _anchors(urls)
    a, b = names
    xs = _placed_on(names, a, "cross-x", CROSSING_ROUNDS)
    ys = _placed_on(names, b, "cross-y", CROSSING_ROUNDS)
    outcomes = _race(urls, [[(x, {"parent_run_id": roots[b]}) for x in xs],
                            [(y, {"parent_run_id": roots[a]}) for y in ys]], pause=0.02)
    assert all(o[0] == "ok" for per in outcomes for o in per), outcomes
    slowest = max(o[2] for per in outcomes for o in per)
    assert slowest < PROMPT_S, f"a crossing creation took {slowest:.1f} s"
    held = _holders(urls, xs + ys)
    assert all(held[x] == [b] for x in xs) and all(held[y] == [a] for y in ys), held


def test_one_id_created_at_once_by_threads_of_one_process_is_created_once(shard_urls) -> None:
    """Threads of one process share each store's commits (group commit): six threads create one id
    at once, with parents on each of the three shards and without one; it is created once."""
    urls = shard_urls(3)
    names, roots = _anchors(urls)
    kinds: list[dict[str, Any]] = [{}, {}, *({"parent_run_id": roots[n]} for n in names), {}]
    ids = [f"threads-{r}" for r in range(ROUNDS)]
    outcomes: list[list[tuple[str, str, float]]] = [[] for _ in kinds]
    with fencepost.open_shards(urls) as shards:
        barrier = threading.Barrier(len(kinds))

        def run(i: int) -> None:
            for rid in ids:
                barrier.wait(timeout=60)
                try:
                    shards.runs.create(rid, "{}", **kinds[i])
                    outcomes[i].append(("ok", "", 0.0))
                except fencepost.RunStoreError as exc:
                    outcomes[i].append(("refused", f"{type(exc).__name__}:{exc.code}", 0.0))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(kinds))]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
    assert all(len(per) == len(ids) for per in outcomes), outcomes
    _one_winner(urls, ids, outcomes, [set(names)] * len(ids))
