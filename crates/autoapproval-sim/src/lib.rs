//! One HTTP server simulating the e-sign, owner, store and ad services for
//! the demo, the tests and the benchmarks, with latency, error, timeout and
//! malformed-answer injection and a count of every call.
//!
//! # The four systems (camelCase JSON, the shapes of `autoapproval::external::http::wire`)
//!
//! | endpoint | body | answer |
//! | --- | --- | --- |
//! | `GET /esign/contracts/{ref}` | | `{"contractRef": "c-1", "status": "SIGNED"}`; unknown refs get `--esign-default` |
//! | `POST /owners` | `{"requestId": 42, "businessName": "…"}` | `{"ownerNumber": 10001}` |
//! | `POST /stores` | `{"requestId": 42, "ownerNumber": 10001, "storeName": "…"}` | `{"storeNumber": 50001}`; the store is then known, open |
//! | `GET /stores/{n}` | | `{"storeNumber": 50001, "open": true}` or 404 |
//! | `POST /campaigns/approvals` | `{"requestId": 42, "storeNumber": 50001}` | `{"campaignId": "cmp-000001", "storeNumber": 50001}`; 422 if the store is unknown |
//! | `GET /owners?requestId=42` | | the latest `POST /owners` answer for request 42, or 404 |
//! | `GET /stores?requestId=42` | | the latest `POST /stores` answer for request 42, or 404 |
//! | `GET /campaigns/approvals?requestId=42` | | the latest approval's answer for request 42, or 404 |
//!
//! Mutations need an `Idempotency-Key` header (else 400): a key seen before
//! returns the first answer and creates nothing (an idempotent replay), also
//! under concurrent calls. A key seen before with another body is counted
//! (`keyConflicts`) and answered the same way, or, with `--strict-keys`,
//! refused with 422 as a strict downstream (a payment API) refuses it. With `--idempotency ignored` there is no such
//! support at all: the header is not read and every create call creates;
//! `duplicateCreations` in `/stats` counts what a caller made twice. With `--require-token`, calls without one of the
//! tokens as `Authorization: Bearer …` get 401. Errors are `{"error": "…"}`.
//!
//! Faults apply to these endpoints only: an injected error answers 500 before
//! any work, an injected refusal (`failNext` only) 422; an injected timeout does the work, hangs for `hang`, then
//! answers 504; an injected malformed answer does the work, then answers 200
//! with truncated JSON. The last two lose a mutation's answer, as a crash or
//! a dropped connection would, so they exercise idempotent retries.
//!
//! # Admin
//!
//! - `GET /stats` → [`Stats`]; `GET /healthz` → `ok`.
//! - `GET /admin/faults` → [`Faults`]; `PUT /admin/faults` with a `Faults`
//!   replaces them (400 on a rate outside [0, 1]).
//! - `PUT /admin/idempotency` `{"mode": "ignored"}` (or `"honoured"`) → 204.
//! - `PUT /admin/esign/{ref}` `{"status": "SIGNED"}` → 204.
//! - `PUT /admin/stores/{n}` `{"open": true}` → 204 (creates or updates).
//! - `PUT /admin/campaign-prefix` `{"prefix": "cmp-"}` → 204: what new campaign
//!   ids start with (a prefix a database refuses, such as a NUL byte, makes
//!   every save of the answer fail).
//! - `PUT /admin/refused-names` `{"names": ["Bad Name"]}` → 204: owners and
//!   stores with one of these names are refused from now on with 422 before
//!   anything is created (`namesRefused`), as a downstream refuses a name it
//!   does not accept; with `--strict-keys` a key refused so stays refused
//!   (its body again: 422; another body: a key conflict).
//! - `POST /admin/reset` → 204: no data, zero counters, start-up faults.
//!
//! # HTTPS
//!
//! With `--tls-cert-file` and `--tls-key-file` ([`SimTls`]) it serves HTTPS
//! instead, and with `--tls-client-ca-file` it requires a client certificate
//! signed by that CA. A TLS listener closes each connection after its answer,
//! so every call makes a new handshake against the certificate in force
//! ([`SimHandle::set_tls`] swaps it while serving, as a rotation does).
//! [`SimHandle::add_listener`] serves the same systems on another port with
//! TLS settings of its own (one system behind mTLS, say).

mod routes;
mod state;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use autoapproval::external::ContractStatus;
use autoapproval::external::http::Secret;
use autoapproval::flags::parse_duration;
use autoapproval::shutdown::Termination;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::info;

pub use state::{
    Creations, FailNext, FaultCounts, FaultKind, Faults, Idempotency, PerSystem, RequestCreations,
    SimSystem, Stats, TRACED_CALLS_KEPT, TracedCall,
};
pub use tls::SimTls;

// === impl SimArgs ===

