//! The command line as the user typed it (clap derive). Doc comments here are the
//! `--help` text. Nothing here is checked beyond syntax, except that every duration is
//! within its range ([`crate::config::bounds`]; checked here so that values from the
//! environment are checked as they are read): [`crate::config`] turns these structs
//! into a checked configuration. Depends on [`crate::log`] for the format enum and
//! [`crate::config::bounds`].

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config::bounds;
use crate::log::Format;

mod checked;

/// Run a command under a named distributed lock.
///
/// lockrun acquires the lock NAME (a lease in Redis, PostgreSQL, MySQL, etcd or ZooKeeper, or a
/// lock file on this host), runs COMMAND in its own process group with a fencing token in
/// LOCKRUN_FENCING_TOKEN, renews the lease while the command lives, stops the whole group
/// before the lease can expire if renewal fails, releases the lock and exits with the
/// command's status.
#[derive(Debug, Parser)]
#[command(
    name = "lockrun",
    version,
    max_term_width = 100,
    subcommand_value_name = "SUBCOMMAND"
)]
#[command(after_help = "\
Exit status: the command's own; 128+N if it was killed by signal N; 75 (--conflict-exit-code) \
if the lock is busy; 124 if lockrun stopped the command (lock lost, --max-runtime); 125 if \
lockrun failed before starting it; 126 not executable; 127 not found.")]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands; `run` is the default.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run COMMAND while holding the lock NAME (the default subcommand).
    Run(Box<RunArgs>),
    /// Show who holds the lock NAME and how its last run ended (exit 0 held, 1 free, 125 error).
    Status(StatusArgs),
    /// Break the lock NAME whoever holds it (operator override; needs --force).
    Release(ReleaseArgs),
    /// List the locks under --key-prefix that are held or have a last run, one line
    /// each: holders, TTL left, last run (exit 0, 125 on error).
    List(ListArgs),
}

/// Where the lock lives. The `--url` help is built from the table of backends
/// ([`crate::backend::registry::KINDS`]), so it lists exactly the schemes that are accepted; a
/// backend's own options are flattened in from its module.
#[derive(Clone, Debug, Args)]
pub struct BackendArgs {
    #[arg(
        long,
        env = "LOCKRUN_URL",
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true,
        action = clap::ArgAction::Append,
        help = crate::backend::registry::url_help()
    )]
    /// The backend URL(s); the help text comes from the table of backends.
    pub url: Vec<String>,

    /// Read the backend password from this file (its first line, at most 4 KiB; overrides
    /// the URL's; a warning if group or others can read it). LOCKRUN_PASSWORD in the
    /// environment works too; the command gets neither.
    #[arg(long, env = "LOCKRUN_PASSWORD_FILE", value_name = "PATH")]
    pub password_file: Option<PathBuf>,

    /// Namespace of the backend keys (NAME's key is PREFIX{NAME} on Redis, PostgreSQL
    /// and etcd); two different (prefix, name) pairs never share a key.
    #[arg(
        long,
        env = "LOCKRUN_KEY_PREFIX",
        default_value = "lockrun:",
        value_name = "PREFIX"
    )]
    pub key_prefix: String,

    /// A semaphore: up to N commands hold NAME at once, each in its own slot (0 to
    /// N-1, given to the command as LOCKRUN_SLOT). Every lockrun of one NAME must give
    /// the same N: a holder with another N makes the run fail (125).
    #[arg(
        long,
        env = "LOCKRUN_SLOTS",
        default_value_t = 1,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=crate::backend::MAX_SLOTS as i64)
    )]
    pub slots: u32,

    /// Redis only: take the lock even on a server that may evict it (maxmemory set and
    /// a maxmemory-policy other than noeviction), which is otherwise refused (125). An
    /// evicted lock lets a second holder in; fencing tokens still tell them apart.
    #[arg(
        long,
        env = "LOCKRUN_ALLOW_EVICTION",
        value_parser = yes_or_no
    )]
    pub allow_eviction: bool,

    /// PostgreSQL's options.
    #[command(flatten)]
    pub postgres: PgArgs,
}

