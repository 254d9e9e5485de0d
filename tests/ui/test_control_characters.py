"""Stored text holding control characters reaches the console's pages escaped, on both backends.

A run id may hold any character but NUL (and a lone surrogate); a flow name or an owner's host id
any text. Every page, fragment and JSON answer is free of raw C0 control characters (tab and line
feed aside), and each ``data-*`` attribute still reads back as the exact value: the page writes
such a character as a numeric character reference, which an HTML parser turns back into it.
"""

from __future__ import annotations

import html.parser
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import fencepost
from fencepost.journal.owner import OwnerId
from fencepost.ui import create_app
from fencepost.ui.app import run_href
from fencepost.ui.server import UiServer

from .conftest import PENDING, unescape

C0 = "".join(chr(c) for c in range(1, 0x20))
#: Run ids holding every C0 control but NUL (which no id holds), DEL, C1 controls and the line
#: and paragraph separators.
IDS = [C0, "a\x1b[31mred\x07", "cr\rlf\r\n", "del\x7f", "c1\x85\x9b", "ls\u2028ps\u2029"]
FLOW = "flow\x1b]0;title\x07\x0b\x0c\r"
HOST = "host\x1b[2J\r"
#: Raw characters no page holds: C0 controls but tab and line feed, and DEL.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
#: Raw characters JSON never holds: every C0 control (DEL is JSON text as it is).
RAW_JSON = re.compile("[\x00-\x1f]")
class _Attrs(html.parser.HTMLParser):
    """Every ``data-*`` attribute of a page, decoded as a browser decodes it."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.found: dict[str, list[str]] = {}
        self.feed(page)
        self.close()

    def parse_starttag(self, i: int) -> int:
        saved, html.parser.unescape = html.parser.unescape, unescape  # type: ignore[attr-defined]
        try:
            return super().parse_starttag(i)
        finally:
            html.parser.unescape = saved  # type: ignore[attr-defined]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name.startswith("data-") and value is not None:
                self.found.setdefault(name, []).append(value)


def _no_raw_controls(where: str, text: str, raw: re.Pattern[str] = RAW) -> None:
    found = sorted({hex(ord(c)) for c in raw.findall(text)})
    assert not found, f"{where} holds raw control characters {found}"


@pytest.fixture
def served(db_url: str) -> Iterator[tuple[str, fencepost.Store]]:
    with fencepost.open(db_url) as store:
        for run_id in IDS:
            store.runs.create(run_id, json.dumps({"flowName": FLOW}))
        store.runs.claim_and_own(IDS[0], PENDING, OwnerId(HOST, 4242, "nonce-ui-test-ctrl"), store.clock.now_ms())
        with UiServer(create_app(db_url, tick=0.2, poll_interval=0.5)) as server:
            yield server.url, store


def _get(url: str, **params: str) -> httpx.Response:
    response = httpx.get(url, params=params, timeout=20)
    assert response.status_code == 200, (url, response.status_code, response.text[:300])
    return response


def test_pages_hold_no_raw_control_character_and_attributes_read_back_exactly(served):
    base, _ = served
    listing = _get(base + "/", limit="200").text
    _no_raw_controls("the runs page", listing)
    assert sorted(_Attrs(listing).found["data-run-id"]) == sorted(IDS)

    filtered = _get(base + "/", flow=FLOW).text
    _no_raw_controls("the runs page filtered by flow", filtered)
    assert sorted(_Attrs(filtered).found["data-run-id"]) == sorted(IDS)

    for run_id in IDS:
        page = _get(base + run_href(run_id)).text
        _no_raw_controls(f"the page of {run_id!r}", page)
        assert _Attrs(page).found["data-run-id"] == [run_id]
        fragment = _get(base + run_href(run_id), fragment="1").text
        _no_raw_controls(f"the fragment of {run_id!r}", fragment)

    for path in ("/journal", "/projections", "/health"):
        _no_raw_controls(path, _get(base + path).text)


def test_json_answers_hold_no_raw_control_character(served):
    base, store = served
    answer = _get(base + "/health.json").text
    _no_raw_controls("/health.json", answer, RAW_JSON)
    assert json.loads(answer)["oldest_heartbeat"]["run_id"] == IDS[0]

    position = store.feed.position()
    since = f"{position.source}:0"
    seen: list[Any] = []
    with httpx.stream("GET", base + "/events", params={"since": since}, timeout=20) as response:
        for line in response.iter_lines():
            _no_raw_controls("the event stream", line, RAW_JSON)
            if line.startswith("data: "):
                data = json.loads(line[6:])
                if data.get("run_id") is not None:
                    seen.append(data["run_id"])
            if line.startswith("event: hello"):
                break
    assert set(seen) == set(IDS)
