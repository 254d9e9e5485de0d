"""Membership writes under interruption and concurrency, on both backends.

An interrupted grow (a SIGKILL at any membership write, or a store that cannot be written) leaves a
state the same grow finishes when run again. Two opens that would record different memberships at
once (two grows appending different stores, or the same store under other names; two foundings of
different lists sharing a first store) end with one accepted and the other refused
(``membership_mismatch``), never both. Identical concurrent grows and foundings both succeed. A grow
adds empty stores only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import fencepost
from fencepost._durable import resolve_url
from fencepost.errors import FencepostError
from fencepost.shards import ShardError
from fencepost.shards import membership as ms
from tests.conftest import race_processes

from . import _membership_workers as w

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 5


def _state(urls: list[str]) -> list[tuple[ms.Membership | None, bool]]:
    """Each store's record and whether it is marked founded (every store must exist)."""
    out = []
    for url in urls:
        with fencepost.open(url) as s:
            out.append((ms.read(s), ms.read_founded(s) is not None))
    return out


def _set_with_runs(urls: list[str], n: int = 10) -> None:
    with fencepost.open_shards(urls) as shards:
        for i in range(n):
            shards.runs.create(f"r-{i}", "{}")


def _blank(*urls: str) -> None:
    for url in urls:
        fencepost.open(url).close()  # fresh, empty, migrated stores (as `fencepost init` leaves them)


