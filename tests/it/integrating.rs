//! The integration guide holds (issue 35): docs/INTEGRATING.md's worked example, a business schema
//! shaped like the seed's (`imr`, `esign_version`, `imr_memo`) owned by a business role, bound
//! by running the guide's marked blocks verbatim, each as the role it names, on PostgreSQL and
//! on MariaDB; `migrate` runs as the controller's owner role and creates the controller's objects
//! only, and the controller's role has only the documented grants. Then the real binary approves
//! what the business role inserts, while the business role keeps writing, and refuses to start on
//! a binding with a view or grant missing, naming it. Issue 41: the controller's role is refused
//! all the guide does not grant it, and a role that may create in our schema runs nothing as the
//! owner of our functions.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::postgres::PgPoolOptions;

use crate::support::{
    Db, NS, backends, capture_stderr, eventually, free_port, fresh_dir, kubeconfig_in,
    migrate_twice, repo, spawn_run, stop_on_sigterm, with_pool,
};

/// The password the guide gives its roles.
const PASSWORD: &str = "PASSWORD";

/// One block of the guide marked `<!-- binding: <backend>/<step> -->`.
#[derive(Debug)]
struct Block {
    step: String,
    lang: String,
    text: String,
}

/// The guide's blocks for `backend` (`postgres` or `mysql`), in the order they appear.
fn blocks(backend: &str) -> Vec<Block> {
    let guide = std::fs::read_to_string(repo().join("docs/INTEGRATING.md")).expect("the guide");
    let marker = format!("<!-- binding: {backend}/");
    let mut found = vec![];
    let mut rest = guide.as_str();
    while let Some(at) = rest.find(&marker) {
        let after = &rest[at + marker.len()..];
        let (step, after) = after.split_once(" -->\n").expect("a marker ends with -->");
        let after = after
            .strip_prefix("```")
            .unwrap_or_else(|| panic!("{backend}/{step}: a fence right after the marker"));
        let (lang, after) = after.split_once('\n').expect("the fence's language");
        let end = after.find("\n```").expect("the block's end");
        found.push(Block {
            step: step.to_owned(),
            lang: lang.to_owned(),
            text: after[..end + 1].to_owned(),
        });
        rest = &after[end..];
    }
    assert!(
        !found.is_empty(),
        "docs/INTEGRATING.md has no {backend} block"
    );
    found
}

/// `text` with the identifier `word` replaced by `with` where it stands alone, not inside a longer
/// identifier (`autoapproval` is a role, `autoapproval_request` a view).
fn replace_word(text: &str, word: &str, with: &str) -> String {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(word) {
        let before = rest[..at].chars().last().or_else(|| out.chars().last());
        let after = rest[at + word.len()..].chars().next();
        out.push_str(&rest[..at]);
        if before.is_some_and(is_ident) || after.is_some_and(is_ident) {
            out.push_str(word);
        } else {
            out.push_str(with);
        }
        rest = &rest[at + word.len()..];
    }
    out.push_str(rest);
    out
}

/// Who runs a step of the guide, as the guide says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    Admin,
    Business,
    Controller,
    /// The controller's owner role, which owns our objects.
    Owner,
    /// `autoapproval migrate` as the controller's owner role.
    Migrate,
}

fn who_runs(backend: &str, step: &str) -> Who {
    match (backend, step) {
        (_, "roles") | ("mysql", "access") => Who::Admin,
        (_, "business" | "views" | "index") => Who::Business,
        (_, "migrate") => Who::Migrate,
        (_, "check") => Who::Controller,
        // PostgreSQL: the owner of our routines grants EXECUTE; MySQL: an administrator.
        ("postgres", "grant") => Who::Owner,
        ("mysql", "grant") => Who::Admin,
        _ => panic!("{backend}/{step}: a step this test does not know: say who runs it here"),
    }
}

/// A database bound as the guide says, with a pool for each of its roles.
struct Bound {
    backend: &'static str,
    /// A superuser (PostgreSQL) or root (MySQL).
    admin: Db,
    /// The business role, with the server's session defaults.
    business: Db,
    /// The controller's role.
    controller: Db,
    /// The controller's owner role (`migrate`'s).
    owner: Db,
    /// What `run` is given.
    controller_url: String,
    /// The role names the guide's were replaced by, and on MySQL the two databases.
    business_role: String,
    controller_role: String,
    owner_role: String,
    business_database: String,
}

/// A suffix no other run of this test uses: roles and users are server-wide.
fn unique() -> String {
    format!("{}_{}", std::process::id(), rand::random::<u16>())
}

/// Runs one block on `db`, whole (a MySQL trigger body keeps its `;`).
async fn execute(db: &Db, step: &str, sql: &str) {
    with_pool!(db, pool => sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .map(|_| ())
        .unwrap_or_else(|e| panic!("step {step}: {e}\n{sql}")));
}

/// `autoapproval migrate` as the guide's block shows it, on `url`.
fn migrate(block: &Block, url: &str) {
    assert_eq!(block.lang, "sh", "{block:?}");
    let command = block.text.trim();
    assert!(
        command.starts_with("autoapproval migrate --database-url ")
            && !command.contains("--reference-schema"),
        "the guide migrates the controller's objects only: {command}"
    );
    // Twice, as the controller's role: idempotent there too.
    migrate_twice(url);
}

/// `url` with another user, password and database.
fn with_login(url: &str, user: &str, database: &str) -> String {
    let mut url = url::Url::parse(url).expect("a database URL");
    url.set_username(user).expect("a user");
    url.set_password(Some(PASSWORD)).expect("a password");
    url.set_path(database);
    url.to_string()
}

