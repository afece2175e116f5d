//! The checked configuration: what [`crate::cli`] parsed, validated and typed. The
//! rest of the crate sees only these structs, in which every cross-option rule (renew
//! shorter than the TTL, a valid lock name, a known URL scheme, a signal that exists)
//! already holds. Errors say what to fix, in one line, and never echo a password or a
//! URL that may carry one.

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;
use redis::IntoConnectionInfo;
use thiserror::Error;

use crate::cli::{BackendArgs, RunArgs};

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
    #[error(
        "unsupported backend URL scheme {0:?}: use redis://, rediss://, postgres:// or etcd://"
    )]
    BadScheme(String),
    /// The URL could not be parsed (the URL itself is not shown: it may hold a password).
    #[error("the backend URL is not valid: expected redis://[user:password@]host:port[/db]")]
    BadUrl,
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
    /// The PostgreSQL URL could not be parsed.
    #[error("the PostgreSQL URL is not valid: expected postgres://[user[:password]@]host[:port]/database[?sslmode=...]")]
    BadPostgresUrl,
    /// The table name is not a plain SQL identifier.
    #[error("invalid --pg-table {0:?}: use NAME or SCHEMA.NAME of letters, digits and _")]
    BadTable(String),
    /// The Sentinel URL could not be parsed.
    #[error("the Sentinel URL is not valid: expected redis+sentinel://[user:password@]host:port[,host:port...]/MASTER[/db]")]
    BadSentinelUrl,
    /// The etcd URL could not be parsed.
    #[error("the etcd URL is not valid: expected etcd://host:port[,host:port...]")]
    BadEtcdUrl,
    /// A password was given for etcd without a user.
    #[error("etcd authentication needs a user: etcd://USER@host:port with the password in LOCKRUN_PASSWORD")]
    EtcdPasswordWithoutUser,
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

/// TLS material for `rediss://`, read from the files named by `LOCKRUN_TLS_CA`,
/// `LOCKRUN_TLS_CERT` and `LOCKRUN_TLS_KEY` (PEM). Without a CA the system roots are
/// used.
#[derive(Clone, Default)]
pub struct TlsFiles {
    /// A private CA to trust instead of the system roots.
    pub ca: Option<Vec<u8>>,
    /// A client certificate and its key.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("TlsFiles")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl TlsFiles {
    /// Reads the files named in the environment (`get` looks a variable up).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<TlsFiles, ConfigError> {
        let read = |var: &'static str| -> Result<Option<Vec<u8>>, ConfigError> {
            match get(var).filter(|p| !p.is_empty()) {
                None => Ok(None),
                Some(path) => std::fs::read(&path)
                    .map(Some)
                    .map_err(|e| ConfigError::TlsFile {
                        var,
                        path,
                        reason: e.kind().to_string(),
                    }),
            }
        };
        let client = match (read("LOCKRUN_TLS_CERT")?, read("LOCKRUN_TLS_KEY")?) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err(ConfigError::TlsHalfPair),
        };
        Ok(TlsFiles {
            ca: read("LOCKRUN_TLS_CA")?,
            client,
        })
    }
}

/// Connection details of one Redis server.
#[derive(Clone, Debug)]
pub struct RedisTarget {
    /// Address, database, user and password (the password is redacted in `Debug`).
    /// Behind Sentinel, the address is a placeholder: the master's is asked for.
    pub info: redis::ConnectionInfo,
    /// TLS material, for `rediss://` only.
    pub tls: Option<TlsFiles>,
    /// For `redis+sentinel://`: where to ask for the master's address.
    pub sentinel: Option<Sentinels>,
}

/// The Sentinels that know a master's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sentinels {
    /// `host:port` of each Sentinel.
    pub addrs: Vec<String>,
    /// The master's name as the Sentinels know it.
    pub master: String,
}

