//! `postgres://` and `postgresql://` URLs (libpq's URL form) and the backend's own
//! option, `--pg-table`: checked into a [`PostgresTarget`]. Part of [`super`].
//!
//! The TLS parameters are libpq's and are read here, not by tokio-postgres (which knows
//! only `sslmode=disable|prefer|require`): `sslmode` (`disable`, `allow` (taken as
//! `prefer`), `prefer` (the default), `require`, `verify-ca`, `verify-full`),
//! `sslrootcert` (a PEM file, or `system` for the system's roots, which like libpq 16
//! makes `verify-full` the default and refuses a weaker mode), `sslcert` and `sslkey`
//! (a client certificate, both or neither; a key file others can read is refused, as
//! libpq does), `channel_binding` (`disable`, `prefer`, `require`) and `gssencmode`
//! (`disable` or `prefer`: lockrun never uses GSSAPI encryption). Files are read once,
//! here, so that a missing or bad file is a 125 before anything starts. Fallbacks when
//! the URL names no file: `LOCKRUN_TLS_CA` / `LOCKRUN_TLS_CERT` / `LOCKRUN_TLS_KEY`,
//! then libpq's default files `~/.postgresql/root.crt`, `postgresql.crt` and
//! `postgresql.key`. As libpq does, TLS is never used over Unix-domain sockets (hosts
//! that are paths), and a root certificate from any of these makes
//! `prefer` and `require` check the chain (as `verify-ca`); a chain that fails the
//! check is an error, never a fall-back to plain text. `verify-full` checks the name
//! as libpq does: the certificate's alternative names (an IP address against its IP
//! addresses), or its common name when it has no DNS name among them. Any other parameter
//! tokio-postgres does not know is refused by name.

mod tls;

use std::sync::Arc;

use super::PostgresBackend;
use crate::backend::tls::ServerCheck;
use crate::backend::url::{percent_decode, BackendConfig, UrlError};
use crate::backend::url::{Kind, Target, UrlContext};
use crate::backend::AnyBackend;
use tls::tls;

/// The table line of PostgreSQL.
pub const KIND: Kind = Kind {
    schemes: &["postgres", "postgresql"],
    usage: "postgres://[user[:pass]@]host[:port][,...]/db[?param=value&...] (or postgresql://; sslmode, sslrootcert, sslcert, sslkey, channel_binding as in libpq)",
    parse: |url, ctx| Ok(Arc::new(parse(url, ctx)?)),
};

/// Connection details of a PostgreSQL database.
#[derive(Clone, Debug)]
pub struct PostgresTarget {
    /// The parsed connection settings (the password is redacted in `Debug`).
    pub config: tokio_postgres::Config,
    /// TLS as the URL asks for it; `None` with `sslmode=disable`.
    pub tls: Option<PgTls>,
    /// The lease table, `table` or `schema.table`; created if missing.
    pub table: String,
}

impl Target for PostgresTarget {
    fn display(&self) -> String {
        use tokio_postgres::config::Host;
        let ports = self
            .config
            .get_ports()
            .iter()
            .chain(std::iter::repeat(&5432));
        let hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .zip(ports)
            .map(|(h, p)| match h {
                Host::Tcp(h) => format!("{h}:{p}"),
                Host::Unix(path) => path.display().to_string(),
            })
            .collect();
        if hosts.is_empty() {
            "localhost:5432".to_owned()
        } else {
            hosts.join(",")
        }
    }

    fn open(&self, config: &BackendConfig, waiting: bool) -> AnyBackend {
        AnyBackend::new(PostgresBackend::new(self.clone(), config, waiting))
    }

    /// A semaphore's slots are rows of their own: see [`super`].
    fn semaphores(&self) -> bool {
        true
    }
}

/// libpq's `sslmode`, as lockrun applies it (`allow` is taken as `prefer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// No TLS.
    Disable,
    /// TLS if the server offers it, plain text if it says it has none.
    Prefer,
    /// TLS or nothing.
    Require,
    /// TLS, and the server's certificate chain checked.
    VerifyCa,
    /// TLS, the chain checked, and the host name (or IP address) in the certificate.
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<SslMode, UrlError> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(UrlError::Backend(format!(
                    "sslmode={} is not valid: use disable, prefer, require, verify-ca or \
                     verify-full",
                    other.chars().take(32).collect::<String>()
                )))
            }
        })
    }

    /// As it is written in a URL.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// TLS to PostgreSQL: the mode, what it checks, and the rustls configuration made from
