//! `etcd://[user[:password]@]host:port[,host:port...]` and `etcds://` (the same over
//! TLS): the URL checked into an [`EtcdTarget`], with the TLS client configuration made
//! once from `LOCKRUN_TLS_CA` / `_CERT` / `_KEY`, and the warning for a password that
//! would cross the network in clear text. Part of [`super`]; uses
//! [`crate::backend::tls`] and logs through [`crate::log`].
//!
//! `https://` is not taken as a synonym of `etcds://` (as etcdctl's `--endpoints` would):
//! lockrun's scheme names the backend, and `https` names only a transport.

use std::net::IpAddr;
use std::sync::Arc;

use super::EtcdBackend;
use crate::backend::tls::TlsFiles;
use crate::backend::tls::{client_config, Roots, ServerCheck};
use crate::backend::url::{host_list, split_userinfo};
use crate::backend::url::{BackendConfig, UrlError};
use crate::backend::url::{Kind, Target, UrlContext};
use crate::backend::AnyBackend;

/// The table line of etcd.
pub const KIND: Kind = Kind {
    schemes: &["etcd", "etcds"],
    usage: "etcd://[user@]host:port[,host:port...] (etcds:// for TLS)",
    parse: |url, ctx| {
        let target = parse(url, ctx)?;
        warn_if_password_in_clear(&target);
        Ok(Arc::new(target))
    },
};

/// Connection details of an etcd cluster.
#[derive(Clone)]
pub struct EtcdTarget {
    /// `host:port` of each member.
    pub members: Vec<String>,
    /// User and password, if the cluster has authentication on.
    pub credentials: Option<(String, String)>,
    /// For `etcds://`: TLS to every member.
    pub tls: Option<EtcdTls>,
}

/// How `etcds://` speaks TLS: one client configuration for every member, and what the
/// error lines need to know of the files it was made from.
#[derive(Clone)]
pub struct EtcdTls {
    /// The server's chain and host name (an IP address against its IP SANs) are
    /// checked; ALPN `h2`; the client certificate, if given.
    pub config: Arc<rustls::ClientConfig>,
    /// `LOCKRUN_TLS_CA` was given (else the system's roots are trusted).
    pub private_ca: bool,
    /// `LOCKRUN_TLS_CERT` and `LOCKRUN_TLS_KEY` were given.
    pub client_cert: bool,
}

impl std::fmt::Debug for EtcdTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTarget")
            .field("members", &self.members)
            .field("user", &self.credentials.as_ref().map(|(u, _)| u))
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Target for EtcdTarget {
    fn display(&self) -> String {
        self.members.join(",")
    }

    fn open(&self, config: &BackendConfig, _waiting: bool) -> AnyBackend {
        // Waiting needs nothing up front: a watch is opened per wait.
        AnyBackend::new(EtcdBackend::new(self.clone(), config))
    }

    fn semaphores(&self) -> bool {
        true
    }
}

/// Checks an `etcd://` or `etcds://` URL; the context's password wins over the URL's.
/// For `etcds://`, the TLS files are read and the client configuration made here, so
/// that a missing or unusable file is a 125 before anything starts.
pub fn parse(url: &str, ctx: &UrlContext<'_>) -> Result<EtcdTarget, UrlError> {
    let bad = || UrlError::BadUrl {
        expected: KIND.usage,
    };
    let (tls, rest) = match url.split_once("://") {
        Some(("etcd", rest)) => (false, rest),
        Some(("etcds", rest)) => (true, rest),
        _ => return Err(bad()),
    };
    let (userinfo, hosts) = split_userinfo(rest.trim_end_matches('/'));
    let members = host_list(hosts, KIND.usage)?;
    let credentials = match (userinfo, &ctx.password) {
        (Some(u), pw) => {
            let (user, url_pw) = u.split_once(':').unwrap_or((u, ""));
            let password = pw.clone().unwrap_or_else(|| url_pw.to_owned());
            Some((user.to_owned(), password))
        }
        (None, Some(_)) => {
            return Err(UrlError::Backend(
                "etcd authentication needs a user: etcd://USER@host:port with the password in \
                 LOCKRUN_PASSWORD"
                    .into(),
            ))
        }
        (None, None) => None,
    };
    let tls = match tls {
        true => Some(tls_config(&TlsFiles::from_env(ctx.env)?)?),
        false => None,
    };
    Ok(EtcdTarget {
        members,
        credentials,
        tls,
    })
}

/// The TLS configuration of `etcds://` from the files given: the server's chain and
/// name always checked (there is no `--insecure-skip-tls-verify`: a private CA is one
/// `LOCKRUN_TLS_CA` away, and a lock whose server is not authenticated is no lock).
fn tls_config(files: &TlsFiles) -> Result<EtcdTls, UrlError> {
    let roots = match &files.ca {
        Some(pem) => Roots::Pem(pem),
        None => Roots::System,
    };
    let client = files
        .client
        .as_ref()
        .map(|(cert, key)| (cert.as_slice(), key.as_slice()));
    let shared = client_config(ServerCheck::ChainAndName, roots, client).map_err(|e| {
        UrlError::Backend(format!(
            "etcds:// cannot use the TLS files of LOCKRUN_TLS_CA, LOCKRUN_TLS_CERT, \
             LOCKRUN_TLS_KEY: {e}"
        ))
    })?;
    // etcd serves gRPC over HTTP/2 only.
    let mut config = rustls::ClientConfig::clone(&shared);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(EtcdTls {
        config: Arc::new(config),
        private_ca: files.ca.is_some(),
        client_cert: files.client.is_some(),
    })
}

