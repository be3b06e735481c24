//! The vocabulary as SQL: each statement is written once as a template with
//! the business's codes left as placeholders, and rendered when the store
//! connects, with the codes as literals (never parameters), so that the
//! planner proves the business's partial index predicate and reads the
//! candidate index in order. For our own words every statement renders to
//! the text it had before the vocabulary existed.
//!
//! Placeholders, `{NAME}` or `{NAME:argument}`:
//! `{OPEN}` / `{DECIDED}` the open / decided statuses as a literal list;
//! `{STATUS:W}`, `{TYPE:W}`, `{ECONTRACT:W}` the code of word W;
//! `{STATUS_WORD:e}`, `{TYPE_WORD:e}`, `{ECONTRACT_WORD:e}` the column `e`
//! read back as our word (a `CASE` over the codes; an unknown code as its
//! text); the same with `_AS` names the result after `e`'s column;
//! `{FLAG:e}` / `{FLAG_AS:e}` the flag column `e` as a boolean;
//! `{TYPE_PARAM:p}` / `{ECONTRACT_PARAM:p}` a parameter holding our word,
//! as the business's code.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::SqlSafeStr;

use crate::domain::RequestStatus;
use crate::vocabulary::{Code, Kind, Vocabulary};

/// The SQL dialect a template is rendered for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// MySQL 8 / MariaDB.
    Mysql,
}

/// A code as an SQL literal: an integer in decimal, text quoted with its
/// quotes doubled (the vocabulary admits none; this is the second line).
pub(crate) fn literal(code: &Code) -> String {
    match code {
        Code::Int(i) => i.to_string(),
        Code::Text(s) => format!("'{}'", s.replace('\'', "''")),
    }
}

/// A word as a text literal (ours are upper-case letters and `_`).
fn word(w: &str) -> String {
    format!("'{w}'")
}

/// Renders templates for one vocabulary and dialect.
#[derive(Clone, Debug)]
pub(crate) struct Codes {
    vocabulary: Arc<Vocabulary>,
    dialect: Dialect,
}

impl Codes {
    pub(crate) fn new(vocabulary: Arc<Vocabulary>, dialect: Dialect) -> Self {
        Self {
            vocabulary,
            dialect,
        }
    }

    /// The vocabulary rendered.
    pub(crate) fn vocabulary(&self) -> &Arc<Vocabulary> {
        &self.vocabulary
    }

    fn code(&self, kind: Kind, w: &str) -> Option<String> {
        self.vocabulary.code(kind, w).map(literal)
    }