/// PostgreSQL's options (flattened into the backend options).
#[derive(Clone, Debug, clap::Args)]
pub struct PgArgs {
    /// PostgreSQL only: the lease table (TABLE or SCHEMA.TABLE), created if missing.
    #[arg(
        long = "pg-table",
        env = "LOCKRUN_PG_TABLE",
        default_value = "lockrun_locks",
        value_name = "TABLE"
    )]
    pub table: String,
}

/// A yes-or-no variable (`LOCKRUN_ALLOW_EVICTION`): 1, true, yes, on; or 0, false, no,
/// off, or empty (set but empty is no, as if unset).
fn yes_or_no(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "" | "0" | "false" | "no" | "off" => Ok(false),
        _ => Err("give 1, true, yes or on for yes; 0, false, no, off or nothing for no".into()),
    }
}

/// Logging on stderr.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// Quieter: only errors.
    #[arg(short, long, conflicts_with = "verbose")]
    pub quiet: bool,

    /// Louder: -v for each step of the run, -vv for every renewal.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Log format on stderr.
    #[arg(
        long,
        env = "LOCKRUN_LOG_FORMAT",
        value_enum,
        default_value = "text",
        value_name = "FORMAT"
    )]
    pub log_format: Format,
}

/// Arguments of `lockrun run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Backend options.
    #[command(flatten)]
    pub backend: BackendArgs,

    /// Logging options.
    #[command(flatten)]
    pub log: LogArgs,

    /// Lease length (humantime: 500ms, 30s, 5m, "1h 30m"), from 100ms to 24h.
    #[arg(long, env = "LOCKRUN_TTL", default_value = "30s", value_parser = |s: &str| bounds::TTL.parse(s), value_name = "DURATION")]
    pub ttl: Duration,

    /// Renewal period, at least 10ms and shorter than the TTL [default: TTL/3].
    #[arg(long, env = "LOCKRUN_RENEW_EVERY", value_parser = |s: &str| bounds::RENEW_EVERY.parse(s), value_name = "DURATION")]
    pub renew_every: Option<Duration>,

    /// How long to wait for a busy lock (0: do not wait), at most 365d.
    #[arg(long, env = "LOCKRUN_WAIT", default_value = "0", value_parser = |s: &str| bounds::WAIT.parse(s), value_name = "DURATION")]
    pub wait: Duration,

    /// Before the first attempt, pause a uniformly random time from 0 to this, holding
    /// nothing, so that a fleet's hosts do not all try on the same tick (a signal ends
    /// the pause and lockrun; the command is not started). --wait counts after it. At
    /// most 24h.
    #[arg(long, env = "LOCKRUN_SPLAY", default_value = "0", value_parser = |s: &str| bounds::SPLAY.parse(s), value_name = "DURATION")]
    pub splay: Duration,

    /// A dead man's switch in the healthchecks.io style: the run that holds the lock
    /// requests URL/start?rid=RID as the command starts and URL/STATUS?rid=RID when it
    /// ends (STATUS = lockrun's exit status). Busy and skipped runs ping nothing. A ping
    /// never delays the command nor changes the exit status; it gives up after about
    /// 10 s (https_proxy, http_proxy, no_proxy apply; LOCKRUN_TLS_CA adds a CA).
    #[arg(long, env = "LOCKRUN_PING", value_name = "URL", hide_env_values = true)]
    pub ping: Option<String>,

    /// Run only if no run of NAME that started within this long (by the backend's
    /// clock) succeeded, judged while holding the lock; else exit with the conflict
    /// status, the command not started. A failed run does not count. At most 7d; not
    /// on etcd or ZooKeeper yet.
    #[arg(long, env = "LOCKRUN_ONCE_PER", value_parser = |s: &str| bounds::ONCE_PER.parse(s), value_name = "DURATION")]
    pub once_per: Option<Duration>,

    /// Exit status when the lock was not acquired.
    #[arg(long, env = "LOCKRUN_CONFLICT_EXIT_CODE", default_value_t = crate::outcome::DEFAULT_CONFLICT_EXIT_CODE, value_name = "N")]
    pub conflict_exit_code: u8,

    /// Keep the lock until this long after acquisition even if the command ends
    /// sooner (without keeping a process alive), so hosts with skewed clocks do not
    /// run the same cron tick again. At most 24h (it is stored as the lock's expiry).
    #[arg(long, env = "LOCKRUN_HOLD_AT_LEAST", default_value = "0", value_parser = |s: &str| bounds::HOLD_AT_LEAST.parse(s), value_name = "DURATION")]
    pub hold_at_least: Duration,

    /// First signal sent to the process group when the lock is lost (TERM, INT, HUP,
    /// QUIT, USR1, USR2, KILL, or a number; SIG prefix optional). Signals that only
    /// stop or continue a process or are ignored by default (STOP, TSTP, TTIN, TTOU,
    /// CONT, CHLD, WINCH, URG) are refused.
    #[arg(
        long,
        env = "LOCKRUN_KILL_SIGNAL",
        default_value = "TERM",
        value_name = "SIG"
    )]
    pub kill_signal: String,

    /// Escalate to SIGKILL this long after the kill signal or a signal forwarded to the
    /// command, or at the lease deadline, whichever comes first. At most 24h.
    #[arg(long, env = "LOCKRUN_KILL_AFTER", default_value = "10s", value_parser = |s: &str| bounds::KILL_AFTER.parse(s), value_name = "DURATION")]
    pub kill_after: Duration,

    /// Stop the command (kill signal, then SIGKILL after --kill-after) once it has
    /// run this long (0: no limit), at most 365d.
    #[arg(long, env = "LOCKRUN_MAX_RUNTIME", value_parser = |s: &str| bounds::MAX_RUNTIME.parse(s), value_name = "DURATION")]
    pub max_runtime: Option<Duration>,

    /// After every run (ran, busy, lost or failed), atomically replace this file with
    /// Prometheus text-format gauges for node_exporter's textfile collector (use one
    /// file per lock, named *.prom).
    #[arg(long, env = "LOCKRUN_METRICS_FILE", value_name = "PATH")]
    pub metrics_file: Option<PathBuf>,

    /// The lock's name: 1 to 200 bytes of A-Z a-z 0-9 . _ - : /
    pub name: String,

    /// The command and its arguments, after `--` (run directly, not through a shell).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// Arguments of `lockrun status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Backend options.
    #[command(flatten)]
    pub backend: BackendArgs,

    /// Logging options.
    #[command(flatten)]
    pub log: LogArgs,

    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    pub json: bool,

    /// The lock's name.
    pub name: String,
}