/// The members a password would reach in clear text: with credentials over plain
/// `etcd://`, each member whose host, as written in the URL, is not loopback
/// (`127.0.0.0/8`, `::1`, `localhost`). A name is judged as written, not resolved: what
/// it resolves to can change, and the warning is about the URL.
pub fn password_in_clear(target: &EtcdTarget) -> Vec<&str> {
    if target.tls.is_some() || target.credentials.is_none() {
        return Vec::new();
    }
    target
        .members
        .iter()
        .map(String::as_str)
        .filter(|m| !is_loopback(m))
        .collect()
}

/// True when the host of `member` (`host:port`) is a loopback address or `localhost`.
fn is_loopback(member: &str) -> bool {
    let host = member.rsplit_once(':').map_or(member, |(host, _)| host);
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let host = host.strip_suffix('.').unwrap_or(host);
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// One warning line when the password would cross the network in clear text.
fn warn_if_password_in_clear(target: &EtcdTarget) {
    let members = password_in_clear(target);
    if members.is_empty() {
        return;
    }
    let msg = format!(
        "the etcd password crosses the network in clear text to {} (etcd:// is not \
         encrypted): use etcds:// (TLS) for a member that is not on this machine",
        members.join(",")
    );
    crate::log::emit(
        crate::log::Level::Warn,
        crate::log::Event::PasswordInClear,
        &msg,
        &[],
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::url::testing::{ctx, options};

    #[test]
    fn etcd_urls_list_every_member() {
        let a = options();
        let t = parse("etcd://10.0.0.1:2379,10.0.0.2:2379", &ctx(&a, None)).unwrap();
        assert_eq!(t.members, vec!["10.0.0.1:2379", "10.0.0.2:2379"]);
        assert!(t.credentials.is_none());
        assert_eq!(t.display(), "10.0.0.1:2379,10.0.0.2:2379");
        let t = parse("etcd://root@h:2379", &ctx(&a, Some("pw"))).unwrap();
        assert_eq!(t.credentials, Some(("root".into(), "pw".into())));
        assert!(!format!("{t:?}").contains("pw\""));
        assert!(matches!(
            parse("etcd://h:2379", &ctx(&a, Some("pw"))),
            Err(UrlError::Backend(_))
        ));
        for bad in [
            "etcd://",
            "etcd://host",
            "etcd://h:1,",
            "etcds://h",
            "https://h:1",
        ] {
            assert!(parse(bad, &ctx(&a, None)).is_err(), "{bad}");
        }
        for zero in ["etcd://host:0", "etcd://a:2379,b:0", "etcd://u:pw@h:0/"] {
            assert_eq!(
                parse(zero, &ctx(&a, None)).unwrap_err(),
                UrlError::PortZero,
                "{zero}"
            );
        }
    }

    #[test]
    fn etcds_reads_its_tls_files_when_the_url_is_checked() {
        let a = options();
        let missing = |v: &str| (v == "LOCKRUN_TLS_CA").then(|| "/nonexistent/ca.pem".to_owned());
        let ctx = UrlContext {
            password: None,
            options: &a,
            env: &missing,
        };
        assert!(matches!(
            parse("etcds://h:2379", &ctx),
            Err(UrlError::TlsFile {
                var: "LOCKRUN_TLS_CA",
                ..
            })
        ));
        // etcd:// never reads them.
        let t = parse("etcd://h:2379", &ctx).unwrap();
        assert!(t.tls.is_none());
        assert!(format!("{t:?}").contains("tls: false"));
    }

    #[test]
    fn a_password_over_plain_etcd_is_in_clear_text_unless_every_member_is_loopback() {
        let a = options();
        let in_clear = |url: &str, password: Option<&str>| {
            let t = parse(url, &ctx(&a, password)).unwrap();
            password_in_clear(&t)
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        let none: Vec<String> = Vec::new();
        // Loopback as written: 127.0.0.0/8, ::1, localhost.
        for url in [
            "etcd://root@127.0.0.1:2379",
            "etcd://root@127.1.2.3:2379,localhost:2380",
            "etcd://root@[::1]:2379",
            "etcd://root@LOCALHOST.:2379",
        ] {
            assert_eq!(in_clear(url, Some("pw")), none, "{url}");
        }
        assert_eq!(
            in_clear(
                "etcd://root@127.0.0.1:2379,10.0.0.2:2379,db.example:2379",
                Some("pw")
            ),
            vec!["10.0.0.2:2379", "db.example:2379"]
        );
        // Judged as written: a name is not resolved, whatever it points at.
        assert_eq!(
            in_clear("etcd://root:pw@localhost.example:1", None),
            vec!["localhost.example:1"]
        );
        assert_eq!(
            in_clear("etcd://root@[::2]:2379", Some("pw")),
            vec!["[::2]:2379"]
        );
        assert_eq!(
            in_clear("etcd://root@128.0.0.1:2379", Some("pw")),
            vec!["128.0.0.1:2379"]
        );
        // No user, no password sent.
        assert_eq!(in_clear("etcd://10.0.0.2:2379", None), none);
        // Over TLS, never.
        let mut t = parse("etcd://root@10.0.0.2:2379", &ctx(&a, Some("pw"))).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        t.tls = Some(EtcdTls {
            config: Arc::new(config),
            private_ca: false,
            client_cert: false,
        });
        assert!(password_in_clear(&t).is_empty());
    }
}