/// The three roles, their URLs, and the guide's names with what replaces them.
struct Logins {
    business_role: String,
    controller_role: String,
    owner_role: String,
    /// PostgreSQL: the one database; MySQL: the business one.
    business_database: String,
    business_url: String,
    controller_url: String,
    owner_url: String,
    names: [(&'static str, String); 4],
}

/// Runs the guide's blocks for `backend` in order, each as the role it names: the pools of the
/// business role and of the controller's, opened by `connect` (given the URL and whether it is
/// the business role's) once the roles exist.
async fn follow_the_guide<Fut: std::future::Future<Output = Db>>(
    backend: &'static str,
    admin: Db,
    logins: Logins,
    connect: impl Fn(String, bool) -> Fut,
) -> Bound {
    let mut business: Option<Db> = None;
    let mut controller: Option<Db> = None;
    let mut owner: Option<Db> = None;
    for block in blocks(backend) {
        let sql = logins
            .names
            .iter()
            .fold(block.text.clone(), |sql, (word, with)| {
                replace_word(&sql, word, with)
            });
        let db = match who_runs(backend, &block.step) {
            Who::Migrate => {
                migrate(&block, &logins.owner_url);
                continue;
            }
            Who::Admin => &admin,
            Who::Business => match business {
                Some(ref db) => db,
                None => business.insert(connect(logins.business_url.clone(), true).await),
            },
            Who::Controller => match controller {
                Some(ref db) => db,
                None => controller.insert(connect(logins.controller_url.clone(), false).await),
            },
            Who::Owner => match owner {
                Some(ref db) => db,
                None => owner.insert(connect(logins.owner_url.clone(), false).await),
            },
        };
        execute(db, &block.step, &sql).await;
    }
    Bound {
        backend,
        admin,
        business: business.expect("a step as the business role"),
        controller: controller.expect("a step as the controller's role"),
        owner: match owner {
            Some(db) => db,
            None => connect(logins.owner_url, false).await,
        },
        controller_url: logins.controller_url,
        business_role: logins.business_role,
        controller_role: logins.controller_role,
        owner_role: logins.owner_role,
        business_database: logins.business_database,
    }
}

impl Bound {
    /// Binds the fresh, empty database of `admin` (a superuser's pool) by the guide's blocks.
    async fn postgres(admin: PgPool) -> Bound {
        let (database,): (String,) = sqlx::query_as("SELECT current_database()")
            .fetch_one(&admin)
            .await
            .expect("the database");
        let suffix = unique();
        let business_role = format!("imr_owner_{suffix}");
        let controller_role = format!("autoapproval_{suffix}");
        let owner_role = format!("autoapproval_owner_{suffix}");
        let server = Db::Postgres(admin.clone()).url();
        let logins = Logins {
            business_url: with_login(&server, &business_role, &database),
            business_database: database.clone(),
            controller_url: with_login(&server, &controller_role, &database),
            owner_url: with_login(&server, &owner_role, &database),
            // Replaced textually by unique names (roles are cluster-wide; the test database's
            // name has capitals, hence the quotes).
            names: [
                ("imr_owner", business_role.clone()),
                ("autoapproval_owner", owner_role.clone()),
                ("autoapproval", controller_role.clone()),
                ("contracts", format!("\"{database}\"")),
            ],
            business_role,
            controller_role,
            owner_role,
        };
        follow_the_guide(
            "postgres",
            Db::Postgres(admin),
            logins,
            |url, _| async move {
                let pool = PgPoolOptions::new().max_connections(8).connect(&url).await;
                Db::Postgres(pool.unwrap_or_else(|e| panic!("{url}: {e}")))
            },
        )
        .await
    }

    /// Binds two new databases on the server of `MYSQL_URL` by the guide's blocks.
    async fn mysql() -> Bound {
        let server = std::env::var("MYSQL_URL").expect("MYSQL_URL (scripts/test.sh sets it)");
        let admin = MySqlPoolOptions::new()
            .max_connections(2)
            .connect(&server)
            .await
            .unwrap_or_else(|e| panic!("MYSQL_URL {server}: {e}"));
        let suffix = unique();
        let business_role = format!("imr_owner_{suffix}");
        // The controller's user and its database have the same name, as in the guide.
        let controller_role = format!("autoapproval_{suffix}");
        let owner_role = format!("autoapproval_owner_{suffix}");
        let business_database = format!("contracts_{suffix}");
        let logins = Logins {
            business_url: with_login(&server, &business_role, &business_database),
            business_database: business_database.clone(),
            controller_url: with_login(&server, &controller_role, &controller_role),
            owner_url: with_login(&server, &owner_role, &controller_role),
            names: [
                ("imr_owner", business_role.clone()),
                ("autoapproval_owner", owner_role.clone()),
                ("autoapproval", controller_role.clone()),
                ("contracts", business_database),
            ],
            business_role,
            controller_role,
            owner_role,
        };
        follow_the_guide(
            "mysql",
            Db::Mysql(admin),
            logins,
            |url, business| async move {
                let options: MySqlConnectOptions = url.parse().expect("a MySQL URL");
                // The business system's sessions keep the server's defaults (REPEATABLE READ,
                // its time zone).
                let options = if business {
                    options.timezone(None)
                } else {
                    options
                };
                let pool = MySqlPoolOptions::new()
                    .max_connections(8)
                    .connect_with(options)
                    .await;
                Db::Mysql(pool.unwrap_or_else(|e| panic!("{url}: {e}")))
            },
        )
        .await
    }

    /// The business role's SQL in this backend's placeholders.
    fn business_sql(&self, sql: &str) -> String {
        self.business.sql(sql)
    }

    /// Closes the pools and drops what the guide created on the server: the roles, and on MySQL
    /// the two databases (sqlx drops PostgreSQL's test database).
    async fn finish(self) {
        with_pool!(&self.business, pool => pool.close().await);
        with_pool!(&self.controller, pool => pool.close().await);
        with_pool!(&self.owner, pool => pool.close().await);
        let (business, controller, owner) =
            (&self.business_role, &self.controller_role, &self.owner_role);
        match self.backend {
            "postgres" => {
                for role in [business, controller, owner] {
                    self.admin.exec(&format!("DROP OWNED BY {role}")).await;
                }
                for role in [business, controller, owner] {
                    self.admin.exec(&format!("DROP ROLE {role}")).await;
                }
            }
            _ => {
                for database in [&self.business_database, controller] {
                    self.admin.exec(&format!("DROP DATABASE {database}")).await;
                }
                for user in [business, controller, owner] {
                    self.admin.exec(&format!("DROP USER '{user}'@'%'")).await;
                }
            }
        }
    }
}

/// Owner contracts the business role inserts, every condition met.
const OWNERS: i64 = 20;
/// The ad contract, for a store the simulator knows.
const AD: i64 = 100;
const AD_STORE: i64 = 7001;

/// The business role inserts a request into its own table, as its application does.
async fn insert_request(bound: &Bound, id: i64, request_type: &str, store: Option<i64>) {
    let sql = bound.business_sql(
        "INSERT INTO imr (imr_id, imr_type, shop_name, docs_released, menu_done, logo_done,
                          prev_step_done, contract_no, ad_shop_no)
         VALUES ($1, $2, $3, true, true, true, true, $4, $5)",
    );
    with_pool!(&bound.business, pool => sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
        .bind(id)
        .bind(request_type)
        .bind(format!("Shop {id}"))
        .bind(format!("EC-{id}"))
        .bind(store)
        .execute(pool)
        .await
        .map(|_| ())
        .unwrap_or_else(|e| panic!("the business role inserts request {id}: {e}")));
}

/// The results in the business table's own columns, as the business system reads them.
#[derive(Debug, sqlx::FromRow)]
struct ImrRow {
    imr_id: i64,
    status: String,
    owner_no: Option<i64>,
    shop_no: Option<i64>,
    campaign_id: Option<String>,
    approved_by: Option<String>,
    approved_at: Option<chrono::DateTime<chrono::Utc>>,
}

async fn imr_rows(bound: &Bound) -> Vec<ImrRow> {
    let sql = "SELECT imr_id, status, owner_no, shop_no, campaign_id, approved_by, approved_at
                 FROM imr ORDER BY imr_id";
    with_pool!(&bound.business, pool => sqlx::query_as(sql)
        .fetch_all(pool)
        .await
        .expect("the business role reads imr"))
}

/// The business side: short transactions over the owner contracts, each changing a fact its
/// trigger watches and holding the row a moment, until `stop` (and at least two rounds). The
/// errors, and the longest transaction.
async fn business_writes(bound: &Bound, stop: Arc<AtomicBool>) -> (Vec<String>, Duration) {
    let update = bound.business_sql(
        "UPDATE imr SET ad_shop_no = COALESCE(ad_shop_no, 0) + 1, assignee = 'ann' WHERE imr_id = $1",
    );
    let sleep = match bound.backend {
        "postgres" => "SELECT pg_sleep(0.005)",
        _ => "SELECT SLEEP(0.005)",
    };
    let mut errors = vec![];
    let mut longest = Duration::ZERO;
    let mut round = 0;
    while round < 2 || !stop.load(Ordering::Relaxed) {
        for id in 1..=OWNERS {
            let started = Instant::now();
            let result: Result<(), sqlx::Error> = with_pool!(&bound.business, pool => async {
                let mut tx = pool.begin().await?;
                sqlx::query(sqlx::AssertSqlSafe(update.clone()))
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(sleep).execute(&mut *tx).await?;
                tx.commit().await
            }
            .await);
            longest = longest.max(started.elapsed());
            if let Err(error) = result {
                errors.push(format!("round {round}, request {id}: {error}"));
            }
        }
        round += 1;
    }
    (errors, longest)
}

/// The real binary as the controller's role, on the test API server and the simulator.
struct Replica {
    /// Its standard error piped, not read yet.
    child: tokio::process::Child,
    dir: std::path::PathBuf,
}

fn spawn_replica(
    bound: &Bound,
    server: &kube_testserver::TestServer,
    sim_url: &str,
    name: &str,
) -> Replica {
    let dir = fresh_dir("integrating");
    let kubeconfig = kubeconfig_in(&dir, server);
    let child = spawn_run(
        &kubeconfig,
        free_port(),
        &bound.admin,
        &["--namespace", NS, "--replica-name", name],
        &[
            // Overrides the admin's URL spawn_run sets: the controller runs as its own role.
            ("AUTOAPPROVAL_DATABASE_URL", &bound.controller_url),
            ("AUTOAPPROVAL_ESIGN_URL", sim_url),
            ("AUTOAPPROVAL_OWNER_URL", sim_url),
            ("AUTOAPPROVAL_STORE_URL", sim_url),
            ("AUTOAPPROVAL_AD_URL", sim_url),
            ("NO_COLOR", "1"),
        ],
    );
    Replica { child, dir }
}

/// (a) and (b): requests the business role inserts into `imr` are approved end to end by
/// `autoapproval run` as the controller's role, the results in imr's own columns and the
/// e-contract ledger synced into esign_version, while the business role's writes to the same
/// rows all succeed.
async fn bound_as_the_guide_says_the_seeds_imr_is_approved_beside_business_writes(bound: Bound) {
    let (server, _client, sim) = backends().await;
    sim.add_store(AD_STORE, true);
    let mut replica = spawn_replica(&bound, &server, &sim.base_url(), "integ-1");
    let log = capture_stderr(&mut replica.child);
    for id in 1..=OWNERS {
        insert_request(&bound, id, "OWNER_CONTRACT", None).await;
    }
    insert_request(&bound, AD, "AD_CONTRACT", Some(AD_STORE)).await;

    let stop = Arc::new(AtomicBool::new(false));
    let bound = Arc::new(bound);
    let writer = tokio::spawn({
        let (bound, stop) = (bound.clone(), stop.clone());
        async move { business_writes(&bound, stop).await }
    });
    let child = std::sync::Mutex::new(replica.child);
    let approved = eventually("every request in imr to be approved", || async {
        // A replica that stopped (at start-up, say) approves nothing: say why at once.
        if let Ok(Some(status)) = child.lock().expect("child").try_wait() {
            panic!("run exited ({status}): {}", log.lock().expect("log"));
        }
        let rows = imr_rows(&bound).await;
        rows.iter().all(|r| r.status == "APPROVED").then_some(rows)
    })
    .await
    .expect("rows");
    replica.child = child.into_inner().expect("child");
    stop.store(true, Ordering::Relaxed);
    let (errors, longest) = writer.await.expect("the writer");
    eprintln!(
        "{}: longest business transaction {longest:?} (a 5 ms sleep inside)",
        bound.backend
    );

    assert_eq!(approved.len() as i64, OWNERS + 1);
    for row in &approved {
        assert_eq!(row.approved_by.as_deref(), Some("autoapproval"), "{row:?}");
        assert!(row.approved_at.is_some(), "{row:?}");
        if row.imr_id == AD {
            assert!(row.campaign_id.is_some(), "{row:?}");
        } else {
            assert!(row.owner_no.is_some() && row.shop_no.is_some(), "{row:?}");
        }
    }
    let synced = bound
        .business
        .fetch_i64("SELECT count(*) FROM esign_version WHERE esign_status = 'SIGNED'")
        .await;
    assert_eq!(synced, OWNERS + 1, "the ledger synced through its view");
    assert_eq!(
        errors,
        Vec::<String>::new(),
        "the business side never fails"
    );

    let output = stop_on_sigterm(replica.child, Duration::from_secs(30)).await;
    let log = log.lock().expect("log").clone();
    assert!(output.status.success(), "{log}");
    // The guide's index and triggers are what start-up looks for: it warns of neither. On
    // MySQL the controller's user, with no right on imr, can see neither imr's plan nor its
    // triggers, so there start-up cannot tell (the guide says to check them by hand).
    let checked: &[&str] = match bound.backend {
        "postgres" => &["whole", "no wake trigger"],
        _ => &[],
    };
    for warning in checked {
        assert!(
            !log.lines()
                .any(|l| l.contains("WARN") && l.contains(warning)),
            "run warned ({warning}) on the guide's binding: {log}"
        );
    }
    let _ = std::fs::remove_dir_all(&replica.dir);
    Arc::into_inner(bound)
        .expect("the writer is done")
        .finish()
        .await;
}

/// (c): `autoapproval run` refuses to start on a binding that misses a grant or a view, naming it.
async fn a_revoked_grant_or_a_dropped_view_stops_run_naming_it(bound: Bound) {
    let (server, _client, sim) = backends().await;
    let (business, controller) = (&bound.business_role, &bound.controller_role);
    // Each case breaks the binding, expects `run` to stop naming what, then mends it.
    let cases: Vec<(Db, String, &str, Option<String>)> = match bound.backend {
        "postgres" => vec![
            (
                bound.business.clone(),
                format!("REVOKE UPDATE ON autoapproval_request FROM {controller}"),
                "autoapproval_request",
                Some(format!(
                    "GRANT UPDATE (status, updated_at, owner_number, store_number, campaign_id, \
                     decided_at, decided_by) ON autoapproval_request TO {controller}"
                )),
            ),
            (
                bound.business.clone(),
                "DROP VIEW autoapproval_request_memo".to_owned(),
                "autoapproval_request_memo",
                None,
            ),
        ],
        // MySQL: the grant revoked is the views' definer's on the business table.
        _ => vec![
            (
                bound.admin.clone(),
                format!(
                    "REVOKE UPDATE ON {}.* FROM '{business}'@'%'",
                    bound.business_database
                ),
                "autoapproval_request",
                Some(format!(
                    "GRANT UPDATE ON {}.* TO '{business}'@'%'",
                    bound.business_database
                )),
            ),
            (
                bound.admin.clone(),
                format!("DROP VIEW {controller}.autoapproval_request_memo"),
                "autoapproval_request_memo",
                None,
            ),
        ],
    };
    for (n, (as_whom, breaks, named, mends)) in cases.into_iter().enumerate() {
        execute(&as_whom, "break the binding", &breaks).await;
        let replica = spawn_replica(&bound, &server, &sim.base_url(), &format!("broken-{n}"));
        let exited =
            tokio::time::timeout(Duration::from_secs(60), replica.child.wait_with_output())
                .await
                .unwrap_or_else(|_| {
                    panic!("after `{breaks}`, run kept running instead of stopping at start-up")
                })
                .expect("output");
        let _ = std::fs::remove_dir_all(&replica.dir);
        let stderr = String::from_utf8_lossy(&exited.stderr);
        assert!(!exited.status.success(), "after `{breaks}`: {stderr}");
        let last = stderr.lines().last().unwrap_or_default();
        eprintln!("{}: after `{breaks}`: {last}", bound.backend);
        assert!(
            last.contains("binding") && last.contains(named),
            "after `{breaks}`, run's last word names {named}: {stderr}"
        );
        if let Some(mends) = mends {
            execute(&as_whom, "mend the binding", &mends).await;
        }
    }
    bound.finish().await;
}

/// What a statement of `db`'s answered: `Err` with the database's message when refused.
async fn attempt(db: &Db, sql: &str) -> Result<(), String> {
    with_pool!(db, pool => sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string()))
}

