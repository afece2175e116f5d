//! The backend part of the configuration: which backend a URL names, with the
//! connection details each needs (password applied, TLS files read), checked. Errors
//! never echo a URL or a password. Part of [`crate::config`].

use std::path::Path;

use redis::IntoConnectionInfo;

use super::ConfigError;
use crate::cli::BackendArgs;

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

#[cfg(test)]
mod tests {
    use super::*;

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
