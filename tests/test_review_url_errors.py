"""Review: a malformed database URL is refused without quoting any part of it.

URLs carry credentials and are passed around in environment variables; an error (which reaches
logs and the CLI's one-line message) names the rule, never the text it found.
"""

from __future__ import annotations

import pytest

import fencepost

SECRET = "sk-live-review-0123456789abcdef"


def _bad_urls(backend: str, tmp_path) -> list[str]:
    if backend == "sqlite":
        path = tmp_path / "x.db"
        return [f"sqlite:///{path}?busy_timeout_ms={SECRET}", f"sqlite:///{path}?busy_timeout_ms=-5"]
    return [f"postgresql+psycopg://postgres@127.0.0.1:{SECRET}/test",
            f"postgresql+psycopg://user:{SECRET}@127.0.0.1:{SECRET}/test"]


@pytest.mark.parametrize("readonly", [False, True])
def test_open_refuses_a_malformed_url_without_echoing_it(backend: str, tmp_path, readonly: bool) -> None:
    for url in _bad_urls(backend, tmp_path):
        with pytest.raises(Exception) as info:
            fencepost.open(url, readonly=readonly)
        text = f"{info.value!s} {info.value!r} {info.value.__cause__!r} {info.value.__context__!r}"
        assert SECRET not in text, type(info.value).__name__
