//! `autoapproval request`: one request as an operator sees it, and the
//! actions an operator takes on it; `autoapproval pause --all` and `resume
//! --all`: the fleet's brake. All through the database (for people who
//! have a database role and no kubectl access to the namespace).

use std::fmt::Write as _;

use chrono::{DateTime, SecondsFormat, Utc};

use crate::db::{Database, DatabaseArgs, DbError, FleetPause, Memo, Pause};
use crate::domain::{Request, State, StateStatus};

/// Arguments of `autoapproval request`.
#[derive(clap::Args, Debug)]
pub struct RequestArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: RequestAction,
    /// The database (the primary).
    #[command(flatten)]
    pub database: DatabaseArgs,
}

/// What `autoapproval request` does.
#[derive(clap::Subcommand, Debug)]
pub enum RequestAction {
    /// Print the request's facts, its auto-approval state, its pause and its latest history.
    Show {
        /// The request id.
        id: i64,
    },
    /// Print the request's whole history.
    History {
        /// The request id.
        id: i64,
    },
    /// Make a waiting request due now (an exhausted one gets one more attempt).
    Retry {
        /// The request id.
        id: i64,
        /// Who asks, for the memo [default: $USER, else "operator"].
        #[arg(long = "as")]
        who: Option<String>,
        /// The retry limit the replicas run with (--retry-limit of run).
        #[arg(long, env = "AUTOAPPROVAL_RETRY_LIMIT", default_value_t = crate::domain::DEFAULT_RETRY_LIMIT)]
        retry_limit: i32,
    },
    /// Pause the request: no replica claims it until it is resumed.
    Pause {
        /// The request id.
        id: i64,
        /// Who pauses, for the record [default: $USER, else "operator"].
        #[arg(long = "as")]
        who: Option<String>,
    },
    /// End a pause set with `autoapproval request pause`.
    Resume {
        /// The request id.
        id: i64,
    },
}

/// Arguments of `autoapproval pause`.
#[derive(clap::Args, Debug)]
pub struct PauseArgs {
    /// Pause the whole fleet: no replica claims anything until `autoapproval resume --all`, the
    /// chains already running finish, manual claims go on (required; one request is paused with
    /// `autoapproval request pause ID`).
    #[arg(long, required = true)]
    pub all: bool,
    /// Why, for the record: shown by the controller's log, the CRs it holds back and
    /// `autoapproval request show` [default: none].
    #[arg(long)]
    pub reason: Option<String>,
    /// Who pauses, for the record [default: $USER, else "operator"].
    #[arg(long = "as")]
    pub who: Option<String>,
    /// The database (the primary).
    #[command(flatten)]
    pub database: DatabaseArgs,
}

/// Arguments of `autoapproval resume`.
#[derive(clap::Args, Debug)]
pub struct ResumeArgs {
    /// End the fleet's pause: every replica claims again at its next poll (required; one request
    /// is resumed with `autoapproval request resume ID`).
    #[arg(long, required = true)]
    pub all: bool,
    /// Who resumes, for the log line [default: $USER, else "operator"].
    #[arg(long = "as")]
    pub who: Option<String>,
    /// The database (the primary).
    #[command(flatten)]
    pub database: DatabaseArgs,
}

/// Runs `autoapproval pause --all`, through `autoapproval_pause_fleet`
/// (the function people are granted), returning what to print.
pub async fn pause_fleet(args: &PauseArgs) -> Result<String, RequestError> {
    let store = Database::connect(&args.database, None).await?;
    let who = person(&args.who);
    let reason = args.reason.as_deref().filter(|r| !r.trim().is_empty());
    store
        .pause_fleet(&who, reason)
        .await?
        .map_err(RequestError::Refused)?;
    let why = reason.map_or_else(String::new, |r| format!(": {r}"));
    Ok(format!(
        "fleet paused by {who}{why}\nno replica claims anything from now on; the chains already \
         running finish. `autoapproval resume --all` resumes.\n"
    ))
}

