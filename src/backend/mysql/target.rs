//! `mysql://` and `mariadb://` URLs, checked into a [`MysqlTarget`]. Part of [`super`].
//!
//! The form is `mysql://[user[:password]@]host[:port]/DATABASE[?param=value&...]`
//! (port 3306 by default, an IPv6 address in brackets; `%XX` escapes in the user, the
//! password and the database are decoded). The password from `--password-file` or
//! `LOCKRUN_PASSWORD` wins over the URL's; without a user, the login name (`USER`), as
//! the `mysql` client does.
//!
//! Parameters: `ssl-mode`, `ssl-ca`, `ssl-cert` and `ssl-key` as the `mysql` client
//! names them (`tls.rs`), and `table`, the lease table (`lockrun_locks` by default;
//! letters, digits and `_`). Any other parameter is refused by name.

use std::sync::Arc;

use super::MysqlBackend;
use crate::backend::url::{percent_decode, split_userinfo, BackendConfig, UrlError};
use crate::backend::url::{Kind, Target, UrlContext};
use crate::backend::AnyBackend;
pub use tls::{presented_name, MyTls, SslMode};

mod tls;

/// The table line of MySQL and MariaDB.
pub const KIND: Kind = Kind {
    schemes: &["mysql", "mariadb"],
    usage: "mysql://[user[:pass]@]host[:port]/db[?param=value&...] (or mariadb://; ssl-mode, ssl-ca, ssl-cert, ssl-key as in the mysql client, table)",
    parse: |url, ctx| Ok(Arc::new(parse(url, ctx)?)),
};

/// The lease table when the URL names none.
pub const DEFAULT_TABLE: &str = "lockrun_locks";

/// Connection details of a MySQL or MariaDB database. Its `Debug` never shows the
/// password.
#[derive(Clone)]
pub struct MysqlTarget {
    /// The host name or address (an IPv6 address without brackets).
    pub host: String,
    /// The TCP port.
    pub port: u16,
    /// The user to log in as.
    pub user: String,
    /// The password, if any.
    pub password: Option<String>,
    /// The database the table lives in.
    pub database: String,
    /// The lease table; created if missing.
    pub table: String,
    /// TLS as `ssl-mode` and the files say.
    pub tls: MyTls,
}

impl std::fmt::Debug for MysqlTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlTarget")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("database", &self.database)
            .field("table", &self.table)
            .field("tls", &self.tls)
            .finish()
    }
}

impl Target for MysqlTarget {
    fn display(&self) -> String {
        match self.host.contains(':') {
            true => format!("[{}]:{}", self.host, self.port),
            false => format!("{}:{}", self.host, self.port),
        }
    }

    fn open(&self, config: &BackendConfig, waiting: bool) -> AnyBackend {
        AnyBackend::new(MysqlBackend::new(self.clone(), config, waiting))
    }

    fn semaphores(&self) -> bool {
        true
    }
}

fn bad() -> UrlError {
    UrlError::BadUrl {
        expected: KIND.usage,
    }
}

fn refuse(what: String) -> UrlError {
    UrlError::Backend(what)
}

/// At most 32 characters of something the user typed, for a message.
fn shown(s: &str) -> String {
    s.chars().take(32).collect()
}

/// Checks a MySQL URL; the context's password wins over the URL's.
pub fn parse(url: &str, ctx: &UrlContext<'_>) -> Result<MysqlTarget, UrlError> {
    let rest = url.split_once("://").ok_or_else(bad)?.1;
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, database) = rest.split_once('/').ok_or_else(bad)?;
    let database = percent_decode(database);
    if database.is_empty() || database.contains('/') {
        return Err(bad());
    }
    let (userinfo, hostport) = split_userinfo(authority);
    let (host, port) = host_port(hostport)?;
    let (user, url_password) = match userinfo {
        Some(u) => match u.split_once(':') {
            Some((user, pass)) => (percent_decode(user), Some(percent_decode(pass))),
            None => (percent_decode(u), None),
        },
        None => (String::new(), None),
    };
    let user = Some(user)
        .filter(|u| !u.is_empty())
        .or_else(|| (ctx.env)("USER").filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "root".to_owned());
    let (table, tls) = params(query.unwrap_or(""))?;
    Ok(MysqlTarget {
        host,
        port,
        user,
        password: ctx.password.clone().or(url_password),
        database,
        table,
        tls,
    })
}

/// `host[:port]` or `[v6][:port]`.
fn host_port(hostport: &str) -> Result<(String, u16), UrlError> {
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(bad)?;
        match after {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':').ok_or_else(bad)?)),
        }
    } else {
        match hostport.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() || host.contains(['@', ':', '/']) && !hostport.starts_with('[') {
        return Err(bad());
    }
    let port = match port {
        None => 3306,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            p.parse::<u16>().map_err(|_| bad())?
        }
        Some(_) => return Err(bad()),
    };
    if port == 0 {
        return Err(UrlError::PortZero);
    }
    Ok((host.to_owned(), port))
}

