//! TLS for the database tests: a CA the test makes ([`Pki`], rcgen) with
//! server and client certificates written to files, and dedicated servers
//! that speak only TLS: [`TlsPostgres`] (`ssl = on`, a `hostssl`-only
//! pg_hba, run as the postgres user when we are root) and [`tls_mariadb`]
//! (`require_secure_transport = ON`). Never the shared servers.

use std::path::{Path, PathBuf};
use std::process::Command;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, date_time_ymd,
};

/// A fresh directory for one TLS test's certificates and servers, removed
/// on drop: declared first, it outlives the servers kept in it.
pub struct TlsDir(PathBuf);

impl TlsDir {
    /// `autoapproval-<tag>-<pid>-<n>` under the temporary directory.
    pub fn new(tag: &str) -> TlsDir {
        TlsDir(super::fresh_dir(tag))
    }
}

impl std::ops::Deref for TlsDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TlsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub struct CertFiles {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key (PKCS#8), mode 0600.
    pub key: PathBuf,
}

/// A CA of the test's own, writing what it issues into `dir`.
pub struct Pki {
    dir: PathBuf,
    name: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    /// A new CA named `name`; its certificate is written to `dir/<name>-ca.crt`.
    pub fn new(dir: &Path, name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("autoapproval test CA {name}"));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        std::fs::write(dir.join(format!("{name}-ca.crt")), cert.pem()).expect("write the CA");
        Pki {
            dir: dir.to_owned(),
            name: name.to_owned(),
            issuer: Issuer::new(params, key),
        }
    }

    /// The CA's certificate file (a client's `sslrootcert` / `ssl-ca`).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.crt", self.name))
    }

    /// A server certificate for `names` (DNS names or IP addresses), valid
    /// now, or expired since 2021 when `expired`.
    pub fn server(&self, stem: &str, names: &[&str], expired: bool) -> CertFiles {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("server params");
        params.distinguished_name.push(DnType::CommonName, names[0]);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if expired {
            params.not_before = date_time_ymd(2020, 1, 1);
            params.not_after = date_time_ymd(2021, 1, 1);
        }
        self.issue(stem, params)
    }

    /// A client certificate whose common name is `user` (PostgreSQL's
    /// `cert` authentication maps it to the role).
    pub fn client(&self, stem: &str, user: &str) -> CertFiles {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params.distinguished_name.push(DnType::CommonName, user);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.issue(stem, params)
    }

    fn issue(&self, stem: &str, params: CertificateParams) -> CertFiles {
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let files = CertFiles {
            cert: self.dir.join(format!("{stem}.crt")),
            key: self.dir.join(format!("{stem}.key")),
        };
        std::fs::write(&files.cert, cert.pem()).expect("write a certificate");
        std::fs::write(&files.key, key.serialize_pem()).expect("write a key");
        chmod(&files.key, 0o600);
        files
    }
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

// === impl TlsPostgres ===

/// What a [`TlsPostgres`] serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PgTransport {
    /// `ssl = on` and only `hostssl` lines (with `cert` authentication for
    /// the role `certuser`): plaintext TCP is refused.
    TlsOnly,
    /// `ssl = off` and a plain `host` line: TLS is not offered.
    PlaintextOnly,
}

/// A PostgreSQL cluster of the test's own on 127.0.0.1 (initdb, pg_ctl),
/// trust authentication for every role but `certuser`; stopped and removed
/// on drop.
pub struct TlsPostgres {
    bindir: PathBuf,
    dir: PathBuf,
    port: u16,
    /// The CA trusted for client certificates.
    ca: PathBuf,
}

