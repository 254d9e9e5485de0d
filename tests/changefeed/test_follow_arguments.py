"""Every follow of the change feed refuses a ``stop`` that is not an event when it is called, as it
already refused a bad ``poll_interval``: a ``ValueError`` naming ``stop``.

Before: ``next(iter(store.feed.follow(None, stop="x")))`` raised AttributeError 'is_set' at the
first item, and ``afollow`` and the merged follow of several stores refused neither argument until
iterated. Both backends.
"""

from __future__ import annotations

import threading

import pytest

import fencepost
from fencepost.shards.router import merged_follow


@pytest.mark.parametrize("stop", ["x", 5, object()])
def test_follow_and_follow_batches_refuse_a_bad_stop_when_called(store, stop):
    with pytest.raises(ValueError, match=r"^stop "):
        store.feed.follow(None, stop=stop)
    with pytest.raises(ValueError, match=r"^stop "):
        store.feed.follow_batches(None, stop=stop)


@pytest.mark.parametrize(("field", "kwargs"), [
    ("stop", {"stop": "x"}),
    ("poll_interval", {"poll_interval": 0}),
    ("poll_interval", {"poll_interval": float("nan")}),
    ("poll_interval", {"poll_interval": "2"}),
])
def test_afollow_refuses_bad_arguments_when_called(store, field, kwargs):
    with pytest.raises(ValueError, match=rf"^{field} "):
        store.feed.afollow(**kwargs)


@pytest.mark.parametrize(("field", "kwargs"), [
    ("stop", {"stop": "x"}),
    ("poll_interval", {"poll_interval": 0}),
    ("poll_interval", {"poll_interval": True}),
])
def test_the_merged_follow_refuses_bad_arguments_when_called(store, make_db_url, field, kwargs):
    with fencepost.open_shards([make_db_url(), make_db_url()]) as shards:
        with pytest.raises(ValueError, match=rf"^{field} "):
            shards.follow(**kwargs)
    with pytest.raises(ValueError, match=rf"^{field} "):
        merged_follow([("one", store)], **kwargs)


def test_any_stop_with_is_set_still_works(store):
    class Flag:
        def is_set(self) -> bool:
            return True

    assert list(store.feed.follow(None, stop=Flag(), poll_interval=60)) == []
    done = threading.Event()
    done.set()
    assert list(store.feed.follow_batches(None, stop=done, poll_interval=60)) == []
