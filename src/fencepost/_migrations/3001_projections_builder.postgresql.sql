-- Projection builders: applied on a projection's
-- target database, which may be the source database or another one. A checkpoint row per
-- projection name holds the applied (source, revision) and, while a rebuild fills its shadow
-- copy, the shadow's progress, so a crash mid-rebuild resumes instead of starting over.
CREATE TABLE projection_checkpoints (
    name TEXT NOT NULL PRIMARY KEY CHECK (length(name) > 0),
    feed TEXT NOT NULL CHECK (feed IN ('runs', 'consensus')),
    source TEXT CHECK (source IS NULL OR (length(source) = 32 AND source !~ '[^0-9a-f]')),
    revision BIGINT NOT NULL CHECK (revision >= 0 AND revision <= 9007199254740991),
    anchor TEXT,
    applied BIGINT NOT NULL CHECK (applied >= 0),
    rejected BIGINT NOT NULL CHECK (rejected >= 0),
    rebuilds BIGINT NOT NULL CHECK (rebuilds >= 0),
    shadow_source TEXT CHECK (shadow_source IS NULL OR (length(shadow_source) = 32 AND shadow_source !~ '[^0-9a-f]')),
    shadow_revision BIGINT CHECK (shadow_revision IS NULL OR (shadow_revision >= 0 AND shadow_revision <= 9007199254740991)),
    shadow_anchor TEXT,
    shadow_applied BIGINT CHECK (shadow_applied IS NULL OR shadow_applied >= 0),
    shadow_reason TEXT CHECK (shadow_reason IS NULL OR shadow_reason IN ('source_changed', 'source_rewound', 'journal_diverged', 'requested')),
    shadow_started_at_ms BIGINT,
    updated_at_ms BIGINT NOT NULL,
    CONSTRAINT projection_checkpoints_shadow_whole CHECK (
        (shadow_source IS NULL AND shadow_revision IS NULL AND shadow_reason IS NULL AND shadow_started_at_ms IS NULL AND shadow_applied IS NULL)
        OR (shadow_source IS NOT NULL AND shadow_revision IS NOT NULL AND shadow_reason IS NOT NULL AND shadow_started_at_ms IS NOT NULL AND shadow_applied IS NOT NULL)
    )
);

-- One row per completed rebuild: why, from which applied position, to which one.
CREATE TABLE projection_rebuilds (
    rebuild_id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name TEXT NOT NULL CHECK (length(name) > 0),
    reason TEXT NOT NULL CHECK (reason IN ('source_changed', 'source_rewound', 'journal_diverged', 'requested')),
    from_source TEXT,
    from_revision BIGINT,
    to_source TEXT NOT NULL,
    to_revision BIGINT NOT NULL,
    applied BIGINT NOT NULL,
    started_at_ms BIGINT NOT NULL,
    finished_at_ms BIGINT NOT NULL
);
CREATE INDEX projection_rebuilds_name_idx ON projection_rebuilds (name, rebuild_id);

-- What each projection holds per run id: the (source, revision) of the last applied update,
-- kept for deleted runs too, so a late older snapshot can never resurrect or regress a row.
CREATE TABLE projection_run_revisions (
    name TEXT NOT NULL,
    run_id TEXT NOT NULL,
    source TEXT NOT NULL,
    revision BIGINT NOT NULL,
    PRIMARY KEY (name, run_id)
);
CREATE TABLE projection_run_revisions_shadow (
    name TEXT NOT NULL,
    run_id TEXT NOT NULL,
    source TEXT NOT NULL,
    revision BIGINT NOT NULL,
    PRIMARY KEY (name, run_id)
);
