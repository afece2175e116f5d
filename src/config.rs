//! The checked configuration: what [`crate::cli`] parsed, validated and typed. The
//! rest of the crate sees only these structs, in which every cross-option rule (renew
//! shorter than the TTL, a valid lock name, a known URL scheme, a signal that ends a
//! process, every duration within its [`bounds`]) already holds. Errors say what to fix, in one line, and never echo a password or a
//! URL that may carry one.

use std::ffi::OsString;
use std::time::Duration;

use nix::sys::signal::Signal;
use thiserror::Error;

mod backend;
pub mod bounds;

pub use backend::BackendConfig;

use crate::cli::RunArgs;

/// A configuration mistake; each one is exit status 125 before anything starts.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The lock name breaks the naming rule.
    #[error("invalid lock name {0:?}: use 1 to 200 bytes of A-Z a-z 0-9 . _ - : /")]
    BadName(String),
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
    /// The URL's scheme is not a backend this build knows.
    #[error("unsupported backend URL scheme {0:?}: use {list}", list = crate::backend::scheme_list())]
    BadScheme(String),
    /// A URL names port 0, which no server listens on (the URL is not shown).
    #[error("the backend URL has port 0: give the server's port, 1 to 65535")]
    PortZero,
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
    /// The password file could not be read, or holds no usable password.
    #[error("cannot use the password file {path}: {reason}")]
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
        // clap's value parsers checked these already; checked again because a
        // `RunArgs` can be built without them, and the rest of the crate relies on it.
        let ttl = bounds::TTL.check(args.ttl)?;
        // At least 33 ms: the TTL is at least 100 ms.
        let renew_every = bounds::RENEW_EVERY.check(args.renew_every.unwrap_or(ttl / 3))?;
        if renew_every >= ttl {
            return Err(ConfigError::RenewTooSlow {
                renew: humantime::format_duration(renew_every).to_string(),
                ttl: humantime::format_duration(ttl).to_string(),
            });
        }
        let max_runtime = match args.max_runtime {
            Some(d) => Some(bounds::MAX_RUNTIME.check(d)?).filter(|d| !d.is_zero()),
            None => None,
        };
        Ok(RunConfig {
            name,
            backend: BackendConfig::from_args(&args.backend, env_password)?,
            ttl,
            renew_every,
            wait: bounds::WAIT.check(args.wait)?,
            conflict_exit_code: args.conflict_exit_code,
            hold_at_least: bounds::HOLD_AT_LEAST.check(args.hold_at_least)?,
            kill_signal: parse_signal(&args.kill_signal)?,
            kill_after: bounds::KILL_AFTER.check(args.kill_after)?,
            max_runtime,
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
    }

    #[test]
    fn durations_out_of_range_are_refused_even_when_clap_did_not_check_them() {
        const HUGE: Duration = Duration::from_secs(u64::MAX);
        type Spoil = fn(&mut RunArgs);
        let cases: [(&str, Spoil); 7] = [
            ("--ttl", |a| a.ttl = Duration::ZERO),
            ("--ttl", |a| a.ttl = HUGE),
            ("--renew-every", |a| {
                a.renew_every = Some(Duration::from_nanos(1))
            }),
            ("--wait", |a| a.wait = HUGE),
            ("--hold-at-least", |a| a.hold_at_least = HUGE),
            ("--kill-after", |a| a.kill_after = HUGE),
            ("--max-runtime", |a| a.max_runtime = Some(HUGE)),
        ];
        for (option, spoil) in cases {
            let mut args = run_args(&["job", "--", "true"]);
            spoil(&mut args);
            let e = RunConfig::from_args(&args, None).unwrap_err();
            assert!(
                matches!(e, ConfigError::OutOfRange { option: o, .. } if o == option),
                "{option}: {e}"
            );
        }
    }

    #[test]
    fn max_runtime_zero_means_no_limit() {
        let args = run_args(&["--max-runtime", "0", "job", "--", "true"]);
        assert_eq!(RunConfig::from_args(&args, None).unwrap().max_runtime, None);
    }

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
