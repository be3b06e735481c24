//! Pauses an operator set, in MySQL's SQL (`<=>` is IS NOT DISTINCT FROM).

use super::{MysqlStore, db};
use crate::db::pause::impl_pauses;

impl_pauses! {
    MysqlStore,
    record: "INSERT INTO auto_approve_pause (request_id, paused_by, cr_uid) VALUES (?, ?, ?)
             ON DUPLICATE KEY UPDATE cr_uid = VALUES(cr_uid)",
    end: "DELETE FROM auto_approve_pause WHERE request_id = ? AND cr_uid <=> ?",
    read: "SELECT paused_by, cr_uid, paused_at FROM auto_approve_pause WHERE request_id = ?",
}

crate::db::pause::impl_fleet_pauses! {
    MysqlStore,
    pause: "CALL autoapproval_pause_fleet(?, ?)",
    resume: "CALL autoapproval_resume_fleet(?)",
    read: "SELECT paused_by, reason, paused_at FROM auto_approve_fleet_pause",
}