/// Arguments of `lockrun list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Backend options.
    #[command(flatten)]
    pub backend: BackendArgs,

    /// Logging options.
    #[command(flatten)]
    pub log: LogArgs,

    /// Print a JSON array of `status --json` objects instead of lines.
    #[arg(long)]
    pub json: bool,

    /// Only the names matching this shell glob (`*`, `?`, `[a-z]`); quote it.
    #[arg(value_name = "PATTERN")]
    pub pattern: Option<String>,
}

/// Arguments of `lockrun release`.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// Backend options.
    #[command(flatten)]
    pub backend: BackendArgs,

    /// Logging options.
    #[command(flatten)]
    pub log: LogArgs,

    /// Confirm that the lock is to be broken whoever holds it. The holder's command
    /// keeps running until its lockrun notices the loss (at its next renewal).
    #[arg(long, required = true)]
    pub force: bool,

    /// The lock's name.
    pub name: String,
}

/// The subcommand names; anything else in first position means `run`.
const SUBCOMMANDS: &[&str] = &["run", "status", "release", "list", "help"];

/// Inserts the default subcommand `run` unless the first argument names a subcommand
/// or asks for help or the version.
pub fn with_default_subcommand(mut args: Vec<OsString>) -> Vec<OsString> {
    let first = args.get(1).and_then(|a| a.to_str());
    let explicit = match first {
        None => true,
        Some(a) => SUBCOMMANDS.contains(&a) || matches!(a, "-h" | "--help" | "-V" | "--version"),
    };
    if !explicit {
        args.insert(1, OsString::from("run"));
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        Cli::try_parse_from(with_default_subcommand(args))
    }

    #[test]
    fn run_is_the_default_subcommand() {
        let cli = parse(&["lockrun", "--ttl", "5s", "job", "--", "true"]).unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        assert_eq!(run.name, "job");
        assert_eq!(run.ttl, Duration::from_secs(5));
        assert_eq!(run.command, vec![OsString::from("true")]);
    }

    #[test]
    fn run_status_locks_a_lock_named_status() {
        let cli = parse(&["lockrun", "run", "status", "--", "echo", "hi"]).unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        assert_eq!(run.name, "status");
    }

    #[test]
    fn status_and_release_are_subcommands() {
        assert!(
            matches!(parse(&["lockrun", "status", "--json", "job"]).unwrap().command, Command::Status(s) if s.json)
        );
        assert!(matches!(
            parse(&["lockrun", "release", "--force", "job"])
                .unwrap()
                .command,
            Command::Release(_)
        ));
        assert!(
            parse(&["lockrun", "release", "job"]).is_err(),
            "release needs --force"
        );
    }

    #[test]
    fn the_command_must_follow_a_double_dash() {
        assert!(parse(&["lockrun", "job"]).is_err());
        assert!(parse(&["lockrun", "job", "true"]).is_err());
        let cli = parse(&["lockrun", "job", "--", "sh", "-c", "exit 3"]).unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        assert_eq!(run.command.len(), 3);
    }

    #[test]
    fn durations_use_humantime() {
        let run = |extra: &[&str]| {
            let mut argv = vec!["lockrun"];
            argv.extend_from_slice(extra);
            argv.extend_from_slice(&["job", "--", "true"]);
            match parse(&argv).map(|c| c.command) {
                Ok(Command::Run(run)) => Ok(run),
                Ok(other) => panic!("{other:?}"),
                Err(e) => Err(e.to_string()),
            }
        };
        let r = run(&["--ttl", "1h 30m", "--wait", "0"]).unwrap();
        assert_eq!(r.ttl, Duration::from_secs(5400));
        assert_eq!(r.wait, Duration::ZERO);
        assert!(run(&["--ttl", "5x"]).unwrap_err().contains("examples"));
    }

    #[test]
    fn every_duration_is_bounded_when_parsed_with_the_range_in_the_message() {
        let refused = |option: &str, value: &str| {
            let argv = ["lockrun", option, value, "job", "--", "true"];
            let e = parse(&argv).expect_err(&format!("{option} {value} was accepted"));
            e.to_string()
        };
        for (option, value, range) in [
            ("--ttl", "99ms", "100ms to 24h"),
            ("--ttl", "24h 1ms", "100ms to 24h"),
            ("--ttl", "0", "100ms to 24h"),
            ("--ttl", "292000000000y", "100ms to 24h"),
            ("--renew-every", "1ns", "10ms to 24h"),
            ("--wait", "500000000000y", "0 to 365d"),
            ("--wait", "366d", "0 to 365d"),
            ("--hold-at-least", "25h", "0 to 24h"),
            ("--splay", "24h 1ms", "0 to 24h"),
            ("--once-per", "8d", "1ms to 7d"),
            ("--once-per", "0", "1ms to 7d"),
            ("--kill-after", "2d", "0 to 24h"),
            ("--max-runtime", "500000000000y", "0 (no limit) to 365d"),
        ] {
            let text = refused(option, value);
            assert!(text.contains(range), "{option} {value}: {text}");
            assert!(text.contains(option), "{option} {value}: {text}");
        }
    }

    #[test]
    fn help_and_version_are_not_taken_for_a_lock_name() {
        assert_eq!(
            with_default_subcommand(vec!["lockrun".into(), "--help".into()]).len(),
            2
        );
        assert_eq!(
            with_default_subcommand(vec!["lockrun".into(), "-V".into()]).len(),
            2
        );
    }

    #[test]
    fn allow_eviction_is_a_flag_and_its_variable_a_yes_or_no() {
        let cli = parse(&["lockrun", "--allow-eviction", "job", "--", "true"]).unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        assert!(run.backend.allow_eviction);
        for yes in ["1", "true", "Yes", " on "] {
            assert_eq!(yes_or_no(yes), Ok(true), "{yes:?}");
        }
        for no in ["", "0", "FALSE", "no", "off"] {
            assert_eq!(yes_or_no(no), Ok(false), "{no:?}");
        }
        for neither in ["2", "maybe", "y e s"] {
            assert!(yes_or_no(neither).is_err(), "{neither:?}");
        }
    }

    #[test]
    fn clap_definitions_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
