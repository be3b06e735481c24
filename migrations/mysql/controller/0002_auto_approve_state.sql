-- Our own tables, with the meaning of migrations/postgres 0003, 0006, 0008,
-- 0011, 0012 and 0014 as they stand after all of them.

-- One row per request that auto-approval has touched: created by the claim,
-- deleted on success. Its row count is "in progress + waiting", never a backlog.
CREATE TABLE auto_approve_state (
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
    -- Two workers racing on a new request cannot both create a row.
    CONSTRAINT auto_approve_state_request_id_key UNIQUE (request_id),
    CONSTRAINT auto_approve_state_status CHECK (status IN ('IN_PROGRESS', 'RETRY_WAITING')),
    -- The cleanser finds rows stuck IN_PROGRESS with this index.
    KEY auto_approve_state_status_modified_at (status, modified_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- The fencing token of each shard (request_id mod shard_count), as in
-- PostgreSQL 0008: every claim share-locks its shard's row by primary key
-- (LOCK IN SHARE MODE), so a raise waits for claims in flight and every
-- claim after it sees the new token.
CREATE TABLE shard_fence (
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
CREATE TABLE shard_layout (
    only_row    BOOLEAN      NOT NULL DEFAULT true PRIMARY KEY,
    shard_count INTEGER      NOT NULL,
    set_by      VARCHAR(255) NOT NULL,
    set_at      DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    CONSTRAINT shard_layout_only_row CHECK (only_row = true),
    CONSTRAINT shard_layout_count CHECK (shard_count > 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- A pause an operator set (PostgreSQL 0014), kept so it outlives the CR.
CREATE TABLE auto_approve_pause (
    request_id BIGINT       NOT NULL PRIMARY KEY,
    paused_by  VARCHAR(255) NOT NULL,
    cr_uid     VARCHAR(255),
    paused_at  DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
