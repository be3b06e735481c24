-- The business's codes for our words (issue 44): the vocabulary `migrate
-- --vocabulary FILE` stores, read by our routines, which until now compared
-- the request's status and type with our own words. auto_approve_vocabulary
-- holds (kind, word, code), one row per word, the code as the database
-- shows it in text; these rows are our own words, what an install without
-- a vocabulary file has. Owned by the owner role, like every object here;
-- readable by every role (it holds no secret), so that `run` compares its
-- --vocabulary with it without a new grant. The functions that read a
-- status or a type translate it through autoapproval_word, and the manual
-- decision writes the business's code through autoapproval_code; qualified
-- as 0002 qualifies everything, search_path pg_catalog first.
CREATE TABLE auto_approve_vocabulary (
    kind TEXT NOT NULL,
    word TEXT NOT NULL,
    code TEXT NOT NULL,
    PRIMARY KEY (kind, word),
    UNIQUE (kind, code)
);
INSERT INTO auto_approve_vocabulary (kind, word, code) VALUES
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
GRANT SELECT ON auto_approve_vocabulary TO PUBLIC;

DO $migration$
DECLARE
    schema_name pg_catalog.text := pg_catalog.quote_ident(pg_catalog.current_schema());
    path pg_catalog.text := pg_catalog.format('pg_catalog, %I, pg_temp', pg_catalog.current_schema());
    definition pg_catalog.text;
BEGIN
    FOREACH definition IN ARRAY ARRAY[
$fn$
CREATE FUNCTION @s@.autoapproval_word(p_kind pg_catalog.text, p_code pg_catalog.text)
RETURNS pg_catalog.text
LANGUAGE sql STABLE SECURITY INVOKER SET search_path = @path@ AS $$
-- Our word for a code of the business's (a code no word has: itself).
    SELECT coalesce((SELECT v.word FROM @s@.auto_approve_vocabulary v
                      WHERE v.kind OPERATOR(pg_catalog.=) p_kind
                        AND v.code OPERATOR(pg_catalog.=) p_code), p_code);
$$
$fn$,
$fn$
CREATE FUNCTION @s@.autoapproval_code(p_kind pg_catalog.text, p_word pg_catalog.text)
RETURNS pg_catalog.text
LANGUAGE sql STABLE SECURITY INVOKER SET search_path = @path@ AS $$
-- The business's code for one of our words.
    SELECT v.code FROM @s@.auto_approve_vocabulary v
     WHERE v.kind OPERATOR(pg_catalog.=) p_kind AND v.word OPERATOR(pg_catalog.=) p_word;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_econtract_changed() RETURNS pg_catalog.trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
-- An e-contract signed or voided: a fact of every open request on it.
-- TG_ARGV[0] names the column holding the contract's reference. The chain's
-- own ledger sync names its request in autoapproval.syncing_request: that
-- request is not woken by its own write.
DECLARE
    ref pg_catalog.text := pg_catalog.to_jsonb(NEW) OPERATOR(pg_catalog.->>) TG_ARGV[0];
    syncing pg_catalog.text := pg_catalog.current_setting('autoapproval.syncing_request', true);
    woken pg_catalog.int8[];
BEGIN
    SELECT pg_catalog.array_agg(r.id) INTO woken
      FROM @s@.autoapproval_request r
     WHERE r.econtract_ref OPERATOR(pg_catalog.=) ref
       AND @s@.autoapproval_word('request_statuses', r.status::pg_catalog.text) OPERATOR(pg_catalog.=) ANY (ARRAY['ING', 'PENDING', 'RETRY']::pg_catalog.text[])
       AND (r.id IS NULL OR syncing IS NULL OR syncing OPERATOR(pg_catalog.=) ''
            OR r.id::pg_catalog.text OPERATOR(pg_catalog.<>) syncing);
    IF woken IS NOT NULL THEN
        PERFORM @s@.autoapproval_wake(woken);
        PERFORM pg_catalog.pg_notify('autoapproval_request_changed', w::pg_catalog.text)
           FROM pg_catalog.unnest(woken) AS w;
    END IF;
    RETURN NULL;
END;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_manual_claim(p_request_id pg_catalog.int8, p_who pg_catalog.text)
RETURNS TABLE (token pg_catalog.int8, refusal pg_catalog.text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
DECLARE
    me     pg_catalog.text := 'manual:' OPERATOR(pg_catalog.||) p_who;
    mine   pg_catalog.int8 := OPERATOR(pg_catalog.-) pg_catalog.nextval('@s@.autoapproval_manual_token'::pg_catalog.regclass);
    status_now pg_catalog.text;
    kind   pg_catalog.text;
    held   RECORD;
BEGIN
    IF p_who IS NULL OR p_who OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION 'autoapproval_manual_claim: who must name the person';
    END IF;
    SELECT @s@.autoapproval_word('request_statuses', r.status::pg_catalog.text),
           @s@.autoapproval_word('request_types', r.request_type::pg_catalog.text) INTO status_now, kind
      FROM @s@.autoapproval_request r WHERE r.id OPERATOR(pg_catalog.=) p_request_id;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::pg_catalog.int8, pg_catalog.format('request %s does not exist', p_request_id);
        RETURN;
    END IF;
    IF NOT (status_now OPERATOR(pg_catalog.=) ANY (ARRAY['PENDING', 'RETRY', 'ING']::pg_catalog.text[])) THEN
        RETURN QUERY SELECT NULL::pg_catalog.int8, pg_catalog.format('request %s is already %s', p_request_id, status_now);
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
         WHERE s.request_id OPERATOR(pg_catalog.=) p_request_id
           AND s.status OPERATOR(pg_catalog.=) 'RETRY_WAITING';
        IF NOT FOUND THEN
            SELECT s.holder, s.step, s.modified_at INTO held
              FROM @s@.auto_approve_state s WHERE s.request_id OPERATOR(pg_catalog.=) p_request_id;
            IF NOT FOUND THEN
                RETURN QUERY SELECT NULL::pg_catalog.int8, pg_catalog.format('request %s changed meanwhile; try again', p_request_id);
            ELSIF held.holder OPERATOR(pg_catalog.~~) 'manual:%' THEN
                RETURN QUERY SELECT NULL::pg_catalog.int8, pg_catalog.format('request %s is claimed by %s (last seen %s)',
                    p_request_id, pg_catalog.substr(held.holder, 8), held.modified_at);
            ELSE
                RETURN QUERY SELECT NULL::pg_catalog.int8, pg_catalog.format('auto-approval is running step %s since %s, on replica %s',
                    coalesce(held.step, 'start'), held.modified_at, held.holder);
            END IF;
            RETURN;
        END IF;
    END IF;
    -- A decision committed while the insert waited on the controller's
    -- claim is seen by this new statement: give the claim back at once.
    SELECT @s@.autoapproval_word('request_statuses', r.status::pg_catalog.text) INTO status_now
      FROM @s@.autoapproval_request r WHERE r.id OPERATOR(pg_catalog.=) p_request_id;
    IF status_now IS NULL
       OR NOT (status_now OPERATOR(pg_catalog.=) ANY (ARRAY['PENDING', 'RETRY', 'ING']::pg_catalog.text[])) THEN
        DELETE FROM @s@.auto_approve_state s
         WHERE s.request_id OPERATOR(pg_catalog.=) p_request_id
           AND s.holder OPERATOR(pg_catalog.=) me AND s.fencing_token OPERATOR(pg_catalog.=) mine;
        RETURN QUERY SELECT NULL::pg_catalog.int8, pg_catalog.format('request %s is already %s', p_request_id, coalesce(status_now, 'gone'));
        RETURN;
    END IF;
    INSERT INTO @s@.autoapproval_request_memo (request_id, author, message)
    VALUES (p_request_id, me, 'claimed for manual approval');
    RETURN QUERY SELECT mine, NULL::pg_catalog.text;
END;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_manual_decide(
    p_request_id pg_catalog.int8, p_who pg_catalog.text, p_token pg_catalog.int8,
    p_decision pg_catalog.text, p_note pg_catalog.text)
RETURNS TABLE (decided pg_catalog.bool, refusal pg_catalog.text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
DECLARE
    me pg_catalog.text := 'manual:' OPERATOR(pg_catalog.||) p_who;
    status_now pg_catalog.text;
BEGIN
    IF p_decision IS NULL
       OR NOT (p_decision OPERATOR(pg_catalog.=) ANY (ARRAY['APPROVED', 'REJECTED', 'CANCELED']::pg_catalog.text[])) THEN
        RAISE EXCEPTION 'autoapproval_manual_decide: decision must be APPROVED, REJECTED or CANCELED, not %', p_decision;
    END IF;
    SELECT @s@.autoapproval_word('request_statuses', r.status::pg_catalog.text) INTO status_now FROM @s@.autoapproval_request r
     WHERE r.id OPERATOR(pg_catalog.=) p_request_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, pg_catalog.format('request %s does not exist', p_request_id);
        RETURN;
    END IF;
    PERFORM 1 FROM @s@.auto_approve_state s
      WHERE s.request_id OPERATOR(pg_catalog.=) p_request_id
        AND s.status OPERATOR(pg_catalog.=) 'IN_PROGRESS'
        AND s.holder OPERATOR(pg_catalog.=) me AND s.fencing_token OPERATOR(pg_catalog.=) p_token
      FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, pg_catalog.format('request %s is not claimed by %s under token %s', p_request_id, me, p_token);
        RETURN;
    END IF;
    DELETE FROM @s@.auto_approve_state s WHERE s.request_id OPERATOR(pg_catalog.=) p_request_id;
    IF NOT (status_now OPERATOR(pg_catalog.=) ANY (ARRAY['PENDING', 'RETRY', 'ING']::pg_catalog.text[])) THEN
        RETURN QUERY SELECT false, pg_catalog.format('request %s is already %s', p_request_id, status_now);
        RETURN;
    END IF;
    -- The decision in the business's code, as a literal: the column may be
    -- of any type (a smallint, a char(1)), and an untyped literal is
    -- converted to it as the controller's statements' are.
    EXECUTE pg_catalog.format(
        'UPDATE @s@.autoapproval_request r'
        ' SET status = %L, decided_at = pg_catalog.now(), decided_by = $1, updated_at = pg_catalog.now()'
        ' WHERE r.id OPERATOR(pg_catalog.=) $2',
        @s@.autoapproval_code('request_statuses', p_decision))
    USING me, p_request_id;
    INSERT INTO @s@.autoapproval_request_memo (request_id, author, message)
    VALUES (p_request_id, me,
            p_decision OPERATOR(pg_catalog.||)
            CASE WHEN p_note IS NULL OR p_note OPERATOR(pg_catalog.=) '' THEN ''
                 ELSE ': ' OPERATOR(pg_catalog.||) p_note END);
    RETURN QUERY SELECT true, NULL::pg_catalog.text;
END;
$$
$fn$
    ] LOOP
        EXECUTE pg_catalog.replace(pg_catalog.replace(definition, '@path@', path), '@s@', schema_name);
    END LOOP;
END;
$migration$;
