//! `redis+sentinel://[user:password@]host:port[,host:port...]/MASTER[/db]`: Redis behind
//! Sentinel. The URL names the Sentinels; each connection asks them, in turn, for the
//! master's address, and the connection insists on `ROLE master` (see `conn.rs`), so a
//! failover is followed at the next reconnection. Part of [`super`].

use std::sync::Arc;
use std::time::Duration;

use redis::IntoConnectionInfo;

use super::errors::{describe, io_reason};
use super::target::{self, RedisTarget};
use crate::backend::table::{host_list, split_userinfo};
use crate::backend::{BackendError, Kind, UrlContext};
use crate::config::ConfigError;

/// The table line of Redis behind Sentinel.
pub const KIND: Kind = Kind {
    schemes: &["redis+sentinel"],
    usage: "redis+sentinel://[user:pass@]host:port[,...]/MASTER[/db]",
    parse: |url, ctx| Ok(Arc::new(parse(url, ctx)?)),
};

/// How long one Sentinel may take to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(1);

/// The Sentinels that know a master's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sentinels {
    /// `host:port` of each Sentinel.
    pub addrs: Vec<String>,
    /// The master's name as the Sentinels know it.
    pub master: String,
}

/// Checks a `redis+sentinel://` URL into the master's connection settings (on a
/// placeholder address) and the Sentinels to ask for the real one.
pub fn parse(url: &str, ctx: &UrlContext<'_>) -> Result<RedisTarget, ConfigError> {
    let bad = || ConfigError::BadUrl {
        expected: KIND.usage,
    };
    let rest = url.strip_prefix("redis+sentinel://").ok_or_else(bad)?;
    let (userinfo, rest) = split_userinfo(rest);
    let (hosts, path) = rest.split_once('/').ok_or_else(bad)?;
    let (master, db) = match path.split_once('/') {
        Some((m, db)) => (m, Some(db)),
        None => (path, None),
    };
    let addrs = host_list(hosts, KIND.usage)?;
    if master.is_empty() || db.is_some_and(|d| d.parse::<u32>().is_err()) {
        return Err(bad());
    }
    // The data nodes' settings (user, password, database) on a placeholder address.
    let template = format!(
        "redis://{}127.0.0.1:6379/{}",
        userinfo.map(|u| format!("{u}@")).unwrap_or_default(),
        db.unwrap_or("0")
    );
    let mut node = target::parse(&template, ctx).map_err(|_| bad())?;
    node.sentinel = Some(Sentinels {
        addrs,
        master: master.to_owned(),
    });
    Ok(node)
}

impl Sentinels {
    /// Asks the Sentinels, in turn, for the master's address.
    pub async fn master_address(&self) -> Result<redis::ConnectionInfo, BackendError> {
        let mut last_error = String::from("no Sentinel answered");
        for addr in &self.addrs {
            let ask = async {
                let client = redis::Client::open(format!("redis://{addr}"))?;
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.master)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await
            };
            match tokio::time::timeout(ASK_TIMEOUT, ask).await {
                Ok(Ok(Some((host, port)))) => {
                    return format!("redis://{host}:{port}")
                        .into_connection_info()
                        .map_err(|e| describe(&e, addr));
                }
                Ok(Ok(None)) => {
                    last_error = format!(
                        "Sentinel {addr} does not know a master named {:?}",
                        self.master
                    )
                }
                Ok(Err(e)) => last_error = format!("Sentinel {addr}: {}", io_reason(&e)),
                Err(_) => last_error = format!("Sentinel {addr} did not answer within 1s"),
            }
        }
        Err(BackendError::Unavailable(last_error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::table::testing::{args, ctx};
    use crate::backend::Target;

    #[test]
    fn sentinel_urls_name_the_sentinels_and_the_master() {
        let a = args(&[]);
        let node = parse(
            "redis+sentinel://:pw@s1:26379,s2:26380/mymaster/2",
            &ctx(&a, None),
        )
        .unwrap();
        let s = node.sentinel.as_ref().unwrap();
        assert_eq!(s.addrs, vec!["s1:26379", "s2:26380"]);
        assert_eq!(s.master, "mymaster");
        assert_eq!(node.info.redis_settings().password(), Some("pw"));
        assert_eq!(node.info.redis_settings().db(), 2);
        assert_eq!(node.display(), "sentinel s1:26379,s2:26380/mymaster");
        for bad in [
            "redis+sentinel://s1:26379",
            "redis+sentinel://s1/m",
            "redis+sentinel://s1:1/",
            "redis+sentinel://s1:1/m/x",
        ] {
            assert_eq!(
                parse(bad, &ctx(&a, None)).unwrap_err(),
                ConfigError::BadUrl {
                    expected: KIND.usage
                },
                "{bad}"
            );
        }
        assert_eq!(
            parse("redis+sentinel://s1:1,s2:0/m", &ctx(&a, None)).unwrap_err(),
            ConfigError::PortZero
        );
    }
}
