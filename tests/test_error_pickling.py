"""Errors cross process boundaries (worker processes, multiprocessing pools) by pickling."""

from __future__ import annotations

import pickle

from fencepost._durable import DbFailure, map_failure
from fencepost.errors import OpenError, RunStoreError, SourceChanged


def test_a_pickled_error_keeps_the_attributes_set_after_it_was_made() -> None:
    """Defect: ``db_code`` (set by the failure mapping), ``store`` and ``rotated`` were lost in a
    pickle round trip: only code, method and detail were carried."""
    mapped = map_failure(DbFailure("persistence_failed", "SQLITE_FULL"), RunStoreError, "create", "run")
    back = pickle.loads(pickle.dumps(mapped))
    assert type(back) is RunStoreError and str(back) == str(mapped)
    assert (back.code, back.db_code) == ("persistence_failed", "SQLITE_FULL")

    rotated = SourceChanged("invalid_run", "follow", "change position belongs to another source: rebuild")
    rotated.rotated, rotated.store = True, "edge"
    back = pickle.loads(pickle.dumps(rotated))
    assert type(back) is SourceChanged and (back.rotated, back.store, back.detail) == (True, "edge", rotated.detail)

    opened = OpenError("disk_full", "open", "the disk is full", db_code="SQLITE_FULL")
    opened.store = "central"
    back = pickle.loads(pickle.dumps(opened))
    assert (back.code, back.db_code, back.store, str(back)) == ("disk_full", "SQLITE_FULL", "central", str(opened))
