//! `autoapproval shadow-report`: what shadow mode would have done with each
//! request, beside what actually happened to it (approved or rejected by
//! the scheduler in place or a person, and when). [`Report::of`] is pure;
//! the command only reads the rows and prints.

use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

use crate::db::{Database, DatabaseArgs, DbError, ShadowOutcome};
use crate::domain::DECIDED_BY_US;

/// Arguments of `autoapproval shadow-report`.
#[derive(clap::Args, Debug)]
pub struct ShadowReportArgs {
    /// The requests first evaluated in shadow since then: a duration back from now (`7d`, `12h`) or an RFC 3339 time (`2026-12-07T09:00:00Z`).
    #[arg(long, default_value = "7d", value_parser = parse_since)]
    pub since: Since,
    /// The report's format.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// The database (the read replica serves the query when set).
    #[command(flatten)]
    pub database: DatabaseArgs,
}

/// Where the report starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Since {
    /// That long before now.
    Ago(Duration),
    /// At this time.
    At(DateTime<Utc>),
}

impl Since {
    /// The time it names, `now` being now.
    pub fn at(self, now: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            Since::Ago(d) => crate::clock::before(now, d),
            Since::At(at) => at,
        }
    }
}

/// `--since`: a duration, else an RFC 3339 time.
pub fn parse_since(input: &str) -> Result<Since, String> {
    if let Ok(d) = crate::flags::parse_duration(input) {
        return Ok(Since::Ago(d));
    }
    DateTime::parse_from_rfc3339(input.trim())
        .map(|at| Since::At(at.with_timezone(&Utc)))
        .map_err(|_| {
            format!("{input:?} is neither a duration (7d, 12h) nor an RFC 3339 time (2026-12-07T09:00:00Z)")
        })
}

/// The report's format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Lines for people.
    #[default]
    Text,
    /// One JSON object.
    Json,
}

/// A request where shadow and what happened disagree.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Disagreement {
    /// The request.
    pub request_id: i64,
    /// Its type.
    pub request_type: String,
    /// Who decided it (the binding's decided_by), if recorded.
    pub decided_by: Option<String>,
    /// When, if recorded.
    pub decided_at: Option<DateTime<Utc>>,
    /// When shadow would first have approved it, if it would have.
    pub would_approve_at: Option<DateTime<Utc>>,
    /// Shadow's latest step and reason.
    pub shadow_said: String,
}

/// How much sooner shadow would have approved what was approved.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Saved {
    /// Requests measured: would approve, approved, both times known.
    pub requests: usize,
    /// Median of decided_at − wouldApproveAt, in seconds (negative: the
    /// scheduler in place was faster).
    pub median_seconds: f64,
    /// The 99th percentile (nearest rank), in seconds.
    pub p99_seconds: f64,
}

/// The comparison, as `shadow-report` prints it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Requests first evaluated in shadow at or after this time.
    pub since: DateTime<Utc>,
    /// Requests evaluated.
    pub evaluated: usize,
    /// Of those, shadow would have approved.
    pub would_approve: usize,
    /// Of those, shadow held every time so far.
    pub would_hold: usize,
    /// Approved or rejected since by the scheduler in place or a person.
    pub decided: usize,
    /// Decided as shadow would have: approved where it would approve,
    /// rejected where it held.
    pub agreed: usize,
    /// agreed / decided; absent when nothing was decided.
    pub agreement_rate: Option<f64>,
    /// Would have approved, and a person rejected it: the dangerous kind.
    pub approved_but_rejected: Vec<Disagreement>,
    /// Held, and approved by the scheduler in place or a person.
    pub held_but_approved: Vec<Disagreement>,
    /// Still open: nothing to compare yet.
    pub undecided: usize,
    /// Canceled, or no longer in the request view: not compared.
    pub canceled_or_gone: usize,
    /// Approved by autoapproval itself (after a switch to active): not compared.
    pub approved_by_us: usize,
    /// The pickup time shadow would have saved on the requests approved.
    pub saved: Option<Saved>,
}

