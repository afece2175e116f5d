//! A Redlock quorum's URLs, checked: several plain Redis servers. Part of [`super`].

use std::sync::Arc;

use super::super::target::{self, RedisTarget};
use super::RedlockBackend;
use crate::backend::url::{BackendConfig, Target, UrlContext, UrlError};
use crate::backend::AnyBackend;

/// The fewest servers a quorum may have: with fewer, one failure stops every lock.
pub const MIN_NODES: usize = 3;

/// Several `redis://` URLs, checked: at least [`MIN_NODES`] independent servers.
#[derive(Clone, Debug)]
pub struct RedlockTarget {
    pub(super) nodes: Vec<RedisTarget>,
}

/// Checks several URLs into a quorum: every one a plain `redis://` or `rediss://`
/// server (not Sentinel), and at least [`MIN_NODES`] of them.
pub fn parse(urls: &[String], ctx: &UrlContext<'_>) -> Result<Arc<dyn Target>, UrlError> {
    let is_redis = |u: &String| u.starts_with("redis://") || u.starts_with("rediss://");
    if urls.len() < MIN_NODES || !urls.iter().all(is_redis) {
        return Err(UrlError::BadQuorum);
    }
    let nodes = urls
        .iter()
        .map(|u| target::parse(u, ctx))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Arc::new(RedlockTarget { nodes }))
}

impl Target for RedlockTarget {
    fn display(&self) -> String {
        let shown: Vec<String> = self.nodes.iter().map(|n| n.display()).collect();
        shown.join(",")
    }

    fn open(&self, config: &BackendConfig, waiting: bool) -> AnyBackend {
        AnyBackend::new(RedlockBackend::new(self, config, waiting))
    }

    fn semaphores(&self) -> bool {
        true
    }
}
