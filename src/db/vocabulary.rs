//! The vocabulary in the database: `migrate` stores the one it was given in
//! `auto_approve_vocabulary`, for our routines (the manual functions, the
//! e-contract trigger) to speak the business's codes too; `run` refuses to
//! start when its own differs, and checks that the binding admits it.

use super::DbError;

interface! {
    /// Vocabulary: see the methods on [`Database`].
    trait VocabularyTable {
        /// Replaces the stored vocabulary with this store's (`migrate`, as
        /// the owner role).
        fn store_vocabulary(&self) -> Result<(), DbError>;
        /// The stored vocabulary as (kind, word, code) rows.
        fn stored_vocabulary(&self) -> Result<Vec<(String, String, String)>, DbError>;
        /// What in the binding cannot carry this store's vocabulary: a code
        /// the candidate index does not admit, a written column that is an
        /// expression of its view; each names the view, column or index.
        fn vocabulary_problems(&self) -> Result<Vec<String>, DbError>;
    }
}

impl super::Database {
    /// Stops start-up when the vocabulary `migrate` stored differs from this
    /// store's (naming each word), or when the binding cannot carry it.
    pub async fn check_vocabulary(&self) -> Result<(), DbError> {
        let differences = self
            .vocabulary()
            .differences(&self.stored_vocabulary().await?);
        if !differences.is_empty() {
            return Err(DbError::VocabularyMismatch {
                differences: differences.join("; "),
            });
        }
        let problems = self.vocabulary_problems().await?;
        if !problems.is_empty() {
            return Err(DbError::Binding {
                problems: problems.join("; "),
            });
        }
        Ok(())
    }
}

/// The columns we write, by view: none may be an expression of its view
/// (a `CASE`, a count), which the database cannot write through.
pub(super) const WRITTEN: &[(&str, &[&str])] = &[
    (
        "autoapproval_request",
        &[
            "status",
            "updated_at",
            "owner_number",
            "store_number",
            "campaign_id",
            "decided_at",
            "decided_by",
        ],
    ),
    (
        "autoapproval_econtract",
        &["contract_ref", "status", "synced_at"],
    ),
    (
        "autoapproval_request_memo",
        &["request_id", "created_at", "author", "message"],
    ),
];
