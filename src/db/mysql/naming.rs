//! Our own writes named to the business tables' wake triggers: a session
//! variable of one primary connection, set before the write and cleared
//! after it, on every path (PostgreSQL: a transaction-local setting, which
//! MySQL has not). The procedures the triggers call read it
//! (migrations/mysql/controller).

use sqlx::pool::PoolConnection;
use sqlx::{MySql, MySqlConnection, MySqlPool};

use super::db;
use crate::db::DbError;

/// A session variable a wake procedure reads.
#[derive(Clone, Copy, Debug)]
pub(super) enum Named {
    /// `@autoapproval_writing_request`: autoapproval_request_changed
    /// appends no wake row for the request our own write changed.
    WritingRequest,
    /// `@autoapproval_syncing_request`: autoapproval_econtract_changed
    /// records the request whose chain synced the contract, not to wake it.
    SyncingRequest,
}

impl Named {
    fn set_sql(self) -> &'static str {
        match self {
            Named::WritingRequest => "SET @autoapproval_writing_request = ?",
            Named::SyncingRequest => "SET @autoapproval_syncing_request = ?",
        }
    }

    fn clear_sql(self) -> &'static str {
        match self {
            Named::WritingRequest => "SET @autoapproval_writing_request = NULL",
            Named::SyncingRequest => "SET @autoapproval_syncing_request = NULL",
        }
    }
}

/// Runs `write` on a connection of `pool` naming `request_id` in `named`,
/// and clears the variable after it, whatever `write` answered.
pub(super) async fn named_write<T>(
    pool: &MySqlPool,
    named: Named,
    request_id: i64,
    operation: &'static str,
    write: impl AsyncFnOnce(&mut MySqlConnection) -> Result<T, DbError>,
) -> Result<T, DbError> {
    let mut naming = Naming::new(pool, named, request_id, operation).await?;
    let outcome = write(naming.conn()).await;
    naming.clear().await;
    outcome
}

/// A primary connection whose session names a request in a [`Named`]
/// variable until [`Naming::clear`] ([`named_write`]). A connection dropped without it (an
/// error, a cancelled future) or whose clearing failed is closed, never
/// returned to the pool with the variable set: another write on it would
/// wake nobody, or skip the wrong request.
struct Naming {
    conn: PoolConnection<MySql>,
    named: Named,
    request_id: i64,
    /// The variable may still be set.
    set: bool,
}

// === impl Naming ===

impl Naming {
    /// A connection of `pool` naming `request_id` in `named`.
    async fn new(
        pool: &MySqlPool,
        named: Named,
        request_id: i64,
        operation: &'static str,
    ) -> Result<Self, DbError> {
        let conn = pool.acquire().await.map_err(db(operation))?;
        let mut naming = Naming {
            conn,
            named,
            request_id,
            set: true,
        };
        sqlx::query(named.set_sql())
            .bind(request_id)
            .execute(&mut *naming.conn)
            .await
            .map_err(db(operation))?;
        Ok(naming)
    }

    /// The connection, for the statements of the write.
    fn conn(&mut self) -> &mut MySqlConnection {
        &mut self.conn
    }

    /// Clears the variable; the connection goes back to the pool only when
    /// that succeeded. The write's outcome stands either way.
    async fn clear(mut self) {
        match sqlx::query(self.named.clear_sql())
            .execute(&mut *self.conn)
            .await
        {
            Ok(_) => self.set = false,
            Err(error) => tracing::warn!(
                request_id = self.request_id,
                %error,
                "could not clear the session variable naming our own write; the connection is closed"
            ),
        }
    }
}

impl Drop for Naming {
    fn drop(&mut self) {
        if self.set {
            self.conn.close_on_drop();
        }
    }
}
