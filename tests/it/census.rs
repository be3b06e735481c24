//! The leader's census behind the state metrics: requests by state, the
//! backlog's age as the candidate queries define eligibility, and a census
//! that withdraws its numbers off the leader or without a database.

use std::sync::Arc;
use std::time::Duration as StdDuration;

use autoapproval::census::{Census, CensusConfig};
use autoapproval::clock::ManualClock;
use autoapproval::db::{Database, RequestCensus};
use autoapproval::domain::DEFAULT_RETRY_LIMIT;
use autoapproval::telemetry::Metrics;
use chrono::Duration;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;

use crate::support::{Db, NewRequest, eventually, metric_sum, on_both, seed_reference_rows, t0};

const WINDOW: StdDuration = StdDuration::from_secs(30 * 86_400);

fn census_of(store: Database, metrics: &Metrics) -> Census {
    Census {
        store,
        clock: Arc::new(ManualClock::new(t0())),
        metrics: metrics.clone(),
        config: CensusConfig {
            interval: StdDuration::from_secs(15),
            window: WINDOW,
            retry_limit: DEFAULT_RETRY_LIMIT,
        },
    }
}

async fn oldest(store: &Database) -> Option<chrono::DateTime<chrono::Utc>> {
    store
        .oldest_eligible(
            autoapproval::clock::before(t0(), WINDOW),
            t0(),
            DEFAULT_RETRY_LIMIT,
        )
        .await
        .unwrap()
}

on_both!(the_census_counts_the_reference_rows_by_state_and_reason_class);
/// Rows 101–107: 104 in progress; 102, 103 (due) and 105 (not due) waiting
/// for a condition; 106 at the limit. A transient failure moves 105.
async fn the_census_counts_the_reference_rows_by_state_and_reason_class(db: Db) {
    seed_reference_rows(&db).await;
    let store = db.database();
    let census = store.census(DEFAULT_RETRY_LIMIT).await.unwrap();
    assert_eq!(
        census,
        RequestCensus {
            in_progress: 1,
            waiting_transient: 0,
            waiting_condition: 3,
            exhausted: 1,
        }
    );
    db.exec("UPDATE auto_approve_state SET transient_streak = 2 WHERE request_id = 105")
        .await;
    let census = store.census(DEFAULT_RETRY_LIMIT).await.unwrap();
    assert_eq!((census.waiting_transient, census.waiting_condition), (1, 2));
}

on_both!(the_backlog_is_the_oldest_request_a_candidate_query_would_select);
/// Eligible means what a candidate query would select: open, inside the
/// window, unclaimed or due and under the limit, not paused, an ad contract
/// with its store. Older rows that miss any one of these are not backlog.
async fn the_backlog_is_the_oldest_request_a_candidate_query_would_select(db: Db) {
    let store = db.database();
    assert_eq!(oldest(&store).await, None, "nothing waits");
    seed_reference_rows(&db).await;
    // 101 is new since t0 - 1 min; 102 and 103 are due since then too.
    assert_eq!(oldest(&store).await, Some(t0() - Duration::minutes(1)));

    // Older, and not eligible: paused, an ad contract without its store,
    // outside the window, not auto-approvable, decided.
    let now = t0();
    NewRequest::ready_owner(108)
        .sorted_at(now - Duration::minutes(20))
        .insert(&db)
        .await;
    db.exec("INSERT INTO auto_approve_pause (request_id, paused_by) VALUES (108, 'olivia')")
        .await;
    let mut storeless = NewRequest::ready_ad(109, 0).sorted_at(now - Duration::minutes(25));
    storeless.target_store_number = None;
    storeless.insert(&db).await;
    NewRequest::ready_owner(110)
        .sorted_at(now - Duration::days(31))
        .insert(&db)
        .await;
    let mut menu = NewRequest::ready_owner(111).sorted_at(now - Duration::minutes(40));
    menu.request_type = "MENU_CHANGE";
    menu.insert(&db).await;
    NewRequest::ready_owner(112)
        .status("REJECTED")
        .sorted_at(now - Duration::minutes(45))
        .insert(&db)
        .await;
    assert_eq!(oldest(&store).await, Some(now - Duration::minutes(1)));

    // A new ad contract in progress on the business side, older: it is.
    NewRequest::ready_ad(113, 900)
        .status("ING")
        .sorted_at(now - Duration::minutes(15))
        .insert(&db)
        .await;
    assert_eq!(oldest(&store).await, Some(now - Duration::minutes(15)));

    // 105's retry due since 50 minutes: it is the oldest; at the limit it is not.
    db.exec_at(
        "UPDATE auto_approve_state SET next_retry_time = $1 WHERE request_id = 105",
        now - Duration::minutes(50),
    )
    .await;
    assert_eq!(oldest(&store).await, Some(now - Duration::minutes(50)));
    db.exec("UPDATE auto_approve_state SET retry_count = 300 WHERE request_id = 105")
        .await;
    assert_eq!(oldest(&store).await, Some(now - Duration::minutes(15)));
}