def _child(urls: Any, *, grow: bool, stop: str = "0", go: Path | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    args = [sys.executable, "-m", "tests.shards._membership_child", json.dumps(urls), "1" if grow else "0",
            stop]
    if go is not None:
        args.append(str(go))
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(proc: subprocess.Popen[str], word: str) -> None:
    """Read the child's output up to the line ``word`` (lines before it are the child's own steps)."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    while line.strip() == "opening" and word != "opening":
        line = proc.stdout.readline()
    if line.strip() != word:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        pytest.fail(f"the child did not print {word}: {line!r} {err[-2000:]}")


def _outcome(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=60)
    lines = [ln for ln in out.splitlines() if ln.strip() and ln.strip() not in ("paused", "opening")]
    assert lines, err[-2000:]
    return lines[-1]


def _opens(urls: Any, **kw: Any) -> bool:
    try:
        fencepost.open_shards(urls, **kw).close()
    except ShardError as exc:
        assert exc.code == "membership_mismatch", exc
        return False
    return True


def _killed_after(urls: list[str], *, grow: bool, writes: int) -> None:
    """Open ``urls`` (growing or not) in a child process and SIGKILL it right after its ``writes``-th
    membership write."""
    proc = _child(urls, grow=grow, stop=f"after:{writes}")
    try:
        _wait_for(proc, "paused")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)


# ---------------------------------------------------------------- an interrupted grow is finished by re-running it
@pytest.mark.parametrize("stop", [1, 2, 3, 4])
def test_a_grow_killed_at_any_membership_write_is_finished_by_running_it_again(shard_urls, stop: int) -> None:
    """SIGKILL the grow of [s0, s1] by s2 right after its 1st, 2nd, 3rd, 4th membership write. The
    same grow run again finishes it: every store records the grown list, every run is still found."""
    urls = shard_urls(3)
    _set_with_runs(urls[:2])
    _killed_after(urls, grow=True, writes=stop)
    with fencepost.open_shards(urls, grow=True) as shards:
        assert shards.membership.generation == 2
        assert all(shards.runs.get(f"r-{i}") is not None for i in range(10))
        shards.runs.create("after", "{}")
    with fencepost.open_shards(urls) as shards:
        assert shards.membership.members == ("shard-0", "shard-1", "shard-2")
    state = _state(urls)
    assert [(r.generation, r.members, founded) for r, founded in state if r is not None] == \
        [(2, ("shard-0", "shard-1", "shard-2"), True)] * 3
    assert not _opens(urls[:2])  # the old list is refused once the grow finished


@pytest.mark.parametrize("stop", [1, 2, 3, 4, 5])
def test_a_founding_killed_at_any_membership_write_is_finished_by_the_next_open(shard_urls, stop: int) -> None:
    """SIGKILL the founding of [s0, s1, s2] (empty stores) after each of its membership writes: the
    next open of the same list founds or finishes the set, and every member ends recorded and marked."""
    urls = shard_urls(3)
    _blank(*urls)
    _killed_after(urls, grow=False, writes=stop)
    with fencepost.open_shards(urls) as shards:
        shards.runs.create("after", "{}")
        set_id = shards.membership.set_id
    assert [(r.set_id, r.shard_name, founded) for r, founded in _state(urls) if r is not None] == \
        [(set_id, "shard-0", True), (set_id, "shard-1", True), (set_id, "shard-2", True)]


def test_a_grow_whose_new_store_cannot_be_written_changes_nothing(shard_urls, backend: str, monkeypatch) -> None:
    """The new store's write lock is held by another connection past the wait: the grow fails
    (``persistence_failed``), every store is left as it was, and the same grow then succeeds."""
    urls = shard_urls(3)
    _set_with_runs(urls[:2])
    _blank(urls[2])
    before = _state(urls)
    waiting = urls[2] + ("&" if "?" in urls[2] else "?") + "busy_timeout_ms=300"
    holder = fencepost.open(urls[2])
    held, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: holder.db.write(lambda conn: (held.set(), release.wait(30))))
    real = ms._record

    def lock_the_new_store_first(store: Any, *args: Any, **kwargs: Any) -> None:
        if store.db.url == resolve_url(waiting) and not held.is_set():
            thread.start()
            assert held.wait(10)
        return real(store, *args, **kwargs)

    monkeypatch.setattr(ms, "_record", lock_the_new_store_first)
    try:
        with pytest.raises(ShardError) as err:
            fencepost.open_shards([urls[0], urls[1], waiting], grow=True)
        assert err.value.code == "persistence_failed", err.value
    finally:
        release.set()
        if thread.is_alive():
            thread.join(30)
        holder.close()
    monkeypatch.setattr(ms, "_record", real)
    assert held.is_set()
    assert _state(urls) == before
    with fencepost.open_shards(urls, grow=True) as shards:
        assert shards.membership.generation == 2
        assert all(shards.runs.get(f"r-{i}") is not None for i in range(10))
    fencepost.open_shards(urls).close()


# ---------------------------------------------------------------- two different grows or foundings at once
def _one_wins(first: Any, second: Any, outcomes: list[str]) -> tuple[Any, Any]:
    """Exactly one of two opens was accepted and the other refused (``membership_mismatch``): the
    accepted list opens afterwards, the refused one does not. Returns ``(winner, loser)``."""
    kinds = [o.split(" ", 2)[:2] for o in outcomes]
    assert sorted(k[0] for k in kinds) == ["ok", "refused"], outcomes
    assert all(k[1] == "membership_mismatch" for k in kinds if k[0] == "refused"), outcomes
    winner, loser = (first, second) if kinds[0][0] == "ok" else (second, first)
    assert _opens(winner)
    assert not _opens(loser)
    return winner, loser


def _paused_race(first: Any, second: Any, *, grow: bool, stop: str, tmp_path: Path) -> list[str]:
    """``first`` stops at a membership write (``stop``: ``after:K`` or ``before:K``); ``second``
    starts then; ``first`` carries on once ``second`` ended or has been opening for 3 s (it waits
    for ``first``'s write lock on store #0 meanwhile, well within its 10 s wait for a lock). Their
    outcomes, in that order."""
    go = tmp_path / f"go-{time.monotonic_ns()}"
    a = _child(first, grow=grow, stop=stop, go=go)
    b = None
    try:
        _wait_for(a, "paused")
        b = _child(second, grow=grow)
        _wait_for(b, "opening")
        try:
            b.wait(3.0)
        except subprocess.TimeoutExpired:
            pass
        go.touch()
        return [_outcome(a), _outcome(b)]
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=30)


def test_two_grows_appending_different_stores_under_one_name_do_not_both_succeed(shard_urls, tmp_path) -> None:
    """The first grower stops after its first membership write; the second grows meanwhile."""
    s0, s1, s2, s3 = shard_urls(4)
    _set_with_runs([s0, s1])
    _blank(s2, s3)
    outcomes = _paused_race([s0, s1, s2], [s0, s1, s3], grow=True, stop="after:1", tmp_path=tmp_path)
    _, loser = _one_wins([s0, s1, s2], [s0, s1, s3], outcomes)
    with fencepost.open(loser[2]) as s:
        assert ms.read(s) is None  # the refused grow left its new store as it was


def test_two_grows_appending_under_different_names_do_not_both_succeed(shard_urls, tmp_path) -> None:
    """The first grower has read every record and stops before its first membership write; the
    second grows meanwhile."""
    s0, s1, s2, s3 = shard_urls(4)
    _set_with_runs([s0, s1])
    _blank(s2, s3)
    x = {"shard-0": s0, "shard-1": s1, "x": s2}
    y = {"shard-0": s0, "shard-1": s1, "y": s3}
    outcomes = _paused_race(x, y, grow=True, stop="before:1", tmp_path=tmp_path)
    winner, loser = _one_wins(x, y, outcomes)
    assert {r.members for r, _ in _state([s0, s1, list(winner.values())[2]]) if r} == {tuple(winner)}
    with fencepost.open(list(loser.values())[2]) as s:
        assert ms.read(s) is None  # the refused grow left its new store as it was


def test_two_foundings_of_different_lists_sharing_the_first_store_do_not_both_succeed(shard_urls, tmp_path) -> None:
    """The first founder recorded its first store and stops before recording the second; the
    second founder (the same first store, another second store) opens meanwhile."""
    s0, s1, s2 = shard_urls(3)
    _blank(s0, s1, s2)
    outcomes = _paused_race([s0, s1], [s0, s2], grow=False, stop="before:2", tmp_path=tmp_path)
    _, loser = _one_wins([s0, s1], [s0, s2], outcomes)
    with fencepost.open(loser[1]) as s:
        assert ms.read(s) is None


@pytest.mark.parametrize("kind", ["grow_same_name", "grow_other_names", "found_other_lists", "grow_identical",
                                  "found_identical"])
def test_concurrent_opens_race_freely(shard_urls, kind: str) -> None:
    """Two processes open at once (a barrier, no pause), ROUNDS times: two different grows or
    foundings end with exactly one accepted; identical ones both succeed, on one membership."""
    plans: list[tuple[Any, Any]] = []
    for _ in range(ROUNDS):
        s0, s1, s2, s3 = shard_urls(4)
        if kind.startswith("grow"):
            _set_with_runs([s0, s1], 3)
        _blank(*(u for u in (s0, s1, s2, s3) if not kind.startswith("grow") or u in (s2, s3)))
        plans.append({
            "grow_same_name": ([s0, s1, s2], [s0, s1, s3]),
            "grow_other_names": ({"shard-0": s0, "shard-1": s1, "x": s2}, {"shard-0": s0, "shard-1": s1, "y": s3}),
            "found_other_lists": ([s0, s1], [s0, s2]),
            "grow_identical": ([s0, s1, s2], [s0, s1, s2]),
            "found_identical": ([s0, s1], [s0, s1]),
        }[kind])
    grow = kind.startswith("grow")
    results, _ = race_processes(w.open_rounds, lambda i: (i, [p[i] for p in plans], grow), 2, timeout=90)
    assert all(r[0] == "done" for r in results), results
    results.sort(key=lambda r: r[1])  # in process order: process i opened plans[rnd][i]
    for rnd, (first, second) in enumerate(plans):
        outcomes = [r[2][rnd] for r in results]
        if kind.endswith("identical"):
            assert [o[0] for o in outcomes] == ["ok", "ok"], outcomes
            assert outcomes[0][1:] == outcomes[1][1:], outcomes
            assert _opens(first)
        else:
            _one_wins(first, second, [" ".join(map(str, o)) for o in outcomes])


# ---------------------------------------------------------------- a grow adds empty stores only
def test_a_grow_refuses_a_store_that_holds_runs_and_changes_nothing(shard_urls) -> None:
    urls = shard_urls(3)
    _set_with_runs(urls[:2])
    with fencepost.open(urls[2]) as s:
        s.runs.create("r-1", "{}")  # the id is also a member's: it must never be held by two shards
    before = _state(urls)
    with pytest.raises(ShardError) as err:
        fencepost.open_shards(urls, grow=True)
    assert err.value.code == "membership_mismatch"
    assert "shard #2 holds runs" in str(err.value) and "a grow adds empty stores only" in str(err.value)
    assert _state(urls) == before
    fencepost.open_shards(urls[:2]).close()


def test_a_grow_refuses_a_store_that_got_runs_after_the_look(shard_urls, monkeypatch) -> None:
    """Runs reach the new store after the read-only look and after the grow read it empty: the
    recording write looks again and refuses; every store is left as it was."""
    urls = shard_urls(3)
    _set_with_runs(urls[:2])
    _blank(urls[2])
    before = _state(urls)
    real_empty = ms._empty
    done: list[bool] = []

    def empty_then_a_run_arrives(store: Any) -> bool:
        found = real_empty(store)
        if not done and store.db.url == resolve_url(urls[2]):
            done.append(True)
            with fencepost.open(urls[2]) as other:
                other.runs.create("late", "{}")
        return found

    monkeypatch.setattr(ms, "_empty", empty_then_a_run_arrives)
    with pytest.raises(FencepostError) as err:
        fencepost.open_shards(urls, grow=True)
    assert done
    assert err.value.code == "membership_mismatch", err.value
    assert "shard #2 holds runs" in str(err.value)
    assert _state(urls) == before


def test_checking_a_founded_set_takes_no_lock_and_writes_nothing(shard_urls) -> None:
    """Membership changes hold store #0's write lock; checking a set whose members already record
    the given list, marked founded (what every ordinary open of the set does once its stores are
    open), has nothing to change: it answers while another connection holds that lock (it would
    wait for the lock, then fail at the busy timeout, if it took it) and leaves every record as it was."""
    urls = shard_urls(2)
    _set_with_runs(urls, 2)
    before = _state(urls)
    held, release = threading.Event(), threading.Event()
    checked: list[Any] = []
    stores = [fencepost.open(url) for url in urls]
    try:
        with fencepost.open(urls[0]) as locker_store:
            locker = threading.Thread(
                target=lambda: locker_store.db.write(lambda conn: (held.set(), release.wait(30))))
            locker.start()
            try:
                assert held.wait(10)
                checker = threading.Thread(
                    target=lambda: checked.append(ms.reconcile(["shard-0", "shard-1"], stores).generation))
                checker.start()
                checker.join(5)  # well under the busy timeout (10 s)
                assert checked == [1], "checking the set waited for store #0's write lock"
            finally:
                release.set()
                locker.join(30)
                checker.join(30)
    finally:
        for store in stores:
            store.close()
    assert _state(urls) == before
