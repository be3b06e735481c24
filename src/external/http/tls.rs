//! TLS to the external systems: the CA bundle and client certificate each
//! system's client uses, read from files, re-read when they change
//! (cert-manager rotates them), and a failed handshake said in words.
//!
//! A CA file replaces the bundled web roots for its system: the client then
//! trusts that bundle and nothing else. Verification is always on; no flag
//! turns it off.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tracing::{error, info};

use super::ConfigError;
use crate::external::System;
use crate::flags::parse_duration;
use crate::telemetry::Metrics;

// === impl ExternalTlsArgs ===

/// Which CAs the external systems' server certificates are checked against,
/// and the client certificate (mTLS) the controller shows them.
#[derive(clap::Args, Clone, Debug)]
pub struct ExternalTlsArgs {
    /// PEM bundle of the CAs trusted for every external system without a CA
    /// file of its own; it replaces the bundled web roots [default: none, the
    /// bundled web roots (Mozilla's)].
    #[arg(long, env = "AUTOAPPROVAL_EXTERNAL_CA_FILE")]
    pub external_ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) shown to every external system without
    /// one of its own; needs --external-client-key-file [default: none, no
    /// client certificate].
    #[arg(long, env = "AUTOAPPROVAL_EXTERNAL_CLIENT_CERT_FILE")]
    pub external_client_cert_file: Option<PathBuf>,
    /// PEM private key of --external-client-cert-file [default: none].
    #[arg(long, env = "AUTOAPPROVAL_EXTERNAL_CLIENT_KEY_FILE")]
    pub external_client_key_file: Option<PathBuf>,
    /// PEM CA bundle for the e-sign service only [default: none, --external-ca-file's].
    #[arg(long, env = "AUTOAPPROVAL_ESIGN_CA_FILE")]
    pub esign_ca_file: Option<PathBuf>,
    /// PEM client certificate for the e-sign service only [default: none, --external-client-cert-file's].
    #[arg(long, env = "AUTOAPPROVAL_ESIGN_CLIENT_CERT_FILE")]
    pub esign_client_cert_file: Option<PathBuf>,
    /// PEM private key of --esign-client-cert-file [default: none].
    #[arg(long, env = "AUTOAPPROVAL_ESIGN_CLIENT_KEY_FILE")]
    pub esign_client_key_file: Option<PathBuf>,
    /// PEM CA bundle for the owner service only [default: none, --external-ca-file's].
    #[arg(long, env = "AUTOAPPROVAL_OWNER_CA_FILE")]
    pub owner_ca_file: Option<PathBuf>,
    /// PEM client certificate for the owner service only [default: none, --external-client-cert-file's].
    #[arg(long, env = "AUTOAPPROVAL_OWNER_CLIENT_CERT_FILE")]
    pub owner_client_cert_file: Option<PathBuf>,
    /// PEM private key of --owner-client-cert-file [default: none].
    #[arg(long, env = "AUTOAPPROVAL_OWNER_CLIENT_KEY_FILE")]
    pub owner_client_key_file: Option<PathBuf>,
    /// PEM CA bundle for the store service only [default: none, --external-ca-file's].
    #[arg(long, env = "AUTOAPPROVAL_STORE_CA_FILE")]
    pub store_ca_file: Option<PathBuf>,
    /// PEM client certificate for the store service only [default: none, --external-client-cert-file's].
    #[arg(long, env = "AUTOAPPROVAL_STORE_CLIENT_CERT_FILE")]
    pub store_client_cert_file: Option<PathBuf>,
    /// PEM private key of --store-client-cert-file [default: none].
    #[arg(long, env = "AUTOAPPROVAL_STORE_CLIENT_KEY_FILE")]
    pub store_client_key_file: Option<PathBuf>,
    /// PEM CA bundle for the ad campaign service only [default: none, --external-ca-file's].
    #[arg(long, env = "AUTOAPPROVAL_AD_CA_FILE")]
    pub ad_ca_file: Option<PathBuf>,
    /// PEM client certificate for the ad campaign service only [default: none, --external-client-cert-file's].
    #[arg(long, env = "AUTOAPPROVAL_AD_CLIENT_CERT_FILE")]
    pub ad_client_cert_file: Option<PathBuf>,
    /// PEM private key of --ad-client-cert-file [default: none].
    #[arg(long, env = "AUTOAPPROVAL_AD_CLIENT_KEY_FILE")]
    pub ad_client_key_file: Option<PathBuf>,
    /// How often, at most, the CA and client certificate files are read again
    /// before a call; changed files make a new client (calls in flight keep
    /// theirs), broken ones are reported and the last good ones kept. 0s:
    /// before every call.
    #[arg(
        long,
        env = "AUTOAPPROVAL_EXTERNAL_TLS_RELOAD_INTERVAL",
        default_value = "30s",
        value_parser = parse_duration
    )]
    pub external_tls_reload_interval: Duration,
}

