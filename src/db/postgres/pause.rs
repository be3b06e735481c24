//! Pauses an operator set, kept in the database (migration 0014) so they
//! outlive the CR they were set through.

use super::{PgStore, db};
use crate::db::pause::impl_pauses;

impl_pauses! {
    PgStore,
    record: "INSERT INTO auto_approve_pause (request_id, paused_by, cr_uid) VALUES ($1, $2, $3)
             ON CONFLICT (request_id) DO UPDATE SET cr_uid = EXCLUDED.cr_uid
              WHERE auto_approve_pause.cr_uid IS DISTINCT FROM EXCLUDED.cr_uid",
    end: "DELETE FROM auto_approve_pause WHERE request_id = $1 AND cr_uid IS NOT DISTINCT FROM $2",
    read: "SELECT paused_by, cr_uid, paused_at FROM auto_approve_pause WHERE request_id = $1",
}

crate::db::pause::impl_fleet_pauses! {
    PgStore,
    pause: "SELECT paused, refusal FROM autoapproval_pause_fleet($1, $2)",
    resume: "SELECT resumed, refusal FROM autoapproval_resume_fleet($1)",
    read: "SELECT paused_by, reason, paused_at FROM auto_approve_fleet_pause",
}
