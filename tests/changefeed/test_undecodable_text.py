"""A stored TEXT value that is not valid UTF-8 (written by hand or by a foreign tool) fails every read
of it as ``decode_failed``, naming the column, never the bytes and never the (possibly secret) run id.

SQLite only: SQLite stores whatever bytes a statement casts to TEXT and the driver fails to decode
them when the row is fetched. PostgreSQL refuses invalid UTF-8 on input in a UTF8 database; a SQL_ASCII database (which
would take any bytes) cannot hold a store at all today (opening it fails: psycopg returns its text as
bytes), so the case cannot arise there.
"""

from __future__ import annotations

import pytest

import fencepost
from tests.changefeed.conftest import insert_run

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])

# ``{"flowName": "fl\xffw"}``: valid JSON to SQLite's json_valid (it does not check UTF-8), invalid UTF-8.
BAD_STATE = "CAST(x'7b22666c6f774e616d65223a2022666cff77227d' AS TEXT)"
BAD_TEXT = "CAST(x'41ff42' AS TEXT)"


def spoil(raw, column: str, value: str = BAD_TEXT, run_id: str = "secret-run") -> None:
    raw.exec_driver_sql(f"UPDATE flows_runs SET {column} = {value} WHERE run_id = '{run_id}'")
    raw.commit()


def assert_decode_failed(err: fencepost.FencepostError, column: str) -> None:
    assert err.code == "decode_failed", err
    message = str(err)
    assert column in message
    assert "UTF-8" in message
    assert "secret-run" not in message
    assert "\ufffd" not in message and "A\\xff" not in message and "\\xff" not in message
    # The driver's exception (its text quotes the bytes) is not kept, not even as context.
    seen: BaseException | None = err
    while seen is not None:
        assert "Could not decode" not in str(seen) and not hasattr(seen, "orig"), repr(seen)
        seen = seen.__cause__ or seen.__context__


@pytest.fixture
def spoiled(store, raw):
    """Two runs, the second (``secret-run``) holding invalid UTF-8 in its state."""
    insert_run(raw, "good-run", created=1)
    insert_run(raw, "secret-run", created=2)
    raw.commit()
    spoil(raw, "state_json", BAD_STATE)
    return store


def test_runs_get_is_decode_failed(spoiled):
    with pytest.raises(fencepost.RunStoreError) as err:
        spoiled.runs.get("secret-run")
    assert_decode_failed(err.value, "state_json")
    assert spoiled.runs.get("good-run").run_id == "good-run"  # the store stays usable


def test_feed_read_is_decode_failed(spoiled):
    with pytest.raises(fencepost.RunStoreError) as err:
        spoiled.feed.read(["secret-run"])
    assert_decode_failed(err.value, "state_json")
    assert [s.run_id for s in spoiled.feed.read(["good-run"]).snapshots] == ["good-run"]


def test_changes_with_snapshots_is_decode_failed(spoiled, origin):
    with pytest.raises(fencepost.RunStoreError) as err:
        spoiled.feed.changes_with_snapshots(origin, 10)
    assert_decode_failed(err.value, "state_json")
    # The changes alone (no snapshots) are still readable.
    assert [c.run_id for c in spoiled.feed.changes_since(origin, 10).changes] == ["good-run", "secret-run"]


def test_follow_batches_is_decode_failed(spoiled, origin):
    with pytest.raises(fencepost.RunStoreError) as err:
        next(iter(spoiled.feed.follow_batches(origin, limit=10, poll_interval=0.01)))
    assert_decode_failed(err.value, "state_json")


def test_listing_is_list_failed_with_a_decode_cause(spoiled):
    with pytest.raises(fencepost.RunStoreError) as err:
        spoiled.feed.list_runs(None, None, 10)
    assert err.value.code == "list_failed"
    assert err.value.cause["code"] == "decode_failed"
    message = str(err.value)
    assert "state_json" in message and "UTF-8" in message and "secret-run" not in message and "\\xff" not in message


@pytest.mark.parametrize("column", ["status", "waiting_reason", "owner_host_id", "lineage_id"])
def test_any_text_column_is_named(store, raw, column):
    """Whichever text column holds the bytes, reads name it (CHECK constraints off to store them)."""
    insert_run(raw, "secret-run")
    raw.commit()
    raw.exec_driver_sql("PRAGMA ignore_check_constraints = ON")
    spoil(raw, column)
    if column != "waiting_reason":  # runs.get does not read the waiting columns
        with pytest.raises(fencepost.RunStoreError) as err:
            store.runs.get("secret-run")
        assert_decode_failed(err.value, column)
    with pytest.raises(fencepost.RunStoreError) as err:
        store.feed.read(["secret-run"])
    assert_decode_failed(err.value, column)


def test_a_write_that_reads_the_row_is_decode_failed_and_changes_nothing(spoiled, raw):
    """``retry`` reads the run inside its write: the write fails as decode_failed, nothing written."""
    raw.exec_driver_sql("PRAGMA ignore_check_constraints = ON")
    raw.exec_driver_sql("UPDATE flows_runs SET status = 'failed', finished_at_ms = 1 WHERE run_id = 'secret-run'")
    raw.commit()
    before = raw.exec_driver_sql("SELECT count(*) FROM flows_runs").scalar()
    with pytest.raises(fencepost.RunStoreError) as err:
        spoiled.runs.retry("secret-run", new_run_id="again")
    assert_decode_failed(err.value, "state_json")
    raw.rollback()
    assert raw.exec_driver_sql("SELECT count(*) FROM flows_runs").scalar() == before