/// Connection details of a PostgreSQL database.
#[derive(Clone, Debug)]
pub struct PostgresTarget {
    /// The parsed connection settings (the password is redacted in `Debug`).
    pub config: tokio_postgres::Config,
    /// `sslmode` from the URL: TLS is used unless it is `disable`.
    pub tls: bool,
    /// The lease table, `table` or `schema.table`; created if missing.
    pub table: String,
}

/// Connection details of an etcd cluster.
#[derive(Clone)]
pub struct EtcdTarget {
    /// `http://host:port` of each member.
    pub endpoints: Vec<String>,
    /// User and password, if the cluster has authentication on.
    pub credentials: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTarget")
            .field("endpoints", &self.endpoints)
            .field("user", &self.credentials.as_ref().map(|(u, _)| u))
            .finish()
    }
}

/// The backend a URL names.
#[derive(Clone, Debug)]
pub enum Target {
    /// `redis://`, `rediss://`.
    Redis(RedisTarget),
    /// `postgres://`, `postgresql://`.
    Postgres(PostgresTarget),
    /// `etcd://host:port[,host:port...]`.
    Etcd(EtcdTarget),
    /// Several independent `redis://` servers: a Redlock quorum.
    Redlock(Vec<RedisTarget>),
}

/// Where the lock lives.
#[derive(Clone, Debug)]
pub struct BackendConfig {
    /// Which backend, and how to reach it.
    pub target: Target,
    /// The server(s) as `host:port`, for messages (never the full URL).
    pub display: String,
    /// The namespace of the keys.
    pub key_prefix: String,
}

impl BackendConfig {
    /// Checks the backend options; `env_password` is `LOCKRUN_PASSWORD`.
    pub fn from_args(
        args: &BackendArgs,
        env_password: Option<String>,
    ) -> Result<BackendConfig, ConfigError> {
        let password = match &args.password_file {
            Some(path) => Some(read_password_file(path)?),
            None => env_password.filter(|p| !p.is_empty()),
        };
        let urls = split_urls(&args.url);
        let (target, display) = match urls.as_slice() {
            [] => return Err(ConfigError::BadUrl),
            [url] => single_target(url, password, &args.pg_table)?,
            several => {
                let mut nodes = Vec::new();
                let mut shown = Vec::new();
                for url in several {
                    match single_target(url, password.clone(), &args.pg_table)? {
                        (Target::Redis(node), display) => {
                            nodes.push(node);
                            shown.push(display);
                        }
                        _ => return Err(ConfigError::BadQuorum),
                    }
                }
                if nodes.len() < 3 {
                    return Err(ConfigError::BadQuorum);
                }
                (Target::Redlock(nodes), shown.join(","))
            }
        };
        Ok(BackendConfig {
            target,
            display,
            key_prefix: args.key_prefix.clone(),
        })
    }
}

/// The URLs given: each `--url`, with a comma-separated list of `redis://` URLs (as
/// `LOCKRUN_URL` carries a quorum) split apart. Commas inside one etcd or PostgreSQL
/// URL stay.
fn split_urls(given: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for url in given {
        let parts: Vec<&str> = url.split(',').map(str::trim).collect();
        let all_redis = parts.len() > 1
            && parts
                .iter()
                .all(|p| p.starts_with("redis://") || p.starts_with("rediss://"));
        if all_redis {
            out.extend(parts.iter().map(|p| p.to_string()));
        } else {
            out.push(url.trim().to_owned());
        }
    }
    out
}

fn single_target(
    url: &str,
    password: Option<String>,
    pg_table: &str,
) -> Result<(Target, String), ConfigError> {
    let scheme = url
        .split_once("://")
        .map(|(s, _)| s)
        .ok_or(ConfigError::BadUrl)?;
    match scheme {
        "redis" | "rediss" => redis_target(url, scheme, password),
        "postgres" | "postgresql" => postgres_target(url, password, pg_table),
        "etcd" => etcd_target(url, password),
        "redis+sentinel" => sentinel_target(url, password),
        other => Err(ConfigError::BadScheme(other.chars().take(32).collect())),
    }
}

