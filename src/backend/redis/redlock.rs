//! Redlock: one lock over N independent Redis servers (3 or 5), held only while a
//! majority holds it.
//!
//! Each server runs the same scripts as the single-server backend ([`RedisBackend`]);
//! this file only counts answers. Every call goes to all servers at once, each with a
//! per-server timeout far below the TTL, so one slow server costs nothing. The lease's
//! validity is the driver's: it counts the TTL from before the first request was sent,
//! less the drift margin, which is Redlock's "TTL − elapsed − drift".
//!
//! Fencing: each server answers with `max(its counter + 1, its clock in µs)`. The
//! quorum's token is the largest answer of the majority that granted the lock, written
//! back to a majority before it is handed out. Two majorities always share a server,
//! so a later acquisition sees a counter at least that large and answers with a larger
//! one: tokens strictly increase while a majority keeps its data.
//!
//! Where Redlock's safety rests on timing (a server that restarts without its data
//! while the lease runs, clocks that jump, long pauses), the fencing token is what
//! protects the downstream store: see the README.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join_all, select_all};

use super::target::{self, RedisTarget};
use super::RedisBackend;
use crate::backend::{
    Acquire, AcquireRequest, AnyBackend, Backend, BackendError, Holder, Release, Target, UrlContext,
};
use crate::config::{BackendConfig, ConfigError};

/// The fewest servers a quorum may have: with fewer, one failure stops every lock.
pub const MIN_NODES: usize = 3;

/// Several `redis://` URLs, checked: at least [`MIN_NODES`] independent servers.
#[derive(Clone, Debug)]
pub struct RedlockTarget {
    nodes: Vec<RedisTarget>,
}

