//! The entry point of the binary: forks the guard (`run`: first, while the process has
//! one thread, see `supervisor::guard`), parses the command line, builds a current-thread
//! runtime and dispatches: `run` to [`crate::run`], `status` and `release` to
//! [`crate::admin`]. A setup error is printed here, once, as `lockrun: {err:#}`.
//! The top of the crate: it may use every module, and none uses it.

use std::ffi::OsString;
use std::io;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

use crate::backend::AnyBackend;
use crate::cli::{Cli, Command, LogArgs, RunArgs};
use crate::clock::marks;
use crate::config::{BackendConfig, LockName, RunConfig};
use crate::log::{Format, Logger};
use crate::metrics::RunReport;
use crate::outcome::Outcome;
use crate::supervisor::Guard;
use crate::{admin, cli, log, metrics, run};

/// Runs lockrun with `args` (argv, program name first) and returns the exit status.
pub fn main_with(args: Vec<OsString>) -> u8 {
    marks::init();
    let line = cli::with_default_subcommand(args.clone());
    // A run's guard is forked before anything else (see `supervisor::guard`), so that
    // its start and the job's cgroup run beside the parsing and the acquire; it exits
    // when lockrun drops it (a usage error, a bad configuration).
    let guard = (line.get(1).is_some_and(|a| a == "run")).then(|| Guard::start(args.clone()));
    marks::mark("forked");
    let cli = match Cli::try_parse_from(line) {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e, &args),
    };
    marks::mark("parsed");
    let code = match dispatch(cli, guard, &args) {
        Ok(code) => code,
        // The one place a setup error is printed (through the logger, so that it is a
        // JSON line with `--log-format json`): the whole chain, on one line.
        Err(err) => run::fail(&format!("{err:#}")).exit_code(),
    };
    // A stderr that does not take lockrun's last lines holds back its exit this long
    // at most; the lines are lost then.
    log::flush(LAST_LINES_WAIT);
    marks::mark("exit");
    marks::write_marks();
    code
}