/// Issue 41, defect 7: the controller's role, with the guide's grants, can neither insert nor
/// delete a business request, nor write a column it does not write, nor replace a function or
/// routine of ours that business writers' triggers call (it owns none), nor create anything.
async fn the_controllers_role_is_refused_what_the_guide_does_not_grant(bound: Bound) {
    insert_request(&bound, 1, "OWNER_CONTRACT", None).await;
    let mut refused = vec![
        "DELETE FROM autoapproval_request WHERE id = 1".to_owned(),
        "INSERT INTO autoapproval_request (id, request_type, status) \
         VALUES (2, 'OWNER_CONTRACT', 'APPROVED')"
            .to_owned(),
        "UPDATE autoapproval_request SET business_name = 'renamed' WHERE id = 1".to_owned(),
        "UPDATE autoapproval_request SET econtract_ref = 'EC-forged' WHERE id = 1".to_owned(),
        "DELETE FROM autoapproval_request_memo WHERE request_id = 1".to_owned(),
        "DELETE FROM autoapproval_econtract WHERE contract_ref = 'EC-1'".to_owned(),
    ];
    match bound.backend {
        "postgres" => refused.push(
            // SECURITY INVOKER would run the body as every business writer.
            "CREATE OR REPLACE FUNCTION autoapproval_request_changed() RETURNS trigger \
             LANGUAGE plpgsql SECURITY INVOKER AS $$ BEGIN RETURN NULL; END $$"
                .to_owned(),
        ),
        _ => refused.extend([
            "DROP PROCEDURE autoapproval_request_changed".to_owned(),
            "CREATE PROCEDURE controller_routine() BEGIN END".to_owned(),
        ]),
    }
    refused.push("CREATE TABLE controller_ddl (x INT)".to_owned());
    for sql in &refused {
        match attempt(&bound.controller, sql).await {
            Ok(()) => panic!("{}: the controller's role may `{sql}`", bound.backend),
            Err(e) => assert!(
                e.contains("denied") || e.contains("must be owner"),
                "{}: `{sql}` refused for another reason: {e}",
                bound.backend
            ),
        }
    }
    // It owns (defines) none of our routines, so it cannot change one another way either.
    let owned = match bound.backend {
        "postgres" => format!(
            "SELECT count(*) FROM pg_catalog.pg_proc
              WHERE proname LIKE 'autoapproval%' AND pg_catalog.pg_get_userbyid(proowner) = '{}'",
            bound.controller_role
        ),
        _ => format!(
            "SELECT COUNT(*) FROM information_schema.ROUTINES
              WHERE ROUTINE_SCHEMA = '{0}' AND DEFINER LIKE '{0}@%'",
            bound.controller_role
        ),
    };
    assert_eq!(bound.admin.fetch_i64(&owned).await, 0, "{owned}");
    let untouched = bound
        .business
        .fetch_i64("SELECT count(*) FROM imr WHERE imr_id = 1 AND shop_name = 'Shop 1'")
        .await;
    assert_eq!(untouched, 1, "{}: request 1 as inserted", bound.backend);
    bound.finish().await;
}

