-- What was sent under each idempotency key, recorded under the claim's
-- fence before the call and sent verbatim by every later attempt until the
-- result is saved (PostgreSQL 0018). `result`: the answer saved from it.
-- The rows of a request go with its completion.
CREATE TABLE auto_approve_sent (
    request_id      BIGINT       NOT NULL,
    idempotency_key VARCHAR(255) NOT NULL,
    body            TEXT         NOT NULL,
    result          VARCHAR(255),
    sent_at         DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (request_id, idempotency_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
