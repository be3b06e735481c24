-- K, the number of shards, must be one value for every replica: Lease
-- names carry only the shard number and shard_fence rows are keyed by K,
-- so two replicas started with different --shards values would both own
-- one request (shard 3 of 16 and shard 3 of 8 share request 19). The first
-- replica to start records its K here; a replica started with another K
-- refuses to start, naming the value in force.
--
-- To change K: stop every replica (kubectl scale --replicas=0; each gives
-- its claims back), run DELETE FROM shard_layout as the controller's role,
-- and start them all with the new --shards (helm upgrade --set shards=K).
CREATE TABLE shard_layout (
    only_row    BOOLEAN     PRIMARY KEY DEFAULT true CHECK (only_row),
    shard_count INTEGER     NOT NULL CHECK (shard_count > 0),
    set_by      TEXT        NOT NULL,
    set_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
