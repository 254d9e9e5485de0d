"""Fixtures of the shard suites: ``shard_urls(n)`` gives n fresh databases on the backend."""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.fixture
def shard_urls(make_db_url: Callable[..., str]) -> Callable[[int], list[str]]:
    def make(n: int) -> list[str]:
        return [make_db_url() for _ in range(n)]

    return make
