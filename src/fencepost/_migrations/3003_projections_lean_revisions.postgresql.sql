-- SQLite stores the builder's held revisions WITHOUT ROWID from this migration on. PostgreSQL tables
-- have no rowid: its tables are already what SQLite's become, and nothing changes here.
SELECT 1;