/// Runs `autoapproval resume --all`, through `autoapproval_resume_fleet`
/// (the function people are granted).
pub async fn resume_fleet(args: &ResumeArgs) -> Result<String, RequestError> {
    let store = Database::connect(&args.database, None).await?;
    let who = person(&args.who);
    store
        .resume_fleet(&who)
        .await?
        .map_err(RequestError::Refused)?;
    Ok(format!(
        "fleet resumed by {who}: every replica claims again at its next poll\n"
    ))
}

/// Why an action was refused; the message names the request.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The database failed.
    #[error(transparent)]
    Database(#[from] DbError),
    /// The action cannot be done, and why.
    #[error("{0}")]
    Refused(String),
}

/// How many history entries `show` prints.
const SHOWN_HISTORY: usize = 5;

/// Runs `autoapproval request …`, returning what to print.
pub async fn run(args: &RequestArgs) -> Result<String, RequestError> {
    let store = Database::connect(&args.database, None).await?;
    match &args.action {
        RequestAction::Show { id } => show(&store, *id).await,
        RequestAction::History { id } => {
            let request = existing(&store, *id).await?;
            let history = store.history(request.id).await?;
            let mut out = format!("request {id}: {} entries\n", history.len());
            write_history(&mut out, &history);
            Ok(out)
        }
        RequestAction::Retry {
            id,
            who,
            retry_limit,
        } => retry(&store, *id, &person(who), *retry_limit).await,
        RequestAction::Pause { id, who } => pause(&store, *id, &person(who)).await,
        RequestAction::Resume { id } => resume(&store, *id).await,
    }
}

