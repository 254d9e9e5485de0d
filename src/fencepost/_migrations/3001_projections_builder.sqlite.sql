-- Projection builders: applied on a projection's
-- target database, which may be the source database or another one. A checkpoint row per
-- projection name holds the applied (source, revision) and, while a rebuild fills its shadow
-- copy, the shadow's progress, so a crash mid-rebuild resumes instead of starting over.
CREATE TABLE projection_checkpoints (
    name TEXT NOT NULL PRIMARY KEY CHECK (length(name) > 0),
    feed TEXT NOT NULL CHECK (feed IN ('runs', 'consensus')),
    source TEXT CHECK (source IS NULL OR (length(source) = 32 AND source NOT GLOB '*[^0-9a-f]*')),
    revision INTEGER NOT NULL CHECK (typeof(revision) = 'integer' AND revision >= 0 AND revision <= 9007199254740991),
    anchor TEXT,
    applied INTEGER NOT NULL CHECK (typeof(applied) = 'integer' AND applied >= 0),
    rejected INTEGER NOT NULL CHECK (typeof(rejected) = 'integer' AND rejected >= 0),
    rebuilds INTEGER NOT NULL CHECK (typeof(rebuilds) = 'integer' AND rebuilds >= 0),
    shadow_source TEXT CHECK (shadow_source IS NULL OR (length(shadow_source) = 32 AND shadow_source NOT GLOB '*[^0-9a-f]*')),
    shadow_revision INTEGER CHECK (shadow_revision IS NULL OR (typeof(shadow_revision) = 'integer' AND shadow_revision >= 0 AND shadow_revision <= 9007199254740991)),
    shadow_anchor TEXT,
    shadow_applied INTEGER CHECK (shadow_applied IS NULL OR shadow_applied >= 0),
    shadow_reason TEXT CHECK (shadow_reason IS NULL OR shadow_reason IN ('source_changed', 'source_rewound', 'journal_diverged', 'requested')),
    shadow_started_at_ms INTEGER,
    updated_at_ms INTEGER NOT NULL,
    CONSTRAINT projection_checkpoints_shadow_whole CHECK (
        (shadow_source IS NULL AND shadow_revision IS NULL AND shadow_reason IS NULL AND shadow_started_at_ms IS NULL AND shadow_applied IS NULL)
        OR (shadow_source IS NOT NULL AND shadow_revision IS NOT NULL AND shadow_reason IS NOT NULL AND shadow_started_at_ms IS NOT NULL AND shadow_applied IS NOT NULL)
    )
);

-- One row per completed rebuild: why, from which applied position, to which one.
CREATE TABLE projection_rebuilds (
    rebuild_id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL CHECK (length(name) > 0),
    reason TEXT NOT NULL CHECK (reason IN ('source_changed', 'source_rewound', 'journal_diverged', 'requested')),
    from_source TEXT,
    from_revision INTEGER,
    to_source TEXT NOT NULL,
    to_revision INTEGER NOT NULL,
    applied INTEGER NOT NULL,
    started_at_ms INTEGER NOT NULL,
    finished_at_ms INTEGER NOT NULL
);
CREATE INDEX projection_rebuilds_name_idx ON projection_rebuilds (name, rebuild_id);

-- What each projection holds per run id: the (source, revision) of the last applied update,
-- kept for deleted runs too, so a late older snapshot can never resurrect or regress a row.
CREATE TABLE projection_run_revisions (
    name TEXT NOT NULL,
    run_id TEXT NOT NULL,
    source TEXT NOT NULL,
    revision INTEGER NOT NULL,
    PRIMARY KEY (name, run_id)
);
CREATE TABLE projection_run_revisions_shadow (
    name TEXT NOT NULL,
    run_id TEXT NOT NULL,
    source TEXT NOT NULL,
    revision INTEGER NOT NULL,
    PRIMARY KEY (name, run_id)
);
