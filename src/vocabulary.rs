//! The business's codes for our words: how its request types, request
//! statuses, e-contract statuses and yes/no flags are spelt in its own
//! columns, so that the binding's views stay plain column renames and the
//! controller's statements speak the business's codes (docs/INTEGRATING.md,
//! Bring your own codes). Loaded once from a file, checked before anything
//! is contacted; the SQL it becomes is rendered in `db::codes`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use crate::domain::ContractStatus;
use crate::domain::{RequestStatus, RequestType};

/// A code of the business's: a string or an integer, of a shape that is
/// safe to write as an SQL literal (checked when the file is read).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Code {
    /// A string code (`'P'`, `'OWNER_CONTRACT'`).
    Text(String),
    /// An integer code (`1`).
    Int(i64),
}

impl fmt::Display for Code {
    /// The code as the database shows it in text (`::text`, `CAST(… AS CHAR)`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Code::Text(s) => f.write_str(s),
            Code::Int(i) => write!(f, "{i}"),
        }
    }
}

/// One kind of word the vocabulary maps, with the file's key for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `request_types`: the two auto-approved types (every other code is another type).
    RequestType,
    /// `request_statuses`: the three open and three decided statuses.
    RequestStatus,
    /// `econtract_statuses`: what the ledger records from the e-sign system.
    EContractStatus,
    /// `flags`: the code meaning yes (everything else is no).
    Flag,
}

impl Kind {
    /// Every kind, in the file's order.
    pub const ALL: [Kind; 4] = [
        Kind::RequestType,
        Kind::RequestStatus,
        Kind::EContractStatus,
        Kind::Flag,
    ];

    /// The file's key, also the `kind` column of `auto_approve_vocabulary`.
    pub fn key(self) -> &'static str {
        match self {
            Kind::RequestType => "request_types",
            Kind::RequestStatus => "request_statuses",
            Kind::EContractStatus => "econtract_statuses",
            Kind::Flag => "flags",
        }
    }

    /// The words of this kind, each of which a section of the file must give.
    pub fn words(self) -> &'static [&'static str] {
        match self {
            Kind::RequestType => &["OWNER_CONTRACT", "AD_CONTRACT"],
            Kind::RequestStatus => &[
                "ING", "PENDING", "RETRY", "APPROVED", "REJECTED", "CANCELED",
            ],
            Kind::EContractStatus => &["PENDING", "SIGNED", "REJECTED"],
            Kind::Flag => &["yes"],
        }
    }
}

/// Why a vocabulary file was refused; each names the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum VocabularyError {
    /// The file could not be read.
    #[error("--vocabulary {path}: cannot read it: {source}")]
    Read {
        /// The file.
        path: String,
        /// The operating system's words.
        #[source]
        source: std::io::Error,
    },
    /// The file is not YAML (or JSON) of the documented shape.
    #[error("--vocabulary: {0}")]
    Parse(String),
    /// A key is missing, unknown, or its code is not allowed.
    #[error("--vocabulary: {key}: {message}")]
    Invalid {
        /// The key, as `request_statuses.PENDING`.
        key: String,
        /// What is wrong with it.
        message: String,
    },
}

/// The codes of the business for each of our words. The default is our own
/// words (types and statuses as text, flags as booleans): an existing
/// binding needs no file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vocabulary {
    /// (kind, word) → code; every word of the first three kinds is present,
    /// `(Flag, "yes")` only when the flags are coded.
    codes: BTreeMap<(Kind, &'static str), Code>,
}

impl Default for Vocabulary {
    fn default() -> Self {
        let mut codes = BTreeMap::new();
        for kind in [
            Kind::RequestType,
            Kind::RequestStatus,
            Kind::EContractStatus,
        ] {
            for word in kind.words() {
                codes.insert((kind, *word), Code::Text((*word).to_owned()));
            }
        }
        Self { codes }
    }
}

/// The longest text code accepted.
const MAX_TEXT: usize = 64;

