-- The builder's held revisions, one row per projection and run, are looked up and written only by
-- their primary key. Stored WITHOUT ROWID, the key is the table itself: each row is written into one
-- b-tree instead of a rowid table plus a separate key index, which is most of a first build's writes.
-- Same columns, same key, same rows.
CREATE TABLE projection_run_revisions_v2 (
    name TEXT NOT NULL,
    run_id TEXT NOT NULL,
    source TEXT NOT NULL,
    revision INTEGER NOT NULL,
    PRIMARY KEY (name, run_id)
) WITHOUT ROWID;
INSERT INTO projection_run_revisions_v2 (name, run_id, source, revision)
SELECT name, run_id, source, revision FROM projection_run_revisions;
DROP TABLE projection_run_revisions;
ALTER TABLE projection_run_revisions_v2 RENAME TO projection_run_revisions;

CREATE TABLE projection_run_revisions_shadow_v2 (
    name TEXT NOT NULL,
    run_id TEXT NOT NULL,
    source TEXT NOT NULL,
    revision INTEGER NOT NULL,
    PRIMARY KEY (name, run_id)
) WITHOUT ROWID;
INSERT INTO projection_run_revisions_shadow_v2 (name, run_id, source, revision)
SELECT name, run_id, source, revision FROM projection_run_revisions_shadow;
DROP TABLE projection_run_revisions_shadow;
ALTER TABLE projection_run_revisions_shadow_v2 RENAME TO projection_run_revisions_shadow;
