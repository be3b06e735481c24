//! Rows as the business system and earlier attempts leave them: requests
//! to insert, state rows placed by hand, and what a request looks like now.

use chrono::{DateTime, Duration, Utc};

use autoapproval::db::{Completion, Database};
use autoapproval::domain::{Claim, Facts};

use super::db::{AsDb, with_pool};
use super::engine::t0;

/// A request row to insert; `ready_owner`/`ready_ad` meet every condition.
#[derive(Clone, Debug)]
pub struct NewRequest {
    pub id: i64,
    pub request_type: &'static str,
    pub status: &'static str,
    pub sort_time: DateTime<Utc>,
    pub documents_released: bool,
    pub operational_hold: bool,
    pub menu_registered: bool,
    pub logo_registered: bool,
    pub previous_step_approved: bool,
    pub econtract_ref: Option<String>,
    pub target_store_number: Option<i64>,
}

impl NewRequest {
    /// An owner contract with every condition met.
    pub fn ready_owner(id: i64) -> Self {
        Self {
            id,
            request_type: "OWNER_CONTRACT",
            status: "PENDING",
            sort_time: t0() - Duration::minutes(1),
            documents_released: true,
            operational_hold: false,
            menu_registered: true,
            logo_registered: true,
            previous_step_approved: true,
            econtract_ref: Some(format!("EC-{id}")),
            target_store_number: None,
        }
    }

    /// An ad contract with every condition met, for `store`.
    pub fn ready_ad(id: i64, store: i64) -> Self {
        Self {
            request_type: "AD_CONTRACT",
            target_store_number: Some(store),
            ..Self::ready_owner(id)
        }
    }

    pub fn sorted_at(mut self, at: DateTime<Utc>) -> Self {
        self.sort_time = at;
        self
    }

    pub fn status(mut self, status: &'static str) -> Self {
        self.status = status;
        self
    }

    pub async fn insert(&self, db: &impl AsDb) -> i64 {
        let db = db.db();
        let sql = db.sql(
            "INSERT INTO approval_request
                (id, request_type, status, sort_time, created_at, business_name, documents_released,
                 operational_hold, menu_registered, logo_registered, previous_step_approved,
                 econtract_ref, target_store_number)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        );
        with_pool!(&db, pool => sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
        .bind(self.id)
        .bind(self.request_type)
        .bind(self.status)
        .bind(self.sort_time)
        .bind(self.sort_time)
        .bind(format!("Shop {}", self.id))
        .bind(self.documents_released)
        .bind(self.operational_hold)
        .bind(self.menu_registered)
        .bind(self.logo_registered)
        .bind(self.previous_step_approved)
        .bind(&self.econtract_ref)
        .bind(self.target_store_number)
        .execute(pool)
        .await
        .expect("insert request").rows_affected());
        self.id
    }
}

/// Inserts a state row directly, as another worker or an earlier attempt left it.
pub async fn insert_state(
    db: &impl AsDb,
    request_id: i64,
    status: &str,
    next_retry_time: Option<DateTime<Utc>>,
    retry_count: i32,
    modified_at: DateTime<Utc>,
) -> i64 {
    let db = db.db();
    // No RETURNING on MySQL: the row is read back by its unique request id.
    let sql = db.sql(
        "INSERT INTO auto_approve_state
            (request_id, request_type, status, next_retry_time, retry_count, holder, fencing_token,
             created_at, modified_at)
         SELECT id, request_type, $1, $2, $3, 'elsewhere', 1, $4, $5 FROM approval_request WHERE id = $6",
    );
    with_pool!(&db, pool => sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
        .bind(status)
        .bind(next_retry_time)
        .bind(retry_count)
        .bind(modified_at)
        .bind(modified_at)
        .bind(request_id)
        .execute(pool)
        .await
        .expect("insert state").rows_affected());
    db.fetch_i64(&format!(
        "SELECT id FROM auto_approve_state WHERE request_id = {request_id}"
    ))
    .await
}

/// A request's business status and results, as the business system sees them.
#[derive(Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct RequestView {
    pub status: String,
    pub owner_number: Option<i64>,
    pub store_number: Option<i64>,
    pub campaign_id: Option<String>,
}

