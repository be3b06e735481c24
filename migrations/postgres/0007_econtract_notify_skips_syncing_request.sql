-- The chain syncs the e-contract ledger while it processes a request; that
-- write must not wake the very request that made it (a second, useless
-- attempt with its external calls). The store names that request in the
-- transaction-local setting `autoapproval.syncing_request`; other requests
-- on the same contract are still notified.
CREATE OR REPLACE FUNCTION autoapproval_notify_econtract() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    syncing TEXT := current_setting('autoapproval.syncing_request', true);
BEGIN
    IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status THEN
        PERFORM pg_notify('autoapproval_request_changed', r.id::text)
           FROM approval_request r
          WHERE r.econtract_ref = NEW.contract_ref
            AND r.id::text IS DISTINCT FROM NULLIF(syncing, '');
    END IF;
    RETURN NULL;
END;
$$;
