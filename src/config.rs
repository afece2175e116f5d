//! The checked configuration: what [`crate::cli`] parsed, validated and typed. The
//! rest of the crate sees only these structs, in which every cross-option rule (renew
//! shorter than the TTL, a valid lock name, a known URL scheme, a signal that ends a
//! process, every duration within its [`bounds`]) already holds. Errors say what to fix, in one line, and never echo a password or a
//! URL that may carry one.

use std::ffi::OsString;
use std::time::Duration;

use nix::sys::signal::Signal;
use thiserror::Error;

pub(crate) mod backend;
pub mod bounds;
pub mod ping;

pub use crate::backend::url::BackendConfig;
pub use crate::name::LockName;
pub use ping::PingUrl;

use crate::backend::url::UrlError;
use crate::name::BadName;

/// A configuration mistake; each one is exit status 125 before anything starts.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The lock name breaks the naming rule.
    #[error(transparent)]
    BadName(#[from] BadName),
    /// A duration outside its allowed range ([`bounds`]).
    #[error("{option} must be from {range}")]
    OutOfRange {
        /// The option (`--ttl`).
        option: &'static str,
        /// The allowed range in words.
        range: &'static str,
    },
    /// Renewal would not happen before the lease expires.
    #[error("--renew-every ({renew}) must be shorter than --ttl ({ttl})")]
    RenewTooSlow {
        /// The renewal period as typed.
        renew: String,
        /// The TTL as typed.
        ttl: String,
    },
    /// The kill signal is unknown.
    #[error("unknown signal {0:?} for --kill-signal: use {USABLE_SIGNALS}")]
    BadSignal(String),
    /// The kill signal would not end the command: it only stops or continues a
    /// process, or is ignored by default.
    #[error("--kill-signal {0} would not end the command (it only stops or continues a process, or is ignored by default): use {USABLE_SIGNALS}")]
    InertSignal(String),
    /// A backend URL or option refused by the backend's parser.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// `--ping`'s URL is unusable (the words never quote it), or the CA file for it
    /// cannot be read.
    #[error("--ping: {0}")]
    Ping(String),
    /// The password file could not be read, or holds no usable password.
    #[error("cannot use the password file {path}: {reason}")]
    PasswordFile {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// The kill signals to suggest in a refusal.
const USABLE_SIGNALS: &str = "TERM, INT, HUP, QUIT, USR1, USR2, KILL, or another signal that ends a process (by name or number)";

/// Signals whose default action is to stop or continue a process, or nothing at all:
/// as a first kill signal they would leave the command running until SIGKILL, or
/// stopped (and holding whatever it holds) until then.
const INERT_SIGNALS: &[Signal] = &[
    Signal::SIGSTOP,
    Signal::SIGTSTP,
    Signal::SIGTTIN,
    Signal::SIGTTOU,
    Signal::SIGCONT,
    Signal::SIGCHLD,
    Signal::SIGWINCH,
    Signal::SIGURG,
];

/// Parses a signal name (`TERM`, `SIGTERM`, `term`) or number (`15`) into a signal
/// whose default action ends a process.
pub fn parse_signal(s: &str) -> Result<Signal, ConfigError> {
    let bad = || ConfigError::BadSignal(s.chars().take(32).collect());
    let signal = match s.parse::<i32>() {
        Ok(n) => Signal::try_from(n).map_err(|_| bad())?,
        Err(_) => {
            let upper = s.to_ascii_uppercase();
            let name = if upper.starts_with("SIG") {
                upper
            } else {
                format!("SIG{upper}")
            };
            name.parse::<Signal>().map_err(|_| bad())?
        }
    };
    if INERT_SIGNALS.contains(&signal) {
        let name = signal.as_str().trim_start_matches("SIG");
        return Err(ConfigError::InertSignal(name.to_owned()));
    }
    Ok(signal)
}

/// Everything `lockrun run` needs, checked.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The lock.
    pub name: LockName,
    /// The backend.
    pub backend: BackendConfig,
    /// Lease length.
    pub ttl: Duration,
    /// Renewal period (< ttl).
    pub renew_every: Duration,
    /// How long to wait for a busy lock.
    pub wait: Duration,
    /// The longest random pause before the first attempt.
    pub splay: Duration,
    /// Run only if no run succeeded within this long (`--once-per`).
    pub once_per: Option<Duration>,
    /// Exit status when busy.
    pub conflict_exit_code: u8,
    /// Minimum time the lock stays taken after acquisition.
    pub hold_at_least: Duration,
    /// First signal on lock loss or max runtime.
    pub kill_signal: Signal,
    /// Grace before SIGKILL.
    pub kill_after: Duration,
    /// Stop the command after this long.
    pub max_runtime: Option<Duration>,
    /// The dead man's switch to ping at the command's start and end.
    pub ping: Option<PingUrl>,
    /// The command and its arguments (never empty).
    pub command: Vec<OsString>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_parse_by_name_and_number() {
        assert_eq!(parse_signal("TERM").unwrap(), Signal::SIGTERM);
        assert_eq!(parse_signal("sigint").unwrap(), Signal::SIGINT);
        assert_eq!(parse_signal("9").unwrap(), Signal::SIGKILL);
        assert!(parse_signal("NOPE").is_err());
        assert!(parse_signal("999").is_err());
        assert!(parse_signal("0").is_err());
    }

    #[test]
    fn signals_that_do_not_end_a_process_are_refused() {
        for inert in [
            "STOP", "SIGTSTP", "ttin", "TTOU", "CONT", "CHLD", "WINCH", "URG", "19", "17",
        ] {
            let e = parse_signal(inert).unwrap_err();
            assert!(matches!(e, ConfigError::InertSignal(_)), "{inert}: {e}");
            let text = e.to_string();
            assert!(text.contains("TERM") && text.contains("KILL"), "{text}");
        }
        assert_eq!(
            parse_signal("stop")
                .unwrap_err()
                .to_string()
                .split(' ')
                .nth(1),
            Some("STOP")
        );
        for usable in [
            "TERM", "INT", "HUP", "QUIT", "USR1", "USR2", "KILL", "ALRM", "PIPE",
        ] {
            assert!(parse_signal(usable).is_ok(), "{usable}");
        }
    }
}