/// Reads the query's parameters; answers the table and TLS.
fn params(query: &str) -> Result<(String, MyTls), UrlError> {
    let mut table = DEFAULT_TABLE.to_owned();
    let (mut mode, mut ca, mut cert, mut key) = (None, None, None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, value) = pair.split_once('=').ok_or_else(bad)?;
        let (k, value) = (percent_decode(k), percent_decode(value));
        let slot = match k.as_str() {
            "ssl-mode" => &mut mode,
            "ssl-ca" => &mut ca,
            "ssl-cert" => &mut cert,
            "ssl-key" => &mut key,
            "table" => {
                table = value;
                continue;
            }
            k => {
                return Err(refuse(format!(
                    "the MySQL URL has the parameter {:?}, which lockrun does not support: \
                     use ssl-mode, ssl-ca, ssl-cert, ssl-key and table (see the MySQL URL in \
                     docs/backends.md)",
                    shown(k)
                )))
            }
        };
        *slot = Some(value);
    }
    if !valid_table(&table) {
        return Err(refuse(format!(
            "invalid table {:?} in the MySQL URL: use 1 to 60 letters, digits and _, \
             not starting with a digit",
            shown(&table)
        )));
    }
    let mode = match mode {
        None => SslMode::Preferred,
        Some(m) => SslMode::parse(&m)?,
    };
    Ok((table, MyTls::new(mode, ca, cert, key)?))
}

/// An unquoted identifier of at most 60 bytes.
fn valid_table(table: &str) -> bool {
    (1..=60).contains(&table.len())
        && table.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::url::testing::{ctx, options};

    fn ok(url: &str) -> MysqlTarget {
        parse(url, &ctx(&options(), None)).unwrap()
    }

    fn err(url: &str) -> String {
        parse(url, &ctx(&options(), None)).unwrap_err().to_string()
    }

    #[test]
    fn a_full_url_gives_every_part() {
        let t = ok("mysql://u%40x:p%3Aw@db.example:3307/app?ssl-mode=disabled&table=locks_1");
        assert_eq!(t.tls.mode, SslMode::Disabled);
        assert_eq!((t.host.as_str(), t.port), ("db.example", 3307));
        assert_eq!(
            (t.user.as_str(), t.password.as_deref()),
            ("u@x", Some("p:w"))
        );
        assert_eq!((t.database.as_str(), t.table.as_str()), ("app", "locks_1"));
        assert_eq!(t.display(), "db.example:3307");
        let v6 = ok("mariadb://[::1]/d?ssl-mode=DISABLED");
        assert_eq!(
            (v6.host.as_str(), v6.port, v6.table.as_str()),
            ("::1", 3306, DEFAULT_TABLE)
        );
        assert_eq!(v6.display(), "[::1]:3306");
    }

    #[test]
    fn the_given_password_wins_and_debug_hides_it() {
        let t = parse(
            "mysql://u:url@h/d?ssl-mode=DISABLED",
            &ctx(&options(), Some("file")),
        )
        .unwrap();
        assert_eq!(t.password.as_deref(), Some("file"));
        let shown = format!("{t:?}");
        assert!(!shown.contains("file") && !shown.contains("url"), "{shown}");
    }

    #[test]
    fn bad_urls_are_one_line_without_the_url() {
        for bad in [
            "mysql://h",
            "mysql:///d",
            "mysql://h:x/d",
            "mysql://h:99999/d",
        ] {
            let e = err(&format!("{bad}?ssl-mode=DISABLED"));
            assert!(e.starts_with("the backend URL is not valid"), "{bad}: {e}");
        }
        assert_eq!(
            err("mysql://h:0/d?ssl-mode=DISABLED"),
            UrlError::PortZero.to_string()
        );
        let e = err("mysql://u:secret@h/d?ssl-mode=DISABLED&bogus=1");
        assert!(e.contains("\"bogus\"") && !e.contains("secret"), "{e}");
        assert_eq!(ok("mysql://h/d").tls.mode, SslMode::Preferred);
        assert!(err("mysql://h/d?ssl-mode=DISABLED&ssl-ca=/nonexistent").contains("ssl-ca"));
        assert!(err("mysql://h/d?ssl-mode=nope").contains("not valid"));
        assert!(err("mysql://h/d?ssl-mode=DISABLED&table=a-b").contains("invalid table"));
        assert!(!err("mysql://h/d?x=1").contains('\n'));
    }
}
