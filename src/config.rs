//! The checked configuration: what [`crate::cli`] parsed, validated and typed. The
//! rest of the crate sees only these structs, in which every cross-option rule (renew
//! shorter than the TTL, a valid lock name, a known URL scheme, a signal that exists)
//! already holds. Errors say what to fix, in one line, and never echo a password or a
//! URL that may carry one.

use std::ffi::OsString;
use std::time::Duration;

use nix::sys::signal::Signal;
use thiserror::Error;

mod backend;

pub use backend::BackendConfig;

use crate::cli::RunArgs;

/// A configuration mistake; each one is exit status 125 before anything starts.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The lock name breaks the naming rule.
    #[error("invalid lock name {0:?}: use 1 to 200 bytes of A-Z a-z 0-9 . _ - : /")]
    BadName(String),
    /// A duration that must be positive is zero.
    #[error("--ttl must be longer than zero")]
    ZeroTtl,
    /// Renewal would not happen before the lease expires.
    #[error("--renew-every ({renew}) must be shorter than --ttl ({ttl})")]
    RenewTooSlow {
        /// The renewal period as typed.
        renew: String,
        /// The TTL as typed.
        ttl: String,
    },
    /// The renewal period is zero.
    #[error("--renew-every must be longer than zero")]
    ZeroRenew,
    /// The kill signal is unknown.
    #[error("unknown signal {0:?} for --kill-signal: use a name such as TERM, INT, HUP, QUIT, USR1, KILL, or a number")]
    BadSignal(String),
    /// The URL's scheme is not a backend this build knows.
    #[error("unsupported backend URL scheme {0:?}: use {list}", list = crate::backend::scheme_list())]
    BadScheme(String),
    /// The URL could not be parsed (the URL itself is not shown: it may hold a password).
    #[error("the backend URL is not valid: expected {expected}")]
    BadUrl {
        /// The form the URL's backend expects.
        expected: &'static str,
    },
    /// A backend refused its URL or options for a reason of its own, in one line.
    #[error("{0}")]
    Backend(String),
    /// A TLS file named in the environment could not be read.
    #[error("cannot read {var} ({path}): {reason}")]
    TlsFile {
        /// The environment variable that named it.
        var: &'static str,
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// Only one half of a client certificate was given.
    #[error("LOCKRUN_TLS_CERT and LOCKRUN_TLS_KEY go together: set both or neither")]
    TlsHalfPair,
    /// Several URLs that are not all Redis, or too few for a quorum.
    #[error("several --url values make a Redlock quorum: give 3 or more (3 or 5 advised) redis:// or rediss:// URLs of independent servers")]
    BadQuorum,
    /// The password file could not be read.
    #[error("cannot read the password file {path}: {reason}")]
    PasswordFile {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// A valid lock name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockName(String);

impl LockName {
    /// Checks the naming rule: 1 to 200 bytes of `A-Z a-z 0-9 . _ - : /`.
    pub fn parse(name: &str) -> Result<LockName, ConfigError> {
        let ok_char =
            |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '/');
        if (1..=200).contains(&name.len()) && name.chars().all(ok_char) {
            Ok(LockName(name.to_owned()))
        } else {
            Err(ConfigError::BadName(name.chars().take(64).collect()))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Parses a signal name (`TERM`, `SIGTERM`, `term`) or number (`15`).
pub fn parse_signal(s: &str) -> Result<Signal, ConfigError> {
    let bad = || ConfigError::BadSignal(s.chars().take(32).collect());
    if let Ok(n) = s.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| bad());
    }
    let upper = s.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse::<Signal>().map_err(|_| bad())
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
    /// The command and its arguments (never empty).
    pub command: Vec<OsString>,
}

impl RunConfig {
    /// Checks `lockrun run` arguments; `env_password` is `LOCKRUN_PASSWORD`.
    pub fn from_args(
        args: &RunArgs,
        env_password: Option<String>,
    ) -> Result<RunConfig, ConfigError> {
        let name = LockName::parse(&args.name)?;
        if args.ttl.is_zero() {
            return Err(ConfigError::ZeroTtl);
        }
        let renew_every = args.renew_every.unwrap_or(args.ttl / 3);
        if renew_every.is_zero() {
            return Err(ConfigError::ZeroRenew);
        }
        if renew_every >= args.ttl {
            return Err(ConfigError::RenewTooSlow {
                renew: humantime::format_duration(renew_every).to_string(),
                ttl: humantime::format_duration(args.ttl).to_string(),
            });
        }
        Ok(RunConfig {
            name,
            backend: BackendConfig::from_args(&args.backend, env_password)?,
            ttl: args.ttl,
            renew_every,
            wait: args.wait,
            conflict_exit_code: args.conflict_exit_code,
            hold_at_least: args.hold_at_least,
            kill_signal: parse_signal(&args.kill_signal)?,
            kill_after: args.kill_after,
            max_runtime: args.max_runtime.filter(|d| !d.is_zero()),
            command: args.command.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn run_args(extra: &[&str]) -> RunArgs {
        let mut argv = vec!["lockrun", "run", "--url", "redis://127.0.0.1:6379"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Run(r) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn lock_names_follow_the_rule() {
        for good in ["job", "a", "nightly/backup:db-1.v2_x", &"x".repeat(200)] {
            assert!(LockName::parse(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "has space",
            "semi;colon",
            "{brace}",
            "ünï",
            &"x".repeat(201),
        ] {
            assert!(LockName::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn renew_every_defaults_to_a_third_of_the_ttl() {
        let c =
            RunConfig::from_args(&run_args(&["--ttl", "30s", "job", "--", "true"]), None).unwrap();
        assert_eq!(c.renew_every, Duration::from_secs(10));
        assert_eq!(c.kill_signal, Signal::SIGTERM);
        assert_eq!(c.conflict_exit_code, 75);
        assert_eq!(c.backend.display, "127.0.0.1:6379");
    }

    #[test]
    fn renew_every_must_be_shorter_than_the_ttl() {
        let e = RunConfig::from_args(
            &run_args(&["--ttl", "5s", "--renew-every", "5s", "job", "--", "true"]),
            None,
        )
        .unwrap_err();
        assert!(matches!(e, ConfigError::RenewTooSlow { .. }), "{e}");
        let e = RunConfig::from_args(&run_args(&["--ttl", "0", "job", "--", "true"]), None)
            .unwrap_err();
        assert_eq!(e, ConfigError::ZeroTtl);
    }

    #[test]
    fn signals_parse_by_name_and_number() {
        assert_eq!(parse_signal("TERM").unwrap(), Signal::SIGTERM);
        assert_eq!(parse_signal("sigint").unwrap(), Signal::SIGINT);
        assert_eq!(parse_signal("9").unwrap(), Signal::SIGKILL);
        assert!(parse_signal("NOPE").is_err());
        assert!(parse_signal("999").is_err());
    }
}
