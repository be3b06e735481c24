//! The vocabulary on MySQL / MariaDB: our own words only in this version
//! (`MysqlStore::with_vocabulary` refuses codes), so there is nothing to
//! store and nothing that can differ.

use super::MysqlStore;
use crate::db::DbError;
use crate::db::vocabulary::VocabularyTable;

impl VocabularyTable for MysqlStore {
    async fn store_vocabulary(&self) -> Result<(), DbError> {
        Ok(())
    }

    async fn stored_vocabulary(&self) -> Result<Vec<(String, String, String)>, DbError> {
        Ok(self
            .statements
            .codes()
            .vocabulary()
            .rows()
            .into_iter()
            .map(|(k, w, c)| (k.to_owned(), w.to_owned(), c))
            .collect())
    }

    async fn vocabulary_problems(&self) -> Result<Vec<String>, DbError> {
        Ok(Vec::new())
    }
}
