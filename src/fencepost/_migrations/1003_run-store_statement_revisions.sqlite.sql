-- PostgreSQL-only change (statement-level revision triggers); SQLite updates its single source row
-- in place, so its per-row triggers from 1002 stay. This no-op keeps the two ledgers in step.
SELECT 1;
