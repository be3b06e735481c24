//! The vocabulary in the database, on PostgreSQL: `auto_approve_vocabulary`
//! (migration 0007) and the start-up checks of the binding against it.

use sqlx::Row;

use super::schema::whole_reads;
use super::{PgStore, db};
use crate::db::DbError;
use crate::db::codes::literal;
use crate::db::vocabulary::{VocabularyTable, WRITTEN};
use crate::domain::{RequestStatus, RequestType};

// The written columns the database cannot update through their view,
// INSTEAD OF triggers counted (pg_column_is_updatable's third argument).
const NOT_UPDATABLE: &str = "
SELECT w.view, w.col
  FROM unnest($1::text[], $2::text[]) AS w(view, col)
  JOIN pg_catalog.pg_attribute a
    ON a.attrelid = pg_catalog.to_regclass(w.view) AND a.attname = w.col::pg_catalog.name
 WHERE NOT pg_catalog.pg_column_is_updatable(a.attrelid, a.attnum, true)
 ORDER BY w.view, a.attnum";

impl VocabularyTable for PgStore {
    async fn store_vocabulary(&self) -> Result<(), DbError> {
        let rows = self.statements.codes().vocabulary().rows();
        let column = |i: usize| -> Vec<String> {
            rows.iter()
                .map(|r| match i {
                    0 => r.0.to_owned(),
                    1 => r.1.to_owned(),
                    _ => r.2.clone(),
                })
                .collect()
        };
        let mut tx = self.begin("storing the vocabulary").await?;
        sqlx::query("DELETE FROM auto_approve_vocabulary")
            .execute(&mut *tx)
            .await
            .map_err(db("storing the vocabulary"))?;
        sqlx::query(
            "INSERT INTO auto_approve_vocabulary (kind, word, code)
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[])",
        )
        .bind(column(0))
        .bind(column(1))
        .bind(column(2))
        .execute(&mut *tx)
        .await
        .map_err(db("storing the vocabulary"))?;
        tx.commit().await.map_err(db("storing the vocabulary"))
    }

    async fn stored_vocabulary(&self) -> Result<Vec<(String, String, String)>, DbError> {
        sqlx::query_as("SELECT kind, word, code FROM auto_approve_vocabulary ORDER BY kind, word")
            .fetch_all(&self.primary)
            .await
            .map_err(db("reading auto_approve_vocabulary"))
    }

    async fn vocabulary_problems(&self) -> Result<Vec<String>, DbError> {
        let mut problems = self.written_expressions().await?;
        if !self.statements.codes().vocabulary().is_ours() {
            problems.extend(self.codes_the_index_refuses().await?);
        }
        Ok(problems)
    }
}

impl PgStore {
    /// Each written column that is an expression of its view, by name.
    async fn written_expressions(&self) -> Result<Vec<String>, DbError> {
        let (views, columns): (Vec<&str>, Vec<&str>) = WRITTEN
            .iter()
            .flat_map(|(view, columns)| columns.iter().map(move |c| (*view, *c)))
            .unzip();
        let rows: Vec<(String, String)> = sqlx::query_as(NOT_UPDATABLE)
            .bind(views)
            .bind(columns)
            .fetch_all(&self.primary)
            .await
            .map_err(db("checking the views' written columns"))?;
        Ok(rows
            .into_iter()
            .map(|(view, column)| {
                format!(
                    "{view}.{column} is written by the controller but is an expression of the \
                     view, which the database cannot write through: map it to a column of your \
                     table as it is (a code of yours goes in --vocabulary, not in a CASE)"
                )
            })
            .collect())
    }

    /// Each (type, open status) pair of codes the candidate index cannot
    /// read as one range: a partial index whose predicate leaves a code
    /// out, an index on other columns, or a code of the wrong type for its
    /// column. Asked of the planner with sequential scans off, on the
    /// read pool, as the candidate query runs.
    async fn codes_the_index_refuses(&self) -> Result<Vec<String>, DbError> {
        let vocabulary = self.statements.codes().vocabulary().clone();
        let mut problems = Vec::new();
        for request_type in RequestType::AUTO_APPROVABLE {
            let Some(type_code) = vocabulary.type_code(request_type) else {
                continue;
            };
            for status in RequestStatus::OPEN {
                let status_code = vocabulary.status_code(status);
                let named = format!(
                    "request_types.{} {} with request_statuses.{} {}",
                    request_type.as_str(),
                    literal(type_code),
                    status.as_str(),
                    literal(status_code)
                );
                let sql = format!(
                    "EXPLAIN (FORMAT JSON) SELECT r.id FROM autoapproval_request r
                      WHERE r.request_type = {} AND r.status IN ({}) AND r.status = {}
                      ORDER BY r.status, r.sort_time LIMIT 1",
                    literal(type_code),
                    self.statements.codes().render("{OPEN}"),
                    literal(status_code)
                );
                let mut tx = self.read.begin().await.map_err(db("checking the codes"))?;
                sqlx::query("SET LOCAL enable_seqscan = off")
                    .execute(&mut *tx)
                    .await
                    .map_err(db("checking the codes"))?;
                let plan = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .fetch_one(&mut *tx)
                    .await;
                let plan: serde_json::Value = match plan.and_then(|row| row.try_get(0)) {
                    Ok(plan) => plan,
                    Err(sqlx::Error::Database(e)) => {
                        problems.push(format!(
                            "{named}: the database refuses the code ({}); give codes of the \
                             column's type (--vocabulary)",
                            e.message()
                        ));
                        continue;
                    }
                    Err(e) => return Err(db("checking the codes")(e)),
                };
                for table in whole_reads(&plan) {
                    problems.push(format!(
                        "{named}: no index of table {table} reads these codes as a range: the \
                         candidate index (<type column>, <status column>, <sort column>) must \
                         admit every open status code (a partial index's WHERE lists them: \
                         <status column> IN ({})), or a code in --vocabulary is wrong",
                        self.statements.codes().render("{OPEN}")
                    ));
                }
            }
        }
        problems.dedup();
        Ok(problems)
    }
}
