//! The registry of backends: which URL schemes exist, what each URL looks like, and the
//! parser that checks it. The configuration dispatches through [`KINDS`] only, and the
//! `--url` help ([`url_help`]) and the unknown-scheme message ([`scheme_list`]) are
//! built from it, so they cannot drift from what is accepted. It sits above every
//! backend (each adds its [`Kind`] line here) and below the configuration.

use std::sync::Arc;

use super::url::{Kind, Target, UrlContext, UrlError};
use super::{etcd, file, mysql, postgres, redis, zookeeper};

/// Every backend, one line each. A URL's scheme picks the first kind that lists it.
pub const KINDS: &[Kind] = &[
    redis::KIND,
    redis::sentinel::KIND,
    postgres::KIND,
    etcd::KIND,
    file::KIND,
    zookeeper::KIND,
    mysql::KIND,
];

/// Checks the URLs given (each `--url`; a comma-separated list of `redis://` URLs, as
/// `LOCKRUN_URL` carries a quorum, is split apart) into a target and its display.
/// Several URLs make a Redlock quorum; one URL is whatever its scheme names.
pub fn parse_urls(given: &[String], ctx: &UrlContext<'_>) -> Result<Arc<dyn Target>, UrlError> {
    match split_urls(given).as_slice() {
        [] => Err(bad_scheme("")),
        [url] => parse_one(url, ctx),
        several => redis::redlock::parse(several, ctx),
    }
}

/// Checks one URL with the parser of its scheme.
fn parse_one(url: &str, ctx: &UrlContext<'_>) -> Result<Arc<dyn Target>, UrlError> {
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    KINDS
        .iter()
        .find(|k| k.schemes.contains(&scheme))
        .ok_or_else(|| bad_scheme(scheme))
        .and_then(|k| (k.parse)(url, ctx))
}

/// The refusal of an unknown scheme (the first 32 characters of it), with the list.
fn bad_scheme(scheme: &str) -> UrlError {
    UrlError::BadScheme {
        scheme: scheme.chars().take(32).collect(),
        known: scheme_list(),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::url::testing::{ctx, options};

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
    fn several_seeds_in_one_cluster_url_are_one_cluster_never_a_quorum() {
        let given = ["redis+cluster://h1:1,h2:2,h3:3".to_owned()];
        let t = parse_urls(&given, &ctx(&options(), None)).unwrap();
        assert_eq!(t.display(), "cluster h1:1,h2:2,h3:3");
    }
}
