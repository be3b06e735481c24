//! A throwaway PostgreSQL: `initdb` into the stack's directory with the
//! system's binaries, `postgres` as a child process on a port of its own,
//! trust authentication on 127.0.0.1 only. As root it runs as the `postgres`
//! user, because PostgreSQL refuses to run as root.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::process::{Child, Command};

use super::process::{free_port, tail};
use super::{StackError, io};

/// A running throwaway server.
pub struct Postgres {
    child: Child,
    port: u16,
    log: PathBuf,
    bindir: PathBuf,
    dir: PathBuf,
    owner: Option<(u32, u32)>,
}

// === impl Postgres ===

impl Postgres {
    /// CPU seconds the server and its backends have used so far.
    pub fn cpu_seconds(&self) -> Option<f64> {
        super::replicas::tree_cpu_seconds(self.child.id()?)
    }

    /// Initialises a cluster under `dir` and starts it; `bindir` overrides
    /// where `initdb` and `postgres` are found.
    pub async fn start(dir: &Path, bindir: Option<&Path>) -> Result<Self, StackError> {
        let bindir = match bindir {
            Some(dir) => dir.to_path_buf(),
            None => find_bindir().ok_or_else(|| {
                StackError::Postgres(
                    "no initdb found in /usr/lib/postgresql/*/bin or PATH: install PostgreSQL \
                     (scripts/demo.sh does) or pass --pg-bindir"
                        .into(),
                )
            })?,
        };
        let owner = run_as()?;
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        if let Some((uid, gid)) = owner {
            // The stack's directory is root's; the server's part is the postgres user's.
            for d in [dir, dir.parent().unwrap_or(dir)] {
                std::os::unix::fs::chown(d, Some(uid), Some(gid))
                    .map_err(io(format!("chown {}", d.display())))?;
            }
        }
        let data = dir.join("data");
        let log = dir.join("server.log");
        let initdb = command(&bindir.join("initdb"), owner)
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"])
            .output()
            .await
            .map_err(io(format!("running {}/initdb", bindir.display())))?;
        if !initdb.status.success() {
            return Err(StackError::Postgres(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&initdb.stderr).trim()
            )));
        }
        let port = free_port()?;
        std::fs::File::create(&log).map_err(io("creating the server log"))?;
        let child = spawn_server(&bindir, dir, port, &log, owner)?;
        let mut pg = Self {
            child,
            port,
            log,
            bindir,
            dir: dir.to_path_buf(),
            owner,
        };
        pg.wait_ready().await?;
        Ok(pg)
    }

    /// Stops the server the way an operator's restart does (fast shutdown:
    /// every session is ended), leaves it down for `down`, and starts it
    /// again on the same port and data; returns once it accepts connections.
    pub async fn restart(&mut self, down: Duration) -> Result<(), StackError> {
        self.shut_down().await;
        tokio::time::sleep(down).await;
        self.child = spawn_server(&self.bindir, &self.dir, self.port, &self.log, self.owner)?;
        self.wait_ready().await
    }

    async fn wait_ready(&mut self) -> Result<(), StackError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(StackError::Postgres(format!(
                    "the server exited ({status}): {}",
                    tail(&self.log)
                )));
            }
            if let Ok(pool) = self.connect("postgres", "postgres").await {
                pool.close().await;
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(StackError::Postgres(format!(
                    "the server did not accept connections within 30 s: {}",
                    tail(&self.log)
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The URL of `database` as `user`.
    pub fn url(&self, user: &str, database: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/{database}", self.port)
    }

    /// A small pool of `database` as `user`.
    pub async fn connect(&self, user: &str, database: &str) -> Result<PgPool, StackError> {
        PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(5))
            .connect(&self.url(user, database))
            .await
            .map_err(|e| StackError::Postgres(format!("connecting as {user} to {database}: {e}")))
    }

    /// Fast shutdown (SIGINT: running sessions are ended), SIGKILL after 10 s.
    pub async fn stop(mut self) {
        self.shut_down().await;
    }

    async fn shut_down(&mut self) {
        if let Some(pid) = self.child.id() {
            super::process::signal(pid, "INT");
        }
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// Starts `postgres` on the cluster under `dir`, its log appended to `log`.
fn spawn_server(
    bindir: &Path,
    dir: &Path,
    port: u16,
    log: &Path,
    owner: Option<(u32, u32)>,
) -> Result<Child, StackError> {
    let mut server = command(&bindir.join("postgres"), owner);
    server
        .arg("-D")
        .arg(dir.join("data"))
        .arg("-k")
        .arg(dir)
        .args(["-p", &port.to_string()])
        .args(["-c", "listen_addresses=127.0.0.1"])
        .args(["-c", "max_connections=200"])
        // Throwaway data: durability only costs time here.
        .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
        .args(["-c", "full_page_writes=off"]);
    let stat_statements = bindir
        .parent()
        .map(|p| p.join("lib/pg_stat_statements.so"))
        .is_some_and(|lib| lib.exists());
    if stat_statements {
        server.args([
            "-c",
            "shared_preload_libraries=pg_stat_statements",
            "-c",
            "pg_stat_statements.track=top",
        ]);
    }
    let log_file = std::fs::OpenOptions::new()
        .append(true)
        .open(log)
        .map_err(io("opening the server log"))?;
    server
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .map_err(io(format!("starting {}/postgres", bindir.display())))
}

/// The newest `/usr/lib/postgresql/<version>/bin` (Debian's layout), else
/// the directory of an `initdb` on PATH.
fn find_bindir() -> Option<PathBuf> {
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    debian.sort();
    if let Some((_, bin)) = debian.pop() {
        return Some(bin);
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .find(|dir| dir.join("initdb").exists() && dir.join("postgres").exists())
    })
}

/// The `postgres` user's uid and gid when we are root (PostgreSQL will not
/// run as root); `None` otherwise.
fn run_as() -> Result<Option<(u32, u32)>, StackError> {
    use std::os::unix::fs::MetadataExt;
    // Our own uid, read off a file we just created: no libc call needed.
    // Unique per call: two stacks of one process may start at once.
    let probe = std::env::temp_dir().join(format!(
        "autoapproval-uid-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::write(&probe, b"").map_err(io("probing the user id"))?;
    let uid = std::fs::metadata(&probe).map(|m| m.uid());
    let _ = std::fs::remove_file(&probe);
    if uid.map_err(io("probing the user id"))? != 0 {
        return Ok(None);
    }
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(io("reading /etc/passwd"))?;
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            match fields.as_slice() {
                ["postgres", _, uid, gid, ..] => Some((uid.parse().ok()?, gid.parse().ok()?)),
                _ => None,
            }
        })
        .map(Some)
        .ok_or_else(|| {
            StackError::Postgres(
                "running as root needs a postgres user to run the server as (Debian's \
                 postgresql package creates it; scripts/demo.sh installs that)"
                    .into(),
            )
        })
}

fn command(program: &Path, owner: Option<(u32, u32)>) -> Command {
    let mut command = Command::new(program);
    if let Some((uid, gid)) = owner {
        command.uid(uid).gid(gid);
    }
    // Its own process group: a Ctrl-C on the terminal reaches only us, and
    // we stop the server in order.
    command.process_group(0).kill_on_drop(true);
    command
}
