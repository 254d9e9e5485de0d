-- Every integer the builder keeps on a target stays a safe integer (at most 2^53 - 1), refused by
-- the database itself, so raw SQL cannot store one either: the held revisions (a revision past the
-- feed's would make every later update of its run "not newer", the projection silently stale), the
-- counters and the stamps (reported by status and the CLI's JSON). ``revision`` and
-- ``shadow_revision`` had their bound already; only upper bounds are added (lower bounds stay as
-- they were), so no row a builder wrote can fail them.
ALTER TABLE projection_checkpoints ADD CONSTRAINT projection_checkpoints_safe_integers CHECK (
    applied <= 9007199254740991 AND rejected <= 9007199254740991 AND rebuilds <= 9007199254740991
    AND updated_at_ms <= 9007199254740991
    AND (shadow_applied IS NULL OR shadow_applied <= 9007199254740991)
    AND (shadow_started_at_ms IS NULL OR shadow_started_at_ms <= 9007199254740991)
);
ALTER TABLE projection_rebuilds ADD CONSTRAINT projection_rebuilds_safe_integers CHECK (
    (from_revision IS NULL OR from_revision <= 9007199254740991) AND to_revision <= 9007199254740991
    AND applied <= 9007199254740991 AND started_at_ms <= 9007199254740991
    AND finished_at_ms <= 9007199254740991
);
ALTER TABLE projection_run_revisions ADD CONSTRAINT projection_run_revisions_safe_revision
    CHECK (revision <= 9007199254740991);
ALTER TABLE projection_run_revisions_shadow ADD CONSTRAINT projection_run_revisions_shadow_safe_revision
    CHECK (revision <= 9007199254740991);