/// What Rust's own start-up does that lockrun needs, for a `main` that skips it (see
/// `main.rs`): descriptors 0, 1 and 2 are open (on `/dev/null` if they were closed), so
/// that no file lockrun opens (a lock file) is taken for stdin, stdout or stderr; and
/// SIGPIPE is ignored, so that a closed pipe is an error where it is written, not a
/// death (the command gets it back at its default: `supervisor::spawn`).
#[allow(unsafe_code)]
pub fn prepare_process() {
    use nix::libc;
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    // SAFETY: `poll` reads and writes the three entries of `fds` only; `open` gets a
    // NUL-terminated path; `signal` installs no handler, only SIG_IGN.
    unsafe {
        if libc::poll(fds.as_mut_ptr(), 3, 0) == -1 {
            // (EINTR, ENOMEM: ask each descriptor instead.)
            for p in &mut fds {
                if libc::fcntl(p.fd, libc::F_GETFD) == -1 {
                    p.revents = libc::POLLNVAL;
                }
            }
        }
        for p in &fds {
            if p.revents & libc::POLLNVAL != 0
                && libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) != p.fd
            {
                // Rust's start-up aborts here too: nothing safe can be done.
                libc::abort();
            }
        }
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// How long lockrun's exit waits for stderr to take its last lines.
const LAST_LINES_WAIT: Duration = Duration::from_secs(1);

/// Runs the parsed command line. `Err` is a setup step that failed before anything
/// was done (exit status 125); what happens later is in the returned status.
/// `guard`: the one forked at start, if it was (a run), with `line` (argv).
fn dispatch(cli: Cli, guard: Option<io::Result<Guard>>, line: &[OsString]) -> anyhow::Result<u8> {
    let password = std::env::var("LOCKRUN_PASSWORD").ok();
    match cli.command {
        Command::Run(args) => Ok(run_command(&args, password, guard, line)),
        Command::Status(args) => {
            install_logger(&args.log, &args.name);
            let backend = admin_backend(&args.backend, &args.name, password)?;
            let outcome = runtime()?.block_on(admin::status(
                &backend,
                &args.name,
                args.backend.slots,
                args.json,
            ));
            Ok(outcome.exit_code())
        }
        Command::List(args) => {
            install_logger(&args.log, "");
            let cfg = BackendConfig::from_args(&args.backend, password)?;
            let pattern = args.pattern.as_deref();
            let outcome = runtime()?.block_on(admin::list(&cfg, pattern, args.json));
            Ok(outcome.exit_code())
        }
        Command::Release(args) => {
            install_logger(&args.log, &args.name);
            let backend = admin_backend(&args.backend, &args.name, password)?;
            let outcome = runtime()?.block_on(admin::force_release(
                &backend,
                &args.name,
                args.backend.slots,
            ));
            Ok(outcome.exit_code())
        }
    }
}

/// `lockrun run`: checks the configuration, tells the guard its command, runs, writes
/// the metrics file; returns the exit status.
fn run_command(
    args: &RunArgs,
    password: Option<String>,
    early: Option<io::Result<Guard>>,
    line: &[OsString],
) -> u8 {
    install_logger(&args.log, &args.name);
    let not_started = |msg: String| RunReport {
        outcome: run::fail(&format!("{msg}; the command was not started")),
        waited: Duration::ZERO,
        held: Duration::ZERO,
    };
    // Not a setup error: a run that cannot start still writes its metrics.
    let report = match RunConfig::from_args(args, password) {
        // Still one thread here: before the log writer's and the runtime.
        Ok(cfg) => match marks::then("config", || told(early, line, &cfg.command)) {
            Ok(guard) => match marks::then("guard", runtime) {
                Ok(runtime) => {
                    marks::mark("runtime");
                    log::start_writer();
                    let backend = AnyBackend::open(&cfg.backend, !cfg.wait.is_zero());
                    let report = runtime.block_on(run::run(&cfg, &backend, guard));
                    // A name lookup of a ping that gave up may still hang on a
                    // blocking thread: not waited for.
                    runtime.shutdown_background();
                    report
                }
                Err(e) => not_started(format!("{e:#}")),
            },
            Err(e) => not_started(format!("cannot start the guard process: {e}")),
        },
        Err(e) => not_started(e.to_string()),
    };
    if let Some(path) = &args.metrics_file {
        if let Err(e) = metrics::write(path, &args.name, &report) {
            let msg = format!("cannot write the metrics file {}: {e}", path.display());
            log::emit(log::Level::Warn, log::Event::MetricsFailed, &msg, &[]);
        }
    }
    report.outcome.exit_code()
}

/// The guard, told that `command` is its command: the one forked at start, or, where
/// none was or the command is not the end of its `line`, one forked now (lockrun still
/// has one thread).
fn told(
    early: Option<io::Result<Guard>>,
    line: &[OsString],
    command: &[OsString],
) -> io::Result<Guard> {
    let guard = match early {
        Some(guard) if line.ends_with(command) => guard?,
        early => {
            // (Gone first: the new guard must not keep the old one's socket open.)
            drop(early);
            Guard::start(command.to_vec())?
        }
    };
    guard.command(command.len())?;
    Ok(guard)
}

/// The current-thread runtime lockrun runs on.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn install_logger(args: &LogArgs, lock: &str) {
    Logger::new(
        args.log_format,
        Logger::level_for(args.quiet, args.verbose),
        lock,
    )
    .install();
}

/// The backend of `status` and `release`, from checked arguments. The configuration's
/// messages are whole sentences already (what is wrong and what to write instead), so
/// they get no context of their own.
fn admin_backend(
    args: &cli::BackendArgs,
    name: &str,
    password: Option<String>,
) -> anyhow::Result<AnyBackend> {
    LockName::parse(name)?;
    let cfg = BackendConfig::from_args(args, password)?;
    Ok(AnyBackend::open(&cfg, false))
}

/// Prints a clap error as one line (help and version go to stdout with status 0).
fn usage_error(e: &clap::Error, args: &[OsString]) -> u8 {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return 0;
    }
    // The log format may not have been parsed: look for it by hand.
    let json = std::env::var("LOCKRUN_LOG_FORMAT").is_ok_and(|f| f == "json")
        || args
            .windows(2)
            .any(|w| w[0] == "--log-format" && w[1] == "json")
        || args.iter().any(|a| a == "--log-format=json");
    let format = if json { Format::Json } else { Format::Text };
    Logger::new(format, log::Level::Error, "").install();
    let rendered = e.to_string();
    let first = rendered.lines().next().unwrap_or("invalid arguments");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    run::fail(&format!(
        "{first} (see 'lockrun --help'); the command was not started"
    ));
    Outcome::Failed.exit_code()
}
