"""An append's head lookup reads one index entry per head, however long the stream has grown.

Before each append the journal reads its stream's heads: the stream's last seq and hash, the log's
last position and hash, and the producer's highest ``source_seq``. Defect: on PostgreSQL that last
one was an aggregate (``max``) which the planner, with the table's statistics not yet gathered (a
table written faster than autovacuum analyses it), ran over every entry the producer had written to
the run: each append cost more than the one before. A benchmark of one worker appending to one run
went from about 1,000 to 260 appends/s over its first 7,200 entries.

Measured without a clock: on PostgreSQL, the rows each step of the lookup's plan actually read
(``EXPLAIN ANALYZE``), with autovacuum off for the table so its statistics stay as a busy table's
would; on SQLite, the virtual machine instructions the lookup executes, short stream against long.
"""

from __future__ import annotations

from typing import Any

import fencepost
from fencepost.journal._sql import HEADS
from tests.conftest import pg_plan_nodes, sqlite_instructions
from tests.journal.conftest import A, hold, rows

RUN = "run-long-stream"
PRODUCER = "worker-1"


def _append(store: fencepost.Store, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        store.journal.append(RUN, "step.finished", {"step": i}, owner=A, source_id=PRODUCER)


def _heads_params(dialect: str) -> tuple[str, dict[str, Any]]:
    text_, defaults = HEADS.compiled(dialect)
    return text_, {**defaults, "run_id": RUN, "source_id": PRODUCER}


def _rows_read(store: fencepost.Store) -> list[tuple[str, int]]:
    """PostgreSQL: each plan node of the head lookup with the rows it actually produced."""
    text_, params = _heads_params("postgresql")
    return [(node["Node Type"], int(node["Actual Rows"])) for node in pg_plan_nodes(store, text_, params)]


def _instructions(store: fencepost.Store) -> int:
    """SQLite: the virtual machine instructions one head lookup executes."""
    text_, params = _heads_params("sqlite")
    return sqlite_instructions(store, lambda raw: raw.execute(text_, params).fetchone())


def test_the_head_lookup_reads_one_entry_per_head_however_long_the_stream(store: fencepost.Store,
                                                                           backend: str) -> None:
    hold(store, RUN, A)
    if backend == "postgresql":
        store.db.write(lambda conn: conn.exec_driver_sql(
            "ALTER TABLE flows_journal_events SET (autovacuum_enabled = off)"))
        _append(store, 300)
        nodes = _rows_read(store)
        assert any(kind.startswith("Index") for kind, _ in nodes), nodes
        assert max(rows for _, rows in nodes) <= 1, nodes
    else:
        _append(store, 10)
        short = _instructions(store)
        _append(store, 400, start=10)
        long = _instructions(store)
        assert long <= short + 5, (short, long)
    # The lookup's answers: the stream's last seq and the producer's highest source_seq, as stored.
    text_, params = _heads_params(backend)
    heads = store.db.read(lambda conn: tuple(conn.connection.dbapi_connection.cursor().execute(text_, params)
                                             .fetchone()))
    stored = rows(store, RUN)
    assert (heads[0], heads[4]) == (stored[-1][1], max(r[3] for r in stored))
    assert len(stored) == (300 if backend == "postgresql" else 410)
