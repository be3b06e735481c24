-- The binding of the reference tables (docs/INTEGRATING.md): the views the
-- controller reads and writes, plain pass-throughs here because these
-- tables already use the controller's vocabulary, and the wake triggers,
-- attached with the watched columns (the facts the filters read; our
-- result columns are not watched).
CREATE OR REPLACE VIEW autoapproval_request AS
SELECT id, request_type, status, sort_time, created_at, updated_at, business_name,
       documents_released, operational_hold, menu_registered, logo_registered,
       previous_step_approved, econtract_ref, target_store_number,
       owner_number, store_number, campaign_id, decided_at, decided_by
  FROM approval_request;

CREATE OR REPLACE VIEW autoapproval_econtract AS
SELECT contract_ref, status, synced_at FROM econtract;

CREATE OR REPLACE VIEW autoapproval_request_memo AS
SELECT id, request_id, created_at, author, message FROM approval_request_memo;

SELECT autoapproval_watch_requests('approval_request', 'id', ARRAY[
    'status', 'request_type', 'documents_released', 'operational_hold', 'menu_registered',
    'logo_registered', 'previous_step_approved', 'econtract_ref', 'target_store_number']);

SELECT autoapproval_watch_econtracts('econtract', 'contract_ref', ARRAY['status']);

-- 0.2.0's wake triggers (its functions named these tables' columns), in
-- the transaction that attached their successors above: a 0.2.0 replica
-- still running is woken by the new ones (the same wake table and NOTIFY
-- channel) from the commit on, and by the old ones until it. Nothing on a
-- new database.
DROP FUNCTION IF EXISTS autoapproval_notify_request() CASCADE;
DROP FUNCTION IF EXISTS autoapproval_notify_econtract() CASCADE;