/// The operators, the domains and the function each calls, that a role with CREATE on the
/// controller's schema puts there: each records who ran it in `ran_as`, then does what
/// pg_catalog's does. Every operator or type an unqualified body of ours could take from the
/// schema.
const HOSTILE_OBJECTS: &str = r#"
CREATE TABLE ran_as (who TEXT NOT NULL, what TEXT NOT NULL);
GRANT INSERT ON ran_as TO PUBLIC;
CREATE FUNCTION public.hostile(what pg_catalog.text) RETURNS void LANGUAGE sql
    AS $$ INSERT INTO public.ran_as (who, what) VALUES (CURRENT_USER, what) $$;
CREATE FUNCTION public.h_eq_text(pg_catalog.text, pg_catalog.text) RETURNS pg_catalog.bool
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.hostile('text = text');
    RETURN $1 OPERATOR(pg_catalog.=) $2; END $$;
CREATE OPERATOR public.= (LEFTARG = pg_catalog.text, RIGHTARG = pg_catalog.text,
    FUNCTION = public.h_eq_text);
CREATE FUNCTION public.h_eq_varchar(pg_catalog.varchar, pg_catalog.text) RETURNS pg_catalog.bool
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.hostile('varchar = text');
    RETURN $1 OPERATOR(pg_catalog.=) $2; END $$;
