-- The fencing token of each shard (request_id mod shard_count). The replica
-- that acquires a shard's Lease raises the token to the Lease's generation
-- (its leaseTransitions); in the same transaction it recovers every claim of
-- the shard made under an older token. A claim under coordination is only
-- taken while its token is the shard's current one, and the claim statement
-- share-locks this row, so a raise waits for claims in flight and every claim
-- after it sees the new token: a replica that lost its shard can neither
-- claim nor write once the new owner has fenced it off.
CREATE TABLE shard_fence (
    shard_count INTEGER     NOT NULL CHECK (shard_count > 0),
    shard       INTEGER     NOT NULL CHECK (shard >= 0 AND shard < shard_count),
    token       BIGINT      NOT NULL,
    holder      TEXT        NOT NULL,
    fenced_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (shard_count, shard)
);
