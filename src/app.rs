//! The entry point of the binary: parses the command line, forks the guard (`run`:
//! while the process has one thread, see `supervisor::guard`), builds a current-thread
//! runtime and dispatches: `run` to [`crate::run`], `status` and `release` to
//! [`crate::admin`]. A setup error is printed here, once, as `lockrun: {err:#}`.
//! The top of the crate: it may use every module, and none uses it.

use std::ffi::OsString;
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
    let cli = match Cli::try_parse_from(cli::with_default_subcommand(args.clone())) {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e, &args),
    };
    marks::mark("parsed");
    let code = match dispatch(cli) {
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

/// How long lockrun's exit waits for stderr to take its last lines.
const LAST_LINES_WAIT: Duration = Duration::from_secs(1);

/// Runs the parsed command line. `Err` is a setup step that failed before anything
/// was done (exit status 125); what happens later is in the returned status.
fn dispatch(cli: Cli) -> anyhow::Result<u8> {
    let password = std::env::var("LOCKRUN_PASSWORD").ok();
    match cli.command {
        Command::Run(args) => Ok(run_command(&args, password)),
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

/// `lockrun run`: checks the configuration, forks the guard, runs, writes the metrics
/// file; returns the exit status.
fn run_command(args: &RunArgs, password: Option<String>) -> u8 {
    install_logger(&args.log, &args.name);
    let not_started = |msg: String| RunReport {
        outcome: run::fail(&format!("{msg}; the command was not started")),
        waited: Duration::ZERO,
        held: Duration::ZERO,
    };
    // Not a setup error: a run that cannot start still writes its metrics.
    let report = match RunConfig::from_args(args, password) {
        // The guard is forked while lockrun has one thread: before the log writer's
        // thread and the runtime (see `supervisor::guard`).
        Ok(cfg) => match marks::then("config", || Guard::start(cfg.command.clone())) {
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