/// Runs the simulator of the four external systems: where it listens, which faults it injects.
#[derive(clap::Args, Clone, Debug)]
pub struct SimArgs {
    /// Address to listen on.
    #[arg(
        long,
        env = "AUTOAPPROVAL_SIM_LISTEN",
        default_value = "127.0.0.1:8090"
    )]
    pub listen: SocketAddr,
    /// Fixed latency added to every call (e.g. 20ms).
    #[arg(long, env = "AUTOAPPROVAL_SIM_LATENCY", default_value = "0ms", value_parser = parse_duration)]
    pub latency: Duration,
    /// Up to this much more latency, drawn uniformly per call.
    #[arg(long, env = "AUTOAPPROVAL_SIM_LATENCY_JITTER", default_value = "0ms", value_parser = parse_duration)]
    pub latency_jitter: Duration,
    /// Fraction of calls answered 500, in [0, 1].
    #[arg(long, env = "AUTOAPPROVAL_SIM_ERROR_RATE", default_value_t = 0.0)]
    pub error_rate: f64,
    /// Fraction of calls that hang for --hang, then answer 504, in [0, 1].
    #[arg(long, env = "AUTOAPPROVAL_SIM_TIMEOUT_RATE", default_value_t = 0.0)]
    pub timeout_rate: f64,
    /// How long a call picked by --timeout-rate hangs.
    #[arg(long, env = "AUTOAPPROVAL_SIM_HANG", default_value = "30s", value_parser = parse_duration)]
    pub hang: Duration,
    /// Fraction of calls answered 200 with malformed JSON, in [0, 1].
    #[arg(long, env = "AUTOAPPROVAL_SIM_MALFORMED_RATE", default_value_t = 0.0)]
    pub malformed_rate: f64,
    /// Whether the owner, store and ad services honour Idempotency-Key (`ignored`: every create creates).
    #[arg(long, env = "AUTOAPPROVAL_SIM_IDEMPOTENCY", value_enum, default_value_t = Idempotency::Honoured)]
    pub idempotency: Idempotency,
    /// Status of e-contracts nobody set through /admin/esign.
    #[arg(long, env = "AUTOAPPROVAL_SIM_ESIGN_DEFAULT", value_enum, default_value_t = EsignDefault::Signed)]
    pub esign_default: EsignDefault,
    /// Accept only these bearer tokens (repeat or comma-separate); none: accept anything.
    #[arg(
        long,
        env = "AUTOAPPROVAL_SIM_REQUIRE_TOKEN",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub require_token: Vec<Secret>,
    /// Seed for the fault draws, for a reproducible run; unset: random.
    #[arg(long, env = "AUTOAPPROVAL_SIM_SEED")]
    pub seed: Option<u64>,
    /// Refuse (422) an Idempotency-Key replayed with another body, as a strict downstream (a payment API) does; off: answer the first result and count it in keyConflicts.
    #[arg(long, env = "AUTOAPPROVAL_SIM_STRICT_KEYS")]
    pub strict_keys: bool,
    /// PEM server certificate (chain): serve HTTPS with it; needs --tls-key-file [default: none, plain HTTP].
    #[arg(
        long,
        env = "AUTOAPPROVAL_SIM_TLS_CERT_FILE",
        requires = "tls_key_file"
    )]
    pub tls_cert_file: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert-file [default: none].
    #[arg(
        long,
        env = "AUTOAPPROVAL_SIM_TLS_KEY_FILE",
        requires = "tls_cert_file"
    )]
    pub tls_key_file: Option<std::path::PathBuf>,
    /// PEM CA bundle: with HTTPS, require a client certificate signed by it [default: none, no client certificate asked for].
    #[arg(
        long,
        env = "AUTOAPPROVAL_SIM_TLS_CLIENT_CA_FILE",
        requires = "tls_cert_file"
    )]
    pub tls_client_ca_file: Option<std::path::PathBuf>,
}

/// `--esign-default` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EsignDefault {
    /// SIGNED.
    Signed,
    /// PENDING.
    Pending,
    /// REJECTED.
    Rejected,
}

impl From<EsignDefault> for ContractStatus {
    fn from(d: EsignDefault) -> Self {
        match d {
            EsignDefault::Signed => ContractStatus::Signed,
            EsignDefault::Pending => ContractStatus::Pending,
            EsignDefault::Rejected => ContractStatus::Rejected,
        }
    }
}