CREATE OPERATOR public.= (LEFTARG = pg_catalog.varchar, RIGHTARG = pg_catalog.text,
    FUNCTION = public.h_eq_varchar);
CREATE FUNCTION public.h_eq_int8(pg_catalog.int8, pg_catalog.int8) RETURNS pg_catalog.bool
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.hostile('bigint = bigint');
    RETURN $1 OPERATOR(pg_catalog.=) $2; END $$;
CREATE OPERATOR public.= (LEFTARG = pg_catalog.int8, RIGHTARG = pg_catalog.int8,
    FUNCTION = public.h_eq_int8);
CREATE FUNCTION public.h_ne_text(pg_catalog.text, pg_catalog.text) RETURNS pg_catalog.bool
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.hostile('text <> text');
    RETURN $1 OPERATOR(pg_catalog.<>) $2; END $$;
CREATE OPERATOR public.<> (LEFTARG = pg_catalog.text, RIGHTARG = pg_catalog.text,
    FUNCTION = public.h_ne_text);
CREATE FUNCTION public.h_concat(pg_catalog.text, pg_catalog.text) RETURNS pg_catalog.text
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.hostile('text || text');
    RETURN $1 OPERATOR(pg_catalog.||) $2; END $$;
CREATE OPERATOR public.|| (LEFTARG = pg_catalog.text, RIGHTARG = pg_catalog.text,
    FUNCTION = public.h_concat);
CREATE FUNCTION public.h_like(pg_catalog.text, pg_catalog.text) RETURNS pg_catalog.bool
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.hostile('text LIKE text');
    RETURN $1 OPERATOR(pg_catalog.~~) $2; END $$;
CREATE OPERATOR public.~~ (LEFTARG = pg_catalog.text, RIGHTARG = pg_catalog.text,
    FUNCTION = public.h_like);
CREATE FUNCTION public.h_neg(pg_catalog.int8) RETURNS pg_catalog.int8
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.hostile('- bigint');
    RETURN OPERATOR(pg_catalog.-) $1; END $$;
CREATE OPERATOR public.- (RIGHTARG = pg_catalog.int8, FUNCTION = public.h_neg);
CREATE FUNCTION public.h_text(pg_catalog.text) RETURNS pg_catalog.bool
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.hostile('domain text'); RETURN true; END $$;
CREATE DOMAIN public.text AS pg_catalog.text CHECK (public.h_text(VALUE));
CREATE FUNCTION public.h_regclass(pg_catalog.regclass) RETURNS pg_catalog.bool
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.hostile('domain regclass'); RETURN true; END $$;
CREATE DOMAIN public.regclass AS pg_catalog.regclass CHECK (public.h_regclass(VALUE));
"#;

