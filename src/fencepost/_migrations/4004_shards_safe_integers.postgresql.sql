-- A shard membership record's ``generation`` and ``joined_at_ms`` stay safe integers (at most
-- 2^53 - 1), refused by the database itself like every other integer of a store, so raw SQL cannot
-- store one either. ``joined_at_ms`` is a stamp nothing reads back; a clock that read past the
-- bound while a set was founded could write one, so such a stamp becomes the bound (the largest
-- stamp a store holds) before the check is added. ``generation`` grows by one each time the set
-- grows, so only a hand edit can have put it past the bound: such a record fails this migration,
-- which then changes nothing (it is one transaction with the rest of the pass).
UPDATE flows_shard_membership SET joined_at_ms = 9007199254740991 WHERE joined_at_ms > 9007199254740991;
ALTER TABLE flows_shard_membership ADD CONSTRAINT flows_shard_membership_safe_integers
    CHECK (generation <= 9007199254740991 AND joined_at_ms <= 9007199254740991);
