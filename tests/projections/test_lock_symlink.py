"""One builder per projection name per target, whatever name the target file is given by.

The SQLite builder lock is an ``flock`` on a file beside the target; that file's name was made from
the target's path as given, so a second builder naming the same file through a symbolic link (to the
file, or to its directory) took a lock of its own and applied beside the first.
"""

from __future__ import annotations

import os

import pytest

import fencepost
from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus


@pytest.mark.parametrize("link", ["file", "directory"])
def test_a_builder_naming_the_target_through_a_symlink_is_refused(tmp_path, link: str) -> None:
    (tmp_path / "models").mkdir()
    real = tmp_path / "models" / "model.db"
    if link == "file":
        linked = tmp_path / "models" / "model-link.db"
        os.symlink(real, linked)
    else:
        os.symlink(tmp_path / "models", tmp_path / "linked")
        linked = tmp_path / "linked" / "model.db"
    with fencepost.open(f"sqlite:///{tmp_path / 'source.db'}") as store:
        store.runs.create("a", "{}")
        with ProjectionBuilder(store, f"sqlite:///{real}", RunsByStatus()) as first:
            first.catch_up()
            with pytest.raises(ProjectionError) as caught:
                with ProjectionBuilder(store, f"sqlite:///{linked}", RunsByStatus()) as second:
                    second.catch_up()
            assert caught.value.code == "builder_busy"
        # Once the first is closed, the one through the link takes it.
        with ProjectionBuilder(store, f"sqlite:///{linked}", RunsByStatus()) as second:
            second.catch_up()
    locks = [p for p in (tmp_path / "models").iterdir() if p.name.endswith(".lock")]
    assert [p.name.startswith("model.db.projection-") for p in locks] == [True]