/// One file given by a flag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct TlsFile {
    flag: &'static str,
    path: PathBuf,
}

impl std::fmt::Display for TlsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.flag, self.path.display())
    }
}

/// The files one system's client is made from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct TlsFiles {
    ca: Option<TlsFile>,
    /// Certificate and key, always both.
    identity: Option<(TlsFile, TlsFile)>,
}

impl TlsFiles {
    fn is_empty(&self) -> bool {
        self.ca.is_none() && self.identity.is_none()
    }

    /// The trust the server's certificate is checked against, for messages.
    fn roots(&self, system: System) -> String {
        match &self.ca {
            Some(ca) => format!("the CAs of {ca}"),
            None => format!(
                "the bundled web roots (give a private CA with --external-ca-file or --{}-ca-file)",
                system.as_str()
            ),
        }
    }
}

impl ExternalTlsArgs {
    /// The files of `system`: its own flags, else the `--external-*` ones;
    /// a certificate without its key (or a key without its certificate) is
    /// refused by name.
    pub(super) fn files(&self, system: System) -> Result<TlsFiles, ConfigError> {
        let (ca, cert, key) = match system {
            System::ESign => (
                ("--esign-ca-file", &self.esign_ca_file),
                ("--esign-client-cert-file", &self.esign_client_cert_file),
                ("--esign-client-key-file", &self.esign_client_key_file),
            ),
            System::Owner => (
                ("--owner-ca-file", &self.owner_ca_file),
                ("--owner-client-cert-file", &self.owner_client_cert_file),
                ("--owner-client-key-file", &self.owner_client_key_file),
            ),
            System::Store => (
                ("--store-ca-file", &self.store_ca_file),
                ("--store-client-cert-file", &self.store_client_cert_file),
                ("--store-client-key-file", &self.store_client_key_file),
            ),
            System::Ad => (
                ("--ad-ca-file", &self.ad_ca_file),
                ("--ad-client-cert-file", &self.ad_client_cert_file),
                ("--ad-client-key-file", &self.ad_client_key_file),
            ),
        };
        let file = |(flag, path): (&'static str, &Option<PathBuf>)| {
            path.clone().map(|path| TlsFile { flag, path })
        };
        let ca = file(ca).or_else(|| file(("--external-ca-file", &self.external_ca_file)));
        let pair = |cert, key| match (file(cert), file(key)) {
            (Some(cert), Some(key)) => Ok(Some((cert, key))),
            (None, None) => Ok(None),
            (Some(_), None) => Err(ConfigError::HalfIdentity {
                given: cert.0,
                missing: key.0,
            }),
            (None, Some(_)) => Err(ConfigError::HalfIdentity {
                given: key.0,
                missing: cert.0,
            }),
        };
        let identity = match pair(cert, key)? {
            Some(own) => Some(own),
            None => pair(
                (
                    "--external-client-cert-file",
                    &self.external_client_cert_file,
                ),
                ("--external-client-key-file", &self.external_client_key_file),
            )?,
        };
        Ok(TlsFiles { ca, identity })
    }
}

/// A TLS file that cannot be used, named by its flag and path.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {reason}")]
pub struct TlsFileError {
    file: String,
    reason: String,
}

impl TlsFileError {
    fn new(file: &TlsFile, reason: impl Into<String>) -> Self {
        Self {
            file: file.to_string(),
            reason: reason.into(),
        }
    }
}

// === reading and building ===

/// The bytes of a system's files as read together.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Contents {
    ca: Option<Vec<u8>>,
    cert: Option<Vec<u8>>,
    key: Option<Vec<u8>>,
}

