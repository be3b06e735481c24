//! Certificates the test makes (a CA of its own, server and client
//! certificates it signs), files on disk for the controller to read, and the
//! simulator over HTTPS with them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use autoapproval::clock::{ManualClock, SharedClock};
use autoapproval::external::http::{ExternalArgs, HttpExternalSystems};
use autoapproval::telemetry::Metrics;
use autoapproval_sim::{SimConfig, SimHandle, SimTls, Simulator};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::db::AsDb;
use super::engine::{Env, defaults, t0};

/// A certificate and its key, PEM.
#[derive(Clone, Debug)]
pub struct Pem {
    pub cert: String,
    pub key: String,
}

/// A CA made by the test.
pub struct TestCa {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl TestCa {
    /// A new self-signed CA called `name`.
    pub fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().expect("a CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("a self-signed CA");
        TestCa {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    fn issue(&self, params: CertificateParams) -> Pem {
        let key = KeyPair::generate().expect("a key");
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// A server certificate for 127.0.0.1 and localhost, valid for centuries.
    pub fn server(&self) -> Pem {
        self.server_for(&["127.0.0.1", "localhost"])
    }

    /// A server certificate for `names` only.
    pub fn server_for(&self, names: &[&str]) -> Pem {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("server params");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params)
    }

    /// A server certificate for 127.0.0.1 that expired in 2001.
    pub fn expired_server(&self) -> Pem {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("server params");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        self.issue(params)
    }

    /// A client certificate for `name`.
    pub fn client(&self, name: &str) -> Pem {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }

    /// The simulator's TLS with `server`, requiring a client certificate of
    /// `client_ca` if given.
    pub fn sim_tls(server: &Pem, client_ca: Option<&TestCa>) -> SimTls {
        SimTls {
            cert_chain_pem: server.cert.clone().into_bytes(),
            key_pem: server.key.clone().into_bytes(),
            client_ca_pem: client_ca.map(|ca| ca.pem.clone().into_bytes()),
        }
    }
}

/// Writes `contents` to `dir/name` the way the kubelet updates a mounted
/// Secret: a new file renamed over the old one, so no reader sees half.
pub fn write_file(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    let next = dir.join(format!(".{name}.next"));
    std::fs::write(&next, contents).expect("write");
    std::fs::rename(&next, &path).expect("rename");
    path
}

/// A CA bundle, a client certificate and its key, made once per test
/// process, for settings that name such files (the chart's rendered ones).
pub fn stand_in_files() -> &'static StandIn {
    static FILES: std::sync::OnceLock<StandIn> = std::sync::OnceLock::new();
    FILES.get_or_init(|| {
        let dir = super::fresh_dir("tls-stand-in");
        let ca = TestCa::new("stand-in CA");
        let client = ca.client("stand-in");
        StandIn {
            ca: write_file(&dir, "ca.crt", &ca.pem),
            cert: write_file(&dir, "tls.crt", &client.cert),
            key: write_file(&dir, "tls.key", &client.key),
        }
    })
}

/// See [`stand_in_files`].
pub struct StandIn {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl StandIn {
    /// The stand-in for the file an `AUTOAPPROVAL_*` variable names, if it names one.
    pub fn for_variable(&self, name: &str) -> Option<&Path> {
        if name.ends_with("_CA_FILE") {
            Some(&self.ca)
        } else if name.ends_with("_CLIENT_CERT_FILE") {
            Some(&self.cert)
        } else if name.ends_with("_CLIENT_KEY_FILE") {
            Some(&self.key)
        } else {
            None
        }
    }
}

/// A simulator serving HTTPS with `server`, requiring a client certificate
/// of `client_ca` if given.
pub async fn https_simulator(server: &Pem, client_ca: Option<&TestCa>) -> SimHandle {
    Simulator::start(
        "127.0.0.1:0".parse().expect("addr"),
        SimConfig {
            tls: Some(TestCa::sim_tls(server, client_ca)),
            ..SimConfig::default()
        },
    )
    .await
    .expect("an HTTPS simulator")
}

/// The engine of `support::engine` over `sim`, its clients built as `run`
/// builds them from `config` (their TLS reloads counted in `env.metrics`).
pub async fn env_over(
    db: impl AsDb,
    sim: SimHandle,
    config: &ExternalArgs,
) -> Result<Env, autoapproval::external::http::ConfigError> {
    let store = db.db().database();
    let metrics = Metrics::new();
    let external = HttpExternalSystems::build_reporting(config, Some(&metrics))?;
    let clock = ManualClock::new(t0());
    let shared: SharedClock = Arc::new(clock.clone());
    let approver = Arc::new(autoapproval::approval::Approver::new(
        store.clone(),
        external,
        shared,
        metrics.clone(),
        defaults().approver,
    ));
    Ok(Env {
        store,
        sim,
        clock,
        metrics,
        approver,
    })
}
