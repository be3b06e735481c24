//! What the benchmarks share: a fresh database per run, and a client of the
//! test API server with the CRD installed.

use autoapproval::controller::crd::AutoApproval;
use autoapproval::db::Database;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::api::{Api, PostParams};
use kube_testserver::TestServer;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// A migrated database `name` created afresh beside `base`'s: the admin
/// pool (to drop it later) and a pool of `connections` on the new one.
pub async fn fresh_database(
    base: &str,
    name: &str,
    connections: u32,
) -> Result<(PgPool, PgPool), Error> {
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(base)
        .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&admin)
    .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await?;
    let url = match base.rsplit_once('/') {
        Some((prefix, _)) => format!("{prefix}/{name}"),
        None => return Err("DATABASE_URL has no database part".into()),
    };
    let pool = PgPoolOptions::new()
        .max_connections(connections)
        .connect(&url)
        .await?;
    Database::postgres(pool.clone(), pool.clone())
        .migrate(true)
        .await?;
    Ok((admin, pool))
}

/// Closes `pool` and drops its database.
pub async fn drop_database(admin: &PgPool, pool: PgPool, name: &str) -> Result<(), Error> {
    pool.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(admin)
    .await?;
    Ok(())
}

/// A client of the test API server, namespace `default`.
pub fn client(server: &TestServer) -> Result<kube::Client, Error> {
    let mut config = kube::Config::new(server.url().parse()?);
    config.default_namespace = "default".into();
    Ok(kube::Client::try_from(config)?)
}

/// Installs the AutoApproval CRD.
pub async fn install_crd(client: &kube::Client) -> Result<(), Error> {
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &AutoApproval::crd())
        .await?;
    Ok(())
}
