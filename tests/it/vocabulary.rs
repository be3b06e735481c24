//! Bring your own codes (issue 44): docs/INTEGRATING.md's coded example, a business schema whose
//! type is a smallint, whose status and flags are char(1) codes, with a menu count, a logo path,
//! an e-contract ledger of int statuses and a notes table on a bigserial key, bound by running
//! the guide's `coded-postgres` blocks verbatim, each as the role it names, the controller in a
//! schema of its own. No column or trigger is added to the business tables but the wake triggers
//! the guide attaches. `autoapproval run --vocabulary` reaches the four outcomes with the results
//! in the business's own codes, while the business role keeps writing; and refuses to start on a
//! vocabulary `migrate` did not store, or on a written column that is a view expression.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use autoapproval::external::ContractStatus;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor, PgPool};

use crate::support::{
    Db, NS, backends, capture_stderr, eventually, free_port, fresh_dir, kubeconfig_in, repo,
    spawn_run, stop_on_sigterm,
};

const PASSWORD: &str = "PASSWORD";
const AD_STORE: i64 = 7001;

/// The guide's `coded-postgres/<step>` blocks, in order: (step, language, text).
fn blocks() -> Vec<(String, String, String)> {
    blocks_of("coded-postgres")
}

/// The guide's `<example>/<step>` blocks, in order: (step, language, text).
fn blocks_of(example: &str) -> Vec<(String, String, String)> {
    let guide = std::fs::read_to_string(repo().join("docs/INTEGRATING.md")).expect("the guide");
    let marker = format!("<!-- binding: {example}/");
    let marker = marker.as_str();
    let mut found = vec![];
    let mut rest = guide.as_str();
    while let Some(at) = rest.find(marker) {
        let after = &rest[at + marker.len()..];
        let (step, after) = after
            .split_once(" -->\n```")
            .expect("a marker, then a fence");
        let (lang, after) = after.split_once('\n').expect("the fence's language");
        let end = after.find("\n```").expect("the block's end");
        found.push((
            step.to_owned(),
            lang.to_owned(),
            after[..end + 1].to_owned(),
        ));
        rest = &after[end..];
    }
    assert!(found.len() >= 7, "the guide's coded example: {found:?}");
    found
}

/// `text` with the identifier `word` replaced where it stands alone.
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

fn with_login(url: &str, user: &str, database: &str) -> String {
    let mut url = url::Url::parse(url).expect("a database URL");
    url.set_username(user).expect("a user");
    url.set_password(Some(PASSWORD)).expect("a password");
    url.set_path(database);
    url.to_string()
}

async fn execute(pool: &PgPool, step: &str, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("step {step}: {e}\n{sql}"));
}

/// The coded schema bound by the guide.
struct Bound {
    admin: PgPool,
    business: PgPool,
    owner: PgPool,
    controller_url: String,
    vocabulary: std::path::PathBuf,
    roles: [String; 3],
    dir: std::path::PathBuf,
}