on_both!(only_the_leader_exports_the_census_and_every_replica_its_database_ping);
/// A dashboard summing over replicas must count the leader's census once:
/// a replica that does not lead exports no state series at all, and still
/// says whether its database answers.
async fn only_the_leader_exports_the_census_and_every_replica_its_database_ping(db: Db) {
    seed_reference_rows(&db).await;
    let metrics = Metrics::new();
    let census = census_of(db.database(), &metrics);

    census.once(true).await;
    let text = metrics.encode();
    let requests = |text: &str, labels: &[&str]| metric_sum(text, "autoapproval_requests", labels);
    assert_eq!(requests(&text, &[r#"state="in_progress""#]), 1.0, "{text}");
    assert_eq!(
        requests(&text, &[r#"reason_class="condition_not_met""#]),
        3.0
    );
    assert_eq!(requests(&text, &[r#"reason_class="transient""#]), 0.0);
    assert_eq!(requests(&text, &[r#"state="exhausted""#]), 1.0);
    // 101, 102 and 103 have waited a minute.
    assert!(
        text.contains("\nautoapproval_backlog_age_seconds 60.0\n"),
        "{text}"
    );
    assert_eq!(
        metric_sum(&text, "autoapproval_database_up", &[r#"pool="primary""#]),
        1.0
    );

    census.once(false).await;
    let text = metrics.encode();
    assert!(!text.contains("autoapproval_requests{"), "{text}");
    assert!(
        !text.contains("\nautoapproval_backlog_age_seconds "),
        "{text}"
    );
    assert_eq!(
        metric_sum(&text, "autoapproval_database_up", &[r#"pool="primary""#]),
        1.0
    );
}

on_both!(the_census_follows_leadership_as_it_changes);
/// The running census follows leadership: it counts once this replica
/// leads, and withdraws at once, not at its next turn, when it stops.
async fn the_census_follows_leadership_as_it_changes(db: Db) {
    seed_reference_rows(&db).await;
    let metrics = Metrics::new();
    let mut census = census_of(db.database(), &metrics);
    // A turn an hour away: only the changes of leadership can act.
    census.config.interval = StdDuration::from_secs(3600);
    let (leader, leading) = tokio::sync::watch::channel(false);
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(census.run(leading, stop.clone()));
    let counted = |text: &str| text.contains("autoapproval_requests{");
    // The first turn runs at start: a ping, no counts.
    eventually("the first ping", || async {
        (metric_sum(&metrics.encode(), "autoapproval_database_up", &[]) == 1.0).then_some(())
    })
    .await;
    assert!(!counted(&metrics.encode()));
    leader.send(true).unwrap();
    eventually("the census once leading", || async {
        counted(&metrics.encode()).then_some(())
    })
    .await;
    leader.send(false).unwrap();
    eventually("the census withdrawn once not leading", || async {
        (!counted(&metrics.encode())).then_some(())
    })
    .await;
    stop.cancel();
    running.await.expect("the census stops");
}

on_both!(a_database_that_does_not_answer_is_reported_down_and_nothing_stale_is_shown);
async fn a_database_that_does_not_answer_is_reported_down_and_nothing_stale_is_shown(db: Db) {
    seed_reference_rows(&db).await;
    let metrics = Metrics::new();
    census_of(db.database(), &metrics).once(true).await;
    assert!(metrics.encode().contains("autoapproval_requests{"));
    // The same metrics, now through a pool whose database refuses
    // connections (nothing listens on port 1).
    let gone = match db {
        Db::Postgres(_) => {
            let gone = PgPoolOptions::new()
                .acquire_timeout(StdDuration::from_secs(2))
                .connect_lazy("postgres://postgres@127.0.0.1:1/gone")
                .expect("lazy pool");
            Database::postgres(gone.clone(), gone)
        }
        Db::Mysql(_) => {
            let gone = MySqlPoolOptions::new()
                .acquire_timeout(StdDuration::from_secs(2))
                .connect_lazy("mysql://root@127.0.0.1:1/gone")
                .expect("lazy pool");
            Database::mysql(gone.clone(), gone)
        }
    };
    census_of(gone, &metrics).once(true).await;
    let text = metrics.encode();
    assert_eq!(
        metric_sum(&text, "autoapproval_database_up", &[r#"pool="primary""#]),
        0.0
    );
    assert!(
        text.contains(r#"autoapproval_database_up{pool="primary"} 0"#),
        "{text}"
    );
    assert!(!text.contains("autoapproval_requests{"), "{text}");
}

/// docs/BENCHMARKS.md shows the plan of the query the store runs, not of a copy.
#[test]
fn the_backlog_benchmark_runs_the_stores_query_verbatim() {
    let script = include_str!("../../benches/backlog_plan.sql");
    assert!(
        script.contains(&format!(
            "PREPARE backlog(timestamptz, timestamptz, int) AS\n{};",
            autoapproval::db::postgres::backlog_sql()
        )),
        "benches/backlog_plan.sql lacks the store's backlog query"
    );
}