impl Vocabulary {
    /// Reads and checks the file at `path` (YAML, or JSON, which YAML reads too).
    pub fn load(path: &Path) -> Result<Self, VocabularyError> {
        let text = std::fs::read_to_string(path).map_err(|source| VocabularyError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Checks a vocabulary given as text: every section present gives every
    /// word of its kind, no other key, codes distinct within a kind, all of
    /// one shape (text or integer) within a kind, text codes of letters,
    /// digits, `_ - . : /` and inner spaces only. A section left out keeps
    /// our words (flags: booleans).
    pub fn parse(text: &str) -> Result<Self, VocabularyError> {
        let root: serde_yaml::Value =
            serde_yaml::from_str(text).map_err(|e| VocabularyError::Parse(e.to_string()))?;
        let mut vocabulary = Self::default();
        if root.is_null() {
            return Ok(vocabulary);
        }
        let serde_yaml::Value::Mapping(root) = root else {
            return Err(VocabularyError::Parse(
                "the file must be a mapping of request_types, request_statuses, econtract_statuses, flags".into(),
            ));
        };
        for (key, section) in root {
            let key = key_text(&key, "")?;
            let kind = Kind::ALL
                .into_iter()
                .find(|k| k.key() == key)
                .ok_or_else(|| invalid(&key, "unknown section; the sections are request_types, request_statuses, econtract_statuses, flags"))?;
            let serde_yaml::Value::Mapping(section) = section else {
                return Err(invalid(&key, "must be a mapping of our word to your code"));
            };
            let mut given: BTreeMap<&'static str, Code> = BTreeMap::new();
            for (word, code) in section {
                let word = key_text(&word, kind.key())?;
                let at = format!("{}.{word}", kind.key());
                let word = kind.words().iter().find(|w| **w == word).ok_or_else(|| {
                    invalid(
                        &at,
                        &format!("unknown word; the words are {}", kind.words().join(", ")),
                    )
                })?;
                given.insert(word, code_of(&code, &at)?);
            }
            for word in kind.words() {
                if !given.contains_key(word) {
                    return Err(invalid(
                        &format!("{}.{word}", kind.key()),
                        "missing: a section gives every word of its kind",
                    ));
                }
            }
            let mut seen: BTreeMap<&Code, &str> = BTreeMap::new();
            for (word, code) in &given {
                if let Some(other) = seen.insert(code, word) {
                    return Err(invalid(
                        &format!("{}.{word}", kind.key()),
                        &format!(
                            "code {code} is also the code of {other}; codes differ within a kind"
                        ),
                    ));
                }
            }
            let texts = given
                .values()
                .filter(|c| matches!(c, Code::Text(_)))
                .count();
            if texts != 0 && texts != given.len() {
                return Err(invalid(
                    kind.key(),
                    "codes of one kind are all text or all integers, as the one column holding them",
                ));
            }
            for (word, code) in given {
                vocabulary.codes.insert((kind, word), code);
            }
        }
        Ok(vocabulary)
    }

    /// Whether every code is our own word and the flags are booleans.
    pub fn is_ours(&self) -> bool {
        *self == Self::default()
    }

    /// The code of a word of a kind; `None` for a word the kind lacks, or
    /// the flags' `yes` when the flags are booleans.
    pub fn code(&self, kind: Kind, word: &str) -> Option<&Code> {
        self.codes
            .iter()
            .find(|((k, w), _)| *k == kind && *w == word)
            .map(|(_, c)| c)
    }

    /// The code of an auto-approved type; `None` for the other ten.
    pub fn type_code(&self, request_type: RequestType) -> Option<&Code> {
        self.code(Kind::RequestType, request_type.as_str())
    }

    /// The code of a request status.
    pub fn status_code(&self, status: RequestStatus) -> &Code {
        self.code(Kind::RequestStatus, status.as_str())
            .unwrap_or(&UNREACHABLE)
    }

    /// The code of an e-contract status.
    pub fn econtract_code(&self, status: ContractStatus) -> &Code {
        self.code(Kind::EContractStatus, status.as_str())
            .unwrap_or(&UNREACHABLE)
    }

    /// The code meaning yes in a flag column; `None`: the flags are booleans.
    pub fn yes(&self) -> Option<&Code> {
        self.code(Kind::Flag, "yes")
    }

    /// Every (kind, word, code) in order, as `auto_approve_vocabulary` holds them.
    pub fn rows(&self) -> Vec<(&'static str, &'static str, String)> {
        self.codes
            .iter()
            .map(|((kind, word), code)| (kind.key(), *word, code.to_string()))
            .collect()
    }

    /// The words whose code differs between this vocabulary and the rows
    /// `migrate` stored (kind, word, code), as `request_statuses.PENDING: P
    /// here, PENDING in the database`; empty when they agree.
    pub fn differences(&self, stored: &[(String, String, String)]) -> Vec<String> {
        let mine: BTreeMap<(String, String), String> = self
            .rows()
            .into_iter()
            .map(|(k, w, c)| ((k.to_owned(), w.to_owned()), c))
            .collect();
        let theirs: BTreeMap<(String, String), String> = stored
            .iter()
            .map(|(k, w, c)| ((k.clone(), w.clone()), c.clone()))
            .collect();
        let mut keys: Vec<&(String, String)> = mine.keys().chain(theirs.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .filter(|key| mine.get(*key) != theirs.get(*key))
            .map(|key| {
                let show = |c: Option<&String>| c.map_or("none".to_owned(), |c| format!("'{c}'"));
                format!(
                    "{}.{}: {} here, {} in the database",
                    key.0,
                    key.1,
                    show(mine.get(key)),
                    show(theirs.get(key))
                )
            })
            .collect()
    }
}

/// Never returned: every status and e-contract word is in every vocabulary.
static UNREACHABLE: Code = Code::Int(i64::MIN);

fn invalid(key: &str, message: &str) -> VocabularyError {
    VocabularyError::Invalid {
        key: key.to_owned(),
        message: message.to_owned(),
    }
}

fn key_text(key: &serde_yaml::Value, section: &str) -> Result<String, VocabularyError> {
    match key {
        serde_yaml::Value::String(s) => Ok(s.clone()),
        other => Err(invalid(
            if section.is_empty() {
                "(top level)"
            } else {
                section
            },
            &format!("key {other:?} is not a word"),
        )),
    }
}

/// A code of safe shape, or a refusal naming `at`: codes become literals in
/// SQL text, so anything that could end a literal or hide in one is refused.
fn code_of(value: &serde_yaml::Value, at: &str) -> Result<Code, VocabularyError> {
    match value {
        serde_yaml::Value::Number(n) => n
            .as_i64()
            .map(Code::Int)
            .ok_or_else(|| invalid(at, "a number code must be an integer")),
        serde_yaml::Value::String(s) => {
            let safe =
                |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/' | ' ');
            if s.is_empty() || s.chars().count() > MAX_TEXT {
                Err(invalid(
                    at,
                    &format!("a text code has 1 to {MAX_TEXT} characters"),
                ))
            } else if !s.chars().all(safe) {
                Err(invalid(
                    at,
                    "a text code has letters, digits, `_ - . : /` and inner spaces only (no quote, backslash or control character)",
                ))
            } else if s.starts_with(' ') || s.ends_with(' ') {
                Err(invalid(
                    at,
                    "a text code neither starts nor ends with a space",
                ))
            } else {
                Ok(Code::Text(s.clone()))
            }
        }
        _ => Err(invalid(at, "a code is a string or an integer")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CODED: &str = "
request_types: {OWNER_CONTRACT: 1, AD_CONTRACT: 2}
request_statuses: {ING: I, PENDING: P, RETRY: R, APPROVED: A, REJECTED: X, CANCELED: C}
econtract_statuses: {PENDING: 1, SIGNED: 2, REJECTED: 3}
flags: {yes: Y}
";

    #[test]
    fn no_file_and_an_empty_file_are_our_words() {
        assert!(Vocabulary::default().is_ours());
        assert!(Vocabulary::parse("").unwrap().is_ours());
        assert_eq!(
            Vocabulary::default().status_code(RequestStatus::Pending),
            &Code::Text("PENDING".into())
        );
        assert_eq!(Vocabulary::default().yes(), None);
    }

    #[test]
    fn a_coded_file_gives_the_codes_of_each_word() {
        let v = Vocabulary::parse(CODED).unwrap();
        assert!(!v.is_ours());
        assert_eq!(v.type_code(RequestType::AdContract), Some(&Code::Int(2)));
        assert_eq!(v.type_code(RequestType::MenuChange), None);
        assert_eq!(
            v.status_code(RequestStatus::Canceled),
            &Code::Text("C".into())
        );
        assert_eq!(v.econtract_code(ContractStatus::Signed), &Code::Int(2));
        assert_eq!(v.yes(), Some(&Code::Text("Y".into())));
    }

    #[test]
    fn a_section_left_out_keeps_our_words() {
        let v = Vocabulary::parse("request_types: {OWNER_CONTRACT: 1, AD_CONTRACT: 2}").unwrap();
        assert_eq!(v.status_code(RequestStatus::Ing), &Code::Text("ING".into()));
        assert_eq!(v.yes(), None);
    }

    #[test]
    fn json_is_read_too() {
        let v = Vocabulary::parse(r#"{"flags": {"yes": 1}}"#).unwrap();
        assert_eq!(v.yes(), Some(&Code::Int(1)));
    }

    /// Each refusal names the key at fault; hostile codes never pass.
    #[test]
    fn refusals_name_the_key() {
        let statuses = |pending: &str| {
            format!(
                "request_statuses: {{ING: I, PENDING: {pending}, RETRY: R, APPROVED: A, REJECTED: X, CANCELED: C}}"
            )
        };
        let table: &[(String, &str)] = &[
            (
                statuses("\"P'; DROP TABLE imr; --\""),
                "request_statuses.PENDING",
            ),
            (statuses("\"P\\\\\""), "request_statuses.PENDING"),
            (statuses("\"P\\n\""), "request_statuses.PENDING"),
            (statuses("\"\""), "request_statuses.PENDING"),
            (statuses("\" P\""), "request_statuses.PENDING"),
            (statuses(&"P".repeat(65)), "request_statuses.PENDING"),
            (statuses("1.5"), "request_statuses.PENDING"),
            (statuses("true"), "request_statuses.PENDING"),
            (statuses("null"), "request_statuses.PENDING"),
            (statuses("[P]"), "request_statuses.PENDING"),
            (statuses("I"), "request_statuses.PENDING"),
            (statuses("7"), "request_statuses"),
            (
                "request_types: {OWNER_CONTRACT: 1}".into(),
                "request_types.AD_CONTRACT",
            ),
            (
                "request_types: {OWNER_CONTRACT: 1, AD_CONTRACT: 2, MENU_CHANGE: 3}".into(),
                "request_types.MENU_CHANGE",
            ),
            ("statuses: {}".into(), "statuses"),
            ("flags: Y".into(), "flags"),
        ];
        for (text, key) in table {
            match Vocabulary::parse(text) {
                Err(VocabularyError::Invalid { key: got, message }) => {
                    assert_eq!(&got, key, "{text}: {message}")
                }
                other => panic!("{text}: expected a refusal naming {key}, got {other:?}"),
            }
        }
        assert!(matches!(
            Vocabulary::parse("request_types: [1, 2]"),
            Err(VocabularyError::Invalid { .. })
        ));
        assert!(matches!(
            Vocabulary::parse("- 1"),
            Err(VocabularyError::Parse(_))
        ));
    }

    #[test]
    fn differences_name_each_word_that_differs() {
        let coded = Vocabulary::parse(CODED).unwrap();
        let stored: Vec<(String, String, String)> = Vocabulary::default()
            .rows()
            .into_iter()
            .map(|(k, w, c)| (k.into(), w.into(), c))
            .collect();
        assert!(Vocabulary::default().differences(&stored).is_empty());
        let diff = coded.differences(&stored);
        assert!(
            diff.contains(
                &"request_statuses.PENDING: 'P' here, 'PENDING' in the database".to_owned()
            ),
            "{diff:?}"
        );
        assert!(
            diff.contains(&"flags.yes: 'Y' here, none in the database".to_owned()),
            "{diff:?}"
        );
        assert_eq!(diff.len(), 2 + 6 + 3 + 1);
    }
}