impl SimArgs {
    /// Validated options; the error names the flag.
    pub fn config(&self) -> Result<SimConfig, SimError> {
        let faults = Faults {
            latency: self.latency,
            jitter: self.latency_jitter,
            error_rate: self.error_rate,
            timeout_rate: self.timeout_rate,
            hang: self.hang,
            malformed_rate: self.malformed_rate,
            system: None,
            creations_only: false,
            fail_next: None,
        };
        faults.check_rates(["--error-rate", "--timeout-rate", "--malformed-rate"])?;
        let read = |name: &'static str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| SimError::Invalid {
                name,
                message: format!("{}: {e}", path.display()),
            })
        };
        let tls = match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => Some(SimTls {
                cert_chain_pem: read("--tls-cert-file", cert)?,
                key_pem: read("--tls-key-file", key)?,
                client_ca_pem: self
                    .tls_client_ca_file
                    .as_deref()
                    .map(|ca| read("--tls-client-ca-file", ca))
                    .transpose()?,
            }),
            _ => None,
        };
        Ok(SimConfig {
            faults,
            idempotency: self.idempotency,
            esign_default: self.esign_default.into(),
            require_tokens: self.require_token.clone(),
            seed: self.seed,
            strict_keys: self.strict_keys,
            tls,
        })
    }
}

/// How an in-process simulator starts.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Faults from the start (and after `POST /admin/reset`).
    pub faults: Faults,
    /// Whether creations honour `Idempotency-Key` (also after a reset).
    pub idempotency: Idempotency,
    /// Status of e-contracts nobody set.
    pub esign_default: ContractStatus,
    /// Bearer tokens accepted; empty: any.
    pub require_tokens: Vec<Secret>,
    /// Seed for the fault draws; `None`: random.
    pub seed: Option<u64>,
    /// Whether a key replayed with another body is refused with 422
    /// (`--strict-keys`); off: answered with the first result.
    pub strict_keys: bool,
    /// HTTPS with this certificate; `None`: plain HTTP.
    pub tls: Option<SimTls>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            faults: Faults::default(),
            idempotency: Idempotency::Honoured,
            esign_default: ContractStatus::Signed,
            require_tokens: Vec::new(),
            seed: None,
            strict_keys: false,
            tls: None,
        }
    }
}

/// Why the simulator could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A bad setting; `name` is the flag or JSON field.
    #[error("{name}: {message}")]
    Invalid {
        /// The flag or field.
        name: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The listen address could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The server failed while serving.
    #[error("serving: {0}")]
    Serve(#[source] std::io::Error),
    /// The server task panicked or was cancelled.
    #[error("server task: {0}")]
    Task(#[source] tokio::task::JoinError),
    /// Ctrl-C / SIGTERM handlers could not be installed.
    #[error("installing signal handlers: {0}")]
    Signal(#[source] std::io::Error),
}

/// `autoapproval-sim`: serves until Ctrl-C or SIGTERM.
pub async fn run(args: SimArgs) -> Result<(), SimError> {
    let options = args.config()?;
    let mut termination = Termination::install().map_err(SimError::Signal)?;
    let handle = Simulator::start(args.listen, options).await?;
    info!(addr = %handle.addr(), "simulator listening");
    termination.recv().await;
    info!("simulator shutting down");
    handle.shutdown().await
}

// === impl Simulator ===

/// Starts simulators in-process.
pub struct Simulator;

impl Simulator {
    /// Binds `addr` (port 0: any free port) and serves in a background task.
    pub async fn start(addr: SocketAddr, options: SimConfig) -> Result<SimHandle, SimError> {
        options.faults.validate()?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| SimError::Bind { addr, source })?;
        let (stop, stopped) = watch::channel(false);
        let mut state = state::State::new(
            options.faults,
            options.idempotency,
            options.esign_default,
            options.seed,
        );
        state.strict_keys = options.strict_keys;
        let shared = Arc::new(routes::Shared::new(
            state,
            options.require_tokens,
            stopped.clone(),
        ));
        let handshake_failures = Arc::new(AtomicU64::new(0));
        let (main, task) = serve(
            listener,
            options.tls.as_ref(),
            routes::router(shared.clone()),
            stopped,
            handshake_failures.clone(),
        )?;
        Ok(SimHandle {
            main,
            shared,
            stop,
            tasks: vec![task],
            handshake_failures,
        })
    }
}

/// Serves `app` on `listener`, over TLS if `tls` is given, until `stopped`.
fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<&SimTls>,
    app: axum::Router,
    stopped: watch::Receiver<bool>,
    handshake_failures: Arc<AtomicU64>,
) -> Result<(SimListener, ServeTask), SimError> {
    let addr = listener.local_addr().map_err(SimError::Serve)?;
    let mut until_stopped = stopped.clone();
    let shutdown = async move {
        // Err: the handle is gone, which also means stop.
        let _ = until_stopped.wait_for(|stop| *stop).await;
    };
    let Some(tls) = tls else {
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        });
        return Ok((SimListener { addr, tls: None }, task));
    };
    let current: tls::CurrentTls = Arc::new(std::sync::RwLock::new(tls.server_config()?));
    let listener = tls::TlsListener::new(listener, current.clone(), handshake_failures, stopped)
        .map_err(SimError::Serve)?;
    // One call per connection: each call's handshake meets the certificate in force.
    let app = app.layer(axum::middleware::map_response(
        |mut answer: axum::response::Response| async move {
            answer.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
            answer
        },
    ));
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
    });
    Ok((
        SimListener {
            addr,
            tls: Some(current),
        },
        task,
    ))
}

