-- When the set's founding finished, as this member saw it: set by the open that found every member
-- recorded and in agreement (the open that founds the set, or the first whole writable open of a set
-- founded before this migration). NULL while a founding is unfinished. A store that records no set
-- beside a member marked founded is no unfinished founding but a stand-in for a member: refused.
ALTER TABLE flows_shard_membership ADD COLUMN founded_at_ms BIGINT
    CHECK (founded_at_ms IS NULL OR (founded_at_ms >= 0 AND founded_at_ms <= 9007199254740991));
