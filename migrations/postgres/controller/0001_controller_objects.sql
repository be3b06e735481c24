-- The controller's own objects, and nothing on a business table (issue 35).
--
-- This is 0.2.0's schema squashed (its 21 migrations, whose history and
-- reasons are in git: `git log -- migrations/postgres`), without the
-- reference business tables (now `migrations/postgres/reference/`), with
-- the wake triggers generalised into routines that the business tables'
-- owner attaches to its own tables (docs/INTEGRATING.md).
--
-- Idempotent on a database 0.2.0 migrated: every object is created only
-- when missing, every function replaced. 0.2.0's trigger functions and
-- their triggers stay: this set runs (the chart's pre-upgrade hook) while
-- 0.2.0's replicas still run, and those approve only while those triggers
-- record their wakes. Whoever attaches the new triggers drops them in the
-- same step (the reference set's binding; docs/INSTALL.md, From 0.2.0).
--
-- The controller reads and writes the business data only through the
-- views autoapproval_request, autoapproval_econtract and
-- autoapproval_request_memo, which the integrator creates in this schema:
-- the functions below name them; PL/pgSQL resolves them when called.

-- One row per request auto-approval has touched: UNIQUE(request_id) makes
-- two workers racing on a new request unable to both create one. Deleted
-- on success; IN_PROGRESS (claimed, holder and fencing token) or
-- RETRY_WAITING (next_retry_time).
CREATE TABLE IF NOT EXISTS auto_approve_state (
    id               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    request_id       BIGINT      NOT NULL,
    request_type     TEXT        NOT NULL,
    status           TEXT        NOT NULL CHECK (status IN ('IN_PROGRESS', 'RETRY_WAITING')),
    next_retry_time  TIMESTAMPTZ,
    retry_count      INTEGER     NOT NULL DEFAULT 0,
    -- Consecutive transient failures: the exponent of the backoff.
    transient_streak INTEGER     NOT NULL DEFAULT 0,
    holder           TEXT        NOT NULL,
    fencing_token    BIGINT      NOT NULL,
    step             TEXT,
    last_reason      TEXT,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    modified_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- A change seen while IN_PROGRESS: the retry it schedules is due at once.
    woken_at         TIMESTAMPTZ,
    -- Which of the holder's claims this is: a write of an earlier attempt
    -- under the same holder and token cannot land on a later one.
    claim_nonce      BIGINT      NOT NULL DEFAULT 0,
    CONSTRAINT auto_approve_state_request_id_key UNIQUE (request_id)
);

-- The cleanser finds rows stuck IN_PROGRESS with this index.
CREATE INDEX IF NOT EXISTS auto_approve_state_status_modified_at
    ON auto_approve_state (status, modified_at);

-- Due retries in due order, without stepping over the requests that wait.
-- Built plainly: on a new install the table is empty, and on 0.2.0 it exists.
CREATE INDEX IF NOT EXISTS auto_approve_state_due
    ON auto_approve_state (next_retry_time)
    WHERE status = 'RETRY_WAITING';

COMMENT ON COLUMN auto_approve_state.modified_at IS
    'Last write by a claim, heartbeat, retry or recovery, in the database clock (now()); the cleanser compares it with now() - the stuck threshold';

-- Wake rows: a change of a request, appended by the business transaction's
-- trigger. No key, constraint or trigger, so the insert takes no lock on any
-- row of ours and never waits; the controller consumes them (each discovery
-- turn makes the woken waiting requests of its shards due and deletes the
-- rows of requests nobody claims; a running claim's retry is due at once
-- when its request was woken meanwhile).
CREATE TABLE IF NOT EXISTS auto_approve_wake (
    request_id BIGINT      NOT NULL,
    woken_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS auto_approve_wake_request ON auto_approve_wake (request_id);

-- Shard fencing: the token a shard's new owner took, so claims of an
-- earlier owner's are recovered and its late writes refused.
CREATE TABLE IF NOT EXISTS shard_fence (
    shard_count INTEGER     NOT NULL CHECK (shard_count > 0),
    shard       INTEGER     NOT NULL CHECK (shard >= 0 AND shard < shard_count),
    token       BIGINT      NOT NULL,
    holder      TEXT        NOT NULL,
    fenced_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (shard_count, shard)
);

-- The one shard count every replica uses.
CREATE TABLE IF NOT EXISTS shard_layout (
    only_row    BOOLEAN     PRIMARY KEY DEFAULT true CHECK (only_row),
    shard_count INTEGER     NOT NULL CHECK (shard_count > 0),
    set_by      TEXT        NOT NULL,
    set_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Requests an operator paused (the AutoApproval CR's spec.paused, or
-- `autoapproval request pause`).
CREATE TABLE IF NOT EXISTS auto_approve_pause (
    request_id BIGINT      PRIMARY KEY,
    paused_by  TEXT        NOT NULL,
    cr_uid     TEXT,
    paused_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The bodies sent to the external systems, by idempotency key, so a retry
-- re-sends the same body and a changed one is refused.
CREATE TABLE IF NOT EXISTS auto_approve_sent (
    request_id      BIGINT      NOT NULL,
    idempotency_key TEXT        NOT NULL,
    body            TEXT        NOT NULL,
    result          TEXT,
    sent_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (request_id, idempotency_key)
);

-- Tokens of people's claims are negative, one per claim: shard fencing
-- recovers only claims with a positive token below the new one.
CREATE SEQUENCE IF NOT EXISTS autoapproval_manual_token;

-- Every function of ours resolves names in its own schema only (0.2.0's
-- issue 33): search_path is pinned to the schema these migrations run in,
-- then pg_catalog, pg_temp last (no temporary object is found before ours);
-- the names it reads are qualified; it runs as its owner, the role that
-- applies the migrations (SECURITY DEFINER), except the watch routines,
-- which run as the business table's owner who calls them (only an owner
-- may create a trigger on its table). @s@ stands for the schema and @path@
-- for the search_path, replaced before each definition is run.
DO $migration$
DECLARE
    schema_name TEXT := pg_catalog.quote_ident(pg_catalog.current_schema());
    path TEXT := pg_catalog.format('%I, pg_catalog, pg_temp', pg_catalog.current_schema());
    definition TEXT;
BEGIN
    FOREACH definition IN ARRAY ARRAY[
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_wake(request_ids BIGINT[]) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = @path@ AS $$
    INSERT INTO @s@.auto_approve_wake (request_id)
    SELECT w.rid FROM pg_catalog.unnest(request_ids) AS w(rid);
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_request_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
-- A change of a watched business request. TG_ARGV[0] names the column
-- holding the request id, so one function serves any table. What the
-- business transaction pays: one row appended to auto_approve_wake (an
-- update only: a new request has no claim to wake) and one NOTIFY; it takes
-- no lock on anything of ours.
DECLARE
    id BIGINT := (pg_catalog.to_jsonb(NEW) OPERATOR(pg_catalog.->>) TG_ARGV[0])::BIGINT;
BEGIN
    -- Our own writes (results, the approval) wake nobody: the replica that
    -- wrote them knows, and the request's CR shows it.
    IF id IS NULL
       OR id::TEXT OPERATOR(pg_catalog.=) pg_catalog.current_setting('autoapproval.writing_request', true) THEN
        RETURN NULL;
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
        PERFORM @s@.autoapproval_wake(ARRAY[id]);
    END IF;
    PERFORM pg_catalog.pg_notify('autoapproval_request_changed', id::TEXT);
    RETURN NULL;
END;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_econtract_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
-- An e-contract signed or voided: a fact of every open request on it.
-- TG_ARGV[0] names the column holding the contract's reference. The chain's
-- own ledger sync names its request in autoapproval.syncing_request: that
-- request is not woken by its own write.
DECLARE
    ref TEXT := pg_catalog.to_jsonb(NEW) OPERATOR(pg_catalog.->>) TG_ARGV[0];
    syncing TEXT := pg_catalog.current_setting('autoapproval.syncing_request', true);
    woken BIGINT[];
BEGIN
    SELECT pg_catalog.array_agg(r.id) INTO woken
      FROM @s@.autoapproval_request r
     WHERE r.econtract_ref = ref
       AND r.status IN ('ING', 'PENDING', 'RETRY')
       AND r.id::TEXT IS DISTINCT FROM NULLIF(syncing, '');
    IF woken IS NOT NULL THEN
        PERFORM @s@.autoapproval_wake(woken);
        PERFORM pg_catalog.pg_notify('autoapproval_request_changed', w::TEXT)
           FROM pg_catalog.unnest(woken) AS w;
    END IF;
    RETURN NULL;
END;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_watch(
    tbl REGCLASS, key_column NAME, columns NAME[], fn TEXT, prefix TEXT)
RETURNS void
LANGUAGE plpgsql SECURITY INVOKER SET search_path = @path@ AS $$
-- Attaches the trigger function `fn` to `tbl` as two triggers named
-- <prefix>_inserted and <prefix>_updated, the update one only when one of
-- `columns` changed (every update when NULL). Runs as the caller: only the
-- table's owner may create a trigger on it.
DECLARE
    missing NAME;
    changed TEXT;
    listed TEXT;
BEGIN
    SELECT c INTO missing
      FROM pg_catalog.unnest(ARRAY[key_column] OPERATOR(pg_catalog.||) coalesce(columns, '{}')) AS c
     WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                        WHERE a.attrelid OPERATOR(pg_catalog.=) tbl
                          AND a.attname OPERATOR(pg_catalog.=) c
                          AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped)
     LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'autoapproval_watch: table % has no column %', tbl, missing;
    END IF;
    EXECUTE pg_catalog.format(
        'CREATE OR REPLACE TRIGGER %I AFTER INSERT ON %s FOR EACH ROW EXECUTE FUNCTION @s@.%I(%L)',
        prefix OPERATOR(pg_catalog.||) '_inserted', tbl, fn, key_column);
    IF columns IS NULL OR pg_catalog.cardinality(columns) OPERATOR(pg_catalog.=) 0 THEN
        EXECUTE pg_catalog.format(
            'CREATE OR REPLACE TRIGGER %I AFTER UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION @s@.%I(%L)',
            prefix OPERATOR(pg_catalog.||) '_updated', tbl, fn, key_column);
    ELSE
        SELECT pg_catalog.string_agg(pg_catalog.format('%I', c), ', '),
               pg_catalog.string_agg(pg_catalog.format('OLD.%1$I IS DISTINCT FROM NEW.%1$I', c), ' OR ')
          INTO listed, changed
          FROM pg_catalog.unnest(columns) AS c;
        EXECUTE pg_catalog.format(
            'CREATE OR REPLACE TRIGGER %I AFTER UPDATE OF %s ON %s FOR EACH ROW WHEN (%s) EXECUTE FUNCTION @s@.%I(%L)',
            prefix OPERATOR(pg_catalog.||) '_updated', listed, tbl, changed, fn, key_column);
    END IF;
END;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_watch_requests(
    tbl REGCLASS, id_column NAME, columns NAME[] DEFAULT NULL)
RETURNS void
LANGUAGE sql SECURITY INVOKER SET search_path = @path@ AS $$
-- The business request table: its id column, and the columns behind the
-- facts the filters read (status, type, the flags, the e-contract, the
-- target store). Our result columns need not be watched.
    SELECT @s@.autoapproval_watch(tbl, id_column, columns,
                                  'autoapproval_request_changed', 'autoapproval_request');
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_watch_econtracts(
    tbl REGCLASS, ref_column NAME, columns NAME[] DEFAULT NULL)
RETURNS void
LANGUAGE sql SECURITY INVOKER SET search_path = @path@ AS $$
-- The e-contract ledger: its reference column, and the status column.
    SELECT @s@.autoapproval_watch(tbl, ref_column, columns,
                                  'autoapproval_econtract_changed', 'autoapproval_econtract');
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_manual_claim(p_request_id BIGINT, p_who TEXT)
RETURNS TABLE (token BIGINT, refusal TEXT)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
DECLARE
    me     TEXT := 'manual:' || p_who;
    mine   BIGINT := -pg_catalog.nextval('@s@.autoapproval_manual_token'::regclass);
    status_now TEXT;
    kind   TEXT;
    held   RECORD;
BEGIN
    IF coalesce(p_who, '') = '' THEN
        RAISE EXCEPTION 'autoapproval_manual_claim: who must name the person';
    END IF;
    SELECT r.status, r.request_type INTO status_now, kind FROM @s@.autoapproval_request r WHERE r.id = p_request_id;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::BIGINT, pg_catalog.format('request %s does not exist', p_request_id);
        RETURN;
    END IF;
    IF status_now NOT IN ('PENDING', 'RETRY', 'ING') THEN
        RETURN QUERY SELECT NULL::BIGINT, pg_catalog.format('request %s is already %s', p_request_id, status_now);
        RETURN;
    END IF;
    INSERT INTO @s@.auto_approve_state AS s
           (request_id, request_type, status, holder, fencing_token, step, created_at, modified_at)
    VALUES (p_request_id, kind, 'IN_PROGRESS', me, mine, 'manual', pg_catalog.now(), pg_catalog.now())
    ON CONFLICT (request_id) DO NOTHING;
    IF NOT FOUND THEN
        -- A waiting (or exhausted) request is taken whatever its retry time:
        -- a person decides now.
        UPDATE @s@.auto_approve_state s
           SET status = 'IN_PROGRESS', holder = me, fencing_token = mine, step = 'manual',
               modified_at = pg_catalog.now(), woken_at = NULL
         WHERE s.request_id = p_request_id AND s.status = 'RETRY_WAITING';
        IF NOT FOUND THEN
            SELECT s.holder, s.step, s.modified_at INTO held
              FROM @s@.auto_approve_state s WHERE s.request_id = p_request_id;
            IF NOT FOUND THEN
                RETURN QUERY SELECT NULL::BIGINT, pg_catalog.format('request %s changed meanwhile; try again', p_request_id);
            ELSIF held.holder LIKE 'manual:%' THEN
                RETURN QUERY SELECT NULL::BIGINT, pg_catalog.format('request %s is claimed by %s (last seen %s)',
                    p_request_id, pg_catalog.substr(held.holder, 8), held.modified_at);
            ELSE
                RETURN QUERY SELECT NULL::BIGINT, pg_catalog.format('auto-approval is running step %s since %s, on replica %s',
                    coalesce(held.step, 'start'), held.modified_at, held.holder);
            END IF;
            RETURN;
        END IF;
    END IF;
    -- A decision committed while the insert waited on the controller's
    -- claim is seen by this new statement: give the claim back at once.
    SELECT r.status INTO status_now FROM @s@.autoapproval_request r WHERE r.id = p_request_id;
    IF status_now IS NULL OR status_now NOT IN ('PENDING', 'RETRY', 'ING') THEN
        DELETE FROM @s@.auto_approve_state s WHERE s.request_id = p_request_id AND s.holder = me AND s.fencing_token = mine;
        RETURN QUERY SELECT NULL::BIGINT, pg_catalog.format('request %s is already %s', p_request_id, coalesce(status_now, 'gone'));
        RETURN;
    END IF;
    INSERT INTO @s@.autoapproval_request_memo (request_id, author, message)
    VALUES (p_request_id, me, 'claimed for manual approval');
    RETURN QUERY SELECT mine, NULL::TEXT;
END;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_manual_heartbeat(p_request_id BIGINT, p_who TEXT, p_token BIGINT)
RETURNS BOOLEAN
LANGUAGE sql SECURITY DEFINER SET search_path = @path@ AS $$
    WITH touched AS (
        UPDATE @s@.auto_approve_state s SET modified_at = pg_catalog.now()
         WHERE s.request_id = p_request_id AND s.status = 'IN_PROGRESS'
           AND s.holder = 'manual:' || p_who AND s.fencing_token = p_token
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM touched);
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_manual_release(p_request_id BIGINT, p_who TEXT, p_token BIGINT)
RETURNS BOOLEAN
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
BEGIN
    UPDATE @s@.auto_approve_state s
       SET status = 'RETRY_WAITING', next_retry_time = pg_catalog.now(), modified_at = pg_catalog.now(),
           last_reason = 'released by manual:' || p_who
     WHERE s.request_id = p_request_id AND s.status = 'IN_PROGRESS'
       AND s.holder = 'manual:' || p_who AND s.fencing_token = p_token;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO @s@.autoapproval_request_memo (request_id, author, message)
    VALUES (p_request_id, 'manual:' || p_who, 'released to auto-approval');
    PERFORM pg_catalog.pg_notify('autoapproval_request_changed', p_request_id::text);
    RETURN true;
END;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_manual_decide(
    p_request_id BIGINT, p_who TEXT, p_token BIGINT, p_decision TEXT, p_note TEXT)
RETURNS TABLE (decided BOOLEAN, refusal TEXT)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
DECLARE
    me TEXT := 'manual:' || p_who;
    status_now TEXT;
BEGIN
    IF p_decision IS NULL OR p_decision NOT IN ('APPROVED', 'REJECTED', 'CANCELED') THEN
        RAISE EXCEPTION 'autoapproval_manual_decide: decision must be APPROVED, REJECTED or CANCELED, not %', p_decision;
    END IF;
    SELECT r.status INTO status_now FROM @s@.autoapproval_request r WHERE r.id = p_request_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, pg_catalog.format('request %s does not exist', p_request_id);
        RETURN;
    END IF;
    PERFORM 1 FROM @s@.auto_approve_state s
      WHERE s.request_id = p_request_id AND s.status = 'IN_PROGRESS'
        AND s.holder = me AND s.fencing_token = p_token
      FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, pg_catalog.format('request %s is not claimed by %s under token %s', p_request_id, me, p_token);
        RETURN;
    END IF;
    DELETE FROM @s@.auto_approve_state s WHERE s.request_id = p_request_id;
    IF status_now NOT IN ('PENDING', 'RETRY', 'ING') THEN
        RETURN QUERY SELECT false, pg_catalog.format('request %s is already %s', p_request_id, status_now);
        RETURN;
    END IF;
    UPDATE @s@.autoapproval_request r
       SET status = p_decision, decided_at = pg_catalog.now(), decided_by = me, updated_at = pg_catalog.now()
     WHERE r.id = p_request_id;
    INSERT INTO @s@.autoapproval_request_memo (request_id, author, message)
    VALUES (p_request_id, me, p_decision || coalesce(': ' || nullif(p_note, ''), ''));
    RETURN QUERY SELECT true, NULL::TEXT;
END;
$$
$fn$
    ] LOOP
        EXECUTE pg_catalog.replace(pg_catalog.replace(definition, '@path@', path), '@s@', schema_name);
    END LOOP;
END;
$migration$;

-- PUBLIC may execute none of them (a trigger fires without EXECUTE on its
-- function). The manual functions are granted by name to the service of
-- people's role, the watch routines and trigger functions to the business
-- tables' owner (docs/INTEGRATING.md, docs/DATABASE.md).
REVOKE EXECUTE ON FUNCTION
    autoapproval_wake(BIGINT[]),
    autoapproval_request_changed(),
    autoapproval_econtract_changed(),
    autoapproval_watch(REGCLASS, NAME, NAME[], TEXT, TEXT),
    autoapproval_watch_requests(REGCLASS, NAME, NAME[]),
    autoapproval_watch_econtracts(REGCLASS, NAME, NAME[]),
    autoapproval_manual_claim(BIGINT, TEXT),
    autoapproval_manual_heartbeat(BIGINT, TEXT, BIGINT),
    autoapproval_manual_release(BIGINT, TEXT, BIGINT),
    autoapproval_manual_decide(BIGINT, TEXT, BIGINT, TEXT, TEXT)
    FROM PUBLIC;
