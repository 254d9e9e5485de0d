"""``store.journal``: fenced and unfenced appends, reads (built out by the journal issue)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from fencepost.journal import _append
from fencepost.journal.entries import Accepted, Duplicate

if TYPE_CHECKING:
    from fencepost._store import Store


class Journal:
    def __init__(self, store: Store) -> None:
        self._store = store

    def append_in(
        self,
        conn: Connection,
        run_id: str,
        event_type: str,
        payload: Any,
        *,
        source_id: str,
        source_seq: int | None = None,
        meta: Any = None,
        dedupe: str = "content",
    ) -> Accepted | Duplicate:
        """Append inside the caller's open write transaction (``conn`` from ``store.db.write``).

        Internal path shared by companion facts and the public appends, so there is one append
        path. Inputs must already be validated; redaction is applied here.
        """
        return _append.append(
            conn,
            run_id=run_id,
            event_type=event_type,
            payload=payload,
            source_id=source_id,
            source_seq=source_seq,
            meta=meta,
            dedupe=dedupe,
            emitted_at_ms=self._store.clock.now_ms(),
        )
