-- A shard membership record's ``generation`` and ``joined_at_ms`` stay safe integers (at most
-- 2^53 - 1), refused by the database itself like every other integer of a store, so raw SQL cannot
-- store one either. ``joined_at_ms`` is a stamp nothing reads back; a clock that read past the
-- bound while a set was founded could write one, so such a stamp becomes the bound (the largest
-- stamp a store holds) as the row is copied. ``generation`` grows by one each time the set grows,
-- so only a hand edit can have put it past the bound: such a record fails this migration, which
-- then changes nothing (it is one transaction with the rest of the pass). SQLite adds a CHECK only
-- with the table: the table (one row at most, no index or trigger) is copied into its bounded twin,
-- with the same columns and constraints as migrations 4001 and 4002 gave it.
CREATE TABLE flows_shard_membership_v2 (
    singleton INTEGER NOT NULL PRIMARY KEY CHECK (singleton = 1),
    set_id TEXT NOT NULL CHECK (length(set_id) = 32 AND set_id NOT GLOB '*[^0-9a-f]*'),
    shard_name TEXT NOT NULL CHECK (length(shard_name) BETWEEN 1 AND 64),
    members_json TEXT NOT NULL CHECK (json_valid(members_json) AND json_type(members_json) = 'array'),
    generation INTEGER NOT NULL
        CHECK (typeof(generation) = 'integer' AND generation >= 1 AND generation <= 9007199254740991),
    joined_at_ms INTEGER NOT NULL
        CHECK (typeof(joined_at_ms) = 'integer' AND joined_at_ms >= 0 AND joined_at_ms <= 9007199254740991),
    founded_at_ms INTEGER
        CHECK (founded_at_ms IS NULL OR (typeof(founded_at_ms) = 'integer' AND founded_at_ms >= 0 AND founded_at_ms <= 9007199254740991))
);
INSERT INTO flows_shard_membership_v2 (singleton, set_id, shard_name, members_json, generation, joined_at_ms,
    founded_at_ms)
SELECT singleton, set_id, shard_name, members_json, generation, min(joined_at_ms, 9007199254740991), founded_at_ms
FROM flows_shard_membership;
DROP TABLE flows_shard_membership;
ALTER TABLE flows_shard_membership_v2 RENAME TO flows_shard_membership;
