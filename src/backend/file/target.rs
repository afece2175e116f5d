//! `file:///ABSOLUTE/DIR`: the URL checked into a [`FileTarget`]. Part of [`super`].
//!
//! The host is empty or `localhost` (the directory is on this host); the path is
//! absolute, taken as written (no percent-escapes), without `..`, query or fragment;
//! no user or password, and no password from `--password-file` or
//! `LOCKRUN_PASSWORD`. `--key-prefix` must leave room for every lock name in a file
//! name. Each refusal says what to write instead, without echoing the URL.

use std::path::PathBuf;
use std::sync::Arc;

use super::{name, FileBackend};
use crate::backend::url::{BackendConfig, UrlError};
use crate::backend::url::{Kind, Target, UrlContext};
use crate::backend::AnyBackend;

/// The table line of the file backend.
pub const KIND: Kind = Kind {
    schemes: &["file"],
    usage: "file:///ABSOLUTE/DIR (locks for this host only, one file per lock in DIR)",
    parse: |url, ctx| Ok(Arc::new(parse(url, ctx)?)),
};

/// A checked lock directory.
#[derive(Clone, Debug)]
pub struct FileTarget {
    /// The directory, absolute, without `.`, `..` or repeated slashes.
    pub dir: PathBuf,
}

impl Target for FileTarget {
    fn display(&self) -> String {
        self.dir.display().to_string()
    }

    fn open(&self, config: &BackendConfig, _waiting: bool) -> AnyBackend {
        // Waiting needs nothing up front: a waiter thread starts per wait.
        AnyBackend::new(FileBackend::new(self.dir.clone(), config))
    }

    fn semaphores(&self) -> bool {
        true
    }
}

/// Checks a `file://` URL (see the module documentation).
pub fn parse(url: &str, ctx: &UrlContext<'_>) -> Result<FileTarget, UrlError> {
    let refuse = |what: &str| {
        UrlError::Backend(format!(
            "the file:// URL {what}: write file:///ABSOLUTE/DIR (three slashes, then the \
             lock directory's absolute path)"
        ))
    };
    let rest = url
        .strip_prefix("file://")
        .ok_or_else(|| refuse("is malformed"))?;
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if host.contains('@') {
        return Err(refuse(
            "has a user or password, which the file backend does not take",
        ));
    }
    if !host.is_empty() && !host.eq_ignore_ascii_case("localhost") {
        return Err(refuse(
            "names a host: the file backend only locks on this host",
        ));
    }
    if path.is_empty() {
        return Err(refuse("has no directory"));
    }
    if path.contains(['?', '#']) {
        return Err(refuse(
            "has a query or fragment (? or #), which the file backend does not take",
        ));
    }
    if path.contains('%') {
        return Err(refuse(
            "has a %: percent-escapes are not decoded, use a path without %",
        ));
    }
    if path.chars().any(char::is_control) {
        return Err(refuse("has a control character"));
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(refuse("has a .. component; give the path without it"));
    }
    if parts.is_empty() {
        return Err(refuse("names / itself; give a directory of lockrun's own"));
    }
    if ctx.password.is_some() {
        return Err(UrlError::Backend(
            "the file backend takes no password: unset LOCKRUN_PASSWORD and drop \
             --password-file"
                .into(),
        ));
    }
    name::check_prefix(&ctx.options.key_prefix).map_err(UrlError::Backend)?;
    Ok(FileTarget {
        dir: PathBuf::from(format!("/{}", parts.join("/"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::url::testing::{ctx, options};

    fn check(url: &str) -> Result<String, String> {
        let a = options();
        parse(url, &ctx(&a, None))
            .map(|t| t.display())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn file_urls_name_an_absolute_directory_on_this_host() {
        assert_eq!(
            check("file:///var/lib/lockrun").as_deref(),
            Ok("/var/lib/lockrun")
        );
        assert_eq!(
            check("file:///var/lib/lockrun/").as_deref(),
            Ok("/var/lib/lockrun")
        );
        assert_eq!(check("file://localhost/run/x").as_deref(), Ok("/run/x"));
        assert_eq!(check("file://LOCALHOST//a/./b").as_deref(), Ok("/a/b"));
        assert_eq!(check("file:///a b/c:d").as_deref(), Ok("/a b/c:d"));
    }

    #[test]
    fn every_refusal_says_what_to_write_and_never_echoes_the_url() {
        for (url, says) in [
            ("file://var/lib", "names a host"),
            ("file://host.example/x", "names a host"),
            ("file://u:s3cret@/x", "user or password"),
            ("file://u:s3cret@localhost/x", "user or password"),
            ("file://", "has no directory"),
            ("file://localhost", "has no directory"),
            ("file:///", "names /"),
            ("file:///./", "names /"),
            ("file:///a/../b", ".."),
            ("file:///a/..", ".."),
            ("file:///x?mode=s3cret", "query"),
            ("file:///x#s3cret", "query"),
            ("file:///a%2fb", "%"),
            ("file:///a\nb", "control"),
        ] {
            let e = check(url).unwrap_err();
            assert!(e.contains(says), "{url}: {e}");
            assert!(e.contains("file:///ABSOLUTE/DIR"), "{url}: {e}");
            assert!(!e.contains("s3cret") && !e.contains('\n'), "{url}: {e}");
        }
    }

    #[test]
    fn a_password_or_a_prefix_too_long_is_refused() {
        let a = options();
        let e = parse("file:///x", &ctx(&a, Some("pw")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("LOCKRUN_PASSWORD") && e.contains("--password-file"),
            "{e}"
        );
        let mut long = options();
        long.key_prefix = "p".repeat(name::MAX_PREFIX + 1);
        let e = parse("file:///x", &ctx(&long, None))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--key-prefix"), "{e}");
    }
}
