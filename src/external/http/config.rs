//! Where the external systems live and how hard we may call them: the
//! `ExternalArgs` flags, credentials that never print, and durations.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::flags::parse_duration;

use reqwest::Url;

use crate::external::{Dedup, System};

// === impl ExternalArgs ===

/// Where the four external systems live and how hard we may call them.
#[derive(clap::Args, Clone, Debug)]
pub struct ExternalArgs {
    /// Base URL of the e-sign service.
    #[arg(
        long,
        env = "AUTOAPPROVAL_ESIGN_URL",
        default_value = "http://127.0.0.1:8090"
    )]
    pub esign_url: String,
    /// Bearer token for the e-sign service [default: none, no Authorization header].
    #[arg(long, env = "AUTOAPPROVAL_ESIGN_TOKEN", hide_env_values = true)]
    pub esign_token: Option<Secret>,
    /// Base URL of the owner service.
    #[arg(
        long,
        env = "AUTOAPPROVAL_OWNER_URL",
        default_value = "http://127.0.0.1:8090"
    )]
    pub owner_url: String,
    /// Bearer token for the owner service [default: none, no Authorization header].
    #[arg(long, env = "AUTOAPPROVAL_OWNER_TOKEN", hide_env_values = true)]
    pub owner_token: Option<Secret>,
    /// Base URL of the store service.
    #[arg(
        long,
        env = "AUTOAPPROVAL_STORE_URL",
        default_value = "http://127.0.0.1:8090"
    )]
    pub store_url: String,
    /// Bearer token for the store service [default: none, no Authorization header].
    #[arg(long, env = "AUTOAPPROVAL_STORE_TOKEN", hide_env_values = true)]
    pub store_token: Option<Secret>,
    /// Base URL of the ad service.
    #[arg(
        long,
        env = "AUTOAPPROVAL_AD_URL",
        default_value = "http://127.0.0.1:8090"
    )]
    pub ad_url: String,
    /// Bearer token for the ad service [default: none, no Authorization header].
    #[arg(long, env = "AUTOAPPROVAL_AD_TOKEN", hide_env_values = true)]
    pub ad_token: Option<Secret>,
    /// How the owner service keeps a retried creation single: `key` (it honours
    /// Idempotency-Key) or `lookup` (it does not: look the request up with
    /// GET /owners?requestId=N before every create).
    #[arg(long, env = "AUTOAPPROVAL_OWNER_DEDUP", value_enum, default_value_t = Dedup::Key)]
    pub owner_dedup: Dedup,
    /// How the store service keeps a retried creation single: `key` or `lookup`
    /// (GET /stores?requestId=N before every create).
    #[arg(long, env = "AUTOAPPROVAL_STORE_DEDUP", value_enum, default_value_t = Dedup::Key)]
    pub store_dedup: Dedup,
    /// How the ad service keeps a retried approval single: `key` or `lookup`
    /// (GET /campaigns/approvals?requestId=N before every approval).
    #[arg(long, env = "AUTOAPPROVAL_AD_DEDUP", value_enum, default_value_t = Dedup::Key)]
    pub ad_dedup: Dedup,
    /// Timeout of one external call, connect to last body byte (e.g. 500ms, 5s, 2m).
    #[arg(
        long,
        env = "AUTOAPPROVAL_EXTERNAL_TIMEOUT",
        default_value = "5s",
        value_parser = parse_duration
    )]
    pub external_timeout: Duration,
    /// Maximum calls in flight to each external system at once.
    #[arg(long, env = "AUTOAPPROVAL_EXTERNAL_CONCURRENCY", default_value_t = 32)]
    pub external_concurrency: usize,
    /// CA bundles and client certificates (`--external-ca-file`, `--<system>-ca-file`, …).
    #[command(flatten)]
    pub tls: super::tls::ExternalTlsArgs,
}

impl ExternalArgs {
    /// All four systems at one base URL (the simulator), no tokens, the
    /// documented default limits.
    pub fn all_at(base_url: impl Into<String>) -> Result<Self, clap::Error> {
        let url = base_url.into();
        Ok(Self {
            esign_url: url.clone(),
            owner_url: url.clone(),
            store_url: url.clone(),
            ad_url: url,
            ..crate::flags::defaults_of::<Self>()?
        })
    }

    /// The same way of keeping creations single for the three creating systems.
    pub fn with_dedup(mut self, dedup: Dedup) -> Self {
        self.owner_dedup = dedup;
        self.store_dedup = dedup;
        self.ad_dedup = dedup;
        self
    }

    /// The same token for all four systems.
    pub fn with_token(mut self, token: &str) -> Self {
        let secret = Some(Secret::new(token));
        self.esign_token = secret.clone();
        self.owner_token = secret.clone();
        self.store_token = secret.clone();
        self.ad_token = secret;
        self
    }

