-- What a controller in shadow mode (`--mode shadow`) would have done with
-- each request: one row per request, kept across restarts for
-- `autoapproval shadow-report`, which compares it with what actually
-- happened to the request (its status, decided_at and decided_by in the
-- binding's view). `would_approve_at`: the first evaluation at which every
-- gate passed (NULL: held every time so far); once set it stays, since an
-- active controller would have approved the request then. `decision`,
-- `step`, `reason`: the latest evaluation. `handed_over_at`: when a start
-- in active mode made the request's waiting row due again (issue 43).
CREATE TABLE IF NOT EXISTS auto_approve_shadow (
    request_id       BIGINT      PRIMARY KEY,
    request_type     TEXT        NOT NULL,
    decision         TEXT        NOT NULL,
    step             TEXT        NOT NULL,
    reason           TEXT        NOT NULL,
    first_seen_at    TIMESTAMPTZ NOT NULL,
    would_approve_at TIMESTAMPTZ,
    evaluated_at     TIMESTAMPTZ NOT NULL,
    evaluations      INTEGER     NOT NULL DEFAULT 1,
    handed_over_at   TIMESTAMPTZ,
    CONSTRAINT auto_approve_shadow_decision CHECK (decision IN ('APPROVE', 'HOLD'))
);
CREATE INDEX IF NOT EXISTS auto_approve_shadow_first_seen
    ON auto_approve_shadow (first_seen_at);
