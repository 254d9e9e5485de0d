"""The cursor of a listing merged from several stores: its text, and what it refuses.

Pure encoding, no database: the same on both backends. Listings across stores that use it are
tested on both backends in tests/cli/test_several_stores.py and tests/ui/test_several_stores.py.
"""

from __future__ import annotations

import pytest

from fencepost.changefeed.cursor import decode_across, encode_across
from fencepost.errors import RunStoreError


def test_encode_across_writes_the_versioned_json_the_cli_prints():
    text = encode_across({"edge-1": '{"version":1,"runId":"r-\u00e9"}', "central": None})
    assert text == '{"version":1,"stores":{"edge-1":"{\\"version\\":1,\\"runId\\":\\"r-\u00e9\\"}","central":null}}'
    assert decode_across(text, ["central", "edge-1"]) == {"edge-1": '{"version":1,"runId":"r-\u00e9"}',
                                                         "central": None}


def test_decode_across_of_no_cursor_is_the_first_page():
    assert decode_across(None, ["a"]) == {}


@pytest.mark.parametrize("cursor", [
    "not json", "[]", '{"version":2,"stores":{}}', '{"version":1}', '{"version":1,"stores":[]}',
    '{"version":1,"stores":{"other":null}}', '{"version":1,"stores":{"a":3}}',
], ids=["not-json", "not-object", "version", "no-stores", "stores-not-object", "unknown-store", "not-text"])
def test_decode_across_refuses_what_is_not_a_cursor_across_these_stores(cursor):
    with pytest.raises(RunStoreError) as err:
        decode_across(cursor, ["a", "b"])
    assert err.value.code == "invalid_cursor"
    assert "across these stores" in str(err.value)
