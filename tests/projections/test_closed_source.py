"""A closed source store is refused before the builder touches its target.

Found by a new-user walkthrough: ``ProjectionBuilder(store, target, ...)`` over a store already
closed (a ``with fencepost.open(...)`` block left too early) created the SQLite target file and the
builder's lock file beside it, then failed reading the source with
``persistence_failed: RunStore.position: change feed read persistence failed: the store is closed``,
naming neither the builder nor its source. Now ``ProjectionError('invalid_sources')`` saying the
source store is closed (by position with several sources, never a name), from the constructor, or
from the first call when the store was closed after the builder was made, and nothing is written.
Sources on both backends; the target is a SQLite file so that "nothing created" can be seen.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import fencepost
from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus


def _nothing_beside(target_dir: Path) -> None:
    assert list(target_dir.iterdir()) == [], list(target_dir.iterdir())


def _target(tmp_path: Path) -> tuple[Path, str]:
    folder = tmp_path / "read-model"
    folder.mkdir()
    return folder, f"sqlite:///{folder / 'rm.db'}"


def test_a_closed_store_is_refused_when_the_builder_is_made(store, tmp_path) -> None:
    folder, url = _target(tmp_path)
    store.runs.create("r1", "{}")
    store.close()
    with pytest.raises(ProjectionError) as caught:
        ProjectionBuilder(store, url, RunsByStatus())
    assert caught.value.code == "invalid_sources" and "closed" in str(caught.value), caught.value
    _nothing_beside(folder)


@pytest.mark.parametrize("call", ["catch_up", "rebuild", "offer", "run"])
def test_a_store_closed_after_the_builder_was_made_is_refused_at_the_first_call(store, tmp_path, call) -> None:
    import threading

    folder, url = _target(tmp_path)
    store.runs.create("r1", "{}")
    builder = ProjectionBuilder(store, url, RunsByStatus())
    try:
        store.close()
        args = {"offer": ([],), "run": (threading.Event(),)}.get(call, ())
        with pytest.raises(ProjectionError) as caught:
            getattr(builder, call)(*args)
        assert caught.value.code == "invalid_sources" and "closed" in str(caught.value), caught.value
    finally:
        builder.close()
    _nothing_beside(folder)


def test_with_several_sources_the_closed_one_is_named_by_position(store, tmp_path) -> None:
    folder, url = _target(tmp_path)
    other = fencepost.open(f"sqlite:///{tmp_path / 'other.db'}")
    try:
        store.close()
        with pytest.raises(ProjectionError) as caught:
            ProjectionBuilder({"edge-1": other, "central": store}, url, RunsByStatus())
        text = str(caught.value)
        assert caught.value.code == "invalid_sources" and "source #1" in text and "closed" in text, text
        assert "central" not in text
    finally:
        other.close()
    _nothing_beside(folder)
