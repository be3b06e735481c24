-- The cleanser judged a claim stuck by comparing modified_at, written with
-- the clock of the replica that claimed or heartbeat it, with the clock of
-- the replica running the cleanser: a replica whose clock ran ahead by the
-- stuck threshold took every live claim for a dead one. From this version
-- on, every time the cleanser or the CR garbage collector compares is
-- written and compared in the database's clock (now()); only due times
-- (next_retry_time) stay in the replicas' clocks, where a skew only delays
-- or hastens a retry by the skew. Nothing to convert: a replica's clock and
-- the database's agree to well within a heartbeat where clocks are synced,
-- and the first heartbeat after the upgrade rewrites the stamp. Our
-- completion stamps approval_request.decided_at with now() as well, as the
-- business system's own decisions do.
COMMENT ON COLUMN auto_approve_state.modified_at IS
    'Last write by a claim, heartbeat, retry or recovery, in the database clock (now()); the cleanser compares it with now() - the stuck threshold';
