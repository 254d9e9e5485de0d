-- Every integer the builder keeps on a target stays a safe integer (at most 2^53 - 1), refused by
-- the database itself, so raw SQL cannot store one either: the held revisions (a revision past the
-- feed's would make every later update of its run "not newer", the projection silently stale), the
-- counters and the stamps (reported by status and the CLI's JSON). ``revision`` and
-- ``shadow_revision`` had their bound already; only upper bounds are added (lower bounds stay as
-- they were), so no row a builder wrote can fail them. SQLite adds a CHECK only with the table:
-- each table is copied into its bounded twin (same columns, constraints, key and indexes).
CREATE TABLE projection_checkpoints_v2 (
    name TEXT NOT NULL PRIMARY KEY CHECK (length(name) > 0),
    feed TEXT NOT NULL CHECK (feed IN ('runs', 'consensus')),
    source TEXT CHECK (source IS NULL OR (length(source) = 32 AND source NOT GLOB '*[^0-9a-f]*')),
    revision INTEGER NOT NULL CHECK (typeof(revision) = 'integer' AND revision >= 0 AND revision <= 9007199254740991),
    anchor TEXT,
    applied INTEGER NOT NULL CHECK (typeof(applied) = 'integer' AND applied >= 0 AND applied <= 9007199254740991),
    rejected INTEGER NOT NULL CHECK (typeof(rejected) = 'integer' AND rejected >= 0 AND rejected <= 9007199254740991),
    rebuilds INTEGER NOT NULL CHECK (typeof(rebuilds) = 'integer' AND rebuilds >= 0 AND rebuilds <= 9007199254740991),
    shadow_source TEXT CHECK (shadow_source IS NULL OR (length(shadow_source) = 32 AND shadow_source NOT GLOB '*[^0-9a-f]*')),
    shadow_revision INTEGER CHECK (shadow_revision IS NULL OR (typeof(shadow_revision) = 'integer' AND shadow_revision >= 0 AND shadow_revision <= 9007199254740991)),
    shadow_anchor TEXT,
    shadow_applied INTEGER CHECK (shadow_applied IS NULL OR (shadow_applied >= 0 AND shadow_applied <= 9007199254740991)),
    shadow_reason TEXT CHECK (shadow_reason IS NULL OR shadow_reason IN ('source_changed', 'source_rewound', 'journal_diverged', 'requested')),
    shadow_started_at_ms INTEGER CHECK (shadow_started_at_ms IS NULL OR shadow_started_at_ms <= 9007199254740991),
    updated_at_ms INTEGER NOT NULL CHECK (updated_at_ms <= 9007199254740991),
    projection TEXT CHECK (projection IS NULL OR length(projection) > 0),
    source_name TEXT
        CHECK ((source_name IS NULL AND projection IS NULL)
               OR (source_name IS NOT NULL AND projection IS NOT NULL AND length(source_name) BETWEEN 1 AND 64)),
    CONSTRAINT projection_checkpoints_shadow_whole CHECK (
        (shadow_source IS NULL AND shadow_revision IS NULL AND shadow_reason IS NULL AND shadow_started_at_ms IS NULL AND shadow_applied IS NULL)
        OR (shadow_source IS NOT NULL AND shadow_revision IS NOT NULL AND shadow_reason IS NOT NULL AND shadow_started_at_ms IS NOT NULL AND shadow_applied IS NOT NULL)
    )
);
INSERT INTO projection_checkpoints_v2 (name, feed, source, revision, anchor, applied, rejected, rebuilds,
    shadow_source, shadow_revision, shadow_anchor, shadow_applied, shadow_reason, shadow_started_at_ms,
    updated_at_ms, projection, source_name)
SELECT name, feed, source, revision, anchor, applied, rejected, rebuilds,
    shadow_source, shadow_revision, shadow_anchor, shadow_applied, shadow_reason, shadow_started_at_ms,
    updated_at_ms, projection, source_name
FROM projection_checkpoints;
DROP TABLE projection_checkpoints;
ALTER TABLE projection_checkpoints_v2 RENAME TO projection_checkpoints;
CREATE UNIQUE INDEX projection_checkpoints_share_idx ON projection_checkpoints (projection, source_name);

CREATE TABLE projection_rebuilds_v2 (
    rebuild_id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL CHECK (length(name) > 0),
    reason TEXT NOT NULL CHECK (reason IN ('source_changed', 'source_rewound', 'journal_diverged', 'requested')),
    from_source TEXT,
    from_revision INTEGER CHECK (from_revision IS NULL OR from_revision <= 9007199254740991),
    to_source TEXT NOT NULL,
    to_revision INTEGER NOT NULL CHECK (to_revision <= 9007199254740991),
    applied INTEGER NOT NULL CHECK (applied <= 9007199254740991),
    started_at_ms INTEGER NOT NULL CHECK (started_at_ms <= 9007199254740991),
    finished_at_ms INTEGER NOT NULL CHECK (finished_at_ms <= 9007199254740991)
);
INSERT INTO projection_rebuilds_v2 (rebuild_id, name, reason, from_source, from_revision, to_source, to_revision,
    applied, started_at_ms, finished_at_ms)
SELECT rebuild_id, name, reason, from_source, from_revision, to_source, to_revision, applied, started_at_ms,
    finished_at_ms
FROM projection_rebuilds;
-- Keep the AUTOINCREMENT high-water mark (ids of deleted rows are never handed out again).
DELETE FROM sqlite_sequence WHERE name = 'projection_rebuilds_v2';
INSERT INTO sqlite_sequence (name, seq) SELECT 'projection_rebuilds_v2', seq FROM sqlite_sequence WHERE name = 'projection_rebuilds';
DROP TABLE projection_rebuilds;
ALTER TABLE projection_rebuilds_v2 RENAME TO projection_rebuilds;
CREATE INDEX projection_rebuilds_name_idx ON projection_rebuilds (name, rebuild_id);

CREATE TABLE projection_run_revisions_v3 (
    name TEXT NOT NULL,
    run_id TEXT NOT NULL,
    source TEXT NOT NULL,
    revision INTEGER NOT NULL CHECK (revision <= 9007199254740991),
    PRIMARY KEY (name, run_id)
) WITHOUT ROWID;
INSERT INTO projection_run_revisions_v3 (name, run_id, source, revision)
SELECT name, run_id, source, revision FROM projection_run_revisions;
DROP TABLE projection_run_revisions;
ALTER TABLE projection_run_revisions_v3 RENAME TO projection_run_revisions;

CREATE TABLE projection_run_revisions_shadow_v3 (
    name TEXT NOT NULL,
    run_id TEXT NOT NULL,
    source TEXT NOT NULL,
    revision INTEGER NOT NULL CHECK (revision <= 9007199254740991),
    PRIMARY KEY (name, run_id)
) WITHOUT ROWID;
INSERT INTO projection_run_revisions_shadow_v3 (name, run_id, source, revision)
SELECT name, run_id, source, revision FROM projection_run_revisions_shadow;
DROP TABLE projection_run_revisions_shadow;
ALTER TABLE projection_run_revisions_shadow_v3 RENAME TO projection_run_revisions_shadow;