type ServeTask = JoinHandle<std::io::Result<()>>;

/// One port the simulator serves on, and its TLS settings if any.
#[derive(Clone)]
pub struct SimListener {
    addr: SocketAddr,
    tls: Option<tls::CurrentTls>,
}

impl SimListener {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, or `https://ADDR` over TLS: the base URL for every system.
    pub fn url(&self) -> String {
        match self.tls {
            Some(_) => format!("https://{}", self.addr),
            None => format!("http://{}", self.addr),
        }
    }

    /// Replaces the TLS settings for the next handshakes; a listener
    /// started without TLS refuses.
    pub fn set_tls(&self, tls: &SimTls) -> Result<(), SimError> {
        let Some(current) = &self.tls else {
            return Err(SimError::Invalid {
                name: "tls",
                message: "this listener serves plain HTTP".to_owned(),
            });
        };
        let config = tls.server_config()?;
        *current.write().unwrap_or_else(|e| e.into_inner()) = config;
        Ok(())
    }
}

/// A running simulator; dropping it stops the server too.
pub struct SimHandle {
    main: SimListener,
    shared: Arc<routes::Shared>,
    stop: watch::Sender<bool>,
    tasks: Vec<ServeTask>,
    handshake_failures: Arc<AtomicU64>,
}

impl SimHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.main.addr
    }

    /// `http://ADDR` (`https://` with TLS), the base URL for every system.
    pub fn base_url(&self) -> String {
        self.main.url()
    }

    /// Replaces the main listener's TLS settings for the next handshakes.
    pub fn set_tls(&self, tls: &SimTls) -> Result<(), SimError> {
        self.main.set_tls(tls)
    }

    /// Serves the same systems and data on another port of `addr`'s host
    /// (port 0: any), with TLS settings of its own.
    pub async fn add_listener(
        &mut self,
        addr: SocketAddr,
        tls: Option<&SimTls>,
    ) -> Result<SimListener, SimError> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| SimError::Bind { addr, source })?;
        let (extra, task) = serve(
            listener,
            tls,
            routes::router(self.shared.clone()),
            self.stop.subscribe(),
            self.handshake_failures.clone(),
        )?;
        self.tasks.push(task);
        Ok(extra)
    }

    /// TLS handshakes that failed (a client that refused our certificate,
    /// or had none where one is required), on every listener.
    pub fn handshake_failures(&self) -> u64 {
        self.handshake_failures.load(Ordering::Relaxed)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        self.shared.lock().stats.clone()
    }

    /// The faults in force (with `fail_next` as far as it is used up).
    pub fn faults(&self) -> Faults {
        self.shared.lock().faults.clone()
    }

    /// Replaces the faults.
    pub fn set_faults(&self, faults: Faults) -> Result<(), SimError> {
        faults.validate()?;
        self.shared.lock().faults = faults;
        Ok(())
    }

    /// Like `PUT /admin/idempotency`.
    pub fn set_idempotency(&self, mode: Idempotency) {
        self.shared.lock().idempotency = mode;
    }

    /// Like `--strict-keys`: refuse (422) a key replayed with another body.
    pub fn set_strict_keys(&self, strict: bool) {
        self.shared.lock().strict_keys = strict;
    }

    /// Sets what e-sign answers for `contract_ref`.
    pub fn set_contract_status(&self, contract_ref: &str, status: ContractStatus) {
        self.shared.lock().set_contract_status(contract_ref, status);
    }

    /// Makes store `store_number` known to the store and ad services.
    pub fn add_store(&self, store_number: i64, open: bool) {
        self.shared.lock().set_store(store_number, open);
    }

    /// Like `PUT /admin/campaign-prefix`: new campaign ids start with `prefix`.
    pub fn set_campaign_prefix(&self, prefix: &str) {
        self.shared.lock().set_campaign_prefix(prefix);
    }

    /// Like `PUT /admin/refused-names`: owners and stores named one of
    /// `names` are refused (422) from now on.
    pub fn set_refused_names(&self, names: &[&str]) {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        self.shared.lock().set_refused_names(&names);
    }

    /// Like `POST /admin/reset`.
    pub fn reset(&self) {
        self.shared.lock().reset();
    }

    /// Stops accepting, cuts hanging calls short, waits for the server to end.
    pub async fn shutdown(mut self) -> Result<(), SimError> {
        self.stop.send_replace(true);
        for task in std::mem::take(&mut self.tasks) {
            task.await
                .map_err(SimError::Task)?
                .map_err(SimError::Serve)?;
        }
        Ok(())
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}
