//! `redis://[user:password@]host:port[/db]` and `rediss://` (TLS): the URL checked into
//! a [`RedisTarget`], with the Redis option `--allow-eviction`; also
//! `redis+cluster://[user:password@]host:port[,host:port...]` (and `rediss+cluster://`),
//! several seed nodes of one Redis Cluster. A `redis://` URL may name a Cluster node
//! too: both follow the Cluster's redirections (see `cluster.rs`); a Redlock node or a
//! Sentinel master never does. Part of [`super`].

use std::sync::Arc;

use redis::IntoConnectionInfo;

use super::sentinel::Sentinels;
use super::RedisBackend;
use crate::backend::tls::TlsFiles;
use crate::backend::url::{host_list, split_userinfo};
use crate::backend::url::{BackendConfig, UrlError};
use crate::backend::url::{Kind, Target, UrlContext};
use crate::backend::AnyBackend;

/// The table line of one Redis server.
pub const KIND: Kind = Kind {
    schemes: &["redis", "rediss", "redis+cluster", "rediss+cluster"],
    usage: "redis://[user:pass@]host:port[/db] (rediss:// for TLS; any node of a Redis \
            Cluster, or several: redis+cluster://[user:pass@]host:port,host:port)",
    parse: |url, ctx| Ok(Arc::new(parse_following(url, ctx)?)),
};

/// One node of a Redis Cluster: host and port.
pub type Node = (String, u16);

/// Where a target that follows a Redis Cluster's redirections starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seeds {
    /// Each seed, in the URL's order.
    pub nodes: Vec<Node>,
    /// The URL says it is a Cluster (`redis+cluster://`); a `redis://` node is known to
    /// be one only once it redirects.
    pub declared: bool,
}

/// Connection details of one Redis server.
#[derive(Clone, Debug)]
pub struct RedisTarget {
    /// Address, database, user and password (the password is redacted in `Debug`).
    /// Behind Sentinel, the address is a placeholder: the master's is asked for.
    pub info: redis::ConnectionInfo,
    /// TLS material, for `rediss://` and `rediss+sentinel://` only.
    pub tls: Option<TlsFiles>,
    /// For `redis+sentinel://` and `rediss+sentinel://`: where to ask for the master's
    /// address, and with what credentials.
    pub sentinel: Option<Sentinels>,
    /// `--allow-eviction`: take the lock even where the server may evict it.
    pub allow_eviction: bool,
    /// The seed nodes of a Redis Cluster: the backend follows the Cluster's
    /// redirections, starting from them. None for a server that must never redirect
    /// (a Redlock node, a Sentinel master): there a redirection is refused.
    pub cluster: Option<Seeds>,
}

impl Target for RedisTarget {
    fn display(&self) -> String {
        match &self.sentinel {
            Some(s) => format!("sentinel {}/{}", s.addrs.join(","), s.master),
            None => match &self.cluster {
                Some(seeds) if seeds.declared => {
                    let shown: Vec<String> = seeds
                        .nodes
                        .iter()
                        .map(|(h, p)| format!("{h}:{p}"))
                        .collect();
                    format!("cluster {}", shown.join(","))
                }
                _ => self.info.addr().to_string(),
            },
        }
    }

    fn open(&self, config: &BackendConfig, waiting: bool) -> AnyBackend {
        AnyBackend::new(RedisBackend::new(self.clone(), config, waiting))
    }

    fn semaphores(&self) -> bool {
        true
    }
}

/// Checks a URL of [`KIND`] into a target that follows a Cluster's redirections:
/// `redis://` and `rediss://` (their node is the one seed), `redis+cluster://` and
/// `rediss+cluster://` (the database is 0: a Cluster has no other).
pub fn parse_following(url: &str, ctx: &UrlContext<'_>) -> Result<RedisTarget, UrlError> {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let Some(plain) = scheme.strip_suffix("+cluster") else {
        let mut target = parse(url, ctx)?;
        target.cluster = node_of(target.info.addr()).map(|n| Seeds {
            nodes: vec![n],
            declared: false,
        });
        return Ok(target);
    };
    let (userinfo, hosts) = split_userinfo(rest);
    let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
    let seeds = host_list(hosts, KIND.usage)?;
    let mut nodes = Vec::with_capacity(seeds.len());
    for seed in &seeds {
        let (host, port) = seed.rsplit_once(':').ok_or(UrlError::BadUrl {
            expected: KIND.usage,
        })?;
        let port = port.parse().map_err(|_| UrlError::BadUrl {
            expected: KIND.usage,
        })?;
        nodes.push((host.to_owned(), port));
    }
    let first = format!(
        "{plain}://{}{}",
        userinfo.map(|u| format!("{u}@")).unwrap_or_default(),
        seeds[0]
    );
    let mut target = parse(&first, ctx)?;
    target.cluster = Some(Seeds {
        nodes,
        declared: true,
    });
    Ok(target)
}

impl RedisTarget {
    /// This target's settings (user, password, database, TLS) at another address: a
    /// node of the same Cluster.
    pub fn at(&self, (host, port): &Node) -> RedisTarget {
        let addr = match self.info.addr() {
            redis::ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => redis::ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => redis::ConnectionAddr::Tcp(host.clone(), *port),
        };
        RedisTarget {
            info: self.info.clone().set_addr(addr),
            ..self.clone()
        }
    }
}

/// The host and port of a TCP address (none for a Unix socket).
fn node_of(addr: &redis::ConnectionAddr) -> Option<Node> {
    match addr {
        redis::ConnectionAddr::Tcp(host, port)
        | redis::ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port)),
        _ => None,
    }
}

