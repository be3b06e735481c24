-- The manual-approval path as a database API (PostgreSQL 0013), as stored
-- procedures: claim, heartbeat, release, decide. Same meaning: a person's
-- claim is a state row held by 'manual:<who>' under a negative token, so the
-- UNIQUE(request_id) and the status test make the controller and people
-- take turns, and every write of a person is conditional on holder and
-- token. Times in the database clock (UTC_TIMESTAMP(6)).
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
CREATE TABLE autoapproval_manual_token (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY
) ENGINE = InnoDB;

-- One attempt of a claim (autoapproval_manual_claim, below, retries it):
-- claims `p_request_id` for the person `p_who`. token: the token to give
-- to heartbeat, release and decide; refusal: why not.
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
      FROM approval_request r WHERE r.id = p_request_id;
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
    SELECT r.status INTO status_now FROM approval_request r WHERE r.id = p_request_id;
    IF status_now IS NULL OR status_now NOT IN ('PENDING', 'RETRY', 'ING') THEN
        DELETE FROM auto_approve_state WHERE id = state_id AND holder = me AND fencing_token = mine;
        COMMIT;
        SELECT CAST(NULL AS SIGNED) AS token,
               CONCAT('request ', p_request_id, ' is already ', COALESCE(status_now, 'gone')) AS refusal;
        LEAVE body;
    END IF;
    INSERT INTO approval_request_memo (request_id, author, message)
    VALUES (p_request_id, me, 'claimed for manual approval');
    COMMIT;
    SELECT mine AS token, CAST(NULL AS CHAR) AS refusal;
END;

-- Tells the cleanser the claim is alive; alive = 0 when it is no longer
-- this claim.
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
-- the claim is no longer this one. The memo row's trigger-free insert and
-- the state update are one transaction; the replicas find the request due
-- at their next turn (PostgreSQL also NOTIFYs; here a wake row does).
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
    INSERT INTO approval_request_memo (request_id, author, message)
    VALUES (p_request_id, CONCAT('manual:', p_who), 'released to auto-approval');
    INSERT INTO auto_approve_wake (request_id) VALUES (p_request_id);
    COMMIT;
    SELECT true AS released;
END;

-- Records the person's decision (APPROVED, REJECTED or CANCELED) and ends
-- the claim in one transaction, only while the claim is this one and the
-- request still open. Lock order as everywhere: the request row, then the
-- state row, each by primary key.
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
    SELECT r.status INTO status_now FROM approval_request r WHERE r.id = p_request_id FOR UPDATE;
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
    UPDATE approval_request r
       SET r.status = p_decision, r.decided_at = UTC_TIMESTAMP(6), r.decided_by = me,
           r.updated_at = UTC_TIMESTAMP(6)
     WHERE r.id = p_request_id;
    INSERT INTO approval_request_memo (request_id, author, message)
    VALUES (p_request_id, me, CONCAT(p_decision, COALESCE(CONCAT(': ', NULLIF(p_note, '')), '')));
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
-- service needs EXECUTE on these four alone.

CREATE PROCEDURE autoapproval_manual_claim(IN p_request_id BIGINT, IN p_who VARCHAR(200))
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

CREATE PROCEDURE autoapproval_manual_heartbeat(IN p_request_id BIGINT, IN p_who VARCHAR(200), IN p_token BIGINT)
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

CREATE PROCEDURE autoapproval_manual_release(IN p_request_id BIGINT, IN p_who VARCHAR(200), IN p_token BIGINT)
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

CREATE PROCEDURE autoapproval_manual_decide(IN p_request_id BIGINT, IN p_who VARCHAR(200), IN p_token BIGINT, IN p_decision VARCHAR(32), IN p_note TEXT)
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