fn read_error(file: &TlsFile, e: &std::io::Error) -> TlsFileError {
    TlsFileError::new(file, format!("cannot be read: {e}"))
}

impl TlsFiles {
    fn read_now(&self) -> Result<Contents, TlsFileError> {
        let read = |file: Option<&TlsFile>| {
            file.map(|f| std::fs::read(&f.path).map_err(|e| read_error(f, &e)))
                .transpose()
        };
        Ok(Contents {
            ca: read(self.ca.as_ref())?,
            cert: read(self.identity.as_ref().map(|(c, _)| c))?,
            key: read(self.identity.as_ref().map(|(_, k)| k))?,
        })
    }

    async fn read(&self) -> Result<Contents, TlsFileError> {
        async fn read(file: Option<&TlsFile>) -> Result<Option<Vec<u8>>, TlsFileError> {
            match file {
                Some(f) => tokio::fs::read(&f.path)
                    .await
                    .map(Some)
                    .map_err(|e| read_error(f, &e)),
                None => Ok(None),
            }
        }
        Ok(Contents {
            ca: read(self.ca.as_ref()).await?,
            cert: read(self.identity.as_ref().map(|(c, _)| c)).await?,
            key: read(self.identity.as_ref().map(|(_, k)| k)).await?,
        })
    }

    /// The rustls configuration of these contents: the CA bundle as the only
    /// roots (else the web roots), the client certificate if any.
    fn config(&self, contents: &Contents) -> Result<rustls::ClientConfig, TlsFileError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let any = self
            .ca
            .as_ref()
            .or(self.identity.as_ref().map(|(c, _)| c))
            .cloned()
            .unwrap_or(TlsFile {
                flag: "--external-ca-file",
                path: PathBuf::new(),
            });
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsFileError::new(&any, format!("TLS set-up: {e}")))?;
        let mut roots = rustls::RootCertStore::empty();
        match (&self.ca, &contents.ca) {
            (Some(file), Some(pem)) => {
                for cert in certificates(file, pem)? {
                    roots.add(cert).map_err(|e| {
                        TlsFileError::new(
                            file,
                            format!("a certificate in it is not a usable CA: {e}"),
                        )
                    })?;
                }
            }
            _ => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let builder = builder.with_root_certificates(roots);
        match (&self.identity, &contents.cert, &contents.key) {
            (Some((cert_file, key_file)), Some(cert), Some(key)) => {
                let chain = certificates(cert_file, cert)?;
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| {
                    TlsFileError::new(
                        key_file,
                        format!("no PEM private key (PKCS#8, PKCS#1 or SEC1) in it: {e}"),
                    )
                })?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    TlsFileError::new(
                        key_file,
                        format!("not the key of {cert_file}, or a key type TLS cannot use: {e}"),
                    )
                })
            }
            _ => Ok(builder.with_no_client_auth()),
        }
    }
}

/// Every certificate of a PEM file; none at all is an error.
fn certificates(file: &TlsFile, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsFileError::new(file, format!("not a PEM file: {e}")))?;
    if certs.is_empty() {
        return Err(TlsFileError::new(file, "no PEM certificate in it"));
    }
    Ok(certs)
}

// === impl Clients ===

/// One system's HTTP client: fixed when it has no TLS files, otherwise
/// rebuilt when its files change.
pub(super) struct Clients {
    system: System,
    files: TlsFiles,
    /// The connect timeout every client of this system is built with.
    connect_timeout: Duration,
    current: Mutex<reqwest::Client>,
    reload: Option<Reload>,
}

/// When the files were last read and what was made of them.
struct Reload {
    every: Duration,
    state: tokio::sync::Mutex<ReloadState>,
    metrics: Option<Metrics>,
}

struct ReloadState {
    checked: Instant,
    loaded: Contents,
    /// Contents refused last, so one broken file is reported once.
    rejected: Option<Contents>,
}

