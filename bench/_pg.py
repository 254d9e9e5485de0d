"""Scratch PostgreSQL schemas for the benchmarks: fresh ``bench_*`` names, dropped on exit."""

from __future__ import annotations

import uuid
from types import TracebackType
from typing import Any


class ScratchSchemas:
    """Hand out new schema names (and their store URLs) on one server; drop them all on exit."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.dsn = base_url.replace("postgresql+psycopg://", "postgresql://")
        self._names: list[str] = []

    def new(self) -> tuple[str, str]:
        """Return ``(schema, store URL)`` for a schema nobody uses yet (created by the first open)."""
        name = "bench_" + uuid.uuid4().hex[:8]
        self._names.append(name)
        sep = "&" if "?" in self.base_url else "?"
        return name, f"{self.base_url}{sep}schema={name}"

    def connect(self, schema: str) -> Any:
        """A raw psycopg connection whose search_path is ``schema`` (the baseline's driver)."""
        import psycopg

        c = psycopg.connect(self.dsn)
        c.execute(f'SET search_path TO "{schema}"')
        c.commit()
        return c

    def __enter__(self) -> ScratchSchemas:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as c:
            for name in self._names:
                c.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
