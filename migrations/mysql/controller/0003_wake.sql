-- Wake without NOTIFY. MySQL has no LISTEN/NOTIFY, so the triggers append
-- one row per relevant change to auto_approve_wake and every replica polls
-- it (--wake-poll-interval, default 250 ms): one range read of the primary
-- key past the last id it read. The rows are both PostgreSQL's NOTIFY
-- (0004, 0015: every replica hears of every change and keeps those of its
-- shards) and its auto_approve_wake (0010: the wake survives a restart and
-- a shard handover because the row stays until the shard's owner consumed
-- it in a discovery turn, Store::apply_wakes).
--
-- What the business transaction pays: one INSERT ... VALUES of a row with
-- a fresh AUTO_INCREMENT id, reading none of our tables. An INSERT ...
-- SELECT ... FROM auto_approve_state (PostgreSQL's EXISTS test, 0010) would
-- not do: under InnoDB's REPEATABLE READ, the business sessions' default,
-- the SELECT part of an INSERT ... SELECT is a locking read (shared
-- next-key locks, for statement-based binlogs), so the business UPDATE
-- would wait for every state row our claim, heartbeat or retry holds. So
-- the row is appended for every request, claimed or not; the consumer
-- joins the state table in its own session, without locks.
-- The insert itself waits for nothing of ours: the id is new (no duplicate
-- check), a simple insert takes the AUTO_INCREMENT counter for the
-- allocation only (innodb_autoinc_lock_mode 1 and 2), and we never hold a
-- gap lock on this table: our sessions run READ COMMITTED and delete the
-- rows they consumed by primary key only.
--
-- An e-contract change names its contract, not its requests (reading
-- approval_request there would lock the business's own rows, as above):
-- the first replica to poll the row replaces it by one row per open request
-- on the contract, in its own transaction.
--
-- Triggers run with their definer's rights: the business role needs no
-- grant on this table.
CREATE TABLE auto_approve_wake (
    id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    -- The changed request; NULL for an e-contract change.
    request_id   BIGINT,
    -- The changed e-contract, when request_id is NULL.
    contract_ref VARCHAR(255),
    -- The request whose own chain synced the contract: not woken (0007).
    skip_request BIGINT,
    -- Appended by the INSERT trigger: a new request, for the replicas to
    -- discover; it has no state row to wake (PostgreSQL writes no wake row
    -- for it), so apply_wakes only deletes it.
    new_request  BOOLEAN      NOT NULL DEFAULT false,
    woken_at     DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    KEY auto_approve_wake_request (request_id, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- A new request: the replicas hear of it (it has no claim to wake yet).
CREATE TRIGGER approval_request_wake_insert
    AFTER INSERT ON approval_request FOR EACH ROW
    INSERT INTO auto_approve_wake (request_id, new_request) VALUES (NEW.id, true);

-- A change of anything a filter reads, as PostgreSQL's trigger watches it
-- (0015); our own approval (decided_by 'autoapproval') wakes nobody.
CREATE TRIGGER approval_request_wake_update
    AFTER UPDATE ON approval_request FOR EACH ROW
BEGIN
    IF NOT (NEW.status = 'APPROVED' AND NEW.decided_by <=> 'autoapproval'
            AND NOT (OLD.status <=> NEW.status))
       AND (NOT (NEW.status <=> OLD.status)
            OR NOT (NEW.request_type <=> OLD.request_type)
            OR NOT (NEW.documents_released <=> OLD.documents_released)
            OR NOT (NEW.operational_hold <=> OLD.operational_hold)
            OR NOT (NEW.menu_registered <=> OLD.menu_registered)
            OR NOT (NEW.logo_registered <=> OLD.logo_registered)
            OR NOT (NEW.previous_step_approved <=> OLD.previous_step_approved)
            OR NOT (NEW.econtract_ref <=> OLD.econtract_ref)
            OR NOT (NEW.target_store_number <=> OLD.target_store_number))
    THEN
        INSERT INTO auto_approve_wake (request_id) VALUES (NEW.id);
    END IF;
END;

-- An e-contract signed (or voided) in the e-sign system is a filter fact
-- too. The chain's own ledger sync names its request in the session
-- variable @autoapproval_syncing_request (PostgreSQL: a transaction-local
-- setting, 0007); that request is not woken by its own write.
CREATE TRIGGER econtract_wake_insert
    AFTER INSERT ON econtract FOR EACH ROW
    INSERT INTO auto_approve_wake (contract_ref, skip_request)
    VALUES (NEW.contract_ref, @autoapproval_syncing_request);

CREATE TRIGGER econtract_wake_update
    AFTER UPDATE ON econtract FOR EACH ROW
BEGIN
    IF NOT (NEW.status <=> OLD.status) THEN
        INSERT INTO auto_approve_wake (contract_ref, skip_request)
        VALUES (NEW.contract_ref, @autoapproval_syncing_request);
    END IF;
END;