impl Report {
    /// Compares each row's would-decision with what happened to its request.
    pub fn of(since: DateTime<Utc>, rows: &[ShadowOutcome]) -> Report {
        let mut report = Report {
            since,
            evaluated: rows.len(),
            would_approve: 0,
            would_hold: 0,
            decided: 0,
            agreed: 0,
            agreement_rate: None,
            approved_but_rejected: Vec::new(),
            held_but_approved: Vec::new(),
            undecided: 0,
            canceled_or_gone: 0,
            approved_by_us: 0,
            saved: None,
        };
        let mut saved = Vec::new();
        for row in rows {
            let would_approve = row.would_approve_at.is_some();
            if would_approve {
                report.would_approve += 1;
            } else {
                report.would_hold += 1;
            }
            let disagreement = || Disagreement {
                request_id: row.request_id,
                request_type: row.request_type.clone(),
                decided_by: row.decided_by.clone(),
                decided_at: row.decided_at,
                would_approve_at: row.would_approve_at,
                shadow_said: format!("{}: {}", row.step, row.reason),
            };
            match row.status.as_deref() {
                Some("APPROVED") if row.decided_by.as_deref() == Some(DECIDED_BY_US) => {
                    report.approved_by_us += 1;
                }
                Some("APPROVED") => {
                    report.decided += 1;
                    if let Some(would) = row.would_approve_at {
                        report.agreed += 1;
                        if let Some(decided) = row.decided_at {
                            saved.push((decided - would).as_seconds_f64());
                        }
                    } else {
                        report.held_but_approved.push(disagreement());
                    }
                }
                Some("REJECTED") => {
                    report.decided += 1;
                    if would_approve {
                        report.approved_but_rejected.push(disagreement());
                    } else {
                        report.agreed += 1;
                    }
                }
                Some("CANCELED") | None => report.canceled_or_gone += 1,
                Some(_) => report.undecided += 1,
            }
        }
        if report.decided > 0 {
            report.agreement_rate = Some(report.agreed as f64 / report.decided as f64);
        }
        if !saved.is_empty() {
            saved.sort_by(f64::total_cmp);
            report.saved = Some(Saved {
                requests: saved.len(),
                median_seconds: percentile(&saved, 50.0),
                p99_seconds: percentile(&saved, 99.0),
            });
        }
        report
    }

    /// The report as lines for people.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let time = |t: DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Secs, true);
        let _ = writeln!(out, "shadow report since {}", time(self.since));
        let _ = writeln!(
            out,
            "evaluated {}: would approve {}, would hold {}",
            self.evaluated, self.would_approve, self.would_hold
        );
        let rate = self
            .agreement_rate
            .map_or_else(|| "-".to_owned(), |r| format!("{:.1}%", r * 100.0));
        let _ = writeln!(
            out,
            "decided since (by the scheduler in place or a person) {}: agreed {} ({rate})",
            self.decided, self.agreed
        );
        let _ = writeln!(
            out,
            "would approve, rejected (dangerous) {}: {}",
            self.approved_but_rejected.len(),
            ids(&self.approved_but_rejected)
        );
        let _ = writeln!(
            out,
            "would hold, approved {}: {}",
            self.held_but_approved.len(),
            ids(&self.held_but_approved)
        );
        let _ = writeln!(
            out,
            "undecided {}, canceled or gone {}, approved by autoapproval {}",
            self.undecided, self.canceled_or_gone, self.approved_by_us
        );
        match &self.saved {
            Some(saved) => {
                let _ = writeln!(
                    out,
                    "pickup time saved on {} approved: median {:.1}s, p99 {:.1}s",
                    saved.requests, saved.median_seconds, saved.p99_seconds
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "pickup time saved: - (nothing it would approve was approved yet)"
                );
            }
        }
        for d in &self.approved_but_rejected {
            let _ = writeln!(
                out,
                "  dangerous: request {} ({}) rejected by {} at {}; shadow would have approved at {}",
                d.request_id,
                d.request_type,
                d.decided_by.as_deref().unwrap_or("?"),
                d.decided_at.map_or_else(|| "?".to_owned(), time),
                d.would_approve_at.map_or_else(|| "?".to_owned(), time),
            );
        }
        for d in &self.held_but_approved {
            let _ = writeln!(
                out,
                "  missed: request {} ({}) approved by {} at {}; shadow held it ({})",
                d.request_id,
                d.request_type,
                d.decided_by.as_deref().unwrap_or("?"),
                d.decided_at.map_or_else(|| "?".to_owned(), time),
                d.shadow_said,
            );
        }
        out
    }
}

