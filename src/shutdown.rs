//! Termination signals: the one place the project waits for SIGTERM (what the
//! kubelet sends a pod) or Ctrl-C. The controller, the simulator and the lab
//! all use it.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGTERM and SIGINT handlers, installed when this is made: a signal that
/// arrives before anyone awaits [`Termination::recv`] is kept, not lost and
/// not left to the default action (which would kill the process mid-start).
pub struct Termination {
    interrupt: Signal,
    terminate: Signal,
}

// === impl Termination ===

impl Termination {
    /// Installs the handlers; call before starting anything that must be
    /// stopped cleanly.
    pub fn install() -> std::io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// Resolves at the next SIGTERM or Ctrl-C (at once for one already caught).
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }

    /// Whether a signal was caught and not yet received; consumes it.
    pub fn caught(&mut self) -> bool {
        futures::FutureExt::now_or_never(self.recv()).is_some()
    }
}
