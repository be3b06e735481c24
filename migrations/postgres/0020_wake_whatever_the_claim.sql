-- A wake recorded whatever the claim's state (issue 33). The wake of 0010
-- was written only when a state row existed, and the trigger's EXISTS reads
-- with the business statement's snapshot: a change made before our claim
-- committed (no state row visible yet) and committed after the attempt read
-- the request wrote no wake, and the retry waited its whole interval.
--
-- Now every change of an open request appends its row. The rows of a
-- request nobody claims are deleted by the next discovery turn of its shard
-- (Store::apply_wakes deletes every row of a request with no running claim);
-- a claim consumes the rows committed before it (the chain reads the facts
-- afterwards), so a row still there after the claim is a change its attempt
-- may not have read: its retry is due at once (Store::schedule_retry), or
-- made due by the next turn once the attempt has ended.
CREATE OR REPLACE FUNCTION autoapproval_wake(request_ids BIGINT[]) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    INSERT INTO auto_approve_wake (request_id)
    SELECT w.rid FROM unnest(request_ids) AS w(rid);
$$;

-- As in 0009: the chain's own ledger sync wakes only the other requests on
-- the contract, and now only the open ones (a decided request has no work
-- left; without the state-row test above it would get a row).
CREATE OR REPLACE FUNCTION autoapproval_notify_econtract() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    syncing TEXT := current_setting('autoapproval.syncing_request', true);
    woken BIGINT[];
BEGIN
    IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status THEN
        SELECT array_agg(r.id) INTO woken
          FROM approval_request r
         WHERE r.econtract_ref = NEW.contract_ref
           AND r.status IN ('ING', 'PENDING', 'RETRY')
           AND r.id::text IS DISTINCT FROM NULLIF(syncing, '');
        IF woken IS NOT NULL THEN
            PERFORM autoapproval_wake(woken);
            PERFORM pg_notify('autoapproval_request_changed', id::text) FROM unnest(woken) AS id;
        END IF;
    END IF;
    RETURN NULL;
END;
$$;