fn ids(list: &[Disagreement]) -> String {
    if list.is_empty() {
        return "-".to_owned();
    }
    list.iter()
        .map(|d| d.request_id.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The nearest-rank percentile `p` of sorted, non-empty `values`.
fn percentile(values: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

/// Why the report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ShadowReportError {
    /// The database failed.
    #[error(transparent)]
    Database(#[from] DbError),
    /// The report did not serialize.
    #[error("writing the report as JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Runs `autoapproval shadow-report`, returning what to print.
pub async fn run(args: &ShadowReportArgs) -> Result<String, ShadowReportError> {
    let store = Database::connect(&args.database, None).await?;
    let since = args.since.at(Utc::now());
    let rows = store.shadow_outcomes(since).await?;
    let report = Report::of(since, &rows);
    Ok(match args.output {
        Output::Text => report.text(),
        Output::Json => serde_json::to_string_pretty(&report)? + "\n",
    })
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn at(minute: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 7, 9, minute, 0)
            .single()
            .unwrap()
    }

    fn row(
        id: i64,
        would: Option<u32>,
        status: Option<&str>,
        decided: Option<(u32, &str)>,
    ) -> ShadowOutcome {
        ShadowOutcome {
            request_id: id,
            request_type: "OWNER_CONTRACT".into(),
            decision: if would.is_some() { "APPROVE" } else { "HOLD" }.into(),
            step: "owner".into(),
            reason: "documents not released".into(),
            first_seen_at: at(0),
            would_approve_at: would.map(at),
            status: status.map(Into::into),
            decided_at: decided.map(|(m, _)| at(m)),
            decided_by: decided.map(|(_, by)| by.into()),
        }
    }

    #[test]
    fn each_outcome_is_counted_where_the_report_says() {
        let rows = [
            row(1, Some(1), Some("APPROVED"), Some((4, "old-scheduler"))),
            row(2, Some(2), Some("APPROVED"), Some((12, "old-scheduler"))),
            row(3, Some(1), Some("REJECTED"), Some((5, "alice"))),
            row(4, None, Some("REJECTED"), Some((6, "bob"))),
            row(5, None, Some("APPROVED"), Some((7, "carol"))),
            row(6, None, Some("PENDING"), None),
            row(7, Some(1), Some("CANCELED"), Some((8, "dave"))),
            row(8, Some(1), Some("APPROVED"), Some((9, DECIDED_BY_US))),
            row(9, Some(1), None, None),
        ];
        let report = Report::of(at(0), &rows);
        assert_eq!(report.evaluated, 9);
        assert_eq!((report.would_approve, report.would_hold), (6, 3));
        assert_eq!((report.decided, report.agreed), (5, 3), "{report:?}");
        assert_eq!(report.agreement_rate, Some(0.6));
        let ids = |l: &[Disagreement]| l.iter().map(|d| d.request_id).collect::<Vec<_>>();
        assert_eq!(ids(&report.approved_but_rejected), [3], "the dangerous one");
        assert_eq!(
            report.approved_but_rejected[0].decided_by.as_deref(),
            Some("alice")
        );
        assert_eq!(ids(&report.held_but_approved), [5]);
        assert_eq!(
            (
                report.undecided,
                report.canceled_or_gone,
                report.approved_by_us
            ),
            (1, 2, 1)
        );
        // 3 min and 10 min sooner: median and p99 by nearest rank.
        let saved = report.saved.clone().expect("saved");
        assert_eq!(saved.requests, 2);
        assert_eq!((saved.median_seconds, saved.p99_seconds), (180.0, 600.0));
        let text = report.text();
        assert!(
            text.contains("would approve, rejected (dangerous) 1: 3"),
            "{text}"
        );
        assert!(text.contains("agreed 3 (60.0%)"), "{text}");
    }

    #[test]
    fn since_is_a_duration_or_a_time() {
        assert_eq!(
            parse_since("12h"),
            Ok(Since::Ago(Duration::from_secs(12 * 3600)))
        );
        assert_eq!(parse_since("2026-12-07T09:03:00Z"), Ok(Since::At(at(3))));
        assert!(parse_since("yesterday").unwrap_err().contains("yesterday"));
    }
}
