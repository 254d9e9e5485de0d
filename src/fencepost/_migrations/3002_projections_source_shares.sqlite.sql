-- Read models fed by several named stores. Each source's share of such a projection keeps its own
-- checkpoint row (named "<projection>@<source name>", so the held revisions, the shadow progress and
-- the rebuild log of the share are keyed by it like any checkpoint) and records here whose share it
-- is. A row of an ordinary, single-source projection has both columns NULL. Builders compare these
-- columns before using a row, so a single-source builder and a multi-source one can never take each
-- other's checkpoints for their own.
ALTER TABLE projection_checkpoints ADD COLUMN projection TEXT CHECK (projection IS NULL OR length(projection) > 0);
ALTER TABLE projection_checkpoints ADD COLUMN source_name TEXT
    CHECK ((source_name IS NULL AND projection IS NULL)
           OR (source_name IS NOT NULL AND projection IS NOT NULL AND length(source_name) BETWEEN 1 AND 64));
CREATE UNIQUE INDEX projection_checkpoints_share_idx ON projection_checkpoints (projection, source_name);
