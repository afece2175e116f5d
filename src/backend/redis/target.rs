//! `redis://[user:password@]host:port[/db]` and `rediss://` (TLS): the URL checked into
//! a [`RedisTarget`], with the Redis option `--allow-eviction`. Part of [`super`].

use std::sync::Arc;

use redis::IntoConnectionInfo;

use super::sentinel::Sentinels;
use super::RedisBackend;
use crate::backend::tls::TlsFiles;
use crate::backend::{AnyBackend, Kind, Target, UrlContext};
use crate::config::{BackendConfig, ConfigError};

/// The table line of one Redis server.
pub const KIND: Kind = Kind {
    schemes: &["redis", "rediss"],
    usage: "redis://[user:pass@]host:port[/db] (rediss:// for TLS)",
    parse: |url, ctx| Ok(Arc::new(parse(url, ctx)?)),
};

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
}

impl Target for RedisTarget {
    fn display(&self) -> String {
        match &self.sentinel {
            Some(s) => format!("sentinel {}/{}", s.addrs.join(","), s.master),
            None => self.info.addr().to_string(),
        }
    }

    fn open(&self, config: &BackendConfig, waiting: bool) -> AnyBackend {
        AnyBackend::new(RedisBackend::new(self.clone(), config, waiting))
    }

    fn semaphores(&self) -> bool {
        true
    }
}

/// Checks a `redis://` or `rediss://` URL; the context's password wins over the URL's,
/// and `--allow-eviction` is taken from the context's options.
pub fn parse(url: &str, ctx: &UrlContext<'_>) -> Result<RedisTarget, ConfigError> {
    let bad = || ConfigError::BadUrl {
        expected: KIND.usage,
    };
    let mut info = url.into_connection_info().map_err(|_| bad())?;
    // The parser takes port 0; no server listens there, and a connection to it fails
    // with a message that looks like a server that is down.
    if matches!(info.addr(), redis::ConnectionAddr::Tcp(_, 0))
        || matches!(info.addr(), redis::ConnectionAddr::TcpTls { port: 0, .. })
    {
        return Err(ConfigError::PortZero);
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
        allow_eviction: ctx.args.allow_eviction,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::table::testing::{args, ctx};

    #[test]
    fn the_password_comes_from_the_context_and_is_never_shown() {
        let a = args(&[]);
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
        let a = args(&[]);
        let e = parse("redis://:s3cret@host:notaport", &ctx(&a, None)).unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
        assert_eq!(
            e,
            ConfigError::BadUrl {
                expected: KIND.usage
            }
        );
    }

    #[test]
    fn allow_eviction_is_carried_to_every_redis_target() {
        let mut a = args(&[]);
        assert!(!parse("redis://h:1", &ctx(&a, None)).unwrap().allow_eviction);
        a.allow_eviction = true;
        assert!(parse("redis://h:1", &ctx(&a, None)).unwrap().allow_eviction);
        let sentinel = super::super::sentinel::parse("redis+sentinel://s:1/m", &ctx(&a, None));
        assert!(sentinel.unwrap().allow_eviction);
    }

    #[test]
    fn port_0_is_refused() {
        let a = args(&[]);
        for url in ["redis://h:0", "rediss://:pw@h:0/1", "redis://127.0.0.1:00"] {
            let e = parse(url, &ctx(&a, None)).unwrap_err();
            assert_eq!(e, ConfigError::PortZero, "{url}");
            assert!(!e.to_string().contains("pw"), "{e}");
        }
        assert!(parse("redis://h:1", &ctx(&a, None)).is_ok());
    }
}