async fn bind(admin: PgPool) -> Bound {
    let (database,): (String,) = sqlx::query_as("SELECT current_database()")
        .fetch_one(&admin)
        .await
        .expect("the database");
    let suffix = format!("{}_{}", std::process::id(), rand::random::<u16>());
    let business_role = format!("biz_owner_{suffix}");
    let owner_role = format!("autoapproval_owner_{suffix}");
    let controller_role = format!("autoapproval_{suffix}");
    let names = [
        ("biz_owner", business_role.clone()),
        ("autoapproval_owner", owner_role.clone()),
        ("autoapproval", controller_role.clone()),
        ("contracts", format!("\"{database}\"")),
    ];
    let server = Db::Postgres(admin.clone()).url();
    let url_of = |role: &str| with_login(&server, role, &database);
    let connect = |url: String| async move {
        PgPoolOptions::new()
            .max_connections(6)
            .connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"))
    };
    let dir = fresh_dir("vocabulary");
    let vocabulary = dir.join("vocabulary.yaml");
    let (mut business, mut owner): (Option<PgPool>, Option<PgPool>) = (None, None);
    for (step, lang, text) in blocks() {
        if step == "vocabulary" {
            assert_eq!(lang, "yaml");
            std::fs::write(&vocabulary, &text).expect("the vocabulary file");
            continue;
        }
        if step == "migrate" {
            let command = text.trim();
            assert!(
                command.starts_with("autoapproval migrate --database-url ")
                    && command.ends_with("--vocabulary vocabulary.yaml"),
                "{command}"
            );
            let output = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
                .args([
                    "migrate",
                    "--database-url",
                    &url_of(&owner_role),
                    "--vocabulary",
                ])
                .arg(&vocabulary)
                .output()
                .expect("migrate");
            assert!(
                output.status.success(),
                "migrate: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            continue;
        }
        let sql = names
            .iter()
            .fold(text, |sql, (word, with)| replace_word(&sql, word, with));
        let pool = match step.as_str() {
            "roles" => &admin,
            "business" | "views" | "index" => match business {
                Some(ref pool) => pool,
                None => business.insert(connect(url_of(&business_role)).await),
            },
            "grant" => match owner {
                Some(ref pool) => pool,
                None => owner.insert(connect(url_of(&owner_role)).await),
            },
            other => panic!("a step this test does not know: {other}"),
        };
        execute(pool, &step, &sql).await;
    }
    Bound {
        admin,
        business: business.expect("the business role's steps"),
        owner: owner.expect("the owner's step"),
        controller_url: url_of(&controller_role),
        vocabulary,
        roles: [business_role, owner_role, controller_role],
        dir,
    }
}

impl Bound {
    async fn finish(self) {
        self.business.close().await;
        self.owner.close().await;
        for role in &self.roles {
            execute(&self.admin, "finish", &format!("DROP OWNED BY {role}")).await;
        }
        for role in &self.roles {
            execute(&self.admin, "finish", &format!("DROP ROLE {role}")).await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// `run` as the controller's role, with `vocabulary` (none: our words).
    fn run(
        &self,
        server: &kube_testserver::TestServer,
        sim_url: &str,
        name: &str,
        vocabulary: Option<&std::path::Path>,
    ) -> tokio::process::Child {
        let kubeconfig = kubeconfig_in(&self.dir, server);
        let vocabulary = vocabulary.map(|p| p.display().to_string());
        let mut env = vec![
            ("AUTOAPPROVAL_DATABASE_URL", self.controller_url.as_str()),
            ("AUTOAPPROVAL_ESIGN_URL", sim_url),
            ("AUTOAPPROVAL_OWNER_URL", sim_url),
            ("AUTOAPPROVAL_STORE_URL", sim_url),
            ("AUTOAPPROVAL_AD_URL", sim_url),
            ("NO_COLOR", "1"),
        ];
        if let Some(ref v) = vocabulary {
            env.push(("AUTOAPPROVAL_VOCABULARY", v.as_str()));
        }
        spawn_run(
            &kubeconfig,
            free_port(),
            &Db::Postgres(self.admin.clone()),
            // A waiting request is retried only after 10 minutes: what approves it sooner is
            // the wake of its contract's signature.
            &[
                "--namespace",
                NS,
                "--replica-name",
                name,
                "--condition-retry-interval",
                "10m",
            ],
            &env,
        )
    }

    async fn insert(&self, category: i16, docs: &str, contract: &str, store: Option<i64>) -> i64 {
        sqlx::query_scalar(
            "INSERT INTO contract_application (category, shop_name, docs_ok_yn, menu_count,
                                               logo_path, prev_ok_yn, esign_doc_id, ad_shop_no)
             VALUES ($1, 'Shop', $2, 3, '/logo.png', 'Y', $3, $4) RETURNING app_no",
        )
        .bind(category)
        .bind(docs)
        .bind(contract)
        .bind(store)
        .fetch_one(&self.business)
        .await
        .expect("the business role inserts a request")
    }

    async fn state_code(&self, app_no: i64) -> String {
        sqlx::query_scalar("SELECT state_code::text FROM contract_application WHERE app_no = $1")
            .bind(app_no)
            .fetch_one(&self.business)
            .await
            .expect("state_code")
    }

    async fn sign_status(&self, doc: &str) -> Option<i32> {
        sqlx::query_scalar("SELECT sign_status FROM esign_doc WHERE doc_id = $1")
            .bind(doc)
            .fetch_optional(&self.business)
            .await
            .expect("sign_status")
    }
}

/// The business side's own writes while the controller works: inserts of another type, and
/// updates of the rows the controller writes too. The errors.
async fn business_writes(business: PgPool, stop: Arc<AtomicBool>) -> Vec<String> {
    let mut errors = vec![];
    let mut round = 0;
    while round < 3 || !stop.load(Ordering::Relaxed) {
        for sql in [
            "INSERT INTO contract_application (category, shop_name) VALUES (7, 'other type')",
            "UPDATE contract_application SET shop_name = shop_name WHERE category IN (1, 2)",
            "INSERT INTO esign_doc (doc_id, sign_status) VALUES ('DRAFT-' || gen_random_uuid(), 0)",
        ] {
            if let Err(e) = sqlx::query(sql).execute(&business).await {
                errors.push(format!("round {round}: {sql}: {e}"));
            }
        }
        round += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    errors
}

/// The four outcomes in the business's codes: an owner contract and an ad contract approved
/// ('A', the ledger's 2 for signed), a request approved at once when its contract is signed in
/// the ledger (long before its retry), a person's rejection through the manual functions ('X').
#[sqlx::test(migrations = false)]
async fn a_coded_schema_bound_by_the_guide_reaches_the_four_outcomes_in_its_own_codes(
    admin: PgPool,
) {
    let bound = bind(admin).await;
    let (server, _client, sim) = backends().await;
    sim.add_store(AD_STORE, true);
    sim.set_contract_status("DOC-3", ContractStatus::Pending);
    let mut child = bound.run(&server, &sim.base_url(), "coded-1", Some(&bound.vocabulary));
    let log = capture_stderr(&mut child);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(business_writes(bound.business.clone(), stop.clone()));

    let owner = bound.insert(1, "Y", "DOC-1", None).await;
    let ad = bound.insert(2, "Y", "DOC-2", Some(AD_STORE)).await;
    let signed_later = bound.insert(1, "Y", "DOC-3", None).await;
    let for_a_person = bound.insert(1, "N", "DOC-4", None).await;
    let child = std::sync::Mutex::new(child);
    let alive = || {
        if let Ok(Some(status)) = child.lock().expect("child").try_wait() {
            panic!("run exited ({status}): {}", log.lock().expect("log"));
        }
    };
    eventually("the owner and ad contracts approved ('A')", || async {
        alive();
        (bound.state_code(owner).await == "A" && bound.state_code(ad).await == "A").then_some(())
    })
    .await
    .expect("approved");
    assert_eq!(
        bound.sign_status("DOC-1").await,
        Some(2),
        "SIGNED as the ledger's 2"
    );
    // The e-sign system says PENDING: the ledger records the business's 1, the request waits.
    eventually("DOC-3 synced as sent (1)", || async {
        alive();
        (bound.sign_status("DOC-3").await == Some(1)).then_some(())
    })
    .await
    .expect("synced");
    assert_eq!(bound.state_code(signed_later).await, "P");
    // The business signs it in its ledger: its trigger wakes the request, approved at once
    // (the ledger's SIGNED passes while the e-sign system still says PENDING).
    let signed_at = Instant::now();
    sqlx::query("UPDATE esign_doc SET sign_status = 2 WHERE doc_id = 'DOC-3'")
        .execute(&bound.business)
        .await
        .expect("the business signs");
    eventually(
        "the request approved after its contract is signed",
        || async {
            alive();
            (bound.state_code(signed_later).await == "A").then_some(())
        },
    )
    .await
    .expect("approved once signed");
    eprintln!(
        "approved {:?} after its contract was signed",
        signed_at.elapsed()
    );
    let took = signed_at.elapsed();
    assert!(
        took < Duration::from_secs(120),
        "approved {took:?} after the signature"
    );

    // A person rejects the request whose documents are not released.
    let (token, refusal): (Option<i64>, Option<String>) =
        sqlx::query_as("SELECT * FROM autoapproval_manual_claim($1, 'ann')")
            .bind(for_a_person)
            .fetch_one(&bound.owner)
            .await
            .expect("claim");
    let token = token.unwrap_or_else(|| panic!("claim refused: {refusal:?}"));
    let (decided, refusal): (bool, Option<String>) = sqlx::query_as(
        "SELECT * FROM autoapproval_manual_decide($1, 'ann', $2, 'REJECTED', 'no documents')",
    )
    .bind(for_a_person)
    .bind(token)
    .fetch_one(&bound.owner)
    .await
    .expect("decide");
    assert!(decided, "{refusal:?}");
    assert_eq!(bound.state_code(for_a_person).await, "X");
    let decided_by: Option<String> =
        sqlx::query_scalar("SELECT decided_by FROM contract_application WHERE app_no = $1")
            .bind(for_a_person)
            .fetch_one(&bound.business)
            .await
            .expect("decided_by");
    assert_eq!(decided_by.as_deref(), Some("manual:ann"));

    stop.store(true, Ordering::Relaxed);
    let errors = writer.await.expect("the writer");
    assert_eq!(
        errors,
        Vec::<String>::new(),
        "the business side never fails"
    );
    let others: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM biz.contract_application WHERE category = 7 AND state_code <> 'P'",
    )
    .fetch_one(&bound.admin)
    .await
    .expect("the other type");
    assert_eq!(others, 0, "another type is left alone");
    let output = stop_on_sigterm(child.into_inner().expect("child"), Duration::from_secs(30)).await;
    let log = log.lock().expect("log").clone();
    assert!(output.status.success(), "{log}");
    // The business's own index on its own codes serves the candidate query.
    assert!(
        !log.lines()
            .any(|l| l.contains("WARN") && l.contains("whole")),
        "{log}"
    );
    bound.finish().await;
}

/// `run` stops at start-up, naming what, on a vocabulary `migrate` did not store (our words
/// here), and on a written column that is an expression of its view.
#[sqlx::test(migrations = false)]
async fn run_refuses_another_vocabulary_and_a_written_view_expression(admin: PgPool) {
    let bound = bind(admin).await;
    let (server, _client, sim) = backends().await;
    let stops = |child: tokio::process::Child, what: &'static str| async move {
        let exited = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("{what}: run kept running"))
            .expect("output");
        assert!(!exited.status.success(), "{what}");
        String::from_utf8_lossy(&exited.stderr).to_string()
    };
    let stderr = stops(
        bound.run(&server, &sim.base_url(), "ours", None),
        "our words against the stored codes",
    )
    .await;
    let last = stderr.lines().last().unwrap_or_default().to_owned();
    eprintln!("{last}");
    assert!(
        last.contains("auto_approve_vocabulary")
            && last.contains("request_statuses.PENDING: 'PENDING' here, 'P' in the database"),
        "{stderr}"
    );

    // The business role maps status through a CASE: no longer a column we can write through.
    let schema = &bound.roles[2];
    execute(
        &bound.business,
        "a CASE view",
        &format!(
            "CREATE OR REPLACE VIEW {schema}.autoapproval_request AS
             SELECT app_no AS id, category AS request_type,
                    (CASE state_code WHEN 'P' THEN 'P' ELSE state_code END)::char(1) AS status,
                    queued_at AS sort_time, created_at, changed_at AS updated_at,
                    shop_name AS business_name, docs_ok_yn AS documents_released,
                    hold_yn AS operational_hold,
                    CASE WHEN menu_count > 0 THEN 'Y' ELSE 'N' END AS menu_registered,
                    CASE WHEN logo_path IS NOT NULL THEN 'Y' ELSE 'N' END AS logo_registered,
                    prev_ok_yn AS previous_step_approved, esign_doc_id AS econtract_ref,
                    ad_shop_no AS target_store_number, owner_no AS owner_number,
                    shop_no AS store_number, campaign_id, decided_at, decided_by
               FROM biz.contract_application"
        ),
    )
    .await;
    let stderr = stops(
        bound.run(&server, &sim.base_url(), "case", Some(&bound.vocabulary)),
        "a written column that is an expression",
    )
    .await;
    let last = stderr.lines().last().unwrap_or_default().to_owned();
    eprintln!("{last}");
    assert!(
        last.contains("autoapproval_request.status") && last.contains("expression"),
        "{stderr}"
    );
    bound.finish().await;
}