impl TlsPostgres {
    /// Starts a cluster in `dir` serving `server` (its certificate) with
    /// `ca` trusted for client certificates, TLS only.
    pub fn start(dir: &Path, ca: &Path, server: &CertFiles) -> TlsPostgres {
        let bindir = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL's binaries under /usr/lib/postgresql")
            .flatten()
            .map(|e| e.path().join("bin"))
            .filter(|bin| bin.join("initdb").is_file())
            .max()
            .expect("an initdb under /usr/lib/postgresql/*/bin");
        let dir = dir.join("pg");
        std::fs::create_dir_all(&dir).expect("the cluster's directory");
        let pg = TlsPostgres {
            bindir,
            dir,
            port: super::free_port(),
            ca: ca.to_owned(),
        };
        if is_root() {
            let _ = Command::new("useradd")
                .args(["--system", "--home-dir", "/var/lib/postgresql", "postgres"])
                .output();
            chown_to_postgres(&pg.dir);
        }
        pg.run(
            "initdb",
            &[
                "-D",
                &pg.data().display().to_string(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        );
        let conf = format!(
            "\nport = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             fsync = off\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n\
             ssl_ca_file = 'root.crt'\nmax_connections = 50\n",
            pg.port,
            pg.dir.display()
        );
        append(&pg.data().join("postgresql.conf"), &conf);
        pg.install(server);
        pg.write_transport(PgTransport::TlsOnly);
        pg.run(
            "pg_ctl",
            &[
                "-D",
                &pg.data().display().to_string(),
                "-l",
                &pg.dir.join("server.log").display().to_string(),
                "-w",
                "-t",
                "120",
                "start",
            ],
        );
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// `postgres://<user>@<host>:<port>/postgres?<query>`.
    pub fn url(&self, user: &str, host: &str, query: &str) -> String {
        format!("postgres://{user}@{host}:{}/postgres?{query}", self.port)
    }

    /// The superuser over the Unix socket, which every configuration
    /// trusts: for the test's own statements.
    pub fn admin_url(&self) -> String {
        format!(
            "postgres://postgres@localhost/postgres?host={}&port={}&sslmode=disable",
            self.dir.display(),
            self.port
        )
    }

    /// Serves `server` from now on (a restart, which waits until the server is up again).
    pub fn serve_certificate(&self, server: &CertFiles) {
        self.install(server);
        self.restart();
    }

    /// Serves `transport` from now on (a restart).
    pub fn serve(&self, transport: PgTransport) {
        self.write_transport(transport);
        self.restart();
    }

    fn install(&self, server: &CertFiles) {
        let data = self.data();
        std::fs::copy(&server.cert, data.join("server.crt")).expect("copy server.crt");
        std::fs::copy(&server.key, data.join("server.key")).expect("copy server.key");
        std::fs::copy(&self.ca, data.join("root.crt")).expect("copy root.crt");
        chmod(&data.join("server.key"), 0o600);
        if is_root() {
            chown_to_postgres(&data);
        }
    }

    fn write_transport(&self, transport: PgTransport) {
        let (ssl, hba) = match transport {
            PgTransport::TlsOnly => (
                "on",
                "local all all trust\n\
                 hostssl all certuser 127.0.0.1/32 cert\n\
                 hostssl all all 127.0.0.1/32 trust\n",
            ),
            PgTransport::PlaintextOnly => (
                "off",
                "local all all trust\nhost all all 127.0.0.1/32 trust\n",
            ),
        };
        let data = self.data();
        std::fs::write(data.join("pg_hba.conf"), hba).expect("pg_hba.conf");
        std::fs::write(data.join("postgresql.auto.conf"), format!("ssl = {ssl}\n"))
            .expect("postgresql.auto.conf");
        if is_root() {
            chown_to_postgres(&data);
        }
    }

    fn restart(&self) {
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data().display().to_string(),
                "-l",
                &self.dir.join("server.log").display().to_string(),
                "-w",
                "-t",
                "120",
                "-m",
                "fast",
                "restart",
            ],
        );
    }

    /// Runs a PostgreSQL program as the postgres user when we are root
    /// (initdb and postgres refuse root); panics with its output on failure.
    fn run(&self, program: &str, args: &[&str]) {
        let path = self.bindir.join(program);
        let mut command = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&path);
            c
        } else {
            Command::new(&path)
        };
        let out = command
            .args(args)
            .output()
            .expect("run a PostgreSQL program");
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        assert!(
            out.status.success(),
            "{program} {args:?}: {}{}\nserver log:\n{log}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        let pg_ctl = self.bindir.join("pg_ctl");
        let data = self.data().display().to_string();
        let args = ["-D", data.as_str(), "-m", "immediate", "-w", "stop"];
        let _ = if is_root() {
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&pg_ctl)
                .args(args)
                .output()
        } else {
            Command::new(&pg_ctl).args(args).output()
        };
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn chown_to_postgres(path: &Path) {
    let out = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(path)
        .output()
        .expect("chown");
    assert!(
        out.status.success(),
        "chown {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open to append");
    file.write_all(text.as_bytes()).expect("append");
}

// === impl TlsMariaDb ===

/// A MariaDB server of the test's own (crates/throwaway-db) serving a
/// certificate of the test's CA, trusting that CA for client certificates,
/// with `require_secure_transport = ON`: plaintext TCP is refused.
pub struct TlsMariaDb {
    /// The server.
    pub db: throwaway_db::MariaDb,
    /// The files it serves, which [`TlsMariaDb::serve_certificate`] replaces.
    served: CertFiles,
}

impl TlsMariaDb {
    /// Starts a server in `dir` serving `server`, trusting `ca`.
    pub async fn start(dir: &Path, ca: &Path, server: &CertFiles) -> TlsMariaDb {
        let served = CertFiles {
            cert: dir.join("mariadb-served.crt"),
            key: dir.join("mariadb-served.key"),
        };
        std::fs::copy(&server.cert, &served.cert).expect("copy the certificate");
        std::fs::copy(&server.key, &served.key).expect("copy the key");
        let db = throwaway_db::MariaDb::start_with(
            throwaway_db::Options::default()
                .arg(format!("--ssl-ca={}", ca.display()))
                .arg(format!("--ssl-cert={}", served.cert.display()))
                .arg(format!("--ssl-key={}", served.key.display()))
                .arg("--require-secure-transport=ON"),
        )
        .await
        .expect("a MariaDB server that requires TLS");
        TlsMariaDb { db, served }
    }

    /// `mysql://<user>@<host>:<port>/<database>?<query>`.
    pub fn url(&self, user: &str, host: &str, database: &str, query: &str) -> String {
        format!(
            "mysql://{user}@{host}:{}/{database}?{query}",
            self.db.port()
        )
    }

    /// Serves `server` from now on: its files are copied over the served
    /// ones, then `FLUSH SSL` reads them again.
    pub async fn serve_certificate(&self, server: &CertFiles) {
        std::fs::copy(&server.cert, &self.served.cert).expect("replace the certificate");
        std::fs::copy(&server.key, &self.served.key).expect("replace the key");
        self.db.execute("FLUSH SSL").await.expect("FLUSH SSL");
    }
}
