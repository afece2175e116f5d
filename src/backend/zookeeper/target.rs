//! `zk://[user:pass@]host:port[,host:port...][/chroot]`: the URL checked into a
//! [`ZkTarget`]. The user and password are ZooKeeper's `digest` authentication; the
//! chroot is the path every lock lives under (it must exist). Part of [`super`].

use std::sync::Arc;

use super::ZkBackend;
use crate::backend::url::{host_list, split_userinfo};
use crate::backend::url::{BackendConfig, UrlError};
use crate::backend::url::{Kind, Target, UrlContext};
use crate::backend::AnyBackend;

/// The table line of ZooKeeper.
pub const KIND: Kind = Kind {
    schemes: &["zk"],
    usage: "zk://[user:pass@]host:port[,host:port...][/chroot]",
    parse: |url, ctx| Ok(Arc::new(parse(url, ctx)?)),
};

/// Connection details of a ZooKeeper ensemble.
#[derive(Clone)]
pub struct ZkTarget {
    /// `host:port` of each server, in the URL's order.
    pub servers: Vec<String>,
    /// The chroot (`/a/b`), or empty for the root.
    pub chroot: String,
    /// `user:password` for the `digest` scheme, if given.
    pub digest: Option<String>,
}

impl std::fmt::Debug for ZkTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let user = self
            .digest
            .as_ref()
            .map(|d| d.split_once(':').map_or(d.as_str(), |(u, _)| u));
        f.debug_struct("ZkTarget")
            .field("servers", &self.servers)
            .field("chroot", &self.chroot)
            .field("user", &user)
            .finish()
    }
}

impl Target for ZkTarget {
    fn display(&self) -> String {
        format!("{}{}", self.servers.join(","), self.chroot)
    }

    fn open(&self, config: &BackendConfig, waiting: bool) -> AnyBackend {
        AnyBackend::new(ZkBackend::new(self.clone(), config, waiting))
    }

    fn semaphores(&self) -> bool {
        true
    }
}

/// Checks a `zk://` URL; the context's password wins over the URL's.
pub fn parse(url: &str, ctx: &UrlContext<'_>) -> Result<ZkTarget, UrlError> {
    let bad = || UrlError::BadUrl {
        expected: KIND.usage,
    };
    let rest = url.strip_prefix("zk://").ok_or_else(bad)?;
    let (userinfo, rest) = split_userinfo(rest);
    let (hosts, chroot) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let servers = host_list(hosts, KIND.usage)?;
    let chroot = check_chroot(chroot)?;
    let digest = match (userinfo, &ctx.password) {
        (Some(u), pw) => {
            let (user, url_pw) = u.split_once(':').unwrap_or((u, ""));
            let password = pw.clone().unwrap_or_else(|| url_pw.to_owned());
            if user.is_empty() || password.is_empty() {
                return Err(UrlError::Backend(
                    "ZooKeeper digest authentication needs a user and a password: \
                     zk://USER:PASSWORD@host:port (or the password in LOCKRUN_PASSWORD)"
                        .into(),
                ));
            }
            Some(format!("{user}:{password}"))
        }
        (None, Some(_)) => {
            return Err(UrlError::Backend(
                "ZooKeeper authentication needs a user: zk://USER@host:port with the password \
                 in LOCKRUN_PASSWORD"
                    .into(),
            ))
        }
        (None, None) => None,
    };
    Ok(ZkTarget {
        servers,
        chroot,
        digest,
    })
}

/// A chroot as ZooKeeper takes it: `/` alone or nothing means none; otherwise `/a/b`
/// with no empty, `.` or `..` part (a trailing `/` is dropped).
fn check_chroot(chroot: &str) -> Result<String, UrlError> {
    let trimmed = chroot.trim_end_matches('/');
    if trimmed.is_empty() {
        return Ok(String::new());
    }
    let bad_part = trimmed
        .split('/')
        .skip(1)
        .any(|p| p.is_empty() || p == "." || p == ".." || p.contains('\0'));
    if bad_part {
        return Err(UrlError::Backend(
            "the ZooKeeper chroot in the URL is not a valid path: write it as /a/b (no empty, \
             . or .. parts)"
                .into(),
        ));
    }
    Ok(trimmed.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::url::testing::{ctx, options};

    #[test]
    fn zk_urls_list_servers_and_a_chroot() {
        let a = options();
        let t = parse(
            "zk://10.0.0.1:2181,10.0.0.2:2181/jobs/locks",
            &ctx(&a, None),
        )
        .unwrap();
        assert_eq!(t.servers, vec!["10.0.0.1:2181", "10.0.0.2:2181"]);
        assert_eq!(t.chroot, "/jobs/locks");
        assert_eq!(t.display(), "10.0.0.1:2181,10.0.0.2:2181/jobs/locks");
        assert!(t.digest.is_none());
        let t = parse("zk://h:2181/", &ctx(&a, None)).unwrap();
        assert_eq!((t.chroot.as_str(), t.display()), ("", "h:2181".to_owned()));
        for bad in [
            "zk://",
            "zk://host",
            "zk://h:1,",
            "zk:///x",
            "zk://h:1//x",
            "zk://h:1/a/../b",
        ] {
            assert!(parse(bad, &ctx(&a, None)).is_err(), "{bad}");
        }
        assert_eq!(
            parse("zk://h:0/x", &ctx(&a, None)).unwrap_err(),
            UrlError::PortZero
        );
    }

    #[test]
    fn the_digest_comes_from_the_url_or_the_password_and_is_never_shown() {
        let a = options();
        let t = parse("zk://app:s3cret@h:2181", &ctx(&a, None)).unwrap();
        assert_eq!(t.digest.as_deref(), Some("app:s3cret"));
        assert!(!format!("{t:?}").contains("s3cret"));
        assert!(!t.display().contains("s3cret") && !t.display().contains("app"));
        let t = parse("zk://app@h:2181", &ctx(&a, Some("pw"))).unwrap();
        assert_eq!(t.digest.as_deref(), Some("app:pw"));
        let t = parse("zk://app:old@h:2181", &ctx(&a, Some("new"))).unwrap();
        assert_eq!(t.digest.as_deref(), Some("app:new"));
        for bad in ["zk://app@h:2181", "zk://:pw@h:2181"] {
            assert!(
                matches!(parse(bad, &ctx(&a, None)), Err(UrlError::Backend(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            parse("zk://h:2181", &ctx(&a, Some("pw"))),
            Err(UrlError::Backend(_))
        ));
    }
}