/// Checks a `redis://` or `rediss://` URL; the context's password wins over the URL's,
/// and `--allow-eviction` is taken from the context's options. The target follows no
/// redirection ([`parse_following`] makes one that does).
pub fn parse(url: &str, ctx: &UrlContext<'_>) -> Result<RedisTarget, UrlError> {
    let bad = || UrlError::BadUrl {
        expected: KIND.usage,
    };
    let mut info = url.into_connection_info().map_err(|_| bad())?;
    // The parser takes port 0; no server listens there, and a connection to it fails
    // with a message that looks like a server that is down.
    if matches!(info.addr(), redis::ConnectionAddr::Tcp(_, 0))
        || matches!(info.addr(), redis::ConnectionAddr::TcpTls { port: 0, .. })
    {
        return Err(UrlError::PortZero);
    }
    if let Some(password) = &ctx.password {
        let settings = info.redis_settings().clone().set_password(password.clone());
        info = info.set_redis_settings(settings);
    }
    let tls = match url.split_once("://") {
        Some(("rediss", _)) => Some(TlsFiles::from_env(ctx.env)?),
        Some(("redis", _)) => None,
        _ => return Err(bad()),
    };
    Ok(RedisTarget {
        info,
        tls,
        sentinel: None,
        cluster: None,
        allow_eviction: ctx.options.allow_eviction,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::url::testing::{ctx, options};

    #[test]
    fn the_password_comes_from_the_context_and_is_never_shown() {
        let a = options();
        let t = parse("redis://:urlpw@127.0.0.1:1/2", &ctx(&a, None)).unwrap();
        assert_eq!(t.info.redis_settings().password(), Some("urlpw"));
        assert_eq!(t.info.redis_settings().db(), 2);
        let t = parse("redis://:urlpw@127.0.0.1:1", &ctx(&a, Some("envpw"))).unwrap();
        assert_eq!(t.info.redis_settings().password(), Some("envpw"));
        assert!(!format!("{t:?}").contains("envpw"), "Debug must redact it");
        assert_eq!(t.display(), "127.0.0.1:1");
    }

    #[test]
    fn a_bad_url_never_echoes_the_url() {
        let a = options();
        let e = parse("redis://:s3cret@host:notaport", &ctx(&a, None)).unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
        assert_eq!(
            e,
            UrlError::BadUrl {
                expected: KIND.usage
            }
        );
    }

    #[test]
    fn cluster_urls_name_their_seeds_and_follow_redirections() {
        let a = options();
        let t = parse_following("redis+cluster://:pw@h1:7000,h2:7001/", &ctx(&a, None)).unwrap();
        let seeds = t.cluster.as_ref().unwrap();
        assert_eq!(
            seeds.nodes,
            vec![("h1".to_owned(), 7000), ("h2".to_owned(), 7001)]
        );
        assert!(seeds.declared);
        assert_eq!(t.info.redis_settings().password(), Some("pw"));
        assert_eq!(t.display(), "cluster h1:7000,h2:7001");
        assert!(t.tls.is_none());
        let t = parse_following("redis://h1:7000", &ctx(&a, None)).unwrap();
        let seeds = t.cluster.as_ref().unwrap();
        assert_eq!(seeds.nodes, vec![("h1".to_owned(), 7000)]);
        assert!(!seeds.declared);
        assert_eq!(t.display(), "h1:7000");
        // A Redlock node (or a Sentinel master) follows nothing.
        assert!(parse("redis://h1:7000", &ctx(&a, None))
            .unwrap()
            .cluster
            .is_none());
        // Another node of the same Cluster keeps the settings.
        let other = t.at(&("h9".to_owned(), 9));
        assert_eq!(other.info.addr().to_string(), "h9:9");
        for bad in [
            "redis+cluster://",
            "redis+cluster://h1",
            "redis+cluster://h1:1,",
            "redis+cluster://h1:1/2",
            "redis+cluster://:pw@h1:x",
        ] {
            let e = parse_following(bad, &ctx(&a, None)).unwrap_err();
            assert_eq!(
                e,
                UrlError::BadUrl {
                    expected: KIND.usage
                },
                "{bad}"
            );
            assert!(!e.to_string().contains("pw"), "{e}");
        }
        assert_eq!(
            parse_following("redis+cluster://h1:1,h2:0", &ctx(&a, None)).unwrap_err(),
            UrlError::PortZero
        );
    }

    #[test]
    fn allow_eviction_is_carried_to_every_redis_target() {
        let mut a = options();
        assert!(!parse("redis://h:1", &ctx(&a, None)).unwrap().allow_eviction);
        a.allow_eviction = true;
        assert!(parse("redis://h:1", &ctx(&a, None)).unwrap().allow_eviction);
        let sentinel = super::super::sentinel::parse("redis+sentinel://s:1/m", &ctx(&a, None));
        assert!(sentinel.unwrap().allow_eviction);
    }

    #[test]
    fn port_0_is_refused() {
        let a = options();
        for url in ["redis://h:0", "rediss://:pw@h:0/1", "redis://127.0.0.1:00"] {
            let e = parse(url, &ctx(&a, None)).unwrap_err();
            assert_eq!(e, UrlError::PortZero, "{url}");
            assert!(!e.to_string().contains("pw"), "{e}");
        }
        assert!(parse("redis://h:1", &ctx(&a, None)).is_ok());
    }
}