/// the files (read when the URL was checked).
#[derive(Clone)]
pub struct PgTls {
    /// The mode asked for.
    pub mode: SslMode,
    /// What is checked of the server's certificate.
    pub check: ServerCheck,
    /// A client certificate is offered.
    pub client_cert: bool,
    /// The client configuration, ALPN `postgresql` (for `sslnegotiation=direct`).
    pub config: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for PgTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the rustls configuration: it holds the client key.
        f.debug_struct("PgTls")
            .field("mode", &self.mode)
            .field("check", &self.check)
            .field("client_cert", &self.client_cert)
            .finish()
    }
}

/// The parameters lockrun reads itself, out of the URL's query.
#[derive(Default)]
struct LibpqParams {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
    sslcert: Option<String>,
    sslkey: Option<String>,
    channel_binding: Option<String>,
    gssencmode: Option<String>,
}

/// The parameters tokio-postgres reads (its `Config::param`).
const PASSED_ON: &[&str] = &[
    "user",
    "password",
    "dbname",
    "options",
    "application_name",
    "sslnegotiation",
    "host",
    "hostaddr",
    "port",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "load_balance_hosts",
];

/// Takes lockrun's own parameters out of `url`'s query (found as tokio-postgres finds
/// it: after the first `@`, the first `?`); the rest of the URL is for tokio-postgres.
/// The last of a repeated parameter wins, as in libpq.
fn split_params(url: &str) -> Result<(String, LibpqParams), UrlError> {
    let after_creds = url.find('@').map_or(0, |at| at + 1);
    let Some(q) = url[after_creds..].find('?').map(|q| q + after_creds) else {
        return Ok((url.to_owned(), LibpqParams::default()));
    };
    let mut params = LibpqParams::default();
    let mut kept = Vec::new();
    for pair in url[q + 1..].split('&').filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(UrlError::BadUrl {
                expected: KIND.usage,
            });
        };
        let key = percent_decode(key);
        let slot = match key.as_str() {
            "sslmode" => &mut params.sslmode,
            "sslrootcert" => &mut params.sslrootcert,
            "sslcert" => &mut params.sslcert,
            "sslkey" => &mut params.sslkey,
            "channel_binding" => &mut params.channel_binding,
            "gssencmode" => &mut params.gssencmode,
            k if PASSED_ON.contains(&k) => {
                kept.push(pair);
                continue;
            }
            k => {
                return Err(UrlError::Backend(format!(
                    "the PostgreSQL URL has the parameter {:?}, which lockrun does not support \
                     (see the PostgreSQL URL's parameters in docs/backends.md or lockrun(1))",
                    k.chars().take(32).collect::<String>()
                )))
            }
        };
        *slot = Some(percent_decode(value));
    }
    let mut rest = url[..q].to_owned();
    if !kept.is_empty() {
        rest.push('?');
        rest.push_str(&kept.join("&"));
    }
    Ok((rest, params))
}

/// Checks a PostgreSQL URL and `--pg-table`; the context's password wins.
pub fn parse(url: &str, ctx: &UrlContext<'_>) -> Result<PostgresTarget, UrlError> {
    check_one_at(url)?;
    let (url, params) = split_params(url)?;
    let mut config: tokio_postgres::Config = url.parse().map_err(|_| UrlError::BadUrl {
        expected: KIND.usage,
    })?;
    // libpq's URL form takes port 0 (in the host list or as `?port=0`); nothing
    // listens there.
    if config.get_ports().contains(&0) {
        return Err(UrlError::PortZero);
    }
    if let Some(password) = &ctx.password {
        config.password(password.clone());
    }
    let table = &ctx.options.pg_table;
    if !valid_table_name(table) {
        return Err(UrlError::Backend(format!(
            "invalid --pg-table {:?}: use NAME or SCHEMA.NAME of letters, digits and _",
            table.chars().take(64).collect::<String>()
        )));
    }
    let tls = tls(&params, &mut config, ctx)?;
    Ok(PostgresTarget {
        config,
        tls,
        table: table.clone(),
    })
}

/// Refuses a raw `@` in the user or password: the URL's parser splits the user
/// information at the first `@`, and the rest of a password would become the host,
/// to be shown in every message. The URL itself is never echoed.
fn check_one_at(url: &str) -> Result<(), UrlError> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    match authority.matches('@').count() {
        0 | 1 => Ok(()),
        _ => Err(UrlError::Backend(
            "the PostgreSQL URL has more than one '@' before its host: write an '@' in the \
             user name or password as %40"
                .to_owned(),
        )),
    }
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

#[cfg(test)]
mod tests;
