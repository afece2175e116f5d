//! The table of backends: which URL schemes exist, what each URL looks like, and the
//! parser that checks it. The configuration dispatches through [`KINDS`] only, and the
//! `--url` help ([`url_help`]) and the unknown-scheme message ([`scheme_list`]) are
//! built from it, so they cannot drift from what is accepted. Part of [`super`].

use std::fmt::Debug;
use std::sync::Arc;

use super::{etcd, file, postgres, redis, zookeeper, AnyBackend};
use crate::cli::BackendArgs;
use crate::config::{BackendConfig, ConfigError};

/// Every backend, one line each. A URL's scheme picks the first kind that lists it.
pub const KINDS: &[Kind] = &[
    redis::KIND,
    redis::sentinel::KIND,
    postgres::KIND,
    etcd::KIND,
    file::KIND,
    zookeeper::KIND,
];

/// One kind of backend.
pub struct Kind {
    /// The URL schemes it answers to, without `://`.
    pub schemes: &'static [&'static str],
    /// The URL's form, for `--help` and for the message when a URL does not parse.
    pub usage: &'static str,
    /// Checks one URL of this kind.
    pub parse: ParseUrl,
}

/// A backend's URL parser.
pub type ParseUrl = fn(&str, &UrlContext<'_>) -> Result<Arc<dyn Target>, ConfigError>;

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

/// What a URL parser may use besides the URL.
pub struct UrlContext<'a> {
    /// The password from `--password-file` or `LOCKRUN_PASSWORD`; it wins over the URL's.
    pub password: Option<String>,
    /// Every backend option as given (each backend reads its own).
    pub args: &'a BackendArgs,
    /// Looks an environment variable up (TLS files, for instance).
    pub env: &'a dyn Fn(&str) -> Option<String>,
}

/// Checks the URLs given (each `--url`; a comma-separated list of `redis://` URLs, as
/// `LOCKRUN_URL` carries a quorum, is split apart) into a target and its display.
/// Several URLs make a Redlock quorum; one URL is whatever its scheme names.
pub fn parse_urls(given: &[String], ctx: &UrlContext<'_>) -> Result<Arc<dyn Target>, ConfigError> {
    match split_urls(given).as_slice() {
        [] => Err(ConfigError::BadScheme(String::new())),
        [url] => parse_one(url, ctx),
        several => redis::redlock::parse(several, ctx),
    }
}

/// Checks one URL with the parser of its scheme.
pub fn parse_one(url: &str, ctx: &UrlContext<'_>) -> Result<Arc<dyn Target>, ConfigError> {
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    KINDS
        .iter()
        .find(|k| k.schemes.contains(&scheme))
        .ok_or_else(|| ConfigError::BadScheme(scheme.chars().take(32).collect()))
        .and_then(|k| (k.parse)(url, ctx))
}

/// Every scheme, as `a://, b:// or c://`.
pub fn scheme_list() -> String {
    let all: Vec<String> = KINDS
        .iter()
        .flat_map(|k| k.schemes.iter().map(|s| format!("{s}://")))
        .collect();
    match all.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The `--url` help: every kind's URL form, then the quorum rule.
pub fn url_help() -> String {
    let forms: Vec<&str> = KINDS.iter().map(|k| k.usage).collect();
    format!(
        "Backend URL: {}. Give 3 or 5 redis:// URLs (repeated --url, or comma-separated in \
         LOCKRUN_URL) for a Redlock quorum over independent servers. Prefer LOCKRUN_URL for \
         URLs with a password: argv is visible in `ps`.",
        forms.join("; ")
    )
}

/// Each `--url`, with a comma-separated list of `redis://` URLs split apart. Commas
/// inside one etcd, Sentinel or PostgreSQL URL stay.
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

/// Splits `[userinfo@]rest` at the last `@`.
pub fn split_userinfo(rest: &str) -> (Option<&str>, &str) {
    match rest.rsplit_once('@') {
        Some((u, r)) => (Some(u), r),
        None => (None, rest),
    }
}

/// Checks a comma-separated `host:port[,host:port...]` list (port 1 to 65535, in
/// decimal digits). `expected` is the URL form, for the message when it is malformed;
/// port 0 has a message of its own ([`ConfigError::PortZero`]).
pub fn host_list(hosts: &str, expected: &'static str) -> Result<Vec<String>, ConfigError> {
    let list: Vec<String> = hosts.split(',').map(str::to_owned).collect();
    for host in &list {
        let (name, port) = host
            .rsplit_once(':')
            .ok_or(ConfigError::BadUrl { expected })?;
        // Digits only: `u16`'s parser would take `+1`.
        let port = Some(port)
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<u16>().ok());
        match port {
            _ if name.is_empty() => return Err(ConfigError::BadUrl { expected }),
            None => return Err(ConfigError::BadUrl { expected }),
            Some(0) => return Err(ConfigError::PortZero),
            Some(_) => {}
        }
    }
    Ok(list)
}

/// Helpers for the parsers' unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// The options as clap gives them by default, with `urls`.
    pub(crate) fn args(urls: &[&str]) -> BackendArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrap {
            #[command(flatten)]
            backend: BackendArgs,
        }
        let mut argv = vec!["x".to_owned()];
        for u in urls {
            argv.push(format!("--url={u}"));
        }
        Wrap::try_parse_from(argv).unwrap().backend
    }

    /// A context with `password` and an empty environment.
    pub(crate) fn ctx(args: &BackendArgs, password: Option<&str>) -> UrlContext<'static> {
        let args: &'static BackendArgs = Box::leak(Box::new(args.clone()));
        UrlContext {
            password: password.map(str::to_owned),
            args,
            env: &|_| None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_list_and_help_name_every_backend() {
        let list = scheme_list();
        for k in KINDS {
            for s in k.schemes {
                assert!(list.contains(&format!("{s}://")), "{s} missing from {list}");
            }
            assert!(url_help().contains(k.usage));
        }
        assert!(list.contains("redis+sentinel://") && list.contains("postgresql://"));
        assert!(list.contains(" or "));
    }

    #[test]
    fn schemes_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for s in KINDS.iter().flat_map(|k| k.schemes) {
            assert!(seen.insert(s), "{s} twice");
        }
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
                Err(ConfigError::BadUrl { expected }),
                "{bad}"
            );
        }
        for zero in ["a:0", "a:1,b:0", "a:00"] {
            assert_eq!(
                host_list(zero, expected),
                Err(ConfigError::PortZero),
                "{zero}"
            );
        }
    }
}