impl Clients {
    /// Reads the files (each missing, unreadable or invalid one refused by
    /// name) and builds the first client.
    pub(super) fn new(
        system: System,
        files: TlsFiles,
        connect_timeout: Duration,
        every: Duration,
        metrics: Option<Metrics>,
    ) -> Result<Self, ConfigError> {
        let (client, reload) = if files.is_empty() {
            let client = super::base_client(connect_timeout)
                .build()
                .map_err(|source| ConfigError::Client { system, source })?;
            (client, None)
        } else {
            let contents = files.read_now()?;
            let client = build(system, &files, &contents, connect_timeout)?;
            let state = ReloadState {
                checked: Instant::now(),
                loaded: contents,
                rejected: None,
            };
            let reload = Reload {
                every,
                state: tokio::sync::Mutex::new(state),
                metrics,
            };
            (client, Some(reload))
        };
        Ok(Self {
            system,
            files,
            connect_timeout,
            current: Mutex::new(client),
            reload,
        })
    }

    /// What the start-up log says about this system's TLS.
    pub(super) fn describe(&self) -> String {
        let client = match &self.files.identity {
            Some((cert, _)) => format!("client certificate {cert}"),
            None => "no client certificate".to_owned(),
        };
        format!(
            "verified against {}; {client}",
            self.files.roots(self.system)
        )
    }

    /// The trust in force, for the message of a failed handshake.
    pub(super) fn roots(&self) -> String {
        self.files.roots(self.system)
    }

    /// The client certificate flag in force, if any.
    pub(super) fn client_cert(&self) -> Option<String> {
        self.files.identity.as_ref().map(|(c, _)| c.to_string())
    }

