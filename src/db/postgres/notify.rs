//! Wakes: the LISTEN connection for the triggers' NOTIFY, and the wake a
//! caller records for a change the database did not see.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgListener;

use super::{PgStore, db};
use crate::db::{ChangeSource, DbError, RequestChange, RequestChanges, ShardFilter, Wakes};

/// The NOTIFY channel of migration 0004: payload is the request id as text.
const REQUEST_CHANGED_CHANNEL: &str = "autoapproval_request_changed";

/// The LISTEN connection for request changes.
pub(crate) struct Listener {
    listener: PgListener,
}

impl Listener {
    /// Waits for the next notification; a reconnect is a change of its own
    /// (notifications may have been missed meanwhile).
    pub(crate) async fn next(&mut self) -> Result<RequestChange, DbError> {
        let received = self
            .listener
            .try_recv()
            .await
            .map_err(db("receive notification"))?;
        Ok(received.map_or(RequestChange::Reconnected, |n| {
            RequestChange::parse(n.payload())
        }))
    }

    /// A notification already received, without waiting.
    pub(crate) fn next_buffered(&mut self) -> Option<RequestChange> {
        self.listener
            .next_buffered()
            .map(|n| RequestChange::parse(n.payload()))
    }
}

impl Wakes for PgStore {
    async fn wake(&self, request_ids: &[i64], now: DateTime<Utc>) -> Result<Vec<i64>, DbError> {
        let rows: Vec<(i64,)> = sqlx::query_as(
            "UPDATE auto_approve_state
                SET next_retry_time = CASE WHEN status = 'RETRY_WAITING' THEN $2 ELSE next_retry_time END,
                    woken_at = CASE WHEN status = 'IN_PROGRESS' THEN $2 ELSE woken_at END
              WHERE request_id = ANY($1)
                AND ((status = 'RETRY_WAITING' AND next_retry_time > $2) OR status = 'IN_PROGRESS')
             RETURNING request_id",
        )
        .bind(request_ids)
        .bind(now)
        .fetch_all(&self.primary)
        .await
        .map_err(db("wake waiting requests"))?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    async fn apply_wakes(
        &self,
        shards: Option<&ShardFilter>,
        now: DateTime<Utc>,
        retry_limit: i32,
    ) -> Result<Vec<i64>, DbError> {
        let (shards, shard_count) = match shards {
            Some(f) => (Some(f.shards.clone()), f.shard_count.max(1)),
            None => (None, 1),
        };
        let rows: Vec<(i64,)> = sqlx::query_as(
            "WITH woken AS (
                 DELETE FROM auto_approve_wake w
                  WHERE ($2::bigint[] IS NULL OR w.request_id % $3 = ANY($2::bigint[]))
                    AND NOT EXISTS (SELECT 1 FROM auto_approve_state s
                                     WHERE s.request_id = w.request_id AND s.status = 'IN_PROGRESS')
                 RETURNING w.request_id
             )
             UPDATE auto_approve_state
                SET next_retry_time = LEAST(next_retry_time, $1),
                    retry_count = CASE WHEN retry_count >= $4 THEN 0 ELSE retry_count END,
                    transient_streak = CASE WHEN retry_count >= $4 THEN 0 ELSE transient_streak END
              WHERE request_id IN (SELECT request_id FROM woken)
                AND status = 'RETRY_WAITING' AND (next_retry_time > $1 OR retry_count >= $4)
             RETURNING request_id",
        )
        .bind(now)
        .bind(shards)
        .bind(shard_count)
        .bind(retry_limit)
        .fetch_all(&self.primary)
        .await
        .map_err(db("apply wakes"))?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    async fn request_changes(&self) -> Result<RequestChanges, DbError> {
        // PgListener holds its connection for good (and takes a new one
        // after a reconnect): a one-connection pool of its own, so the
        // chains' pool keeps every connection it was sized with.
        let own = self.dedicated(1);
        let mut listener = PgListener::connect_with(&own.primary)
            .await
            .map_err(db("connect listener"))?;
        listener
            .listen(REQUEST_CHANGED_CHANNEL)
            .await
            .map_err(db("listen"))?;
        Ok(RequestChanges::new(ChangeSource::Postgres(Listener {
            listener,
        })))
    }
}
