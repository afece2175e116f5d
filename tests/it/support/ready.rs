//! Readiness by asking: a server a test starts is ready when it answers a request of its
//! own protocol (etcd's health check, Redis's PING, ZooKeeper's `srvr`, a PostgreSQL
//! connection), never when its log says so: log lines change between releases (etcd
//! 3.4's "serving insecure client requests" is 3.5's JSON "serving client traffic
//! insecurely"). A server that does not answer fails its test within [`READY_TIMEOUT`],
//! with the last lines of its log.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// How long a fresh server may take to answer: under 30 s, so that a server that never
/// comes up fails its test in less.
pub const READY_TIMEOUT: Duration = Duration::from_secs(25);

/// Why a server did not become ready.
#[derive(Debug)]
pub enum NotReady {
    /// It exited first (say, its port was taken meanwhile): worth another try.
    Exited(String),
    /// It ran but did not answer within [`READY_TIMEOUT`]; it was killed.
    Silent(String),
}

impl NotReady {
    /// The message, whichever the reason.
    pub fn message(&self) -> &str {
        match self {
            NotReady::Exited(m) | NotReady::Silent(m) => m,
        }
    }
}

/// Waits until `answers` says `what` (process `child`, logging to `log`) answers a
/// request; polls every `every`.
pub fn wait_ready(
    what: &str,
    child: &mut Child,
    log: &Path,
    every: Duration,
    mut answers: impl FnMut() -> bool,
) -> Result<(), NotReady> {
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(NotReady::Exited(format!(
                "{what} exited ({status}); its log ends:\n{}",
                last_lines(log, 15)
            )));
        }
        if answers() {
            return Ok(());
        }
        if start.elapsed() > READY_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(NotReady::Silent(format!(
                "{what} did not answer within {READY_TIMEOUT:?}; its log ends:\n{}",
                last_lines(log, 15)
            )));
        }
        std::thread::sleep(every);
    }
}

/// The last `n` lines of the file at `path` (empty if there is none).
pub fn last_lines(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