/// The coded schema on MySQL / MariaDB, bound by the guide's `coded-mysql` blocks.
struct BoundMysql {
    admin: MySqlPool,
    business: MySqlPool,
    owner: MySqlPool,
    controller_url: String,
    vocabulary: std::path::PathBuf,
    users: [String; 3],
    databases: [String; 2],
    dir: std::path::PathBuf,
}

async fn execute_mysql(pool: &MySqlPool, step: &str, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("step {step}: {e}\n{sql}"));
}

async fn bind_mysql() -> BoundMysql {
    let server = std::env::var("MYSQL_URL").expect("MYSQL_URL (scripts/test.sh sets it)");
    let admin = MySqlPoolOptions::new()
        .max_connections(2)
        .connect(&server)
        .await
        .unwrap_or_else(|e| panic!("MYSQL_URL {server}: {e}"));
    let suffix = format!("{}_{}", std::process::id(), rand::random::<u16>());
    let business_user = format!("biz_owner_{suffix}");
    let owner_user = format!("autoapproval_owner_{suffix}");
    // The controller's user and its database have the same name, as in the guide.
    let controller_user = format!("autoapproval_{suffix}");
    let business_database = format!("biz_{suffix}");
    let names = [
        ("biz_owner", business_user.clone()),
        ("autoapproval_owner", owner_user.clone()),
        ("autoapproval", controller_user.clone()),
        ("biz", business_database.clone()),
    ];
    let connect = |url: String, business: bool| async move {
        let options: MySqlConnectOptions = url.parse().expect("a MySQL URL");
        // The business system's sessions keep the server's defaults.
        let options = if business {
            options.timezone(None)
        } else {
            options
        };
        MySqlPoolOptions::new()
            .max_connections(6)
            .connect_with(options)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"))
    };
    let business_url = with_login(&server, &business_user, &business_database);
    let owner_url = with_login(&server, &owner_user, &controller_user);
    let dir = fresh_dir("vocabulary-mysql");
    let vocabulary = dir.join("vocabulary.yaml");
    let (mut business, mut owner): (Option<MySqlPool>, Option<MySqlPool>) = (None, None);
    for (step, lang, text) in blocks_of("coded-mysql") {
        if step == "vocabulary" {
            assert_eq!(lang, "yaml");
            std::fs::write(&vocabulary, &text).expect("the vocabulary file");
            continue;
        }
        if step == "migrate" {
            let command = text.trim();
            assert!(
                command.starts_with("autoapproval migrate --database-url 'mysql://")
                    && command.ends_with("--vocabulary vocabulary.yaml"),
                "{command}"
            );
            let output = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
                .args(["migrate", "--database-url", &owner_url, "--vocabulary"])
                .arg(&vocabulary)
                .output()
                .expect("migrate");
            assert!(
                output.status.success(),
                "migrate: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            continue;
        }
        let sql = names
            .iter()
            .fold(text, |sql, (word, with)| replace_word(&sql, word, with));
        let pool = match step.as_str() {
            "roles" | "grant" | "access" => &admin,
            "business" | "views" | "index" => match business {
                Some(ref pool) => pool,
                None => business.insert(connect(business_url.clone(), true).await),
            },
            other => panic!("a step this test does not know: {other}"),
        };
        execute_mysql(pool, &step, &sql).await;
    }
    let owner = match owner.take() {
        Some(pool) => pool,
        None => connect(owner_url, false).await,
    };
    BoundMysql {
        admin,
        business: business.expect("the business role's steps"),
        owner,
        controller_url: with_login(&server, &controller_user, &controller_user),
        vocabulary,
        users: [business_user, owner_user, controller_user.clone()],
        databases: [business_database, controller_user],
        dir,
    }
}

impl BoundMysql {
    async fn finish(self) {
        self.business.close().await;
        self.owner.close().await;
        for database in &self.databases {
            execute_mysql(&self.admin, "finish", &format!("DROP DATABASE {database}")).await;
        }
        for user in &self.users {
            execute_mysql(&self.admin, "finish", &format!("DROP USER '{user}'@'%'")).await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// `run` as the controller's user, with the guide's vocabulary.
    fn run(
        &self,
        server: &kube_testserver::TestServer,
        sim_url: &str,
        name: &str,
    ) -> tokio::process::Child {
        self.run_with(server, sim_url, name, Some(&self.vocabulary))
    }

    /// `run` as the controller's user, with `vocabulary` (none: our words).
    fn run_with(
        &self,
        server: &kube_testserver::TestServer,
        sim_url: &str,
        name: &str,
        vocabulary: Option<&std::path::Path>,
    ) -> tokio::process::Child {
        let kubeconfig = kubeconfig_in(&self.dir, server);
        let vocabulary = vocabulary.map(|p| p.display().to_string());
        let mut env = vec![
            ("AUTOAPPROVAL_DATABASE_URL", self.controller_url.as_str()),
            ("AUTOAPPROVAL_ESIGN_URL", sim_url),
            ("AUTOAPPROVAL_OWNER_URL", sim_url),
            ("AUTOAPPROVAL_STORE_URL", sim_url),
            ("AUTOAPPROVAL_AD_URL", sim_url),
            ("NO_COLOR", "1"),
        ];
        if let Some(ref v) = vocabulary {
            env.push(("AUTOAPPROVAL_VOCABULARY", v.as_str()));
        }
        spawn_run(
            &kubeconfig,
            free_port(),
            &Db::Mysql(self.admin.clone()),
            &[
                "--namespace",
                NS,
                "--replica-name",
                name,
                "--condition-retry-interval",
                "10m",
            ],
            &env,
        )
    }

    async fn insert(&self, category: i16, docs: &str, contract: &str, store: Option<i64>) -> i64 {
        let done = sqlx::query(
            "INSERT INTO contract_application (category, shop_name, docs_ok_yn, menu_count,
                                               logo_path, prev_ok_yn, esign_doc_id, ad_shop_no)
             VALUES (?, 'Shop', ?, 3, '/logo.png', 'Y', ?, ?)",
        )
        .bind(category)
        .bind(docs)
        .bind(contract)
        .bind(store)
        .execute(&self.business)
        .await
        .expect("the business role inserts a request");
        done.last_insert_id() as i64
    }

    async fn state_code(&self, app_no: i64) -> String {
        sqlx::query_scalar("SELECT state_code FROM contract_application WHERE app_no = ?")
            .bind(app_no)
            .fetch_one(&self.business)
            .await
            .expect("state_code")
    }

    async fn sign_status(&self, doc: &str) -> Option<i32> {
        sqlx::query_scalar("SELECT sign_status FROM esign_doc WHERE doc_id = ?")
            .bind(doc)
            .fetch_optional(&self.business)
            .await
            .expect("sign_status")
    }
}

/// The business side's own writes on MySQL while the controller works: inserts of another
/// type, and updates of the rows the controller writes too, each by its key as an application
/// writes (a range UPDATE under REPEATABLE READ takes next-key locks, which InnoDB may resolve
/// as a deadlock with any writer of that index, ours or the business's own). The errors.
async fn business_writes_mysql(
    business: MySqlPool,
    requests: Arc<std::sync::Mutex<Vec<i64>>>,
    stop: Arc<AtomicBool>,
) -> Vec<String> {
    let mut errors = vec![];
    let mut round = 0;
    while round < 3 || !stop.load(Ordering::Relaxed) {
        for sql in [
            "INSERT INTO contract_application (category, shop_name) VALUES (7, 'other type')",
            "INSERT INTO esign_doc (doc_id, sign_status) VALUES (UUID(), 0)",
        ] {
            if let Err(e) = business.execute(sql).await {
                errors.push(format!("round {round}: {sql}: {e}"));
            }
        }
        let ids = requests.lock().expect("ids").clone();
        for id in ids {
            let update = "UPDATE contract_application SET shop_name = shop_name WHERE app_no = ?";
            if let Err(e) = sqlx::query(update).bind(id).execute(&business).await {
                errors.push(format!("round {round}: {update} ({id}): {e}"));
            }
        }
        round += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    errors
}

/// The four outcomes in the business's codes on MariaDB / MySQL, bound by the guide's
/// `coded-mysql` blocks: owner and ad contracts approved ('A', the ledger's 2), a request
/// approved once its contract is signed in the ledger (long before its retry), a person's
/// rejection through the manual procedures ('X'); the business role's writes all succeed.
#[tokio::test]
async fn a_coded_schema_bound_by_the_guide_reaches_the_four_outcomes_in_its_own_codes_mysql() {
    let bound = bind_mysql().await;
    let (server, _client, sim) = backends().await;
    sim.add_store(AD_STORE, true);
    sim.set_contract_status("DOC-3", ContractStatus::Pending);
    let mut child = bound.run(&server, &sim.base_url(), "coded-my-1");
    let log = capture_stderr(&mut child);
    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(std::sync::Mutex::new(vec![]));
    let writer = tokio::spawn(business_writes_mysql(
        bound.business.clone(),
        requests.clone(),
        stop.clone(),
    ));

    let owner = bound.insert(1, "Y", "DOC-1", None).await;
    let ad = bound.insert(2, "Y", "DOC-2", Some(AD_STORE)).await;
    let signed_later = bound.insert(1, "Y", "DOC-3", None).await;
    let for_a_person = bound.insert(1, "N", "DOC-4", None).await;
    requests
        .lock()
        .expect("ids")
        .extend([owner, ad, signed_later, for_a_person]);
    let child = std::sync::Mutex::new(child);
    let alive = || {
        if let Ok(Some(status)) = child.lock().expect("child").try_wait() {
            panic!("run exited ({status}): {}", log.lock().expect("log"));
        }
    };
    eventually("the owner and ad contracts approved ('A')", || async {
        alive();
        (bound.state_code(owner).await == "A" && bound.state_code(ad).await == "A").then_some(())
    })
    .await
    .expect("approved");
    assert_eq!(
        bound.sign_status("DOC-1").await,
        Some(2),
        "SIGNED as the ledger's 2"
    );
    eventually("DOC-3 synced as sent (1)", || async {
        alive();
        (bound.sign_status("DOC-3").await == Some(1)).then_some(())
    })
    .await
    .expect("synced");
    assert_eq!(bound.state_code(signed_later).await, "P");
    let signed_at = Instant::now();
    sqlx::query("UPDATE esign_doc SET sign_status = 2 WHERE doc_id = 'DOC-3'")
        .execute(&bound.business)
        .await
        .expect("the business signs");
    eventually(
        "the request approved after its contract is signed",
        || async {
            alive();
            (bound.state_code(signed_later).await == "A").then_some(())
        },
    )
    .await
    .expect("approved once signed");
    let took = signed_at.elapsed();
    eprintln!("approved {took:?} after its contract was signed");
    assert!(
        took < Duration::from_secs(120),
        "approved {took:?} after the signature"
    );

    // A person rejects the request whose documents are not released.
    let (token, refusal): (Option<i64>, Option<String>) =
        sqlx::query_as("CALL autoapproval_manual_claim(?, 'ann')")
            .bind(for_a_person)
            .fetch_one(&bound.owner)
            .await
            .expect("claim");
    let token = token.unwrap_or_else(|| panic!("claim refused: {refusal:?}"));
    let (decided, refusal): (bool, Option<String>) =
        sqlx::query_as("CALL autoapproval_manual_decide(?, 'ann', ?, 'REJECTED', 'no documents')")
            .bind(for_a_person)
            .bind(token)
            .fetch_one(&bound.owner)
            .await
            .expect("decide");
    assert!(decided, "{refusal:?}");
    assert_eq!(bound.state_code(for_a_person).await, "X");
    let decided_by: Option<String> =
        sqlx::query_scalar("SELECT decided_by FROM contract_application WHERE app_no = ?")
            .bind(for_a_person)
            .fetch_one(&bound.business)
            .await
            .expect("decided_by");
    assert_eq!(decided_by.as_deref(), Some("manual:ann"));

    stop.store(true, Ordering::Relaxed);
    let errors = writer.await.expect("the writer");
    assert_eq!(
        errors,
        Vec::<String>::new(),
        "the business side never fails"
    );
    let others: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM contract_application WHERE category = 7 AND state_code <> 'P'",
    )
    .fetch_one(&bound.business)
    .await
    .expect("the other type");
    assert_eq!(others, 0, "another type is left alone");
    let output = stop_on_sigterm(child.into_inner().expect("child"), Duration::from_secs(30)).await;
    let log = log.lock().expect("log").clone();
    assert!(output.status.success(), "{log}");
    assert!(
        !log.lines()
            .any(|l| l.contains("WARN") && l.contains("whole")),
        "{log}"
    );
    bound.finish().await;
}

/// On MySQL / MariaDB too, `run` stops at start-up, naming what, on a vocabulary `migrate` did
/// not store (our words here), and on a written column that is an expression of its view.
#[tokio::test]
async fn run_refuses_another_vocabulary_and_a_written_view_expression_mysql() {
    let bound = bind_mysql().await;
    let (server, _client, sim) = backends().await;
    let stops = |child: tokio::process::Child, what: &'static str| async move {
        let exited = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("{what}: run kept running"))
            .expect("output");
        assert!(!exited.status.success(), "{what}");
        String::from_utf8_lossy(&exited.stderr).to_string()
    };
    let stderr = stops(
        bound.run_with(&server, &sim.base_url(), "ours", None),
        "our words against the stored codes",
    )
    .await;
    let last = stderr.lines().last().unwrap_or_default().to_owned();
    eprintln!("{last}");
    assert!(
        last.contains("auto_approve_vocabulary")
            && last.contains("request_statuses.PENDING: 'PENDING' here, 'P' in the database"),
        "{stderr}"
    );

    // The business role maps status through a CASE: no longer a column we can write through.
    let database = &bound.databases[1];
    execute_mysql(
        &bound.business,
        "a CASE view",
        &format!(
            "CREATE OR REPLACE ALGORITHM = MERGE SQL SECURITY DEFINER VIEW {database}.autoapproval_request AS
             SELECT app_no AS id, category AS request_type,
                    CASE state_code WHEN 'P' THEN 'P' ELSE state_code END AS status,
                    queued_at AS sort_time, created_at, changed_at AS updated_at,
                    shop_name AS business_name, docs_ok_yn AS documents_released,
                    hold_yn AS operational_hold,
                    CASE WHEN menu_count > 0 THEN 'Y' ELSE 'N' END AS menu_registered,
                    CASE WHEN logo_path IS NOT NULL THEN 'Y' ELSE 'N' END AS logo_registered,
                    prev_ok_yn AS previous_step_approved, esign_doc_id AS econtract_ref,
                    ad_shop_no AS target_store_number, owner_no AS owner_number,
                    shop_no AS store_number, campaign_id, decided_at, decided_by
               FROM contract_application"
        ),
    )
    .await;
    let stderr = stops(
        bound.run(&server, &sim.base_url(), "case"),
        "a written column that is an expression",
    )
    .await;
    let last = stderr.lines().last().unwrap_or_default().to_owned();
    eprintln!("{last}");
    assert!(
        last.contains("autoapproval_request.status") && last.contains("expression"),
        "{stderr}"
    );
    bound.finish().await;
}