    fn list(&self, statuses: [RequestStatus; 3]) -> String {
        statuses
            .iter()
            .map(|s| literal(self.vocabulary.status_code(*s)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `e` as text, for a code the vocabulary does not name.
    fn as_text(&self, e: &str) -> String {
        match self.dialect {
            Dialect::Postgres => format!("{e}::pg_catalog.text"),
            Dialect::Mysql => format!("CAST({e} AS CHAR)"),
        }
    }

    /// Whether every code of `kind` is our word itself.
    fn kind_is_ours(&self, kind: Kind) -> bool {
        kind.words()
            .iter()
            .all(|w| self.vocabulary.code(kind, w) == Some(&Code::Text((*w).to_owned())))
    }

    /// The column `e` of `kind` as our word.
    fn word_of(&self, kind: Kind, e: &str) -> String {
        if self.kind_is_ours(kind) {
            return e.to_owned();
        }
        let mut case = format!("CASE {e}");
        for w in kind.words() {
            if let Some(code) = self.code(kind, w) {
                case.push_str(&format!(" WHEN {code} THEN {}", word(w)));
            }
        }
        case.push_str(&format!(" ELSE {} END", self.as_text(e)));
        case
    }

    /// A parameter holding our word of `kind`, as the business's code.
    fn param_of(&self, kind: Kind, p: &str) -> String {
        if self.kind_is_ours(kind) {
            return p.to_owned();
        }
        let mut case = format!("CASE {p}");
        for w in kind.words() {
            if let Some(code) = self.code(kind, w) {
                case.push_str(&format!(" WHEN {} THEN {code}", word(w)));
            }
        }
        case.push_str(" END");
        case
    }

    fn flag(&self, e: &str) -> String {
        match (self.vocabulary.yes(), self.dialect) {
            (None, _) => e.to_owned(),
            (Some(yes), Dialect::Postgres) => {
                format!("({e} IS NOT DISTINCT FROM {})", literal(yes))
            }
            (Some(yes), Dialect::Mysql) => format!("({e} <=> {})", literal(yes)),
        }
    }

    /// `rendered` named after `e`'s column when it is not `e` itself.
    fn named(e: &str, rendered: String) -> String {
        if rendered == e {
            return rendered;
        }
        let column = e.rsplit('.').next().unwrap_or(e);
        format!("{rendered} AS {column}")
    }

    /// One placeholder's text, `None` for a name this renderer does not
    /// know (left as it was: `{table}` of a statement filled in later).
    fn placeholder(&self, name: &str, arg: Option<&str>) -> Option<String> {
        Some(match (name, arg) {
            ("OPEN", None) => self.list(RequestStatus::OPEN),
            ("DECIDED", None) => self.list([
                RequestStatus::Approved,
                RequestStatus::Rejected,
                RequestStatus::Canceled,
            ]),
            ("STATUS", Some(w)) => self.code(Kind::RequestStatus, w)?,
            ("TYPE", Some(w)) => self.code(Kind::RequestType, w)?,
            ("ECONTRACT", Some(w)) => self.code(Kind::EContractStatus, w)?,
            ("STATUS_WORD", Some(e)) => self.word_of(Kind::RequestStatus, e),
            ("TYPE_WORD", Some(e)) => self.word_of(Kind::RequestType, e),
            ("ECONTRACT_WORD", Some(e)) => self.word_of(Kind::EContractStatus, e),
            ("STATUS_AS", Some(e)) => Self::named(e, self.word_of(Kind::RequestStatus, e)),
            ("TYPE_AS", Some(e)) => Self::named(e, self.word_of(Kind::RequestType, e)),
            ("ECONTRACT_AS", Some(e)) => Self::named(e, self.word_of(Kind::EContractStatus, e)),
            ("FLAG", Some(e)) => self.flag(e),
            ("FLAG_AS", Some(e)) => Self::named(e, self.flag(e)),
            ("TYPE_PARAM", Some(p)) => self.param_of(Kind::RequestType, p),
            ("ECONTRACT_PARAM", Some(p)) => self.param_of(Kind::EContractStatus, p),
            _ => return None,
        })
    }

    /// `template` with every placeholder replaced.
    pub(crate) fn render(&self, template: &str) -> String {
        let mut out = String::with_capacity(template.len());
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let after = &rest[open + 1..];
            let Some(close) = after.find('}') else {
                out.push_str(&rest[open..]);
                return out;
            };
            let inner = &after[..close];
            let (name, arg) = match inner.split_once(':') {
                Some((n, a)) => (n, Some(a)),
                None => (inner, None),
            };
            match self.placeholder(name, arg) {
                Some(text) => out.push_str(&text),
                None => {
                    out.push('{');
                    out.push_str(inner);
                    out.push('}');
                }
            }
            rest = &after[close + 1..];
        }
        out.push_str(rest);
        out
    }
}

/// The statements of a backend rendered for its vocabulary, looked up by
/// their template.
#[derive(Clone, Debug)]
pub(crate) struct Statements {
    codes: Codes,
    rendered: Arc<HashMap<&'static str, sqlx::SqlStr>>,
}

impl Statements {
    /// Renders every template once.
    pub(crate) fn new(codes: Codes, templates: &[&'static str]) -> Self {
        let rendered = templates
            .iter()
            .map(|t| (*t, sqlx::AssertSqlSafe(codes.render(t)).into_sql_str()))
            .collect();
        Self {
            codes,
            rendered: Arc::new(rendered),
        }
    }

    /// The statement rendered from `template` (a shared string: cloning it
    /// is a reference count); a template not registered is rendered on the
    /// spot.
    pub(crate) fn get(&self, template: &'static str) -> sqlx::SqlStr {
        match self.rendered.get(template) {
            Some(sql) => sql.clone(),
            None => sqlx::AssertSqlSafe(self.codes.render(template)).into_sql_str(),
        }
    }

    /// The statement rendered from a registered `template`, as text.
    pub(crate) fn text(&self, template: &'static str) -> Option<&str> {
        self.rendered.get(template).map(sqlx::SqlStr::as_str)
    }

    /// What the statements were rendered with.
    pub(crate) fn codes(&self) -> &Codes {
        &self.codes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coded(dialect: Dialect) -> Codes {
        let v = Vocabulary::parse(
            "request_types: {OWNER_CONTRACT: 1, AD_CONTRACT: 2}
request_statuses: {ING: I, PENDING: P, RETRY: R, APPROVED: A, REJECTED: X, CANCELED: C}
econtract_statuses: {PENDING: 1, SIGNED: 2, REJECTED: 3}
flags: {yes: Y}",
        )
        .unwrap();
        Codes::new(Arc::new(v), dialect)
    }

    fn ours(dialect: Dialect) -> Codes {
        Codes::new(Arc::new(Vocabulary::default()), dialect)
    }

    /// Each placeholder, for our words and for codes, on both dialects.
    #[test]
    fn placeholders_render_by_table() {
        let table: &[(&str, &str, &str, &str)] = &[
            // template, ours, coded PostgreSQL, coded MySQL
            (
                "{OPEN}",
                "'ING', 'PENDING', 'RETRY'",
                "'I', 'P', 'R'",
                "'I', 'P', 'R'",
            ),
            (
                "{DECIDED}",
                "'APPROVED', 'REJECTED', 'CANCELED'",
                "'A', 'X', 'C'",
                "'A', 'X', 'C'",
            ),
            ("{STATUS:APPROVED}", "'APPROVED'", "'A'", "'A'"),
            ("{TYPE:AD_CONTRACT}", "'AD_CONTRACT'", "2", "2"),
            ("{ECONTRACT:SIGNED}", "'SIGNED'", "2", "2"),
            (
                "{STATUS_WORD:r.status}",
                "r.status",
                "CASE r.status WHEN 'I' THEN 'ING' WHEN 'P' THEN 'PENDING' WHEN 'R' THEN 'RETRY' WHEN 'A' THEN 'APPROVED' WHEN 'X' THEN 'REJECTED' WHEN 'C' THEN 'CANCELED' ELSE r.status::pg_catalog.text END",
                "CASE r.status WHEN 'I' THEN 'ING' WHEN 'P' THEN 'PENDING' WHEN 'R' THEN 'RETRY' WHEN 'A' THEN 'APPROVED' WHEN 'X' THEN 'REJECTED' WHEN 'C' THEN 'CANCELED' ELSE CAST(r.status AS CHAR) END",
            ),
            (
                "{TYPE_AS:r.request_type}",
                "r.request_type",
                "CASE r.request_type WHEN 1 THEN 'OWNER_CONTRACT' WHEN 2 THEN 'AD_CONTRACT' ELSE r.request_type::pg_catalog.text END AS request_type",
                "CASE r.request_type WHEN 1 THEN 'OWNER_CONTRACT' WHEN 2 THEN 'AD_CONTRACT' ELSE CAST(r.request_type AS CHAR) END AS request_type",
            ),
            (
                "{FLAG:menu_registered}",
                "menu_registered",
                "(menu_registered IS NOT DISTINCT FROM 'Y')",
                "(menu_registered <=> 'Y')",
            ),
            (
                "{FLAG_AS:r.menu_registered}",
                "r.menu_registered",
                "(r.menu_registered IS NOT DISTINCT FROM 'Y') AS menu_registered",
                "(r.menu_registered <=> 'Y') AS menu_registered",
            ),
            (
                "{TYPE_PARAM:$8}",
                "$8",
                "CASE $8 WHEN 'OWNER_CONTRACT' THEN 1 WHEN 'AD_CONTRACT' THEN 2 END",
                "CASE $8 WHEN 'OWNER_CONTRACT' THEN 1 WHEN 'AD_CONTRACT' THEN 2 END",
            ),
            (
                "{ECONTRACT_PARAM:$2}",
                "$2",
                "CASE $2 WHEN 'PENDING' THEN 1 WHEN 'SIGNED' THEN 2 WHEN 'REJECTED' THEN 3 END",
                "CASE $2 WHEN 'PENDING' THEN 1 WHEN 'SIGNED' THEN 2 WHEN 'REJECTED' THEN 3 END",
            ),
            (
                "x = {table}.id",
                "x = {table}.id",
                "x = {table}.id",
                "x = {table}.id",
            ),
            (
                "{STATUS:NOPE}",
                "{STATUS:NOPE}",
                "{STATUS:NOPE}",
                "{STATUS:NOPE}",
            ),
        ];
        for (template, mine, pg, my) in table {
            assert_eq!(
                ours(Dialect::Postgres).render(template),
                *mine,
                "{template}"
            );
            assert_eq!(ours(Dialect::Mysql).render(template), *mine, "{template}");
            assert_eq!(coded(Dialect::Postgres).render(template), *pg, "{template}");
            assert_eq!(coded(Dialect::Mysql).render(template), *my, "{template}");
        }
    }

    /// A quote in a code can never end its literal (the vocabulary refuses
    /// it first; the literal doubles it all the same).
    #[test]
    fn a_quote_is_doubled_in_a_literal() {
        assert_eq!(literal(&Code::Text("a'b".into())), "'a''b'");
        assert_eq!(literal(&Code::Int(-3)), "-3");
    }
}
