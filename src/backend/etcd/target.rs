//! `etcd://[user[:password]@]host:port[,host:port...]`: the URL checked into an
//! [`EtcdTarget`]. Part of [`super`].

use std::sync::Arc;

use super::EtcdBackend;
use crate::backend::table::{host_list, split_userinfo};
use crate::backend::{AnyBackend, Kind, Target, UrlContext};
use crate::config::{BackendConfig, ConfigError};

/// The table line of etcd.
pub const KIND: Kind = Kind {
    schemes: &["etcd"],
    usage: "etcd://[user@]host:port[,host:port...]",
    parse: |url, ctx| Ok(Arc::new(parse(url, ctx)?)),
};

/// Connection details of an etcd cluster.
#[derive(Clone)]
pub struct EtcdTarget {
    /// `host:port` of each member.
    pub members: Vec<String>,
    /// User and password, if the cluster has authentication on.
    pub credentials: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTarget")
            .field("members", &self.members)
            .field("user", &self.credentials.as_ref().map(|(u, _)| u))
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

/// Checks an `etcd://` URL; the context's password wins over the URL's.
pub fn parse(url: &str, ctx: &UrlContext<'_>) -> Result<EtcdTarget, ConfigError> {
    let bad = || ConfigError::BadUrl {
        expected: KIND.usage,
    };
    let rest = url.strip_prefix("etcd://").ok_or_else(bad)?;
    let (userinfo, hosts) = split_userinfo(rest.trim_end_matches('/'));
    let members = host_list(hosts, KIND.usage)?;
    let credentials = match (userinfo, &ctx.password) {
        (Some(u), pw) => {
            let (user, url_pw) = u.split_once(':').unwrap_or((u, ""));
            let password = pw.clone().unwrap_or_else(|| url_pw.to_owned());
            Some((user.to_owned(), password))
        }
        (None, Some(_)) => {
            return Err(ConfigError::Backend(
                "etcd authentication needs a user: etcd://USER@host:port with the password in \
                 LOCKRUN_PASSWORD"
                    .into(),
            ))
        }
        (None, None) => None,
    };
    Ok(EtcdTarget {
        members,
        credentials,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::table::testing::{args, ctx};

    #[test]
    fn etcd_urls_list_every_member() {
        let a = args(&[]);
        let t = parse("etcd://10.0.0.1:2379,10.0.0.2:2379", &ctx(&a, None)).unwrap();
        assert_eq!(t.members, vec!["10.0.0.1:2379", "10.0.0.2:2379"]);
        assert!(t.credentials.is_none());
        assert_eq!(t.display(), "10.0.0.1:2379,10.0.0.2:2379");
        let t = parse("etcd://root@h:2379", &ctx(&a, Some("pw"))).unwrap();
        assert_eq!(t.credentials, Some(("root".into(), "pw".into())));
        assert!(!format!("{t:?}").contains("pw\""));
        assert!(matches!(
            parse("etcd://h:2379", &ctx(&a, Some("pw"))),
            Err(ConfigError::Backend(_))
        ));
        for bad in ["etcd://", "etcd://host", "etcd://h:1,"] {
            assert!(parse(bad, &ctx(&a, None)).is_err(), "{bad}");
        }
        for zero in ["etcd://host:0", "etcd://a:2379,b:0", "etcd://u:pw@h:0/"] {
            assert_eq!(
                parse(zero, &ctx(&a, None)).unwrap_err(),
                ConfigError::PortZero,
                "{zero}"
            );
        }
    }
}
