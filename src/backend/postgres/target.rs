//! `postgres://` and `postgresql://` URLs (libpq's URL form, parsed by tokio-postgres)
//! and the backend's own option, `--pg-table`: checked into a [`PostgresTarget`].
//! Part of [`super`].

use std::sync::Arc;

use super::PostgresBackend;
use crate::backend::{AnyBackend, Kind, Target, UrlContext};
use crate::config::{BackendConfig, ConfigError};

/// The table line of PostgreSQL.
pub const KIND: Kind = Kind {
    schemes: &["postgres", "postgresql"],
    usage: "postgres://[user[:pass]@]host[:port]/db[?sslmode=...] (or postgresql://)",
    parse: |url, ctx| Ok(Arc::new(parse(url, ctx)?)),
};

/// The PostgreSQL backend's options (flattened into the command line's backend
/// options).
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

/// Checks a PostgreSQL URL and `--pg-table`; the context's password wins.
pub fn parse(url: &str, ctx: &UrlContext<'_>) -> Result<PostgresTarget, ConfigError> {
    let mut config: tokio_postgres::Config = url.parse().map_err(|_| ConfigError::BadUrl {
        expected: KIND.usage,
    })?;
    // libpq's URL form takes port 0 (in the host list or as `?port=0`); nothing
    // listens there.
    if config.get_ports().contains(&0) {
        return Err(ConfigError::PortZero);
    }
    if let Some(password) = &ctx.password {
        config.password(password.clone());
    }
    let table = &ctx.args.postgres.table;
    if !valid_table_name(table) {
        return Err(ConfigError::Backend(format!(
            "invalid --pg-table {:?}: use NAME or SCHEMA.NAME of letters, digits and _",
            table.chars().take(64).collect::<String>()
        )));
    }
    let tls = config.get_ssl_mode() != tokio_postgres::config::SslMode::Disable;
    Ok(PostgresTarget {
        config,
        tls,
        table: table.clone(),
    })
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
mod tests {
    use super::*;
    use crate::backend::table::testing::{args, ctx};

    #[test]
    fn postgres_urls_parse_and_hide_the_password() {
        let a = args(&[]);
        let pg = parse(
            "postgres://u:pw@db.example:6543/app?sslmode=disable",
            &ctx(&a, None),
        )
        .unwrap();
        assert_eq!(pg.display(), "db.example:6543");
        assert!(!pg.tls);
        assert_eq!(pg.table, "lockrun_locks");
        assert!(!format!("{pg:?}").contains("pw@") && !format!("{pg:?}").contains("\"pw\""));
        let pg = parse("postgresql://localhost/test", &ctx(&a, Some("envpw"))).unwrap();
        assert_eq!(pg.config.get_password(), Some(&b"envpw"[..]));
        assert!(pg.tls, "sslmode defaults to prefer");
    }

    #[test]
    fn port_0_is_refused() {
        let a = args(&[]);
        for url in [
            "postgres://u:pw@h:0/db",
            "postgresql://h1:5432,h2:0/db",
            "postgres://h/db?port=0",
        ] {
            let e = parse(url, &ctx(&a, None)).unwrap_err();
            assert_eq!(e, ConfigError::PortZero, "{url}");
        }
        assert!(parse("postgres://h:5432/db", &ctx(&a, None)).is_ok());
    }

    #[test]
    fn the_table_name_must_be_a_plain_identifier() {
        let mut a = args(&[]);
        a.postgres.table = "x; drop table y".into();
        assert!(matches!(
            parse("postgres://localhost/test", &ctx(&a, None)),
            Err(ConfigError::Backend(m)) if m.contains("--pg-table")
        ));
        assert!(valid_table_name("locks.lockrun_leases"));
        assert!(!valid_table_name("a.b.c"));
    }
}