fn redis_target(
    url: &str,
    scheme: &str,
    password: Option<String>,
) -> Result<(Target, String), ConfigError> {
    let mut info = url
        .into_connection_info()
        .map_err(|_| ConfigError::BadUrl)?;
    if let Some(password) = password {
        let settings = info.redis_settings().clone().set_password(password);
        info = info.set_redis_settings(settings);
    }
    let tls = match scheme {
        "rediss" => Some(TlsFiles::from_env(|v| std::env::var(v).ok())?),
        _ => None,
    };
    let display = info.addr().to_string();
    Ok((
        Target::Redis(RedisTarget {
            info,
            tls,
            sentinel: None,
        }),
        display,
    ))
}

/// `redis+sentinel://[user:password@]host:port[,host:port...]/MASTER[/db]`.
fn sentinel_target(url: &str, password: Option<String>) -> Result<(Target, String), ConfigError> {
    let rest = url
        .strip_prefix("redis+sentinel://")
        .ok_or(ConfigError::BadSentinelUrl)?;
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((u, r)) => (Some(u), r),
        None => (None, rest),
    };
    let (hosts, path) = rest.split_once('/').ok_or(ConfigError::BadSentinelUrl)?;
    let (master, db) = match path.split_once('/') {
        Some((m, db)) => (m, Some(db)),
        None => (path, None),
    };
    let addrs: Vec<String> = hosts.split(',').map(str::to_owned).collect();
    let host_ok = |h: &String| {
        h.rsplit_once(':')
            .is_some_and(|(n, p)| !n.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0))
    };
    if master.is_empty()
        || !addrs.iter().all(host_ok)
        || db.is_some_and(|d| d.parse::<u32>().is_err())
    {
        return Err(ConfigError::BadSentinelUrl);
    }
    // The data nodes' settings (user, password, database) on a placeholder address:
    // the real one comes from the Sentinels at each connection.
    let template = format!(
        "redis://{}127.0.0.1:6379/{}",
        userinfo.map(|u| format!("{u}@")).unwrap_or_default(),
        db.unwrap_or("0")
    );
    let (target, _) =
        redis_target(&template, "redis", password).map_err(|_| ConfigError::BadSentinelUrl)?;
    let Target::Redis(mut node) = target else {
        return Err(ConfigError::BadSentinelUrl);
    };
    node.sentinel = Some(Sentinels {
        addrs,
        master: master.to_owned(),
    });
    Ok((Target::Redis(node), format!("sentinel {hosts}/{master}")))
}

