-- A change to a fact a filter reads now wakes the waiting request in the
-- transaction that makes it, so the wake cannot be lost: not while no
-- replica listens (a LISTEN connection being re-established), not while the
-- request's shard changes hands between replicas. A waiting retry becomes
-- due now; a running claim is marked so the retry it schedules is due at
-- once (the chain may have read the old fact). NOTIFY still tells the
-- replicas to act at once; without it the next poll finds the request due.
CREATE FUNCTION autoapproval_wake(request_ids BIGINT[]) RETURNS void
LANGUAGE sql AS $$
    UPDATE auto_approve_state
       SET next_retry_time = CASE WHEN status = 'RETRY_WAITING' THEN now() ELSE next_retry_time END,
           woken_at = CASE WHEN status = 'IN_PROGRESS' THEN now() ELSE woken_at END
     WHERE request_id = ANY(request_ids)
       AND ((status = 'RETRY_WAITING' AND next_retry_time > now()) OR status = 'IN_PROGRESS');
$$;

CREATE OR REPLACE FUNCTION autoapproval_notify_request() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT'
       OR NEW.status IS DISTINCT FROM OLD.status
       OR NEW.request_type IS DISTINCT FROM OLD.request_type
       OR NEW.documents_released IS DISTINCT FROM OLD.documents_released
       OR NEW.operational_hold IS DISTINCT FROM OLD.operational_hold
       OR NEW.menu_registered IS DISTINCT FROM OLD.menu_registered
       OR NEW.logo_registered IS DISTINCT FROM OLD.logo_registered
       OR NEW.previous_step_approved IS DISTINCT FROM OLD.previous_step_approved
       OR NEW.econtract_ref IS DISTINCT FROM OLD.econtract_ref
       OR NEW.target_store_number IS DISTINCT FROM OLD.target_store_number
    THEN
        -- A new request has no state row yet: nothing to wake.
        IF TG_OP = 'UPDATE' THEN
            PERFORM autoapproval_wake(ARRAY[NEW.id]);
        END IF;
        PERFORM pg_notify('autoapproval_request_changed', NEW.id::text);
    END IF;
    RETURN NULL;
END;
$$;

-- As in 0007: the chain's own ledger sync wakes only the other requests on
-- the contract.
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
           AND r.id::text IS DISTINCT FROM NULLIF(syncing, '');
        IF woken IS NOT NULL THEN
            PERFORM autoapproval_wake(woken);
            PERFORM pg_notify('autoapproval_request_changed', id::text) FROM unnest(woken) AS id;
        END IF;
    END IF;
    RETURN NULL;
END;
$$;