    /// Checks every value; the error names the offending flag.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (flag, url) in [
            ("--esign-url", &self.esign_url),
            ("--owner-url", &self.owner_url),
            ("--store-url", &self.store_url),
            ("--ad-url", &self.ad_url),
        ] {
            parse_base_url(flag, url)?;
        }
        if self.external_timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        if self.external_concurrency == 0 {
            return Err(ConfigError::ZeroConcurrency);
        }
        for system in [System::ESign, System::Owner, System::Store, System::Ad] {
            self.tls.files(system)?;
        }
        Ok(())
    }
}

/// A bad external-system configuration, naming the flag to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A base URL that is not an absolute http(s) URL.
    #[error("{flag}: {value:?} is not an http(s) URL: {reason}")]
    InvalidUrl {
        /// The flag that carried it.
        flag: &'static str,
        /// The value given.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// A token that cannot be sent in an HTTP header.
    #[error("{flag}: the token contains characters not allowed in an HTTP header")]
    InvalidToken {
        /// The flag that carried it.
        flag: &'static str,
    },
    /// `--external-timeout 0`.
    #[error("--external-timeout must be greater than zero")]
    ZeroTimeout,
    /// `--external-concurrency 0`.
    #[error("--external-concurrency must be at least 1")]
    ZeroConcurrency,
    /// A client certificate without its key, or a key without its certificate.
    #[error("{given} is set without {missing}: a client certificate needs both")]
    HalfIdentity {
        /// The flag that was given.
        given: &'static str,
        /// The flag that is missing.
        missing: &'static str,
    },
    /// A CA, certificate or key file that is missing, unreadable or invalid.
    #[error(transparent)]
    TlsFile(#[from] super::tls::TlsFileError),
    /// reqwest could not build its client (TLS set-up).
    #[error("building the HTTP client for {system}: {source}")]
    Client {
        /// The system the client was for.
        system: System,
        /// reqwest's error.
        #[source]
        source: reqwest::Error,
    },
}

pub(super) fn parse_base_url(flag: &'static str, value: &str) -> Result<Url, ConfigError> {
    let invalid = |reason: String| ConfigError::InvalidUrl {
        flag,
        value: value.to_owned(),
        reason,
    };
    let url = Url::parse(value).map_err(|e| invalid(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid(format!(
            "scheme {:?} is not http or https",
            url.scheme()
        )));
    }
    if url.cannot_be_a_base() || url.host_str().is_none() {
        return Err(invalid("no host".to_owned()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        // Credentials in a URL end up in logs; the value is not echoed.
        let mut shown = url.clone();
        let _ = shown.set_username("***");
        let _ = shown.set_password(None);
        return Err(ConfigError::InvalidUrl {
            flag,
            value: shown.to_string(),
            reason: "credentials in the URL are not allowed: give a bearer token with the system's --*-token flag".to_owned(),
        });
    }
    Ok(url)
}

// === impl Secret ===

/// A credential: usable, but printed as `***` by `Debug` and `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a credential.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The credential itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self::new(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let config = ExternalArgs::all_at("http://x")
            .unwrap()
            .with_token("hunter2");
        let printed = format!("{config:?}");
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(printed.contains("***"), "{printed}");
    }

    #[test]
    fn validation_names_the_flag() {
        let mut config = ExternalArgs::all_at("http://127.0.0.1:1").unwrap();
        config.store_url = "ftp://example.com".into();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.starts_with("--store-url"), "{err}");

        config.store_url = "not a url".into();
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .starts_with("--store-url")
        );

        let mut config = ExternalArgs::all_at("https://example.com/base/").unwrap();
        config.validate().unwrap();
        config.external_timeout = Duration::ZERO;
        assert!(matches!(config.validate(), Err(ConfigError::ZeroTimeout)));
        config.external_timeout = Duration::from_secs(1);
        config.external_concurrency = 0;
        assert!(matches!(
            config.validate(),
            Err(ConfigError::ZeroConcurrency)
        ));
    }

    #[test]
    fn flags_and_defaults_parse() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            external: ExternalArgs,
        }
        let cli =
            Cli::try_parse_from(["x", "--external-timeout", "500ms", "--ad-token", "t"]).unwrap();
        assert_eq!(cli.external.external_timeout, Duration::from_millis(500));
        assert_eq!(cli.external.external_concurrency, 32);
        assert_eq!(cli.external.esign_url, "http://127.0.0.1:8090");
        assert_eq!(
            cli.external.ad_token.as_ref().map(Secret::expose),
            Some("t")
        );
        let err = Cli::try_parse_from(["x", "--external-timeout", "5"])
            .err()
            .unwrap();
        assert!(err.to_string().contains("--external-timeout"), "{err}");
    }
}
