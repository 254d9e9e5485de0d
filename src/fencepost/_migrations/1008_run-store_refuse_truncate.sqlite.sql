-- PostgreSQL-only change (TRUNCATE of flows_runs and flows_run_changes refused): SQLite has no
-- TRUNCATE, and its DELETE without WHERE fires the row triggers that write the tombstones. This
-- no-op keeps the two ledgers in step.
SELECT 1;
