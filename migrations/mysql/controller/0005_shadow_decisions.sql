-- What a controller in shadow mode (`--mode shadow`) would have done with
-- each request (PostgreSQL 0006): one row per request, kept across
-- restarts for `autoapproval shadow-report`. `would_approve_at`: the first
-- evaluation at which every gate passed (NULL: held so far), kept once
-- set; `decision`, `step`, `reason`: the latest evaluation;
-- `handed_over_at`: when a start in active mode made the request's waiting
-- row due again (issue 43).
CREATE TABLE IF NOT EXISTS auto_approve_shadow (
    request_id       BIGINT       NOT NULL PRIMARY KEY,
    request_type     VARCHAR(64)  NOT NULL,
    decision         VARCHAR(16)  NOT NULL,
    step             VARCHAR(64)  NOT NULL,
    reason           TEXT         NOT NULL,
    first_seen_at    DATETIME(6)  NOT NULL,
    would_approve_at DATETIME(6)  NULL,
    evaluated_at     DATETIME(6)  NOT NULL,
    evaluations      INT          NOT NULL DEFAULT 1,
    handed_over_at   DATETIME(6)  NULL,
    KEY auto_approve_shadow_first_seen (first_seen_at),
    CONSTRAINT auto_approve_shadow_decision CHECK (decision IN ('APPROVE', 'HOLD'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
