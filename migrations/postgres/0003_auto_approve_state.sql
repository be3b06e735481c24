-- One row per request that auto-approval has touched: created by the claim,
-- deleted on success. Its row count is "in progress + waiting", never a backlog.
CREATE TABLE auto_approve_state (
    id               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    request_id       BIGINT      NOT NULL,
    request_type     TEXT        NOT NULL,
    status           TEXT        NOT NULL CHECK (status IN ('IN_PROGRESS', 'RETRY_WAITING')),
    next_retry_time  TIMESTAMPTZ,
    retry_count      INTEGER     NOT NULL DEFAULT 0,
    -- Consecutive transient failures: the exponent of the backoff.
    transient_streak INTEGER     NOT NULL DEFAULT 0,
    -- Who claimed it last and with which fencing token; every write after the
    -- claim is conditional on both.
    holder           TEXT        NOT NULL,
    fencing_token    BIGINT      NOT NULL,
    step             TEXT,
    last_reason      TEXT,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    modified_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Two workers racing on a new request cannot both create a row.
    CONSTRAINT auto_approve_state_request_id_key UNIQUE (request_id)
);

-- The cleanser finds rows stuck IN_PROGRESS with this index.
CREATE INDEX auto_approve_state_status_modified_at ON auto_approve_state (status, modified_at);
