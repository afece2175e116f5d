//! What every backend shares about its URL: the [`Target`] a parser makes, the
//! [`UrlContext`] it may read, the [`Kind`] line each backend adds to the registry,
//! the [`UrlError`] it refuses a URL with, and the small parsers of URL pieces
//! ([`host_list`], [`split_userinfo`], [`percent_decode`]). A leaf of [`super`]: it depends on the backend
//! trait ([`super::AnyBackend`]) only, never on a backend, the registry, the
//! configuration or the command line.

use std::fmt::Debug;
use std::sync::Arc;

use thiserror::Error;

use super::AnyBackend;

/// One kind of backend: its line in the registry
/// ([`crate::backend::registry::KINDS`]).
pub struct Kind {
    /// The URL schemes it answers to, without `://`.
    pub schemes: &'static [&'static str],
    /// The URL's form, for `--help` and for the message when a URL does not parse.
    pub usage: &'static str,
    /// Checks one URL of this kind.
    pub parse: ParseUrl,
}

/// A backend's URL parser.
pub type ParseUrl = fn(&str, &UrlContext<'_>) -> Result<Arc<dyn Target>, UrlError>;

/// A checked backend address: what a URL named, ready to open. Its `Debug` never
/// shows a password.
pub trait Target: Debug + Send + Sync {
    /// The server(s) as `host:port`, for messages (never the URL).
    fn display(&self) -> String;

    /// Opens the backend; nothing is connected yet. `waiting`: the caller may wait for
    /// a busy lock (`--wait`), so the backend prepares to receive wake-ups.
    fn open(&self, config: &BackendConfig, waiting: bool) -> AnyBackend;

    /// Whether this backend can hold a name with `--slots` above 1 (a semaphore).
    /// Every backend decides: a new one that cannot says false, and `--slots` above 1
    /// is then refused before anything is connected.
    fn semaphores(&self) -> bool;
}

/// Where the lock lives: a checked [`Target`] and the options every backend opens with.
#[derive(Clone, Debug)]
pub struct BackendConfig {
    /// Which backend, and how to reach it (checked by the backend's own parser).
    pub target: Arc<dyn Target>,
    /// The server(s) as `host:port`, for messages (never the full URL).
    pub display: String,
    /// The namespace of the keys.
    pub key_prefix: String,
    /// How many may hold one name at once (`--slots`; 1 is a plain lock).
    pub slots: u32,
}

impl AnyBackend {
    /// Opens (lazily: nothing is connected yet) the backend `config` names;
    /// `waiting` says the caller may wait for a busy lock (`--wait`).
    pub fn open(config: &BackendConfig, waiting: bool) -> AnyBackend {
        config.target.open(config, waiting)
    }
}

/// The backend options besides the URL, as plain values; each backend reads its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendOptions {
    /// The namespace of the keys (`--key-prefix`).
    pub key_prefix: String,
    /// Redis: take the lock even on a server that may evict it (`--allow-eviction`).
    pub allow_eviction: bool,
    /// PostgreSQL: the lease table, `table` or `schema.table` (`--pg-table`).
    pub pg_table: String,
}

/// What a URL parser may use besides the URL.
pub struct UrlContext<'a> {
    /// The password from `--password-file` or `LOCKRUN_PASSWORD`; it wins over the URL's.
    pub password: Option<String>,
    /// The backend options (each backend reads its own).
    pub options: &'a BackendOptions,
    /// Looks an environment variable up (TLS files, for instance).
    pub env: &'a dyn Fn(&str) -> Option<String>,
}

/// A backend URL or option refused before anything is connected; exit status 125. The
/// URL itself is never shown: it may hold a password.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum UrlError {
    /// The URL's scheme is not a backend this build knows.
    #[error("unsupported backend URL scheme {scheme:?}: use {known}")]
    BadScheme {
        /// The scheme given (at most 32 characters).
        scheme: String,
        /// Every scheme this build knows, in words.
        known: String,
    },
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
}

/// Splits `[userinfo@]rest` at the last `@`.
pub fn split_userinfo(rest: &str) -> (Option<&str>, &str) {
    match rest.rsplit_once('@') {
        Some((u, r)) => (Some(u), r),
        None => (None, rest),
    }
}

/// `%XX` decoded (a malformed escape is kept as it is), as text: what a URL's parser
/// reads a query parameter as, and so what the password scrubber must read it as too.
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Checks a comma-separated `host:port[,host:port...]` list (port 1 to 65535, in
/// decimal digits). `expected` is the URL form, for the message when it is malformed;
/// port 0 has a message of its own ([`UrlError::PortZero`]).
pub fn host_list(hosts: &str, expected: &'static str) -> Result<Vec<String>, UrlError> {
    let list: Vec<String> = hosts.split(',').map(str::to_owned).collect();
    for host in &list {
        let (name, port) = host.rsplit_once(':').ok_or(UrlError::BadUrl { expected })?;
        // Digits only: `u16`'s parser would take `+1`.
        let port = Some(port)
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<u16>().ok());
        match port {
            _ if name.is_empty() => return Err(UrlError::BadUrl { expected }),
            None => return Err(UrlError::BadUrl { expected }),
            Some(0) => return Err(UrlError::PortZero),
            Some(_) => {}
        }
    }
    Ok(list)
}

/// Helpers for the parsers' unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// The options as the command line gives them by default.
    pub(crate) fn options() -> BackendOptions {
        BackendOptions {
            key_prefix: "lockrun:".to_owned(),
            allow_eviction: false,
            pg_table: "lockrun_locks".to_owned(),
        }
    }

    /// A context with `password` and an empty environment.
    pub(crate) fn ctx(options: &BackendOptions, password: Option<&str>) -> UrlContext<'static> {
        let options: &'static BackendOptions = Box::leak(Box::new(options.clone()));
        UrlContext {
            password: password.map(str::to_owned),
            options,
            env: &|_| None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_escapes_are_decoded_and_malformed_ones_kept() {
        assert_eq!(percent_decode("p%61ssword"), "password");
        assert_eq!(percent_decode("%50ASS%2"), "PASS%2");
        assert_eq!(percent_decode("a%zzb%"), "a%zzb%");
        assert_eq!(percent_decode("%61"), "a");
    }

    #[test]
    fn host_lists_need_a_port_on_every_host() {
        let expected = "h:p";
        assert_eq!(
            host_list("a:1,b:2", expected),
            Ok(vec!["a:1".to_owned(), "b:2".to_owned()])
        );
        assert_eq!(host_list("[::1]:65535", expected).unwrap().len(), 1);
        for bad in ["", "a", "a:1,", ":1", "a:x", "a:+1", "a:65536", "a:"] {
            assert_eq!(
                host_list(bad, expected),
                Err(UrlError::BadUrl { expected }),
                "{bad}"
            );
        }
        for zero in ["a:0", "a:1,b:0", "a:00"] {
            assert_eq!(host_list(zero, expected), Err(UrlError::PortZero), "{zero}");
        }
    }
}
