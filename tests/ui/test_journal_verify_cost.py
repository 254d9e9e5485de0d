"""The journal page checks the entries appended since its last load, not the whole journal again.

Defect: the page verified the whole journal whenever the head had moved, which on a store being
written is every load (about 70,000 entries a second on SQLite: 1.4 s a load at 100,000 entries).
Now a load goes on from the last entry checked, and the whole journal is checked again only when
its last whole pass is older than ``VERIFY_FROM_START_S``; the page says when that was. Counted as
the entries each load checks, on both backends.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import fencepost
from fencepost.journal import head, verify
from fencepost.ui import views


@pytest.fixture
def checked(verified_positions: list[int]) -> list[int]:
    """The positions of the entries the console checks while the test runs."""
    return verified_positions


def _journal(console: Any) -> str:
    r = httpx.get(console.url + "/journal", timeout=30)
    assert r.status_code == 200, r.text[:500]
    return r.text


def test_a_reload_checks_only_the_new_entries(console: Any, writer: fencepost.Store, checked: list[int],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _journal(console)
    for i in range(3):
        writer.journal.append_unfenced("ui-verify-cost", "step", {"i": i}, source_id="t")
    h = head(writer)
    assert h is not None
    checked.clear()
    text = _journal(console)
    assert checked == [h.position - 2, h.position - 1, h.position]
    checked.clear()
    report = verify(writer)
    assert f"{report.entries_checked} entries in {report.streams_checked} streams" in text
    assert "checked entry by entry from the first one" in text and "hash chain verified" in text
    # Once the last whole pass is old enough, a load checks everything again.
    monkeypatch.setattr(views, "VERIFY_FROM_START_S", 0.0)
    checked.clear()
    _journal(console)
    assert checked == list(range(1, h.position + 1))