fn person(who: &Option<String>) -> String {
    who.clone()
        .or_else(|| std::env::var("USER").ok())
        .filter(|w| !w.is_empty())
        .unwrap_or_else(|| "operator".into())
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

async fn existing(store: &Database, id: i64) -> Result<Request, RequestError> {
    store
        .request(id)
        .await?
        .ok_or_else(|| RequestError::Refused(format!("request {id} does not exist")))
}

async fn show(store: &Database, id: i64) -> Result<String, RequestError> {
    let r = existing(store, id).await?;
    let state = store.state(id).await?;
    let pause = store.pause_of(id).await?;
    let history = store.history(id).await?;
    let mut out = String::new();
    let yes_no = |b: bool, yes: &str, no: &str| if b { yes.to_owned() } else { no.to_owned() };
    let _ = writeln!(
        out,
        "request {id}: {} {}, {:?}, created {}",
        r.request_type,
        r.status,
        r.business_name,
        time(r.created_at)
    );
    if let Some(by) = &r.decided_by {
        let _ = writeln!(out, "  decided by {by}");
    }
    let _ = writeln!(
        out,
        "  facts: {}, {}, {}, {}, e-contract {}, target store {}",
        yes_no(
            r.documents_released,
            "documents released",
            "documents in review"
        ),
        yes_no(r.operational_hold, "operational hold", "no hold"),
        yes_no(
            r.menu_registered && r.logo_registered,
            "menu and logo registered",
            "menu or logo missing"
        ),
        yes_no(
            r.previous_step_approved,
            "previous step approved",
            "previous step open"
        ),
        r.econtract_ref.as_deref().unwrap_or("none"),
        r.target_store_number
            .map_or_else(|| "none".into(), |n| n.to_string()),
    );
    let _ = writeln!(
        out,
        "  results: owner {}, store {}, campaign {}",
        r.owner_number.map_or_else(|| "-".into(), |n| n.to_string()),
        r.store_number.map_or_else(|| "-".into(), |n| n.to_string()),
        r.campaign_id.as_deref().unwrap_or("-"),
    );
    match &state {
        None => {
            let _ = writeln!(out, "auto-approval: no state (not tried yet, or finished)");
        }
        Some(s) => write_state(&mut out, s),
    }
    match &pause {
        None => out.push_str("paused: no\n"),
        Some(p) => write_pause(&mut out, p),
    }
    write_fleet(&mut out, store.fleet_pause().await?.as_ref());
    let shown = history.len().saturating_sub(SHOWN_HISTORY);
    let _ = writeln!(
        out,
        "history ({} of {}; `autoapproval request history {id}` for all):",
        history.len() - shown,
        history.len()
    );
    write_history(&mut out, &history[shown..]);
    Ok(out)
}

fn write_state(out: &mut String, s: &State) {
    let _ = write!(
        out,
        "auto-approval: {} at step {}, {} retries",
        s.status.as_str(),
        s.step.as_deref().unwrap_or("-"),
        s.retry_count
    );
    if let (StateStatus::RetryWaiting, Some(due)) = (s.status, s.next_retry_time) {
        let _ = write!(out, ", due {}", time(due));
    }
    let _ = writeln!(
        out,
        "\n  holder: {} (token {}), last write {}",
        s.holder,
        s.fencing_token,
        time(s.modified_at)
    );
    if let Some(reason) = &s.last_reason {
        let _ = writeln!(out, "  reason: {reason}");
    }
}

fn write_pause(out: &mut String, p: &Pause) {
    let _ = writeln!(
        out,
        "paused: by {} since {}",
        p.paused_by,
        time(p.paused_at)
    );
}

fn write_fleet(out: &mut String, fleet: Option<&FleetPause>) {
    match fleet {
        None => out.push_str("fleet: running\n"),
        Some(p) => {
            let _ = writeln!(
                out,
                "{} (nothing is claimed; `autoapproval resume --all`)",
                p.describe()
            );
        }
    }
}

fn write_history(out: &mut String, history: &[Memo]) {
    for m in history {
        let _ = writeln!(out, "  {} {}: {}", time(m.created_at), m.author, m.message);
    }
}

async fn retry(
    store: &Database,
    id: i64,
    who: &str,
    retry_limit: i32,
) -> Result<String, RequestError> {
    let r = existing(store, id).await?;
    if !r.status.is_open() {
        return Err(RequestError::Refused(format!(
            "request {id} is already {}",
            r.status
        )));
    }
    let note = format!("retry requested by {who} (autoapproval request retry)");
    if store.retry_now(id, retry_limit, &note, Utc::now()).await? {
        return Ok(format!(
            "request {id} is due now; a replica will claim it at its next turn\n"
        ));
    }
    Err(RequestError::Refused(match store.state(id).await? {
        None => format!("request {id} has no waiting retry: it was not tried yet"),
        Some(s) if s.holder.starts_with("manual:") => {
            format!(
                "request {id} is claimed by {}",
                &s.holder["manual:".len()..]
            )
        }
        Some(s) => format!(
            "auto-approval is running request {id} (step {}, replica {})",
            s.step.as_deref().unwrap_or("-"),
            s.holder
        ),
    }))
}

async fn pause(store: &Database, id: i64, who: &str) -> Result<String, RequestError> {
    let r = existing(store, id).await?;
    if let Some(p) = store.pause_of(id).await? {
        return Err(RequestError::Refused(format!(
            "request {id} is already paused by {} since {}",
            p.paused_by,
            time(p.paused_at)
        )));
    }
    store
        .pause(r.id, &format!("{who} (autoapproval request pause)"), None)
        .await?;
    Ok(format!(
        "request {id} paused: no replica claims it until `autoapproval request resume {id}`\n"
    ))
}

async fn resume(store: &Database, id: i64) -> Result<String, RequestError> {
    existing(store, id).await?;
    match store.pause_of(id).await? {
        None => Err(RequestError::Refused(format!("request {id} is not paused"))),
        Some(p) if p.cr_uid.is_some() => Err(RequestError::Refused(format!(
            "request {id} was paused through its AutoApproval ({}): set spec.paused to false there",
            p.paused_by
        ))),
        Some(_) => {
            store.resume(id, None).await?;
            Ok(format!("request {id} resumed\n"))
        }
    }
}
