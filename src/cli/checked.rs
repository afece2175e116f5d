//! From the command line as typed to the checked configuration: the constructors
//! [`RunConfig::from_args`] and [`BackendConfig::from_args`] live here, on the command
//! line's side, so that [`crate::config`] never learns the clap structs. Every check is
//! the configuration's own (names, bounds, signals, backend URLs); this file only
//! reads the arguments out. Part of [`crate::cli`].

use super::{BackendArgs, RunArgs};
use crate::backend::url::BackendOptions;
use crate::config::backend::check_backend;
use crate::config::{
    bounds, parse_signal, BackendConfig, ConfigError, LockName, PingUrl, RunConfig,
};

impl BackendArgs {
    /// The options every backend may read, as plain values.
    pub fn options(&self) -> BackendOptions {
        BackendOptions {
            key_prefix: self.key_prefix.clone(),
            allow_eviction: self.allow_eviction,
            pg_table: self.postgres.table.clone(),
        }
    }
}

impl BackendConfig {
    /// Checks the backend options; `env_password` is `LOCKRUN_PASSWORD`.
    pub fn from_args(
        args: &BackendArgs,
        env_password: Option<String>,
    ) -> Result<BackendConfig, ConfigError> {
        check_backend(
            &args.url,
            &args.options(),
            args.slots,
            args.password_file.as_deref(),
            env_password,
        )
    }
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
        let backend = BackendConfig::from_args(&args.backend, env_password)?;
        let once_per = match args.once_per {
            Some(d) => Some(bounds::ONCE_PER.check(d)?),
            None => None,
        };
        Ok(RunConfig {
            name,
            backend,
            ttl,
            renew_every,
            wait: bounds::WAIT.check(args.wait)?,
            splay: bounds::SPLAY.check(args.splay)?,
            once_per,
            conflict_exit_code: args.conflict_exit_code,
            hold_at_least: bounds::HOLD_AT_LEAST.check(args.hold_at_least)?,
            kill_signal: parse_signal(&args.kill_signal)?,
            kill_after: bounds::KILL_AFTER.check(args.kill_after)?,
            max_runtime,
            ping: check_ping(args.ping.as_deref(), &|v| std::env::var(v).ok())?,
            command: args.command.clone(),
        })
    }
}

/// `--ping`'s URL, checked, with the CA of `LOCKRUN_TLS_CA` (`get` looks a variable up)
/// for an `https://` one; an empty value is no ping.
fn check_ping(
    url: Option<&str>,
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<PingUrl>, ConfigError> {
    let Some(url) = url.filter(|u| !u.is_empty()) else {
        return Ok(None);
    };
    let mut ping = PingUrl::parse(url).map_err(ConfigError::Ping)?;
    if let Some(path) = get("LOCKRUN_TLS_CA").filter(|p| ping.tls && !p.is_empty()) {
        let pem = std::fs::read(&path).map_err(|e| {
            ConfigError::Ping(format!(
                "cannot read the CA file {path} (LOCKRUN_TLS_CA): {}",
                e.kind()
            ))
        })?;
        ping.ca = Some(pem);
    }
    Ok(Some(ping))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use nix::sys::signal::Signal;

    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn run_args(extra: &[&str]) -> RunArgs {
        let mut argv = vec!["lockrun", "run", "--url", "redis://127.0.0.1:6379"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Run(r) => *r,
            other => panic!("{other:?}"),
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
        let cases: [(&str, Spoil); 9] = [
            ("--ttl", |a| a.ttl = Duration::ZERO),
            ("--ttl", |a| a.ttl = HUGE),
            ("--renew-every", |a| {
                a.renew_every = Some(Duration::from_nanos(1))
            }),
            ("--wait", |a| a.wait = HUGE),
            ("--splay", |a| a.splay = HUGE),
            ("--hold-at-least", |a| a.hold_at_least = HUGE),
            ("--kill-after", |a| a.kill_after = HUGE),
            ("--max-runtime", |a| a.max_runtime = Some(HUGE)),
            ("--once-per", |a| a.once_per = Some(HUGE)),
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
    fn once_per_is_taken_on_every_backend() {
        let args = |url: &str| {
            let argv = [
                "lockrun",
                "run",
                "--url",
                url,
                "--once-per",
                "1h",
                "job",
                "--",
                "true",
            ];
            match Cli::try_parse_from(argv).unwrap().command {
                Command::Run(r) => r,
                other => panic!("{other:?}"),
            }
        };
        for url in [
            "redis://127.0.0.1:6379",
            "postgres://u@127.0.0.1/db",
            "file:///tmp",
            "etcd://127.0.0.1:2379",
            "etcds://127.0.0.1:2379",
            "zk://127.0.0.1:2181/",
        ] {
            let c = RunConfig::from_args(&args(url), None).unwrap();
            assert_eq!(c.once_per, Some(Duration::from_secs(3600)), "{url}");
        }
    }
}