/// Checks several URLs into a quorum: every one a plain `redis://` or `rediss://`
/// server (not Sentinel), and at least [`MIN_NODES`] of them.
pub fn parse(urls: &[String], ctx: &UrlContext<'_>) -> Result<Arc<dyn Target>, ConfigError> {
    let is_redis = |u: &String| u.starts_with("redis://") || u.starts_with("rediss://");
    if urls.len() < MIN_NODES || !urls.iter().all(is_redis) {
        return Err(ConfigError::BadQuorum);
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
}

/// A lock backend over a quorum of independent Redis servers.
pub struct RedlockBackend {
    /// At least [`MIN_NODES`] (a [`RedlockTarget`] cannot have fewer).
    nodes: Vec<RedisBackend>,
}

impl RedlockBackend {
    /// A backend over the servers of `target`.
    pub fn new(target: &RedlockTarget, config: &BackendConfig, waiting: bool) -> RedlockBackend {
        let nodes = target
            .nodes
            .iter()
            .map(|t| {
                let node_config = BackendConfig {
                    display: t.display(),
                    ..config.clone()
                };
                RedisBackend::new(t.clone(), &node_config, waiting)
            })
            .collect();
        RedlockBackend { nodes }
    }

    fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// Runs `call` on every server at once, each bounded by `timeout`.
    async fn on_all<'a, T, F, Fut>(
        &'a self,
        timeout: Duration,
        call: F,
    ) -> Vec<Result<T, BackendError>>
    where
        F: Fn(&'a RedisBackend) -> Fut,
        Fut: Future<Output = Result<T, BackendError>> + 'a,
    {
        join_all(self.nodes.iter().map(|node| {
            let fut = call(node);
            async move {
                tokio::time::timeout(timeout, fut)
                    .await
                    .unwrap_or_else(|_| {
                        Err(BackendError::Unavailable(format!(
                            "Redis at {} did not answer within {} ms",
                            node.display(),
                            timeout.as_millis()
                        )))
                    })
            }
        }))
        .await
    }

    /// Explains a missing quorum from the answers' errors.
    fn no_quorum<T>(
        &self,
        what: &str,
        ok: usize,
        answers: &[Result<T, BackendError>],
    ) -> BackendError {
        let first_error = answers.iter().find_map(|a| a.as_ref().err());
        let refused = answers
            .iter()
            .filter(|a| matches!(a, Err(BackendError::Refused(_))))
            .count();
        let detail = first_error.map(|e| format!(" ({e})")).unwrap_or_default();
        let msg = format!(
            "only {ok} of {} Redis servers {what}; a majority of {} is needed{detail}",
            self.nodes.len(),
            self.quorum()
        );
        if refused > self.nodes.len() - self.quorum() {
            BackendError::Refused(msg)
        } else {
            BackendError::Unavailable(msg)
        }
    }
}

/// The per-server timeout: a tenth of the TTL, between 50 ms and 1 s.
fn node_timeout(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

impl Backend for RedlockBackend {
    async fn acquire(&self, name: &str, req: &AcquireRequest) -> Result<Acquire, BackendError> {
        let timeout = node_timeout(req.ttl);
        let answers = self.on_all(timeout, |n| n.acquire(name, req)).await;
        let fences: Vec<u64> = answers
            .iter()
            .filter_map(|a| match a {
                Ok(Acquire::Acquired { fencing_token, .. }) => Some(*fencing_token),
                _ => None,
            })
            .collect();
        if fences.len() >= self.quorum() {
            let fence = fences.iter().copied().max().unwrap_or(0);
            let written = self
                .on_all(timeout, |n| n.raise_fence(name, fence, &req.token))
                .await;
            if written.iter().filter(|w| w.is_ok()).count() >= self.quorum() {
                return Ok(Acquire::Acquired {
                    fencing_token: fence,
                    slot: 0,
                });
            }
            let _ = self
                .on_all(timeout, |n| n.release(name, &req.token, Release::Now))
                .await;
            return Err(self.no_quorum("recorded the fencing token", 0, &written));
        }
        // No majority: give back what we got, everywhere.
        if !fences.is_empty() {
            let _ = self
                .on_all(timeout, |n| n.release(name, &req.token, Release::Now))
                .await;
        }
        let busy = answers.iter().find_map(|a| match a {
            Ok(Acquire::Busy(h)) => Some(h.clone()),
            _ => None,
        });
        let answered = answers.iter().filter(|a| a.is_ok()).count();
        match busy {
            // Enough servers answered to know: someone else holds a majority (or will
            // lose it soon); waiting is the right thing.
            Some(mut holder) if answered >= self.quorum() => {
                if !fences.is_empty() {
                    // A split vote between contenders: each gives its votes back, so
                    // retry after a short random delay rather than the holder's TTL.
                    holder.ttl_left = Duration::from_millis(5 + crate::token::random_u64() % 45);
                }
                Ok(Acquire::Busy(holder))
            }
            _ => Err(self.no_quorum("granted the lock", fences.len(), &answers)),
        }
    }

    async fn renew(&self, name: &str, token: &str, ttl: Duration) -> Result<(), BackendError> {
        let answers = self
            .on_all(node_timeout(ttl), |n| n.renew(name, token, ttl))
            .await;
        let ok = answers.iter().filter(|a| a.is_ok()).count();
        let lost = answers
            .iter()
            .filter(|a| matches!(a, Err(BackendError::NotOwner)))
            .count();
        if ok >= self.quorum() {
            Ok(())
        } else if lost > self.nodes.len() - self.quorum() {
            // A majority can no longer be ours: a definite loss.
            Err(BackendError::NotOwner)
        } else {
            Err(self.no_quorum("renewed the lease", ok, &answers))
        }
    }

    async fn release(&self, name: &str, token: &str, how: Release) -> Result<(), BackendError> {
        let answers = self
            .on_all(Duration::from_secs(1), |n| n.release(name, token, how))
            .await;
        if answers.iter().any(|a| a.is_ok()) {
            Ok(())
        } else if answers
            .iter()
            .all(|a| matches!(a, Err(BackendError::NotOwner)))
        {
            Err(BackendError::NotOwner)
        } else {
            Err(self.no_quorum("released the lock", 0, &answers))
        }
    }

    async fn inspect(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let answers = self
            .on_all(Duration::from_secs(1), |n| n.inspect(name))
            .await;
        let holders: Vec<&Holder> = answers
            .iter()
            .filter_map(|a| a.as_ref().ok()?.first())
            .collect();
        let answered = answers.iter().filter(|a| a.is_ok()).count();
        if answered < self.quorum() {
            return Err(self.no_quorum("answered", answered, &answers));
        }
        // Held only if a majority holds it; show the holder with the quorum's token.
        Ok((holders.len() >= self.quorum())
            .then(|| {
                holders
                    .iter()
                    .max_by_key(|h| h.fencing_token)
                    .map(|h| (*h).clone())
            })
            .flatten()
            .into_iter()
            .collect())
    }

    async fn force_release(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let answers = self
            .on_all(Duration::from_secs(1), |n| n.force_release(name))
            .await;
        let answered = answers.iter().filter(|a| a.is_ok()).count();
        if answered < self.quorum() {
            return Err(self.no_quorum("answered", answered, &answers));
        }
        Ok(answers
            .into_iter()
            .filter_map(|a| a.ok()?.into_iter().next())
            .max_by_key(|h| h.fencing_token)
            .into_iter()
            .collect())
    }

    async fn wait_for_release(
        &self,
        name: &str,
        busy: &Holder,
        max: Duration,
    ) -> Result<(), BackendError> {
        // A release wakes this waiter on every server that queued it: the first
        // wake-up (or the first timer) is enough.
        let waits: Vec<_> = self
            .nodes
            .iter()
            .map(|n| Box::pin(n.wait_for_release(name, busy, max)))
            .collect();
        if waits.is_empty() {
            // Cannot happen (a quorum has servers), but `select_all` must not see it.
            tokio::time::sleep(crate::backend::wait_slice(busy.ttl_left, max)).await;
            return Ok(());
        }
        let (first, _, _) = select_all(waits).await;
        first
    }

    async fn stop_waiting(&self, name: &str) -> Result<(), BackendError> {
        let _ = self
            .on_all(Duration::from_secs(1), |n| n.stop_waiting(name))
            .await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::table::testing::{args, ctx};

    #[test]
    fn a_quorum_needs_three_plain_redis_servers() {
        let a = args(&[]);
        let urls = |u: &[&str]| u.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let t = parse(
            &urls(&["redis://a:1", "redis://b:2", "rediss://c:3"]),
            &ctx(&a, None),
        )
        .unwrap();
        assert_eq!(t.display(), "a:1,b:2,c:3");
        for bad in [
            urls(&["redis://a:1", "redis://b:2"]),
            urls(&["redis://a:1", "redis://b:2", "etcd://c:3"]),
            urls(&["redis://a:1", "redis://b:2", "redis+sentinel://c:3/m"]),
        ] {
            assert_eq!(
                parse(&bad, &ctx(&a, None)).unwrap_err(),
                ConfigError::BadQuorum,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn per_server_timeouts_stay_far_below_the_ttl() {
        assert_eq!(
            node_timeout(Duration::from_secs(30)),
            Duration::from_secs(1)
        );
        assert_eq!(
            node_timeout(Duration::from_secs(2)),
            Duration::from_millis(200)
        );
        assert_eq!(
            node_timeout(Duration::from_millis(100)),
            Duration::from_millis(50)
        );
    }
}
