//! What the stack's children share: a free port to give them, a signal to
//! send them, and the tail of a log for an error message.

use std::path::Path;
use std::process::Stdio;

use super::{StackError, io};

/// A port free now on 127.0.0.1 (bound and released: another process could
/// take it in between, which start-up would then report).
pub fn free_port() -> Result<u16, StackError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("finding a free port"))?;
    Ok(listener
        .local_addr()
        .map_err(io("finding a free port"))?
        .port())
}

/// The last lines of a log file, for error messages.
pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(6);
    format!(
        "\n    {}\n    (whole log: {})",
        lines[start..].join("\n    "),
        path.display()
    )
}

/// Sends `SIG<name>` to `pid` with kill(1): no unsafe code for a signal.
pub fn signal(pid: u32, name: &str) {
    let sent = std::process::Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .stderr(Stdio::null())
        .status();
    if let Err(error) = sent {
        tracing::warn!(pid, signal = name, %error, "could not send a signal");
    }
}
