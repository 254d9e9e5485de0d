-- A record that no open marked founded when this migration runs was written before the mark
-- existed (by a version that did not mark finished foundings), or belongs to a founding that
-- stopped half-way before the upgrade. The store alone cannot tell which, and taking a finished
-- set for an unfinished founding lets a blank store be recorded in place of a member: both are
-- taken as founded, at the time the record was written. An interrupted founding is then refused
-- rather than finished (its stores are empty: found the set again on new stores).
UPDATE flows_shard_membership SET founded_at_ms = joined_at_ms WHERE founded_at_ms IS NULL;
