-- PostgreSQL-only change (the journal refuses TRUNCATE): SQLite has no TRUNCATE, and its DELETE
-- without WHERE fires the row trigger that refuses it. This no-op keeps the two ledgers in step.
SELECT 1;
