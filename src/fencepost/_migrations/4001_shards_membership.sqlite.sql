-- Shard membership: a store that belongs to a shard set records which set, under which name, and
-- the whole ordered member list, so opening a set with a shard missing, an extra store, the stores in
-- another order or a store of another set is refused instead of silently splitting runs. One row at
-- most; none for a store that is no shard. ``generation`` grows by one each time the set grows.
CREATE TABLE flows_shard_membership (
    singleton INTEGER NOT NULL PRIMARY KEY CHECK (singleton = 1),
    set_id TEXT NOT NULL CHECK (length(set_id) = 32 AND set_id NOT GLOB '*[^0-9a-f]*'),
    shard_name TEXT NOT NULL CHECK (length(shard_name) BETWEEN 1 AND 64),
    members_json TEXT NOT NULL CHECK (json_valid(members_json) AND json_type(members_json) = 'array'),
    generation INTEGER NOT NULL CHECK (typeof(generation) = 'integer' AND generation >= 1),
    joined_at_ms INTEGER NOT NULL CHECK (typeof(joined_at_ms) = 'integer' AND joined_at_ms >= 0)
);
