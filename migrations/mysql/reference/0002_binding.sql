-- The binding between the controller and the reference business tables:
-- what an integrator writes for their own tables (docs: Integrating with
-- your database), here over 0001's. Run by the tables' owner, after the
-- controller set (whose procedures the triggers call).
--
-- The three views, in the controller's schema, with fixed names and the
-- controller's column names. Each is a plain SELECT of columns from one
-- table, so MySQL merges it into our statements (ALGORITHM = MERGE: the
-- candidate queries use the table's own indexes, and locking reads lock its
-- rows by primary key) and it is updatable and insertable for the columns
-- we write. SQL SECURITY DEFINER: a view runs with its definer's rights, so
-- the controller's role needs grants on the views alone (SELECT, UPDATE on
-- autoapproval_request; SELECT, INSERT, UPDATE on autoapproval_econtract;
-- SELECT, INSERT on autoapproval_request_memo) and none on the tables.
-- A table shaped otherwise renames its columns here (`imr_status AS
-- status`); the written columns must stay plain columns.
CREATE OR REPLACE ALGORITHM = MERGE SQL SECURITY DEFINER VIEW autoapproval_request AS
SELECT id, request_type, status, sort_time, created_at, updated_at, business_name,
       documents_released, operational_hold, menu_registered, logo_registered,
       previous_step_approved, econtract_ref, target_store_number,
       owner_number, store_number, campaign_id, decided_at, decided_by
  FROM approval_request;

CREATE OR REPLACE ALGORITHM = MERGE SQL SECURITY DEFINER VIEW autoapproval_econtract AS
SELECT contract_ref, status, synced_at
  FROM econtract;

CREATE OR REPLACE ALGORITHM = MERGE SQL SECURITY DEFINER VIEW autoapproval_request_memo AS
SELECT id, request_id, created_at, author, message
  FROM approval_request_memo;

-- The wake triggers (migrations/mysql/controller: the wake table and the
-- two procedures, with what a business transaction pays for them). MySQL
-- cannot create a trigger from a routine, so the table's owner creates
-- these; their definer needs EXECUTE on autoapproval_request_changed and
-- autoapproval_econtract_changed, which write our table with their own
-- definer's rights.
DROP TRIGGER IF EXISTS approval_request_autoapproval_inserted;
DROP TRIGGER IF EXISTS approval_request_autoapproval_updated;
DROP TRIGGER IF EXISTS econtract_autoapproval_inserted;
DROP TRIGGER IF EXISTS econtract_autoapproval_updated;

-- A new request: the replicas hear of it (it has no claim to wake yet).
CREATE TRIGGER approval_request_autoapproval_inserted
    AFTER INSERT ON approval_request FOR EACH ROW
    CALL autoapproval_request_changed(NEW.id, TRUE);

-- A change of anything a filter reads (the columns PostgreSQL's trigger
-- watches). Our own writes (the approval, the results) name their request
-- in @autoapproval_writing_request, and the procedure skips them.
CREATE TRIGGER approval_request_autoapproval_updated
    AFTER UPDATE ON approval_request FOR EACH ROW
BEGIN
    IF NOT (NEW.status <=> OLD.status)
       OR NOT (NEW.request_type <=> OLD.request_type)
       OR NOT (NEW.documents_released <=> OLD.documents_released)
       OR NOT (NEW.operational_hold <=> OLD.operational_hold)
       OR NOT (NEW.menu_registered <=> OLD.menu_registered)
       OR NOT (NEW.logo_registered <=> OLD.logo_registered)
       OR NOT (NEW.previous_step_approved <=> OLD.previous_step_approved)
       OR NOT (NEW.econtract_ref <=> OLD.econtract_ref)
       OR NOT (NEW.target_store_number <=> OLD.target_store_number)
    THEN
        CALL autoapproval_request_changed(NEW.id, FALSE);
    END IF;
END;

-- An e-contract's status is a filter fact too: a new contract, or a change
-- of its status.
CREATE TRIGGER econtract_autoapproval_inserted
    AFTER INSERT ON econtract FOR EACH ROW
    CALL autoapproval_econtract_changed(NEW.contract_ref);

CREATE TRIGGER econtract_autoapproval_updated
    AFTER UPDATE ON econtract FOR EACH ROW
BEGIN
    IF NOT (NEW.status <=> OLD.status) THEN
        CALL autoapproval_econtract_changed(NEW.contract_ref);
    END IF;
END;

-- 0.2.0 created the business tables and four wake triggers on them itself
-- (approval_request_wake_insert/_update, econtract_wake_insert/_update,
-- appending to the same wake table). Dropped here, once their successors
-- above exist, not by the controller set: a 0.2.0 replica still running
-- is never without a trigger recording its wakes (for the moment between
-- the two, a change appends two rows). Nothing on a new database.
DROP TRIGGER IF EXISTS approval_request_wake_insert;
DROP TRIGGER IF EXISTS approval_request_wake_update;
DROP TRIGGER IF EXISTS econtract_wake_insert;
DROP TRIGGER IF EXISTS econtract_wake_update;
