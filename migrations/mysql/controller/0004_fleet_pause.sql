-- A brake for the whole fleet (PostgreSQL 0005): while this table holds its
-- one row, no replica claims anything (every claim statement tests it),
-- the chains already running finish, and people's manual claims go on.
-- Who paused, when and why are kept here, so the pause survives every
-- restart; resuming deletes the row.
CREATE TABLE IF NOT EXISTS auto_approve_fleet_pause (
    only_row  BOOLEAN      NOT NULL DEFAULT true PRIMARY KEY,
    paused_by VARCHAR(255) NOT NULL,
    reason    TEXT,
    paused_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    CONSTRAINT auto_approve_fleet_pause_only_row CHECK (only_row = true)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- The procedures people call (`autoapproval pause --all` and `resume --all`
-- call them too), by 0001's rule: the entry points are created only when
-- missing and never dropped (a grant on them stays), each only calling its
-- inner procedure, which a later migration may replace. Each answers one
-- result set, as the manual procedures do.
DROP PROCEDURE IF EXISTS autoapproval_pause_fleet_attempt;
CREATE PROCEDURE autoapproval_pause_fleet_attempt(IN p_who VARCHAR(200), IN p_reason TEXT)
SQL SECURITY DEFINER
body: BEGIN
    DECLARE held_by VARCHAR(255) DEFAULT NULL;
    DECLARE held_reason TEXT DEFAULT NULL;
    DECLARE held_at DATETIME(6) DEFAULT NULL;
    IF COALESCE(p_who, '') = '' THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'autoapproval_pause_fleet: who must name the person';
    END IF;
    INSERT IGNORE INTO auto_approve_fleet_pause (only_row, paused_by, reason, paused_at)
    VALUES (true, p_who, NULLIF(p_reason, ''), UTC_TIMESTAMP(6));
    IF ROW_COUNT() = 1 THEN
        SELECT true AS paused, CAST(NULL AS CHAR) AS refusal;
        LEAVE body;
    END IF;
    SELECT f.paused_by, f.reason, f.paused_at INTO held_by, held_reason, held_at
      FROM auto_approve_fleet_pause f;
    SELECT false AS paused,
           CONCAT('the fleet is already paused by ', held_by, ' since ', held_at,
                  COALESCE(CONCAT(': ', held_reason), '')) AS refusal;
END;

CREATE PROCEDURE IF NOT EXISTS autoapproval_pause_fleet(IN p_who VARCHAR(200), IN p_reason TEXT)
SQL SECURITY DEFINER
CALL autoapproval_pause_fleet_attempt(p_who, p_reason);

DROP PROCEDURE IF EXISTS autoapproval_resume_fleet_attempt;
CREATE PROCEDURE autoapproval_resume_fleet_attempt(IN p_who VARCHAR(200))
SQL SECURITY DEFINER
BEGIN
    IF COALESCE(p_who, '') = '' THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'autoapproval_resume_fleet: who must name the person';
    END IF;
    DELETE FROM auto_approve_fleet_pause WHERE only_row = true;
    IF ROW_COUNT() = 1 THEN
        SELECT true AS resumed, CAST(NULL AS CHAR) AS refusal;
    ELSE
        SELECT false AS resumed, 'the fleet is not paused' AS refusal;
    END IF;
END;

CREATE PROCEDURE IF NOT EXISTS autoapproval_resume_fleet(IN p_who VARCHAR(200))
SQL SECURITY DEFINER
CALL autoapproval_resume_fleet_attempt(p_who);

DROP PROCEDURE IF EXISTS autoapproval_fleet_pause_attempt;
CREATE PROCEDURE autoapproval_fleet_pause_attempt()
SQL SECURITY DEFINER
SELECT f.paused_by, f.reason, f.paused_at FROM auto_approve_fleet_pause f;

CREATE PROCEDURE IF NOT EXISTS autoapproval_fleet_pause()
SQL SECURITY DEFINER
CALL autoapproval_fleet_pause_attempt();
