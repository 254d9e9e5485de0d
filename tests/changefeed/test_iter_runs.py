"""``feed.iter_runs`` (every page as one iterator), ``feed.count_runs``, newest-first listing and
several statuses in one keyset listing, checked against a model of the rows."""

from __future__ import annotations

import json

import pytest

from fencepost import RunStoreError
from tests.changefeed.conftest import insert_run

STATUSES = ["pending", "running", "suspended", "completed", "failed", "cancelled"]


@pytest.fixture
def rows(store, raw):
    """90 runs, several per creation millisecond (ties break on run_id), three flows, every status."""
    model = []
    for i in range(90):
        status = STATUSES[i % 6]
        row = {"run_id": f"r{(i * 37) % 90:03d}", "created": i // 3, "status": status,
               "flow": f"flow{i % 3}"}
        extra = {"owner_host_id": "h", "owner_pid": 1, "owner_nonce": "n", "heartbeat_at_ms": 0} \
            if status == "running" else {}
        insert_run(raw, row["run_id"], created=row["created"], status=status,
                   state=json.dumps({"flowName": row["flow"]}), **extra)
        model.append(row)
    raw.commit()
    return model


def _order(model, descending=False):
    return [r["run_id"] for r in sorted(model, key=lambda r: (r["created"], r["run_id"]), reverse=descending)]


@pytest.mark.parametrize("page_size", [1, 7, 200])
@pytest.mark.parametrize("descending", [False, True], ids=["asc", "desc"])
def test_iter_runs_yields_every_matching_run_once_in_listing_order(store, rows, page_size, descending):
    assert [r.run_id for r in store.feed.iter_runs(page_size=page_size, newest_first=descending)] == \
        _order(rows, descending)
    flow1 = [r for r in rows if r["flow"] == "flow1"]
    got = store.feed.iter_runs({"flow_name": "flow1"}, page_size=page_size, newest_first=descending)
    assert [r.run_id for r in got] == _order(flow1, descending)


def test_iter_runs_is_lazy_and_resumes_from_a_cursor(store, rows):
    it = store.feed.iter_runs(page_size=10)
    first = [next(it).run_id for _ in range(3)]
    assert first == _order(rows)[:3]
    page = store.feed.list_runs(None, None, 25)
    rest = [r.run_id for r in store.feed.iter_runs(cursor=page.cursor, page_size=10)]
    assert [r.run_id for r in page.runs] + rest == _order(rows)


@pytest.mark.parametrize("statuses", [["running", "failed"], ["pending", "completed", "cancelled"]])
def test_several_statuses_list_as_one_keyset(store, rows, statuses):
    wanted = [r for r in rows if r["status"] in statuses]
    assert [r.run_id for r in store.feed.iter_runs({"status": statuses}, page_size=4)] == _order(wanted)
    assert [r.run_id for r in store.feed.iter_runs({"status": statuses}, page_size=4, newest_first=True)] == \
        _order(wanted, True)
    # The order the statuses are given in does not matter: a cursor from one spelling resumes the other.
    page = store.feed.list_runs({"status": statuses}, None, 5)
    again = store.feed.list_runs({"status": list(reversed(statuses))}, page.cursor, 200)
    assert [r.run_id for r in page.runs + again.runs] == _order(wanted)
    assert store.feed.count_runs({"status": statuses}) == len(wanted)


def test_count_runs_matches_the_listing(store, rows):
    assert store.feed.count_runs() == 90
    for f in ({"status": "running"}, {"flow_name": "flow2"}, {"created_after_ms": 10, "created_before_ms": 20},
              {"status": "pending", "flow_name": "flow0"}):
        assert store.feed.count_runs(f) == sum(1 for _ in store.feed.iter_runs(f)), f


def test_a_cursor_is_bound_to_its_order(store, rows):
    asc = store.feed.list_runs(None, None, 5)
    desc = store.feed.list_runs(None, None, 5, newest_first=True)
    with pytest.raises(RunStoreError) as err:
        store.feed.list_runs(None, asc.cursor, 5, newest_first=True)
    assert err.value.code == "invalid_cursor"
    with pytest.raises(RunStoreError) as err:
        store.feed.list_runs(None, desc.cursor, 5)
    assert err.value.code == "invalid_cursor"


@pytest.mark.parametrize("bad", [[], ["pending", "sleeping"], [1], "sleeping"])
def test_bad_status_lists_are_refused(store, bad):
    with pytest.raises(RunStoreError) as err:
        store.feed.list_runs({"status": bad})
    assert err.value.code == "invalid_options"
    with pytest.raises(RunStoreError):
        store.feed.count_runs({"status": bad})


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"page_size": 0}, "page_size"),
    ({"page_size": -1}, "page_size"),
    ({"page_size": 201}, "page_size"),
    ({"page_size": "50"}, "page_size"),
    ({"page_size": None}, "page_size"),
    ({"page_size": True}, "page_size"),
    ({"filters": {"colour": "red"}}, "1 unknown filter"),
    ({"filters": ["status"]}, "filters"),
    ({"filters": {"status": "sleeping"}}, "status"),
    ({"cursor": 5}, "cursor"),
    ({"newest_first": "yes"}, "newest_first"),
])
def test_iter_runs_refuses_bad_arguments_when_called_naming_them(store, kwargs, field):
    """``iter_runs(page_size=0)`` returned a generator; the error came only at the first ``next``,
    and it named ``limit`` and ``list_runs``, neither of which the caller wrote. Now the call itself
    raises ``invalid_options`` from ``iter_runs``, naming the argument, before any query."""
    with pytest.raises(RunStoreError) as err:
        store.feed.iter_runs(**kwargs)
    assert err.value.code == "invalid_options"
    assert err.value.method == "iter_runs" and err.value.detail.startswith(field), err.value


def test_count_runs_errors_name_count_runs(store):
    with pytest.raises(RunStoreError) as err:
        store.feed.count_runs({"colour": "red"})
    assert err.value.code == "invalid_options" and err.value.method == "count_runs", err.value
