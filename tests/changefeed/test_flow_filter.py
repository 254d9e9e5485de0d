"""The ``flow_name`` filter matches a run whose state's top-level ``flowName`` is that JSON string,
and nothing else: not the same digits as a number, not a nested ``flowName``, and the same string
written with escapes does match. The same answers on both backends, through ``list_runs`` and
``count_runs`` (the filter of ``fencepost runs list --flow`` and the console's runs page)."""

from __future__ import annotations

import fencepost
from tests.changefeed.conftest import insert_run

STATES = {
    "text-5": '{"flowName": "5"}',
    "number-5": '{"flowName": 5}',
    "true": '{"flowName": true}',
    "null": '{"flowName": null}',
    "object": '{"flowName": {"flowName": "5"}}',
    "array": '{"flowName": ["5"]}',
    "nested": '{"inner": {"flowName": "5"}}',
    "missing": '{}',
    "plain": '{"flowName": "flow"}',
    "escaped": '{"flowName": "\\u0066low"}',
    "accent": '{"flowName": "caf\\u00e9"}',
    "quote": '{"flowName": "a\\"b"}',
}


def test_the_flow_filter_matches_the_string_only(store: fencepost.Store, raw) -> None:
    for i, (run_id, state) in enumerate(STATES.items()):
        insert_run(raw, run_id, created=i, state=state)
    raw.commit()

    def matching(flow: str) -> list[str]:
        listed = [r.run_id for r in store.feed.list_runs({"flow_name": flow}).runs]
        assert store.feed.count_runs({"flow_name": flow}) == len(listed)
        return listed

    assert matching("5") == ["text-5"]
    assert matching("flow") == ["plain", "escaped"]
    assert matching("café") == ["accent"]
    assert matching('a"b') == ["quote"]
    assert matching("true") == [] and matching("null") == [] and matching("{}") == []