    /// The client for the next call, after reading the files again if the
    /// reload interval has passed (one caller reads; the others go on with
    /// the current client).
    pub(super) async fn client(&self) -> reqwest::Client {
        if let Some(reload) = &self.reload
            && let Ok(mut state) = reload.state.try_lock()
            && state.checked.elapsed() >= reload.every
        {
            self.check(reload, &mut state).await;
            state.checked = Instant::now();
        }
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    async fn check(&self, reload: &Reload, state: &mut ReloadState) {
        let system = self.system;
        let outcome = match self.files.read().await {
            Ok(contents) if contents == state.loaded => {
                // Back to the files in use (a broken edit undone).
                self.rejected(reload, false);
                state.rejected = None;
                return;
            }
            Ok(contents) => match build(system, &self.files, &contents, self.connect_timeout) {
                Ok(client) => Ok((client, contents)),
                Err(e) => Err((e.to_string(), Some(contents))),
            },
            Err(e) => Err((e.to_string(), None)),
        };
        match outcome {
            Ok((client, contents)) => {
                *self.current.lock().unwrap_or_else(|e| e.into_inner()) = client;
                state.loaded = contents;
                state.rejected = None;
                self.rejected(reload, false);
                if let Some(m) = &reload.metrics {
                    m.external_tls_reload(system.as_str(), "loaded");
                }
                info!(%system, tls = %self.describe(), "the external system's TLS files changed: new connections use them");
            }
            Err((message, contents)) => {
                self.rejected(reload, true);
                // A file that cannot be read is reported at every check.
                if contents.is_none() || state.rejected != contents {
                    if let Some(m) = &reload.metrics {
                        m.external_tls_reload(system.as_str(), "rejected");
                    }
                    error!(%system, error = %message, "the external system's TLS files changed and cannot be used: the last good ones stay in use");
                }
                state.rejected = contents;
            }
        }
    }

    fn rejected(&self, reload: &Reload, rejected: bool) {
        if let Some(m) = &reload.metrics {
            m.external_tls_rejected(self.system.as_str(), rejected);
        }
    }
}

fn build(
    system: System,
    files: &TlsFiles,
    contents: &Contents,
    connect_timeout: Duration,
) -> Result<reqwest::Client, ConfigError> {
    let config = files.config(contents)?;
    super::base_client(connect_timeout)
        .use_preconfigured_tls(config)
        .build()
        .map_err(|source| ConfigError::Client { system, source })
}

// === handshake failures in words ===

/// Why a call failed in TLS, said for an operator, if it did.
pub(super) fn tls_failure(
    error: &(dyn std::error::Error + 'static),
    clients: &Clients,
    host: &str,
) -> Option<String> {
    use rustls::{AlertDescription as Alert, CertificateError as Cert, Error as Tls};
    let tls = find_rustls(error)?;
    let client_cert_flags = format!(
        "--{}-client-cert-file or --external-client-cert-file",
        clients.system.as_str()
    );
    let reason = match tls {
        Tls::InvalidCertificate(Cert::UnknownIssuer) => format!(
            "the server's certificate is not signed by a trusted CA: checked against {}",
            clients.roots()
        ),
        Tls::InvalidCertificate(Cert::Expired | Cert::ExpiredContext { .. }) => {
            "the server's certificate has expired".to_owned()
        }
        Tls::InvalidCertificate(Cert::NotValidYet | Cert::NotValidYetContext { .. }) => {
            "the server's certificate is not valid yet".to_owned()
        }
        Tls::InvalidCertificate(Cert::NotValidForName | Cert::NotValidForNameContext { .. }) => {
            format!("the server's certificate is not valid for the host name {host:?}")
        }
        Tls::InvalidCertificate(other) => {
            format!("the server's certificate was refused: {other:?}")
        }
        Tls::AlertReceived(Alert::CertificateRequired)
        | Tls::AlertReceived(Alert::HandshakeFailure)
            if clients.client_cert().is_none() =>
        {
            format!(
                "the server requires a client certificate and none is configured ({client_cert_flags})"
            )
        }
        Tls::AlertReceived(
            alert @ (Alert::BadCertificate
            | Alert::UnknownCA
            | Alert::CertificateUnknown
            | Alert::CertificateExpired
            | Alert::CertificateRevoked
            | Alert::AccessDenied
            | Alert::CertificateRequired),
        ) => format!(
            "the server refused our client certificate ({}): {alert:?}",
            clients.client_cert().unwrap_or_default()
        ),
        Tls::InvalidMessage(_) => {
            "the server does not speak TLS (a plain HTTP server? check the URL's scheme)".to_owned()
        }
        other => format!("{other}"),
    };
    Some(format!(
        "TLS with the {} failed: {reason}",
        service(clients.system)
    ))
}

/// The system as people call it.
fn service(system: System) -> &'static str {
    match system {
        System::ESign => "e-sign service",
        System::Owner => "owner service",
        System::Store => "store service",
        System::Ad => "ad campaign service",
    }
}

/// The rustls error in `error`'s chain, looking inside I/O errors too
/// (`io::Error::source` skips the error it wraps).
fn find_rustls<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        next = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> ExternalTlsArgs {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            tls: ExternalTlsArgs,
        }
        let mut all = vec!["x"];
        all.extend_from_slice(list);
        Cli::try_parse_from(all).unwrap().tls
    }

    #[test]
    fn a_systems_own_files_win_over_the_external_ones() {
        let a = args(&[
            "--external-ca-file",
            "/all/ca",
            "--owner-ca-file",
            "/owner/ca",
            "--external-client-cert-file",
            "/all/crt",
            "--external-client-key-file",
            "/all/key",
            "--store-client-cert-file",
            "/store/crt",
            "--store-client-key-file",
            "/store/key",
        ]);
        let owner = a.files(System::Owner).unwrap();
        assert_eq!(owner.ca.unwrap().to_string(), "--owner-ca-file /owner/ca");
        assert_eq!(
            owner.identity.unwrap().0.to_string(),
            "--external-client-cert-file /all/crt"
        );
        let store = a.files(System::Store).unwrap();
        assert_eq!(store.ca.unwrap().to_string(), "--external-ca-file /all/ca");
        let (crt, key) = store.identity.unwrap();
        assert_eq!(crt.to_string(), "--store-client-cert-file /store/crt");
        assert_eq!(key.to_string(), "--store-client-key-file /store/key");
        assert!(args(&[]).files(System::Ad).unwrap().is_empty());
        assert_eq!(
            args(&[]).external_tls_reload_interval,
            Duration::from_secs(30)
        );
    }

    #[test]
    fn a_certificate_without_its_key_is_refused_by_name() {
        let err = args(&["--ad-client-cert-file", "/c"])
            .files(System::Ad)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--ad-client-cert-file") && err.contains("--ad-client-key-file"),
            "{err}"
        );
        let err = args(&["--external-client-key-file", "/k"])
            .files(System::Owner)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--external-client-cert-file"), "{err}");
    }
}