/// Who, other than the business role that created them, ran its hostile operators and types.
async fn assert_ran_only_as_the_business_role(bound: &Bound, after: &str) {
    let (business, owner) = (&bound.business_role, &bound.owner_role);
    let foreign: Vec<(String, String)> = with_pool!(&bound.admin, pool => sqlx::query_as(
        sqlx::AssertSqlSafe(format!(
            "SELECT DISTINCT who::pg_catalog.text, what::pg_catalog.text FROM ran_as
              WHERE who OPERATOR(pg_catalog.<>) '{business}' ORDER BY 1, 2")))
        .fetch_all(pool)
        .await
        .expect("ran_as"));
    assert_eq!(
        foreign,
        vec![],
        "after {after}, the business role's operators and types ran as another role (our \
         functions' owner is {owner})"
    );
}

/// Issue 41, defect 3: the business role, which the guide lets create in the controller's schema,
/// puts operators and types there that our functions would take by search path; then it writes
/// an e-contract and a request, and a service of people calls the four manual functions with
/// the documented grant. Nothing of the role's ran as the owner of our functions, and they did
/// their work.
async fn a_role_creating_in_our_schema_runs_nothing_as_our_functions_owner(bound: Bound) {
    execute(&bound.business, "hostile objects", HOSTILE_OBJECTS).await;
    insert_request(&bound, 1, "OWNER_CONTRACT", None).await;
    insert_request(&bound, 2, "OWNER_CONTRACT", None).await;
    for sql in [
        "INSERT INTO esign_version (contract_no, esign_status) VALUES ('EC-1', 'PENDING')",
        "UPDATE esign_version SET esign_status = 'SIGNED' WHERE contract_no = 'EC-1'",
        "UPDATE imr SET docs_released = false WHERE imr_id = 2",
    ] {
        bound.business.exec(sql).await;
    }
    assert_ran_only_as_the_business_role(&bound, "the business writes").await;

    let people = format!("people_{}", unique());
    bound
        .admin
        .exec(&format!("CREATE ROLE {people} LOGIN PASSWORD '{PASSWORD}'"))
        .await;
    bound
        .owner
        .exec(&format!(
            "GRANT EXECUTE ON FUNCTION {} TO {people}",
            autoapproval::db::postgres::MANUAL_FUNCTIONS
        ))
        .await;
    let (database,): (String,) = with_pool!(&bound.admin, pool => sqlx::query_as(
        "SELECT current_database()").fetch_one(pool).await.expect("the database"));
    let url = with_login(&bound.admin.url(), &people, &database);
    let service = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let claim = || async {
        let (token, refusal): (Option<i64>, Option<String>) =
            sqlx::query_as("SELECT * FROM autoapproval_manual_claim(1, 'ann')")
                .fetch_one(&service)
                .await
                .expect("claim");
        token.unwrap_or_else(|| panic!("claim refused: {refusal:?}"))
    };
    let token = claim().await;
    let beat: bool = sqlx::query_scalar("SELECT autoapproval_manual_heartbeat(1, 'ann', $1)")
        .bind(token)
        .fetch_one(&service)
        .await
        .expect("heartbeat");
    let released: bool = sqlx::query_scalar("SELECT autoapproval_manual_release(1, 'ann', $1)")
        .bind(token)
        .fetch_one(&service)
        .await
        .expect("release");
    let token = claim().await;
    let (decided, refusal): (bool, Option<String>) = sqlx::query_as(
        "SELECT * FROM autoapproval_manual_decide(1, 'ann', $1, 'APPROVED', 'by hand')",
    )
    .bind(token)
    .fetch_one(&service)
    .await
    .expect("decide");
    service.close().await;

    assert_ran_only_as_the_business_role(&bound, "the manual functions").await;
    assert!(
        beat && released && decided,
        "{beat} {released} {decided} {refusal:?}"
    );
    let approved = bound
        .business
        .fetch_i64(
            "SELECT count(*) FROM imr WHERE imr_id = 1 AND status = 'APPROVED' \
             AND approved_by = 'manual:ann'",
        )
        .await;
    assert_eq!(approved, 1, "the person's decision is in imr");
    // Both triggers did their work: request 1 woken by its contract, request 2 by its update.
    let woken = bound
        .admin
        .fetch_ids("SELECT DISTINCT request_id FROM auto_approve_wake ORDER BY 1")
        .await;
    assert_eq!(woken, vec![1, 2]);
    bound.admin.exec(&format!("DROP OWNED BY {people}")).await;
    bound.admin.exec(&format!("DROP ROLE {people}")).await;
    bound.finish().await;
}

/// Issue 44: on MySQL the business role could create its views but not replace them (`CREATE
/// OR REPLACE VIEW` needs DROP on the view too). With the guide's grants it replaces each of
/// the three, as it would to change a column, and the controller still reads through them.
async fn the_business_role_replaces_its_views_with_the_guides_grants(bound: Bound) {
    let database = match bound.backend {
        "postgres" => format!("\"{}\"", bound.business_database),
        _ => bound.business_database.clone(),
    };
    let names = [
        ("imr_owner", bound.business_role.clone()),
        ("autoapproval_owner", bound.owner_role.clone()),
        ("autoapproval", bound.controller_role.clone()),
        ("contracts", database),
    ];
    let views = blocks(bound.backend)
        .into_iter()
        .find(|b| b.step == "views")
        .expect("the views step");
    let text = names.iter().fold(views.text, |sql, (word, with)| {
        replace_word(&sql, word, with)
    });
    let mut replaced = 0;
    for statement in text.split(";\n").map(str::trim) {
        let Some(view) = statement
            .strip_prefix("CREATE ALGORITHM")
            .map(|rest| format!("CREATE OR REPLACE ALGORITHM{rest}"))
            .or_else(|| {
                statement
                    .strip_prefix("CREATE VIEW")
                    .map(|rest| format!("CREATE OR REPLACE VIEW{rest}"))
            })
        else {
            continue;
        };
        execute(&bound.business, "replace a view", &view).await;
        replaced += 1;
    }
    assert_eq!(replaced, 3, "the three views replaced");
    let read = with_pool!(&bound.controller, pool => sqlx::query(
        "SELECT id, status FROM autoapproval_request LIMIT 1"
    )
    .fetch_all(pool)
    .await
    .map(|_| ()));
    assert!(read.is_ok(), "{read:?}");
    bound.finish().await;
}

mod the_business_role_replaces_its_views_with_the_guides_grants {
    #[sqlx::test(migrations = false)]
    async fn postgres(admin: sqlx::PgPool) {
        let bound = super::Bound::postgres(admin).await;
        super::the_business_role_replaces_its_views_with_the_guides_grants(bound).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql() {
        let bound = super::Bound::mysql().await;
        super::the_business_role_replaces_its_views_with_the_guides_grants(bound).await
    }
}

mod the_controllers_role_is_refused_what_the_guide_does_not_grant {
    #[sqlx::test(migrations = false)]
    async fn postgres(admin: sqlx::PgPool) {
        let bound = super::Bound::postgres(admin).await;
        super::the_controllers_role_is_refused_what_the_guide_does_not_grant(bound).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql() {
        let bound = super::Bound::mysql().await;
        super::the_controllers_role_is_refused_what_the_guide_does_not_grant(bound).await
    }
}

#[sqlx::test(migrations = false)]
async fn a_role_creating_in_our_schema_runs_nothing_as_our_functions_owner_postgres(
    admin: sqlx::PgPool,
) {
    let bound = Bound::postgres(admin).await;
    a_role_creating_in_our_schema_runs_nothing_as_our_functions_owner(bound).await
}

mod the_seeds_imr_bound_as_the_guide_says_is_approved_beside_business_writes {
    #[sqlx::test(migrations = false)]
    async fn postgres(admin: sqlx::PgPool) {
        let bound = super::Bound::postgres(admin).await;
        super::bound_as_the_guide_says_the_seeds_imr_is_approved_beside_business_writes(bound).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql() {
        let bound = super::Bound::mysql().await;
        super::bound_as_the_guide_says_the_seeds_imr_is_approved_beside_business_writes(bound).await
    }
}

mod a_revoked_grant_or_a_dropped_view_of_the_binding_stops_run_naming_it {
    #[sqlx::test(migrations = false)]
    async fn postgres(admin: sqlx::PgPool) {
        let bound = super::Bound::postgres(admin).await;
        super::a_revoked_grant_or_a_dropped_view_stops_run_naming_it(bound).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql() {
        let bound = super::Bound::mysql().await;
        super::a_revoked_grant_or_a_dropped_view_stops_run_naming_it(bound).await
    }
}

// === Issue 44: start-up probes that match run time ===
//
// Each run-time write of `run` (the memo insert, the e-contract upsert, a request's update) is
// made at start-up for real, as the controller's role, in a transaction rolled back: what only
// a real write shows (a key default drawing from a sequence, a business trigger that runs as
// the writer, ON CONFLICT through a trigger-written view) stops `run`, named with its fix.

/// `run`'s start-up check as the controller's role of `bound`: its refusal, or its warnings.
async fn check_as_controller(bound: &Bound) -> Result<Vec<String>, String> {
    bound
        .controller
        .database()
        .check_schema()
        .await
        .map_err(|e| e.to_string())
}

/// The business role replaces the memo view by one over `table` (its own columns `note_id`,
/// `imr_id`, `reg_dt`, `writer`, `memo`), granted as the guide grants the memo view.
async fn memo_view_over(bound: &Bound, table: &str) {
    let controller = &bound.controller_role;
    match bound.backend {
        "postgres" => {
            let owner = &bound.owner_role;
            for sql in [
                "DROP VIEW autoapproval_request_memo".to_owned(),
                format!(
                    "CREATE VIEW autoapproval_request_memo AS
                     SELECT note_id AS id, imr_id AS request_id, reg_dt AS created_at,
                            writer AS author, memo AS message FROM {table}"
                ),
                format!(
                    "GRANT SELECT, INSERT (request_id, created_at, author, message)
                        ON autoapproval_request_memo TO {controller}, {owner}"
                ),
            ] {
                bound.business.exec(&sql).await;
            }
        }
        _ => {
            // The business role may create views in the controller's database, not drop them;
            // the grants on the name outlive the view.
            bound
                .admin
                .exec(&format!("DROP VIEW {controller}.autoapproval_request_memo"))
                .await;
            bound
                .business
                .exec(&format!(
                    "CREATE ALGORITHM = MERGE SQL SECURITY DEFINER VIEW \
                     {controller}.autoapproval_request_memo AS
                     SELECT note_id AS id, imr_id AS request_id, reg_dt AS created_at,
                            writer AS author, memo AS message FROM {}.{table}",
                    bound.business_database
                ))
                .await;
            bound
                .admin
                .exec(&format!(
                    "GRANT SELECT, INSERT (request_id, created_at, author, message)
                        ON {controller}.autoapproval_request_memo TO '{controller}'@'%'"
                ))
                .await;
        }
    }
}

/// The memo table with a `bigserial` key (PostgreSQL), or one drawing from a sequence (MariaDB
/// `DEFAULT NEXTVAL`): the default runs as the writer, and the controller's role, granted the
/// view only, may not use the sequence. The memo insert refuses at every wait and recovery;
/// `run` stops at start-up naming the view, the sequence and the grant, and starts once given.
async fn a_memo_key_drawing_from_a_sequence_the_controller_may_not_use_stops_run(bound: Bound) {
    let (sequence, grant) = match bound.backend {
        "postgres" => {
            bound
                .business
                .exec(
                    "CREATE TABLE imr_note (note_id BIGSERIAL PRIMARY KEY,
                         imr_id BIGINT NOT NULL REFERENCES imr (imr_id),
                         reg_dt TIMESTAMPTZ NOT NULL DEFAULT now(),
                         writer TEXT NOT NULL, memo TEXT NOT NULL)",
                )
                .await;
            (
                "imr_note_note_id_seq",
                format!(
                    "GRANT USAGE ON SEQUENCE imr_note_note_id_seq TO {}",
                    bound.controller_role
                ),
            )
        }
        _ => {
            bound.business.exec("CREATE SEQUENCE imr_note_seq").await;
            bound
                .business
                .exec(
                    "CREATE TABLE imr_note (note_id BIGINT NOT NULL DEFAULT NEXTVAL(imr_note_seq)
                         PRIMARY KEY, imr_id BIGINT NOT NULL,
                         reg_dt DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
                         writer VARCHAR(255) NOT NULL, memo TEXT NOT NULL)",
                )
                .await;
            (
                "imr_note_seq",
                format!(
                    "GRANT SELECT, INSERT ON {}.imr_note_seq TO '{}'@'%'",
                    bound.business_database, bound.controller_role
                ),
            )
        }
    };
    memo_view_over(&bound, "imr_note").await;
    insert_request(&bound, 1, "OWNER_CONTRACT", None).await;
    let refused = check_as_controller(&bound)
        .await
        .expect_err("the memo insert is refused");
    eprintln!("{}: {refused}", bound.backend);
    for named in [
        "binding to the business tables",
        "memo insert",
        "autoapproval_request_memo",
        sequence,
        "GRANT",
        bound.controller_role.as_str(),
    ] {
        assert!(
            refused.contains(named),
            "{}: names {named}: {refused}",
            bound.backend
        );
    }
    // The fix the message names, by whoever may give it (the sequence's owner; on MySQL an
    // administrator), and `run` starts.
    match bound.backend {
        "postgres" => bound.business.exec(&grant).await,
        _ => bound.admin.exec(&grant).await,
    };
    check_as_controller(&bound)
        .await
        .unwrap_or_else(|e| panic!("{}: the check passes once granted: {e}", bound.backend));
    let notes = bound
        .business
        .fetch_i64("SELECT count(*) FROM imr_note")
        .await;
    assert_eq!(notes, 0, "the probe's memo is rolled back");
    bound.finish().await;
}

mod a_memo_key_drawing_from_a_sequence_the_controller_may_not_use_stops_run {
    #[sqlx::test(migrations = false)]
    async fn postgres(admin: sqlx::PgPool) {
        let bound = super::Bound::postgres(admin).await;
        super::a_memo_key_drawing_from_a_sequence_the_controller_may_not_use_stops_run(bound).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql() {
        let bound = super::Bound::mysql().await;
        super::a_memo_key_drawing_from_a_sequence_the_controller_may_not_use_stops_run(bound).await
    }
}

/// A business trigger on `imr` that fails as the controller's role: on PostgreSQL an AFTER
/// UPDATE trigger whose function (SECURITY INVOKER, the default) writes an audit table in a
/// schema the controller may not use; on MariaDB a BEFORE UPDATE trigger that refuses every
/// account but the business's (a trigger runs as its definer there, and USER() is the writer).
/// With no request yet the update is not probed (said, not refused); with one, `run` stops
/// naming the table, the trigger (PostgreSQL lists it from the catalog; MySQL's controller may
/// not see triggers, and is told so) and the fix; mended, it starts, and the probe left nothing.
async fn a_business_trigger_failing_as_the_controller_stops_run_naming_it(bound: Bound) {
    let business = &bound.business_role;
    match bound.backend {
        "postgres" => {
            bound
                .admin
                .exec(&format!("CREATE SCHEMA biz AUTHORIZATION {business}"))
                .await;
            for sql in [
                "CREATE TABLE biz.imr_audit (imr_id BIGINT NOT NULL, changed_by TEXT NOT NULL)",
                "CREATE FUNCTION imr_audit() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN
                     INSERT INTO biz.imr_audit (imr_id, changed_by) VALUES (NEW.imr_id, current_user);
                     RETURN NULL;
                 END $$",
                "CREATE TRIGGER imr_audited AFTER UPDATE ON imr
                     FOR EACH ROW EXECUTE FUNCTION imr_audit()",
            ] {
                execute(&bound.business, "business trigger", sql).await;
            }
        }
        _ => {
            execute(
                &bound.business,
                "business trigger",
                &format!(
                    "CREATE TRIGGER imr_writers_only BEFORE UPDATE ON imr FOR EACH ROW
                     BEGIN
                         IF SUBSTRING_INDEX(USER(), '@', 1) <> '{business}' THEN
                             SIGNAL SQLSTATE '45000'
                                 SET MESSAGE_TEXT = 'imr is written by the business application only';
                         END IF;
                     END"
                ),
            )
            .await;
        }
    }
    // No request to try the update on: not probed, and said so.
    let report = bound
        .controller
        .database()
        .schema_report()
        .await
        .expect("the report");
    assert!(report.binding.is_empty(), "{:?}", report.binding);
    assert!(
        report
            .unprobed
            .iter()
            .any(|n| n.contains("update of a request") && n.contains("not probed")),
        "{}: {:?}",
        bound.backend,
        report.unprobed
    );

    insert_request(&bound, 1, "OWNER_CONTRACT", None).await;
    let written = match bound.backend {
        "postgres" => "SELECT mod_dt::text FROM imr WHERE imr_id = 1",
        _ => "SELECT CAST(mod_dt AS CHAR) FROM imr WHERE imr_id = 1",
    };
    let before = bound.business.fetch_strings(written).await;
    let refused = check_as_controller(&bound)
        .await
        .expect_err("the update is refused by the trigger");
    eprintln!("{}: {refused}", bound.backend);
    let named: &[&str] = match bound.backend {
        "postgres" => &[
            "update of a request",
            "trigger imr_audited on imr",
            "imr_audit()",
            "permission denied for schema biz",
            "SECURITY DEFINER",
            "GRANT USAGE ON SCHEMA biz TO",
        ],
        _ => &[
            "update of a request",
            "imr is written by the business application only",
            "UPDATE trigger",
            "cannot list them",
        ],
    };
    for name in named {
        assert!(
            refused.contains(name),
            "{}: names {name}: {refused}",
            bound.backend
        );
    }
    assert!(
        !refused.contains("3655"),
        "PostgreSQL's own line: {refused}"
    );

    // Mended as the message says: the function runs as its owner (PostgreSQL); the trigger lets
    // the controller's account write (MariaDB).
    match bound.backend {
        "postgres" => {
            bound
                .business
                .exec("ALTER FUNCTION imr_audit() SECURITY DEFINER SET search_path = public")
                .await;
        }
        _ => {
            bound.business.exec("DROP TRIGGER imr_writers_only").await;
        }
    }
    let warnings = check_as_controller(&bound)
        .await
        .unwrap_or_else(|e| panic!("{}: the check passes once mended: {e}", bound.backend));
    eprintln!("{}: {warnings:?}", bound.backend);
    let after = bound.business.fetch_strings(written).await;
    assert_eq!(before, after, "the probe's update is rolled back");
    if bound.backend == "postgres" {
        let audited = bound
            .business
            .fetch_i64("SELECT count(*) FROM biz.imr_audit")
            .await;
        assert_eq!(audited, 0, "the probe's trigger row is rolled back");
        bound.admin.exec("DROP SCHEMA biz CASCADE").await;
    }
    bound.finish().await;
}

mod a_business_trigger_failing_as_the_controller_stops_run_naming_it {
    #[sqlx::test(migrations = false)]
    async fn postgres(admin: sqlx::PgPool) {
        let bound = super::Bound::postgres(admin).await;
        super::a_business_trigger_failing_as_the_controller_stops_run_naming_it(bound).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql() {
        let bound = super::Bound::mysql().await;
        super::a_business_trigger_failing_as_the_controller_stops_run_naming_it(bound).await
    }
}

/// PostgreSQL: the ledger's view with an expression for `status`, written through an INSTEAD
/// OF trigger (what an integrator does to map codes). ON CONFLICT cannot pass through it, and
/// PostgreSQL says no unique key matches, though `esign_version` has one: `run` stops saying
/// what is wrong, the view, and that it must be a plain column rename. (MySQL has no INSTEAD OF
/// trigger.)
#[sqlx::test(migrations = false)]
async fn a_ledger_view_written_through_an_instead_of_trigger_stops_run_saying_why_postgres(
    admin: sqlx::PgPool,
) {
    let bound = Bound::postgres(admin).await;
    let (controller, owner) = (&bound.controller_role, &bound.owner_role);
    for sql in [
        "DROP VIEW autoapproval_econtract".to_owned(),
        "CREATE VIEW autoapproval_econtract AS
         SELECT contract_no AS contract_ref, upper(esign_status) AS status, synced_at
           FROM esign_version"
            .to_owned(),
        "CREATE FUNCTION autoapproval_econtract_write() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO esign_version (contract_no, esign_status, synced_at)
             VALUES (NEW.contract_ref, lower(NEW.status), NEW.synced_at)
             ON CONFLICT (contract_no) DO UPDATE
                SET esign_status = EXCLUDED.esign_status, synced_at = EXCLUDED.synced_at;
             RETURN NEW;
         END $$"
            .to_owned(),
        "CREATE TRIGGER autoapproval_econtract_write INSTEAD OF INSERT OR UPDATE
             ON autoapproval_econtract FOR EACH ROW EXECUTE FUNCTION autoapproval_econtract_write()"
            .to_owned(),
        format!(
            "GRANT SELECT, INSERT (contract_ref, status, synced_at), UPDATE (status, synced_at)
                ON autoapproval_econtract TO {controller}, {owner}"
        ),
    ] {
        bound.business.exec(&sql).await;
    }
    let refused = check_as_controller(&bound)
        .await
        .expect_err("the upsert is refused");
    eprintln!("postgres: {refused}");
    for named in [
        "e-contract upsert",
        "autoapproval_econtract",
        "INSTEAD OF trigger autoapproval_econtract_write",
        "column status is an expression",
        "ON CONFLICT (contract_ref)",
        "plain column rename",
    ] {
        assert!(refused.contains(named), "names {named}: {refused}");
    }
    bound.finish().await;
}

#[test]
fn replace_word_leaves_longer_identifiers_alone() {
    assert_eq!(
        replace_word(
            "GRANT SELECT ON autoapproval_request TO autoapproval; CALL autoapproval.p(1);",
            "autoapproval",
            "ctl_1"
        ),
        "GRANT SELECT ON autoapproval_request TO ctl_1; CALL ctl_1.p(1);"
    );
    assert_eq!(replace_word("'imr_owner'@'%'", "imr_owner", "b"), "'b'@'%'");
    assert_eq!(
        replace_word("xautoapproval", "autoapproval", "c"),
        "xautoapproval"
    );
}
