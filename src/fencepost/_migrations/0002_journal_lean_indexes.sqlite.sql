-- The journal is written far more than it is filtered by type: every index is one more b-tree
-- page per append (and, under synchronous=FULL, more WAL bytes to sync per commit). fencepost
-- reads streams by (run_id, seq) (the primary key) and the log by position (unique), so the two
-- event-type indexes from upstream are dropped; a type filter scans its stream.
DROP INDEX IF EXISTS flows_journal_events_event_type_idx;
DROP INDEX IF EXISTS flows_journal_events_run_event_type_idx;
