-- The e-contract ledger (the seed's `esign_version`): the e-sign sync writes
-- the latest status it saw for each contract.
CREATE TABLE econtract (
    contract_ref TEXT PRIMARY KEY,
    status       TEXT        NOT NULL,
    synced_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX approval_request_econtract_ref ON approval_request (econtract_ref)
    WHERE econtract_ref IS NOT NULL;
