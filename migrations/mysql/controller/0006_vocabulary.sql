-- The business's codes for our words (issue 44), as PostgreSQL's 0007:
-- auto_approve_vocabulary holds the vocabulary `migrate --vocabulary FILE`
-- stores, one row per word (kind, word, code), the code as the database
-- shows it in text; these rows are our own words, what an install without
-- a vocabulary file has. `run` compares its --vocabulary with it (the
-- controller's account needs SELECT on it: docs/INTEGRATING.md, grants;
-- with our own words a refused read is taken as our own words).
-- Binary collation: a code is compared byte for byte, 'p' is not 'P'.
CREATE TABLE IF NOT EXISTS auto_approve_vocabulary (
    kind VARCHAR(32) NOT NULL,
    word VARCHAR(32) NOT NULL,
    code VARCHAR(64) NOT NULL,
    PRIMARY KEY (kind, word),
    UNIQUE KEY auto_approve_vocabulary_code (kind, code)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
INSERT IGNORE INTO auto_approve_vocabulary (kind, word, code) VALUES
    ('econtract_statuses', 'PENDING', 'PENDING'),
    ('econtract_statuses', 'REJECTED', 'REJECTED'),
    ('econtract_statuses', 'SIGNED', 'SIGNED'),
    ('request_statuses', 'APPROVED', 'APPROVED'),
    ('request_statuses', 'CANCELED', 'CANCELED'),
    ('request_statuses', 'ING', 'ING'),
    ('request_statuses', 'PENDING', 'PENDING'),
    ('request_statuses', 'REJECTED', 'REJECTED'),
    ('request_statuses', 'RETRY', 'RETRY'),
    ('request_types', 'AD_CONTRACT', 'AD_CONTRACT'),
    ('request_types', 'OWNER_CONTRACT', 'OWNER_CONTRACT');

-- The manual procedures read the request's status and type as our words
-- (a code no word has: itself) and write the decision as the business's
-- code. Only the inner procedures are replaced (DROP + CREATE, as 0001's
-- rule says): nobody is granted them, and the four entry points that
-- people are granted stay as they are, with their grants. The wake
-- procedures read no status or type (the poller matches requests by
-- their contract, and the claim reads the status through our
-- statements), so they stay too.

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
    SELECT COALESCE((SELECT v.word FROM auto_approve_vocabulary v
                     WHERE v.kind = 'request_statuses' AND v.code = CONVERT(r.status USING utf8mb4) COLLATE utf8mb4_bin),
                   CONVERT(r.status USING utf8mb4) COLLATE utf8mb4_bin),
           COALESCE((SELECT v.word FROM auto_approve_vocabulary v
                     WHERE v.kind = 'request_types' AND v.code = CONVERT(r.request_type USING utf8mb4) COLLATE utf8mb4_bin),
                   CONVERT(r.request_type USING utf8mb4) COLLATE utf8mb4_bin)
      INTO status_now, kind
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
    SELECT COALESCE((SELECT v.word FROM auto_approve_vocabulary v
                     WHERE v.kind = 'request_statuses' AND v.code = CONVERT(r.status USING utf8mb4) COLLATE utf8mb4_bin),
                   CONVERT(r.status USING utf8mb4) COLLATE utf8mb4_bin)
      INTO status_now FROM autoapproval_request r WHERE r.id = p_request_id;
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
    DECLARE decided_code VARCHAR(64) DEFAULT NULL;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    IF p_decision IS NULL OR p_decision NOT IN ('APPROVED', 'REJECTED', 'CANCELED') THEN
        SIGNAL SQLSTATE '45000'
            SET MESSAGE_TEXT = 'autoapproval_manual_decide: decision must be APPROVED, REJECTED or CANCELED';
    END IF;
    SET me = CONCAT('manual:', p_who);
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    SELECT COALESCE((SELECT v.word FROM auto_approve_vocabulary v
                     WHERE v.kind = 'request_statuses' AND v.code = CONVERT(r.status USING utf8mb4) COLLATE utf8mb4_bin),
                   CONVERT(r.status USING utf8mb4) COLLATE utf8mb4_bin)
      INTO status_now FROM autoapproval_request r WHERE r.id = p_request_id FOR UPDATE;
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
    -- The decision in the business's code; the column converts the text
    -- (a smallint's '3', a char(1)'s 'A') as it converts a literal.
    SELECT v.code INTO decided_code FROM auto_approve_vocabulary v
     WHERE v.kind = 'request_statuses' AND v.word = p_decision;
    UPDATE autoapproval_request r
       SET r.status = decided_code, r.decided_at = UTC_TIMESTAMP(6), r.decided_by = me,
           r.updated_at = UTC_TIMESTAMP(6)
     WHERE r.id = p_request_id;
    INSERT INTO autoapproval_request_memo (request_id, created_at, author, message)
    VALUES (p_request_id, UTC_TIMESTAMP(6), me, CONCAT(p_decision, COALESCE(CONCAT(': ', NULLIF(p_note, '')), '')));
    COMMIT;
    SELECT true AS decided, CAST(NULL AS CHAR) AS refusal;
END;
