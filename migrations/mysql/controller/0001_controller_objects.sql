-- The controller's own objects on MySQL 8 / MariaDB 10.6, as 0.2.0's
-- migrations 0002 to 0007 left them, minus everything on the business
-- tables, plus the two procedures a business table's wake triggers call
-- (autoapproval_request_changed, autoapproval_econtract_changed). The
-- business tables are the integrator's; the controller reaches them through
-- the views autoapproval_request, autoapproval_econtract and
-- autoapproval_request_memo (docs: Integrating with your database; the
-- reference set, migrations/mysql/reference, is the worked example).
--
-- Idempotent on a database 0.2.0's migrations created, which is how one
-- upgrades: every table is CREATE TABLE IF NOT EXISTS with every column and
-- index declared inline (MySQL 8 has no CREATE INDEX IF NOT EXISTS), every
-- routine as the rule below says. 0.2.0's four triggers on
-- approval_request and econtract stay: this set runs while 0.2.0's
-- replicas still run, which approve only while those triggers append their
-- wake rows; whoever attaches the successors drops them (the reference
-- set's binding; docs/INSTALL.md, From 0.2.0).
--
-- Routines and the grants on them (the rule for every migration after
-- this one). Other accounts call six of our procedures, each under a
-- GRANT EXECUTE ON PROCEDURE an administrator gave: the business tables'
-- triggers call autoapproval_request_changed and
-- autoapproval_econtract_changed (their definer needs it, or every
-- business write fails, 1370), the people's service the four
-- autoapproval_manual_* procedures. DROP PROCEDURE drops every grant on
-- the procedure (both servers, automatic_sp_privileges on, the default);
-- MySQL 8 has no CREATE OR REPLACE PROCEDURE, and the controller's role
-- can neither read mysql.procs_priv nor grant (docs/INTEGRATING.md), so
-- what was granted cannot be re-granted either. So:
-- * These six entry points are created with CREATE PROCEDURE IF NOT
--   EXISTS (MySQL 8.0.29+, MariaDB 10.1.3+) and never dropped or replaced:
--   each body only calls its inner procedure with its own arguments. The
--   four manual ones are 0.2.0's, verbatim: on a 0.2.0 database they stay,
--   with their grants.
-- * The inner procedures (autoapproval_wake_request,
--   autoapproval_wake_econtract, autoapproval_manual_*_attempt) are called
--   by the entry points alone, as their definer (the controller's role,
--   which owns them): nobody is granted them, so a migration changes one
--   by DROP PROCEDURE IF EXISTS + CREATE PROCEDURE. Between the two
--   statements a call of it fails (1305): MySQL cannot replace a routine
--   in one statement.
-- * An entry point that must change in a way its inner procedure cannot
--   absorb (another parameter) is a new entry point under a new name,
--   granted anew by the administrator; the old one stays until a later
--   release (expand, then contract).
--
-- Types, as in the reference business schema:
-- * TIMESTAMPTZ becomes DATETIME(6) holding UTC: DATETIME has no 2038 limit
--   and no conversion by the session's time_zone. Our sessions run with
--   time_zone '+00:00' (sqlx sets it); defaults are UTC_TIMESTAMP(6).
--   Expression defaults need parentheses on MySQL 8.0.13+; MariaDB 10.2+
--   accepts them.
-- * TEXT becomes VARCHAR where a column is indexed (InnoDB indexes no
--   unbounded TEXT); BOOLEAN is TINYINT(1) on both.

-- One row per request that auto-approval has touched: created by the claim,
-- deleted on success. Its row count is "in progress + waiting", never a backlog.
CREATE TABLE IF NOT EXISTS auto_approve_state (
    id               BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    request_id       BIGINT       NOT NULL,
    request_type     VARCHAR(64)  NOT NULL,
    status           VARCHAR(16)  NOT NULL,
    -- In the replicas' clocks (PostgreSQL 0011): a skew only moves a retry.
    next_retry_time  DATETIME(6),
    retry_count      INTEGER      NOT NULL DEFAULT 0,
    -- Consecutive transient failures: the exponent of the backoff.
    transient_streak INTEGER      NOT NULL DEFAULT 0,
    -- Who claimed it last and with which fencing token; every write after the
    -- claim is conditional on both.
    holder           VARCHAR(255) NOT NULL,
    fencing_token    BIGINT       NOT NULL,
    step             VARCHAR(255),
    last_reason      TEXT,
    created_at       DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    -- Last write by a claim, heartbeat, retry or recovery, in the database
    -- clock (UTC_TIMESTAMP(6)); the cleanser compares it with the database
    -- clock minus the stuck threshold (PostgreSQL 0011).
    modified_at      DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    -- A change seen while IN_PROGRESS: the retry it schedules is due at once.
    woken_at         DATETIME(6),
    -- A fence per claim (PostgreSQL 0017): every claim and re-claim draws a
    -- fresh random nonce, and every write made under a claim also needs it,
    -- so a claim given back and taken again by the same replica under the
    -- same shard generation never shares a fence with a chain still running
    -- from the first claim. Manual claims keep 0.
    claim_nonce      BIGINT       NOT NULL DEFAULT 0,
    -- Two workers racing on a new request cannot both create a row.
    CONSTRAINT auto_approve_state_request_id_key UNIQUE (request_id),
    CONSTRAINT auto_approve_state_status CHECK (status IN ('IN_PROGRESS', 'RETRY_WAITING')),
    -- The cleanser finds rows stuck IN_PROGRESS with this index.
    KEY auto_approve_state_status_modified_at (status, modified_at),
    -- The fresh candidate query reads due retries from this index, in due
    -- order, without stepping over the requests that wait
    -- (src/db/mysql/candidates.rs); PostgreSQL's is partial (WHERE status =
    -- 'RETRY_WAITING'), which MySQL has not, so status leads and the query
    -- reads the one status's range.
    KEY auto_approve_state_due (status, next_retry_time)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- The fencing token of each shard (request_id mod shard_count), as in
-- PostgreSQL 0008: every claim share-locks its shard's row by primary key
-- (LOCK IN SHARE MODE), so a raise waits for claims in flight and every
-- claim after it sees the new token.
CREATE TABLE IF NOT EXISTS shard_fence (
    shard_count INTEGER      NOT NULL,
    shard       INTEGER      NOT NULL,
    token       BIGINT       NOT NULL,
    holder      VARCHAR(255) NOT NULL,
    fenced_at   DATETIME(6)  NOT NULL,
    PRIMARY KEY (shard_count, shard),
    CONSTRAINT shard_fence_count CHECK (shard_count > 0),
    CONSTRAINT shard_fence_shard CHECK (shard >= 0 AND shard < shard_count)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- K, the one shard count of every replica (PostgreSQL 0012). To change K:
-- stop every replica, DELETE FROM shard_layout, start them with the new K.
CREATE TABLE IF NOT EXISTS shard_layout (
    only_row    BOOLEAN      NOT NULL DEFAULT true PRIMARY KEY,
    shard_count INTEGER      NOT NULL,
    set_by      VARCHAR(255) NOT NULL,
    set_at      DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    CONSTRAINT shard_layout_only_row CHECK (only_row = true),
    CONSTRAINT shard_layout_count CHECK (shard_count > 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- A pause an operator set (PostgreSQL 0014), kept so it outlives the CR.
CREATE TABLE IF NOT EXISTS auto_approve_pause (
    request_id BIGINT       NOT NULL PRIMARY KEY,
    paused_by  VARCHAR(255) NOT NULL,
    cr_uid     VARCHAR(255),
    paused_at  DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- What was sent under each idempotency key, recorded under the claim's
-- fence before the call and sent verbatim by every later attempt until the
-- result is saved (PostgreSQL 0018). `result`: the answer saved from it.
-- The rows of a request go with its completion.
CREATE TABLE IF NOT EXISTS auto_approve_sent (
    request_id      BIGINT       NOT NULL,
    idempotency_key VARCHAR(255) NOT NULL,
    body            TEXT         NOT NULL,
    result          VARCHAR(255),
    sent_at         DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (request_id, idempotency_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- Wake without NOTIFY. MySQL has no LISTEN/NOTIFY, so the business tables'
-- triggers append one row per relevant change to auto_approve_wake (through
-- the two procedures below) and every replica polls it
-- (--wake-poll-interval, default 250 ms): one range read of the primary
-- key past the last id it read. The rows are both PostgreSQL's NOTIFY
-- (every replica hears of every change and keeps those of its shards) and
-- its auto_approve_wake (the wake survives a restart and a shard handover
-- because the row stays until the shard's owner consumed it in a discovery
-- turn, Database::apply_wakes).
--
-- What the business transaction pays: one INSERT ... VALUES of a row with
-- a fresh AUTO_INCREMENT id, reading none of our tables. An INSERT ...
-- SELECT ... FROM auto_approve_state (PostgreSQL's EXISTS test) would not
-- do: under InnoDB's REPEATABLE READ, the business sessions' default, the
-- SELECT part of an INSERT ... SELECT is a locking read (shared next-key
-- locks, for statement-based binlogs), so the business UPDATE would wait
-- for every state row our claim, heartbeat or retry holds. So the row is
-- appended for every request, claimed or not; the consumer joins the state
-- table in its own session, without locks.
-- The insert itself waits for nothing of ours: the id is new (no duplicate
-- check), a simple insert takes the AUTO_INCREMENT counter for the
-- allocation only (innodb_autoinc_lock_mode 1 and 2), and we never hold a
-- gap lock on this table: our sessions run READ COMMITTED and delete the
-- rows they consumed by primary key only.
--
-- An e-contract change names its contract, not its requests (reading the
-- requests there would lock the business's own rows, as above): the first
-- replica to poll the row replaces it by one row per open request on the
-- contract, in its own transaction.
CREATE TABLE IF NOT EXISTS auto_approve_wake (
    id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    -- The changed request; NULL for an e-contract change.
    request_id   BIGINT,
    -- The changed e-contract, when request_id is NULL.
    contract_ref VARCHAR(255),
    -- The request whose own chain synced the contract: not woken.
    skip_request BIGINT,
    -- Appended by the INSERT trigger: a new request, for the replicas to
    -- discover; it has no state row to wake (PostgreSQL writes no wake row
    -- for it), so apply_wakes only deletes it.
    new_request  BOOLEAN      NOT NULL DEFAULT false,
    woken_at     DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    KEY auto_approve_wake_request (request_id, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- A business request was inserted (p_inserted) or changed in a column a
-- filter reads: the replicas hear of it. Called by the integrator's
-- triggers on their request table:
--   CREATE TRIGGER <t>_autoapproval_inserted AFTER INSERT ON <t> FOR EACH ROW
--       CALL autoapproval_request_changed(NEW.<id>, TRUE);
--   CREATE TRIGGER <t>_autoapproval_updated AFTER UPDATE ON <t> FOR EACH ROW
--       IF NOT (NEW.<c> <=> OLD.<c>) OR ... THEN
--           CALL autoapproval_request_changed(NEW.<id>, FALSE);
--       END IF;
-- (MySQL cannot create a trigger from a routine, hence the template; the
-- trigger's definer needs EXECUTE on this procedure.)
-- Our own writes wake nobody: the controller names the request it writes
-- in the session variable @autoapproval_writing_request around the write
-- and clears it after (PostgreSQL: the transaction-local setting
-- autoapproval.writing_request). This replaces 0.2.0's test of
-- decided_by = 'autoapproval', which only the integrator's column names
-- could express.
-- SQL SECURITY DEFINER: the procedure writes auto_approve_wake with its
-- definer's rights, so the business role needs no grant on our tables.
-- An entry point (see the top): its work is autoapproval_wake_request's.
DROP PROCEDURE IF EXISTS autoapproval_wake_request;
CREATE PROCEDURE autoapproval_wake_request(IN p_request_id BIGINT, IN p_inserted BOOLEAN)
SQL SECURITY DEFINER
BEGIN
    IF NOT (@autoapproval_writing_request <=> p_request_id) THEN
        INSERT INTO auto_approve_wake (request_id, new_request) VALUES (p_request_id, p_inserted);
    END IF;
END;

CREATE PROCEDURE IF NOT EXISTS autoapproval_request_changed(IN p_request_id BIGINT, IN p_inserted BOOLEAN)
SQL SECURITY DEFINER
CALL autoapproval_wake_request(p_request_id, p_inserted);

-- An e-contract signed (or voided) in the e-sign system is a filter fact
-- too. Called by the integrator's triggers on their e-contract table (an
-- insert, and an update of the status) with the contract's reference. The
-- chain's own ledger sync names its request in the session variable
-- @autoapproval_syncing_request (PostgreSQL: the transaction-local setting
-- autoapproval.syncing_request); that request is not woken by its own write.
-- An entry point (see the top): its work is autoapproval_wake_econtract's.
DROP PROCEDURE IF EXISTS autoapproval_wake_econtract;
CREATE PROCEDURE autoapproval_wake_econtract(IN p_contract_ref VARCHAR(255))
SQL SECURITY DEFINER
BEGIN
    INSERT INTO auto_approve_wake (contract_ref, skip_request)
    VALUES (p_contract_ref, @autoapproval_syncing_request);
END;

CREATE PROCEDURE IF NOT EXISTS autoapproval_econtract_changed(IN p_contract_ref VARCHAR(255))
SQL SECURITY DEFINER
CALL autoapproval_wake_econtract(p_contract_ref);

-- The manual-approval path as a database API (PostgreSQL's manual
-- functions), as stored procedures: claim, heartbeat, release, decide. Same
-- meaning: a person's claim is a state row held by 'manual:<who>' under a
-- negative token, so the UNIQUE(request_id) and the status test make the
-- controller and people take turns, and every write of a person is
-- conditional on holder and token. Times in the database clock
-- (UTC_TIMESTAMP(6)). The request and its memos are reached through the
-- views autoapproval_request and autoapproval_request_memo.
--
-- Differences from PostgreSQL, here only:
-- * Procedures instead of set-returning functions: each answers with one
--   result set (CALL autoapproval_manual_claim(42, 'kim') gives token,
--   refusal). Each is one transaction of its own (START TRANSACTION ...
--   COMMIT inside), READ COMMITTED like our sessions whatever the
--   caller's session uses: call it outside a transaction (one open is an
--   error, 1568, as the isolation cannot change inside it).
-- * No sequences in MySQL 8: the tokens come from an AUTO_INCREMENT table.
-- * InnoDB locks what PostgreSQL does not: REPEATABLE READ gap-locks a
--   missing key (two claims of a new request would each block the other's
--   insert), and INSERT IGNORE share-locks the row it finds, which a later
--   UPDATE of it upgrades (two claims of a waiting request, each holding
--   the share lock, deadlocked on the upgrade); and a row found through
--   the request_id index is locked there before its primary key, the
--   reverse of the controller's statements by primary key (a person's
--   update by request_id deadlocked with the controller's delete by id).
--   So the procedures run READ COMMITTED, find the state row's id with a
--   plain read (the newest committed row) and lock and write it by its
--   primary key alone (with request_id in the WHERE too, MariaDB may pick
--   that unique index and lock it first); the claim updates a waiting row
--   before it tries an insert and never updates after a refused insert.
-- * Stored routines run with their definer's rights (SQL SECURITY
--   DEFINER, the default): the other service's role needs EXECUTE on the
--   four procedures (GRANT EXECUTE ON PROCEDURE ...) and nothing on our
--   tables.
CREATE TABLE IF NOT EXISTS autoapproval_manual_token (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY
) ENGINE = InnoDB;

-- One attempt of a claim (autoapproval_manual_claim, below, retries it):
-- claims `p_request_id` for the person `p_who`. token: the token to give
-- to heartbeat, release and decide; refusal: why not.
DROP PROCEDURE IF EXISTS autoapproval_manual_claim_attempt;
CREATE PROCEDURE autoapproval_manual_claim_attempt(IN p_request_id BIGINT, IN p_who VARCHAR(200))
SQL SECURITY DEFINER
body: BEGIN
    DECLARE me VARCHAR(255);
    DECLARE mine BIGINT;
    DECLARE status_now VARCHAR(32) DEFAULT NULL;
    DECLARE kind VARCHAR(64);
    DECLARE held_holder VARCHAR(255) DEFAULT NULL;
    DECLARE held_step VARCHAR(255);
    DECLARE held_at DATETIME(6);
    DECLARE held_status VARCHAR(32);
    DECLARE state_id BIGINT DEFAULT NULL;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    IF COALESCE(p_who, '') = '' THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'autoapproval_manual_claim: who must name the person';
    END IF;
    SET me = CONCAT('manual:', p_who);
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    SELECT r.status, r.request_type INTO status_now, kind
      FROM autoapproval_request r WHERE r.id = p_request_id;
    IF status_now IS NULL THEN
        COMMIT;
        SELECT CAST(NULL AS SIGNED) AS token, CONCAT('request ', p_request_id, ' does not exist') AS refusal;
        LEAVE body;
    END IF;
    IF status_now NOT IN ('PENDING', 'RETRY', 'ING') THEN
        COMMIT;
        SELECT CAST(NULL AS SIGNED) AS token, CONCAT('request ', p_request_id, ' is already ', status_now) AS refusal;
        LEAVE body;
    END IF;
    INSERT INTO autoapproval_manual_token () VALUES ();
    SET mine = -LAST_INSERT_ID();
    -- A waiting (or exhausted) request is taken whatever its retry time:
    -- the update first, so the row is locked once, exclusively.
    SELECT s.id INTO state_id FROM auto_approve_state s
     WHERE s.request_id = p_request_id AND s.status = 'RETRY_WAITING';
    UPDATE auto_approve_state s
       SET s.status = 'IN_PROGRESS', s.holder = me, s.fencing_token = mine, s.step = 'manual',
           s.modified_at = UTC_TIMESTAMP(6), s.woken_at = NULL
     WHERE s.id = state_id AND s.status = 'RETRY_WAITING';
    IF ROW_COUNT() = 0 THEN
        INSERT IGNORE INTO auto_approve_state
               (request_id, request_type, status, holder, fencing_token, step, created_at, modified_at)
        VALUES (p_request_id, kind, 'IN_PROGRESS', me, mine, 'manual', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6));
        SET state_id = IF(ROW_COUNT() = 1, LAST_INSERT_ID(), NULL);
        IF state_id IS NULL THEN
            -- Held, or made waiting since the update: refused either way,
            -- as updating the row now would upgrade the insert's share lock.
            SELECT s.holder, s.step, s.modified_at, s.status INTO held_holder, held_step, held_at, held_status
              FROM auto_approve_state s WHERE s.request_id = p_request_id;
            COMMIT;
            IF held_holder IS NULL OR held_status <> 'IN_PROGRESS' THEN
                SELECT CAST(NULL AS SIGNED) AS token,
                       CONCAT('request ', p_request_id, ' changed meanwhile; try again') AS refusal;
            ELSEIF held_holder LIKE 'manual:%' THEN
                SELECT CAST(NULL AS SIGNED) AS token,
                       CONCAT('request ', p_request_id, ' is claimed by ', SUBSTRING(held_holder, 8),
                              ' (last seen ', held_at, ')') AS refusal;
            ELSE
                SELECT CAST(NULL AS SIGNED) AS token,
                       CONCAT('auto-approval is running step ', COALESCE(held_step, 'start'), ' since ',
                              held_at, ', on replica ', held_holder) AS refusal;
            END IF;
            LEAVE body;
        END IF;
    END IF;
    -- A decision committed while the insert waited on the controller's
    -- claim: READ COMMITTED reads it, without locking the request row
    -- after the state row (the lock order is the other way round).
    SET status_now = NULL;
    SELECT r.status INTO status_now FROM autoapproval_request r WHERE r.id = p_request_id;
    IF status_now IS NULL OR status_now NOT IN ('PENDING', 'RETRY', 'ING') THEN
        DELETE FROM auto_approve_state WHERE id = state_id AND holder = me AND fencing_token = mine;
        COMMIT;
        SELECT CAST(NULL AS SIGNED) AS token,
               CONCAT('request ', p_request_id, ' is already ', COALESCE(status_now, 'gone')) AS refusal;
        LEAVE body;
    END IF;
    INSERT INTO autoapproval_request_memo (request_id, created_at, author, message)
    VALUES (p_request_id, UTC_TIMESTAMP(6), me, 'claimed for manual approval');
    COMMIT;
    SELECT mine AS token, CAST(NULL AS CHAR) AS refusal;
END;

-- Tells the cleanser the claim is alive; alive = 0 when it is no longer
-- this claim.
DROP PROCEDURE IF EXISTS autoapproval_manual_heartbeat_attempt;
CREATE PROCEDURE autoapproval_manual_heartbeat_attempt(IN p_request_id BIGINT, IN p_who VARCHAR(200), IN p_token BIGINT)
SQL SECURITY DEFINER
BEGIN
    DECLARE state_id BIGINT DEFAULT NULL;
    SELECT s.id INTO state_id FROM auto_approve_state s WHERE s.request_id = p_request_id;
    UPDATE auto_approve_state s SET s.modified_at = UTC_TIMESTAMP(6)
     WHERE s.id = state_id AND s.status = 'IN_PROGRESS'
       AND s.holder = CONCAT('manual:', p_who) AND s.fencing_token = p_token;
    SELECT ROW_COUNT() = 1 AS alive;
END;

-- Gives the request back to auto-approval, due at once; released = 0 when
-- the claim is no longer this one. The memo and the state update are one
-- transaction; the replicas find the request due at their next turn
-- (PostgreSQL also NOTIFYs; here a wake row does).
DROP PROCEDURE IF EXISTS autoapproval_manual_release_attempt;
CREATE PROCEDURE autoapproval_manual_release_attempt(IN p_request_id BIGINT, IN p_who VARCHAR(200), IN p_token BIGINT)
SQL SECURITY DEFINER
body: BEGIN
    DECLARE state_id BIGINT DEFAULT NULL;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    SELECT s.id INTO state_id FROM auto_approve_state s WHERE s.request_id = p_request_id;
    UPDATE auto_approve_state s
       SET s.status = 'RETRY_WAITING', s.next_retry_time = UTC_TIMESTAMP(6), s.modified_at = UTC_TIMESTAMP(6),
           s.last_reason = CONCAT('released by manual:', p_who)
     WHERE s.id = state_id AND s.status = 'IN_PROGRESS'
       AND s.holder = CONCAT('manual:', p_who) AND s.fencing_token = p_token;
    IF ROW_COUNT() = 0 THEN
        ROLLBACK;
        SELECT false AS released;
        LEAVE body;
    END IF;
    INSERT INTO autoapproval_request_memo (request_id, created_at, author, message)
    VALUES (p_request_id, UTC_TIMESTAMP(6), CONCAT('manual:', p_who), 'released to auto-approval');
    INSERT INTO auto_approve_wake (request_id) VALUES (p_request_id);
    COMMIT;
    SELECT true AS released;
END;

-- Records the person's decision (APPROVED, REJECTED or CANCELED) and ends
-- the claim in one transaction, only while the claim is this one and the
-- request still open. Lock order as everywhere: the request row, then the
-- state row, each by primary key. The decision is a business change like
-- any other (the caller's session does not name the request in
-- @autoapproval_writing_request): the request's trigger appends its wake
-- row, as 0.2.0's did for a decided_by other than 'autoapproval'.
DROP PROCEDURE IF EXISTS autoapproval_manual_decide_attempt;
CREATE PROCEDURE autoapproval_manual_decide_attempt(
    IN p_request_id BIGINT, IN p_who VARCHAR(200), IN p_token BIGINT, IN p_decision VARCHAR(32), IN p_note TEXT)
SQL SECURITY DEFINER
body: BEGIN
    DECLARE me VARCHAR(255);
    DECLARE status_now VARCHAR(32) DEFAULT NULL;
    DECLARE state_id BIGINT DEFAULT NULL;
    DECLARE held BIGINT DEFAULT NULL;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    IF p_decision IS NULL OR p_decision NOT IN ('APPROVED', 'REJECTED', 'CANCELED') THEN
        SIGNAL SQLSTATE '45000'
            SET MESSAGE_TEXT = 'autoapproval_manual_decide: decision must be APPROVED, REJECTED or CANCELED';
    END IF;
    SET me = CONCAT('manual:', p_who);
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    SELECT r.status INTO status_now FROM autoapproval_request r WHERE r.id = p_request_id FOR UPDATE;
    IF status_now IS NULL THEN
        ROLLBACK;
        SELECT false AS decided, CONCAT('request ', p_request_id, ' does not exist') AS refusal;
        LEAVE body;
    END IF;
    -- Two variables: a SELECT INTO that finds no row leaves its target as it was.
    SELECT s.id INTO state_id FROM auto_approve_state s WHERE s.request_id = p_request_id;
    SELECT s.id INTO held FROM auto_approve_state s
     WHERE s.id = state_id AND s.status = 'IN_PROGRESS'
       AND s.holder = me AND s.fencing_token = p_token
       FOR UPDATE;
    IF held IS NULL THEN
        ROLLBACK;
        SELECT false AS decided,
               CONCAT('request ', p_request_id, ' is not claimed by ', me, ' under token ', p_token) AS refusal;
        LEAVE body;
    END IF;
    DELETE FROM auto_approve_state WHERE id = held;
    IF status_now NOT IN ('PENDING', 'RETRY', 'ING') THEN
        COMMIT;
        SELECT false AS decided, CONCAT('request ', p_request_id, ' is already ', status_now) AS refusal;
        LEAVE body;
    END IF;
    UPDATE autoapproval_request r
       SET r.status = p_decision, r.decided_at = UTC_TIMESTAMP(6), r.decided_by = me,
           r.updated_at = UTC_TIMESTAMP(6)
     WHERE r.id = p_request_id;
    INSERT INTO autoapproval_request_memo (request_id, created_at, author, message)
    VALUES (p_request_id, UTC_TIMESTAMP(6), me, CONCAT(p_decision, COALESCE(CONCAT(': ', NULLIF(p_note, '')), '')));
    COMMIT;
    SELECT true AS decided, CAST(NULL AS CHAR) AS refusal;
END;

-- The four procedures the other service calls: each runs its attempt again
-- when InnoDB chose it as a deadlock's victim (1213, the attempt rolled
-- back and nothing answered yet: every answer follows the commit), up to 5
-- times. The orders above avoid the deadlocks among people; the
-- controller's statements by request_id (applying wakes) lock that index
-- before the primary key and can still meet a person's transaction.
-- Each procedure's own SQL runs only here, as the definer, so the other
-- service needs EXECUTE on these four alone. Entry points (see the top):
-- 0.2.0's, kept with their grants; a change goes into the attempts.

CREATE PROCEDURE IF NOT EXISTS autoapproval_manual_claim(IN p_request_id BIGINT, IN p_who VARCHAR(200))
SQL SECURITY DEFINER
BEGIN
    DECLARE attempt INT DEFAULT 1;
    retry: LOOP
        BEGIN
            DECLARE EXIT HANDLER FOR 1213 BEGIN
                IF attempt >= 5 THEN RESIGNAL; END IF;
                SET attempt = attempt + 1;
            END;
            CALL autoapproval_manual_claim_attempt(p_request_id, p_who);
            LEAVE retry;
        END;
    END LOOP;
END;

CREATE PROCEDURE IF NOT EXISTS autoapproval_manual_heartbeat(IN p_request_id BIGINT, IN p_who VARCHAR(200), IN p_token BIGINT)
SQL SECURITY DEFINER
BEGIN
    DECLARE attempt INT DEFAULT 1;
    retry: LOOP
        BEGIN
            DECLARE EXIT HANDLER FOR 1213 BEGIN
                IF attempt >= 5 THEN RESIGNAL; END IF;
                SET attempt = attempt + 1;
            END;
            CALL autoapproval_manual_heartbeat_attempt(p_request_id, p_who, p_token);
            LEAVE retry;
        END;
    END LOOP;
END;

CREATE PROCEDURE IF NOT EXISTS autoapproval_manual_release(IN p_request_id BIGINT, IN p_who VARCHAR(200), IN p_token BIGINT)
SQL SECURITY DEFINER
BEGIN
    DECLARE attempt INT DEFAULT 1;
    retry: LOOP
        BEGIN
            DECLARE EXIT HANDLER FOR 1213 BEGIN
                IF attempt >= 5 THEN RESIGNAL; END IF;
                SET attempt = attempt + 1;
            END;
            CALL autoapproval_manual_release_attempt(p_request_id, p_who, p_token);
            LEAVE retry;
        END;
    END LOOP;
END;

CREATE PROCEDURE IF NOT EXISTS autoapproval_manual_decide(IN p_request_id BIGINT, IN p_who VARCHAR(200), IN p_token BIGINT, IN p_decision VARCHAR(32), IN p_note TEXT)
SQL SECURITY DEFINER
BEGIN
    DECLARE attempt INT DEFAULT 1;
    retry: LOOP
        BEGIN
            DECLARE EXIT HANDLER FOR 1213 BEGIN
                IF attempt >= 5 THEN RESIGNAL; END IF;
                SET attempt = attempt + 1;
            END;
            CALL autoapproval_manual_decide_attempt(p_request_id, p_who, p_token, p_decision, p_note);
            LEAVE retry;
        END;
    END LOOP;
END;
