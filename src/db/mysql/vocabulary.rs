//! The vocabulary in the database, on MySQL / MariaDB:
//! `auto_approve_vocabulary` (migration 0006) and the start-up check that
//! nothing we write goes through an expression of its view.

use super::schema::column_behind;
use super::{MysqlStore, db};
use crate::db::DbError;
use crate::db::vocabulary::{VocabularyTable, WRITTEN};

/// SELECT command denied: the controller's account was not granted the
/// table (an install from before migration 0006 keeps its grants).
const SELECT_DENIED: u16 = 1142;

impl VocabularyTable for MysqlStore {
    async fn store_vocabulary(&self) -> Result<(), DbError> {
        let rows = self.statements.codes().vocabulary().rows();
        let mut tx = self.begin("storing the vocabulary").await?;
        sqlx::query("DELETE FROM auto_approve_vocabulary")
            .execute(&mut *tx)
            .await
            .map_err(db("storing the vocabulary"))?;
        for (kind, word, code) in rows {
            sqlx::query("INSERT INTO auto_approve_vocabulary (kind, word, code) VALUES (?, ?, ?)")
                .bind(kind)
                .bind(word)
                .bind(code)
                .execute(&mut *tx)
                .await
                .map_err(db("storing the vocabulary"))?;
        }
        tx.commit().await.map_err(db("storing the vocabulary"))
    }

    async fn stored_vocabulary(&self) -> Result<Vec<(String, String, String)>, DbError> {
        let rows = sqlx::query_as(
            "SELECT kind, word, code FROM auto_approve_vocabulary ORDER BY kind, word",
        )
        .fetch_all(&self.primary)
        .await;
        let vocabulary = self.statements.codes().vocabulary();
        match rows {
            Ok(rows) => Ok(rows),
            // Our own words need nothing stored: an account not granted the
            // table runs as before; codes need the grant, and say so.
            Err(sqlx::Error::Database(e))
                if e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                    .is_some_and(|e| e.number() == SELECT_DENIED) =>
            {
                if vocabulary.is_ours() {
                    return Ok(vocabulary
                        .rows()
                        .into_iter()
                        .map(|(k, w, c)| (k.to_owned(), w.to_owned(), c))
                        .collect());
                }
                Err(DbError::Binding {
                    problems: format!(
                        "--vocabulary is given but this account cannot read \
                         auto_approve_vocabulary, where `migrate` stored it ({}): GRANT SELECT ON \
                         <controller database>.auto_approve_vocabulary TO <this account> \
                         (docs/INTEGRATING.md, grants)",
                        e.message()
                    ),
                })
            }
            Err(e) => Err(db("reading auto_approve_vocabulary")(e)),
        }
    }

    async fn vocabulary_problems(&self) -> Result<Vec<String>, DbError> {
        self.written_expressions().await
    }
}

/// Column '…' is not updatable: an expression of its view.
const NOT_UPDATABLE: u16 = 1348;

impl MysqlStore {
    /// Whether the server refuses to update `view`.`column` because it is an
    /// expression; any other refusal (a grant) is left to the write probes.
    async fn not_updatable(&self, view: &str, column: &str) -> Result<bool, DbError> {
        let sql = format!("UPDATE {view} SET {column} = {column} WHERE 1 = 0");
        match sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&self.primary)
            .await
        {
            Ok(_) => Ok(false),
            Err(sqlx::Error::Database(e)) => Ok(e
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|e| e.number() == NOT_UPDATABLE)),
            Err(e) => Err(db("checking the views' written columns")(e)),
        }
    }

    /// Each written column that is an expression of its view, by name, read
    /// from the view's definition (information_schema.VIEWS) or, when this
    /// account may not see it, asked of the server.
    async fn written_expressions(&self) -> Result<Vec<String>, DbError> {
        const OPERATION: &str = "checking the views' written columns";
        let mut problems = Vec::new();
        for (view, columns) in WRITTEN {
            let definition: Option<(String, String)> = sqlx::query_as(
                "SELECT VIEW_DEFINITION, IS_UPDATABLE FROM information_schema.VIEWS
                  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
            )
            .bind(*view)
            .fetch_optional(&self.primary)
            .await
            .map_err(db(OPERATION))?;
            let Some((definition, updatable)) = definition else {
                continue;
            };
            if updatable.eq_ignore_ascii_case("NO") {
                problems.push(format!(
                    "{view} is written by the controller but the database cannot write through \
                     it (information_schema.VIEWS.IS_UPDATABLE is NO): make it a plain rename of \
                     one table's columns, without DISTINCT, GROUP BY, UNION or a join that \
                     hides the key (a code of yours goes in --vocabulary, not in a CASE)"
                ));
                continue;
            }
            for column in *columns {
                let expression = if definition.trim().is_empty() {
                    // The definition is shown to its definer and to SHOW VIEW
                    // only: the server is asked instead, by an update that
                    // matches no row (a column it cannot write is refused
                    // before any row is read, 1348). The memo's columns are
                    // only inserted: the write probes try that insert.
                    *view != "autoapproval_request_memo" && self.not_updatable(view, column).await?
                } else {
                    // A column missing from the view is the probes' to name.
                    let named = format!(" as `{column}`");
                    definition.to_ascii_lowercase().contains(&named)
                        && column_behind(&definition, column).is_none()
                };
                if expression {
                    problems.push(format!(
                        "{view}.{column} is written by the controller but is an expression of \
                         the view, which the database cannot write through: map it to a column \
                         of your table as it is (a code of yours goes in --vocabulary, not in a \
                         CASE)"
                    ));
                }
            }
        }
        Ok(problems)
    }
}