pub async fn request_view(db: &impl AsDb, id: i64) -> RequestView {
    let sql = format!(
        "SELECT status, owner_number, store_number, campaign_id FROM approval_request WHERE id = {id}"
    );
    with_pool!(&db.db(), pool => sqlx::query_as(sqlx::AssertSqlSafe(sql.clone()))
        .fetch_one(pool)
        .await
        .expect("request row"))
}

/// Whether request `id` has a state row (a chain started and not yet finished).
pub async fn state_exists(db: &impl AsDb, id: i64) -> bool {
    db.db()
        .fetch_i64(&format!(
            "SELECT count(*) FROM auto_approve_state WHERE request_id = {id}"
        ))
        .await
        > 0
}

pub async fn state_count(db: &impl AsDb) -> i64 {
    db.db()
        .fetch_i64("SELECT count(*) FROM auto_approve_state")
        .await
}

/// An owner contract created now, every condition met.
pub fn owner_now(id: i64) -> NewRequest {
    NewRequest::ready_owner(id).sorted_at(Utc::now())
}

/// Completes `claim` on the facts its request holds now (the ledger not
/// compared), as a chain that read it just before would: for the tests of
/// the completion's other refusals, which run no chain.
pub async fn complete_now(store: &Database, claim: &Claim) -> Completion {
    let request = store
        .request(claim.request_id)
        .await
        .expect("read request")
        .expect("the request exists");
    store
        .complete(claim, &Facts::of(&request))
        .await
        .expect("complete")
}

/// A request's business status.
pub async fn request_status(db: &impl AsDb, id: i64) -> String {
    request_view(db, id).await.status
}

/// The memo history of a request, oldest first.
pub async fn memos(db: &impl AsDb, id: i64) -> Vec<String> {
    db.db().database().memos(id).await.expect("memos")
}

/// Like `owner_now`, its documents still in review: it waits.
pub fn waiting_owner_now(id: i64) -> NewRequest {
    NewRequest {
        documents_released: false,
        ..owner_now(id)
    }
}

/// Rows 101–107 of the seed: new; first retry due; twelfth retry due;
/// IN_PROGRESS elsewhere; retry not yet due; retry limit reached; approved.
pub async fn seed_reference_rows(pool: &impl AsDb) {
    seed_reference_rows_at(pool, t0()).await;
}

/// `seed_reference_rows` placed around `now` (the wall clock, for a
/// running controller).
pub async fn seed_reference_rows_at(pool: &impl AsDb, now: DateTime<Utc>) {
    NewRequest::ready_owner(101)
        .sorted_at(now - Duration::minutes(1))
        .insert(pool)
        .await;
    NewRequest::ready_owner(102)
        .status("ING")
        .sorted_at(now - Duration::minutes(11))
        .insert(pool)
        .await;
    insert_state(
        pool,
        102,
        "RETRY_WAITING",
        Some(now - Duration::minutes(1)),
        1,
        now - Duration::minutes(11),
    )
    .await;
    NewRequest::ready_owner(103)
        .sorted_at(now - Duration::hours(2))
        .insert(pool)
        .await;
    insert_state(
        pool,
        103,
        "RETRY_WAITING",
        Some(now - Duration::minutes(1)),
        12,
        now - Duration::minutes(11),
    )
    .await;
    NewRequest::ready_owner(104)
        .sorted_at(now - Duration::minutes(3))
        .insert(pool)
        .await;
    insert_state(
        pool,
        104,
        "IN_PROGRESS",
        None,
        0,
        now - Duration::seconds(5),
    )
    .await;
    NewRequest::ready_owner(105)
        .sorted_at(now - Duration::minutes(30))
        .insert(pool)
        .await;
    insert_state(
        pool,
        105,
        "RETRY_WAITING",
        Some(now + Duration::minutes(4)),
        2,
        now - Duration::minutes(6),
    )
    .await;
    NewRequest::ready_owner(106)
        .sorted_at(now - Duration::days(3))
        .insert(pool)
        .await;
    insert_state(
        pool,
        106,
        "RETRY_WAITING",
        Some(now - Duration::minutes(1)),
        300,
        now - Duration::minutes(11),
    )
    .await;
    NewRequest::ready_owner(107)
        .status("APPROVED")
        .sorted_at(now - Duration::minutes(2))
        .insert(pool)
        .await;
}