fn postgres_target(
    url: &str,
    password: Option<String>,
    table: &str,
) -> Result<(Target, String), ConfigError> {
    let mut config: tokio_postgres::Config =
        url.parse().map_err(|_| ConfigError::BadPostgresUrl)?;
    if let Some(password) = password {
        config.password(password);
    }
    if !valid_table_name(table) {
        return Err(ConfigError::BadTable(table.chars().take(64).collect()));
    }
    let tls = config.get_ssl_mode() != tokio_postgres::config::SslMode::Disable;
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .zip(config.get_ports().iter().chain(std::iter::repeat(&5432)))
        .map(|(h, p)| match h {
            tokio_postgres::config::Host::Tcp(h) => format!("{h}:{p}"),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let display = if hosts.is_empty() {
        "localhost:5432".to_owned()
    } else {
        hosts.join(",")
    };
    Ok((
        Target::Postgres(PostgresTarget {
            config,
            tls,
            table: table.to_owned(),
        }),
        display,
    ))
}

/// `name` or `schema.name`, each an unquoted SQL identifier of at most 63 bytes.
fn valid_table_name(table: &str) -> bool {
    let ident = |s: &str| {
        (1..=63).contains(&s.len())
            && s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    match table.split_once('.') {
        Some((schema, name)) => ident(schema) && ident(name),
        None => ident(table),
    }
}

fn etcd_target(url: &str, password: Option<String>) -> Result<(Target, String), ConfigError> {
    let rest = url.strip_prefix("etcd://").ok_or(ConfigError::BadUrl)?;
    let rest = rest.trim_end_matches('/');
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, rest),
    };
    let mut endpoints = Vec::new();
    for host in hosts.split(',') {
        let ok = host
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
        if !ok {
            return Err(ConfigError::BadEtcdUrl);
        }
        endpoints.push(format!("http://{host}"));
    }
    let credentials = match (userinfo, password) {
        (Some(u), pw) => {
            let (user, url_pw) = u.split_once(':').unwrap_or((u, ""));
            Some((user.to_owned(), pw.unwrap_or_else(|| url_pw.to_owned())))
        }
        (None, Some(_)) => return Err(ConfigError::EtcdPasswordWithoutUser),
        (None, None) => None,
    };
    Ok((
        Target::Etcd(EtcdTarget {
            endpoints,
            credentials,
        }),
        hosts.to_owned(),
    ))
}

fn read_password_file(path: &Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::PasswordFile {
        path: path.display().to_string(),
        reason: e.kind().to_string(),
    })?;
    Ok(text.lines().next().unwrap_or("").to_owned())
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

    #[test]
    fn url_errors_never_echo_the_url() {
        let args = backend_args("redis://:s3cret@host:notaport");
        let e = BackendConfig::from_args(&args, None).unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let args = BackendArgs {
            url: vec!["memcached://x".into()],
            ..args
        };
        assert_eq!(
            BackendConfig::from_args(&args, None).unwrap_err(),
            ConfigError::BadScheme("memcached".into())
        );
    }

    fn redis_info(c: &BackendConfig) -> &redis::ConnectionInfo {
        match &c.target {
            Target::Redis(r) => &r.info,
            other => panic!("{other:?}"),
        }
    }

    fn backend_args(url: &str) -> BackendArgs {
        BackendArgs {
            url: vec![url.into()],
            password_file: None,
            key_prefix: "lockrun:".into(),
            pg_table: "lockrun_locks".into(),
        }
    }

    #[test]
    fn postgres_urls_parse_and_hide_the_password() {
        let c = BackendConfig::from_args(
            &backend_args("postgres://u:pw@db.example:6543/app?sslmode=disable"),
            None,
        )
        .unwrap();
        assert_eq!(c.display, "db.example:6543");
        let Target::Postgres(pg) = &c.target else {
            panic!("{c:?}")
        };
        assert!(!pg.tls);
        assert_eq!(pg.table, "lockrun_locks");
        assert!(!format!("{c:?}").contains("pw@") && !format!("{c:?}").contains("\"pw\""));
        let c = BackendConfig::from_args(
            &backend_args("postgresql://localhost/test"),
            Some("envpw".into()),
        )
        .unwrap();
        let Target::Postgres(pg) = &c.target else {
            panic!("{c:?}")
        };
        assert_eq!(pg.config.get_password(), Some(&b"envpw"[..]));
        let bad = BackendArgs {
            pg_table: "x; drop table y".into(),
            ..backend_args("postgres://localhost/test")
        };
        assert!(matches!(
            BackendConfig::from_args(&bad, None),
            Err(ConfigError::BadTable(_))
        ));
        assert!(valid_table_name("locks.lockrun_leases"));
        assert!(!valid_table_name("a.b.c"));
    }

    #[test]
    fn several_redis_urls_make_a_quorum() {
        let args = BackendArgs {
            url: vec![
                "redis://a:1".into(),
                "redis://b:2".into(),
                "redis://c:3".into(),
            ],
            ..backend_args("")
        };
        let c = BackendConfig::from_args(&args, None).unwrap();
        assert!(
            matches!(&c.target, Target::Redlock(n) if n.len() == 3),
            "{c:?}"
        );
        assert_eq!(c.display, "a:1,b:2,c:3");
        let env_style = backend_args("redis://a:1,redis://b:2,redis://c:3,redis://d:4,redis://e:5");
        let c = BackendConfig::from_args(&env_style, None).unwrap();
        assert!(matches!(&c.target, Target::Redlock(n) if n.len() == 5));
        for bad in [
            vec!["redis://a:1".to_owned(), "redis://b:2".to_owned()],
            vec![
                "redis://a:1".to_owned(),
                "redis://b:2".to_owned(),
                "etcd://c:3".to_owned(),
            ],
        ] {
            let args = BackendArgs {
                url: bad,
                ..backend_args("")
            };
            assert_eq!(
                BackendConfig::from_args(&args, None).unwrap_err(),
                ConfigError::BadQuorum
            );
        }
        // Commas inside one etcd URL are its endpoints, not a quorum.
        let c = BackendConfig::from_args(&backend_args("etcd://a:1,b:2"), None).unwrap();
        assert!(matches!(c.target, Target::Etcd(_)));
    }

    #[test]
    fn sentinel_urls_name_the_sentinels_and_the_master() {
        let c = BackendConfig::from_args(
            &backend_args("redis+sentinel://:pw@s1:26379,s2:26380/mymaster/2"),
            None,
        )
        .unwrap();
        let Target::Redis(node) = &c.target else {
            panic!("{c:?}")
        };
        let s = node.sentinel.as_ref().unwrap();
        assert_eq!(s.addrs, vec!["s1:26379", "s2:26380"]);
        assert_eq!(s.master, "mymaster");
        assert_eq!(node.info.redis_settings().password(), Some("pw"));
        assert_eq!(node.info.redis_settings().db(), 2);
        assert_eq!(c.display, "sentinel s1:26379,s2:26380/mymaster");
        for bad in [
            "redis+sentinel://s1:26379",
            "redis+sentinel://s1/m",
            "redis+sentinel://s1:1/",
            "redis+sentinel://s1:1/m/x",
        ] {
            assert_eq!(
                BackendConfig::from_args(&backend_args(bad), None).unwrap_err(),
                ConfigError::BadSentinelUrl,
                "{bad}"
            );
        }
    }

    #[test]
    fn etcd_urls_list_every_endpoint() {
        let c = BackendConfig::from_args(&backend_args("etcd://10.0.0.1:2379,10.0.0.2:2379"), None)
            .unwrap();
        let Target::Etcd(e) = &c.target else {
            panic!("{c:?}")
        };
        assert_eq!(
            e.endpoints,
            vec!["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
        );
        assert!(e.credentials.is_none());
        let c = BackendConfig::from_args(&backend_args("etcd://root@h:2379"), Some("pw".into()))
            .unwrap();
        let Target::Etcd(e) = &c.target else {
            panic!("{c:?}")
        };
        assert_eq!(e.credentials, Some(("root".into(), "pw".into())));
        assert!(!format!("{c:?}").contains("pw\""));
        for bad in ["etcd://", "etcd://host", "etcd://host:0", "etcd://h:1,"] {
            assert!(
                BackendConfig::from_args(&backend_args(bad), None).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn password_comes_from_the_environment_or_a_file() {
        let args = backend_args("redis://127.0.0.1:1");
        let c = BackendConfig::from_args(&args, Some("envpw".into())).unwrap();
        assert_eq!(redis_info(&c).redis_settings().password(), Some("envpw"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "filepw\n").unwrap();
        let args = BackendArgs {
            password_file: Some(path),
            ..args
        };
        let c = BackendConfig::from_args(&args, Some("envpw".into())).unwrap();
        assert_eq!(redis_info(&c).redis_settings().password(), Some("filepw"));
        assert!(
            !format!("{c:?}").contains("filepw"),
            "Debug output must redact the password"
        );
    }
}
