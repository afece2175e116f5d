//! The one interface every lock backend implements, and its typed results.
//!
//! A backend stores, per lock name, the holder's random token with an expiry, a fencing
//! counter that only grows, and the holder's description for `status`. Its answers
//! are never folded into a bool: "held by someone else" ([`Acquire::Busy`]), "not
//! yours any more" ([`BackendError::NotOwner`]) and "cannot tell right now"
//! ([`BackendError::Unavailable`]) lead to different exit statuses and actions.
//! One file per backend; [`AnyBackend`] picks one from the configuration.

pub mod etcd;
pub mod postgres;
pub mod redis;
pub mod redlock;

use std::time::Duration;

use thiserror::Error;

/// The longest a waiter sleeps without asking the backend again, in case a wake-up
/// was lost (a connection cut, a woken waiter that died before taking the lock).
pub const MAX_WAIT_SLICE: Duration = Duration::from_secs(2);

/// How long a waiter sleeps before trying again: until the busy lease would expire
/// (`expires_in`: a crashed holder never sends a wake-up), at most
/// [`MAX_WAIT_SLICE`] and `max`, plus up to 50 ms of jitter so that waiters that time
/// out together do not ask together.
pub fn wait_slice(expires_in: Duration, max: Duration) -> Duration {
    let jitter = Duration::from_millis(crate::token::random_u64() % 50);
    expires_in
        .min(MAX_WAIT_SLICE)
        .saturating_add(jitter)
        .min(max)
}

/// Why a backend call did not give an answer about the lock.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BackendError {
    /// The backend could not be reached or did not answer in time. May pass.
    #[error("{0}")]
    Unavailable(String),
    /// The backend refused us for good: wrong password, missing permission, a
    /// server that cannot run our scripts. Retrying will not help.
    #[error("{0}")]
    Refused(String),
    /// The lock is not (or no longer) held with our token.
    #[error("the lock is not held by this lockrun")]
    NotOwner,
}

impl BackendError {
    /// True if retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            BackendError::Unavailable(_) => true,
            BackendError::Refused(_) | BackendError::NotOwner => false,
        }
    }
}

/// Who holds a lock, as stored by the holder's lockrun.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Holder {
    /// Host name of the holder.
    pub host: String,
    /// Process id of the holder's lockrun.
    pub pid: u32,
    /// Acquisition time, milliseconds since the Unix epoch (server clock).
    pub since_ms: u64,
    /// The fencing token handed out with this acquisition.
    pub fencing_token: u64,
    /// Lease time left.
    pub ttl_left: Duration,
}

impl Holder {
    /// The acquisition time as RFC 3339 (seconds, UTC), for messages.
    pub fn since(&self) -> String {
        let at = std::time::UNIX_EPOCH + Duration::from_millis(self.since_ms);
        humantime::format_rfc3339_seconds(at).to_string()
    }
}

/// What lockrun asks for when acquiring.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    /// The random token that proves ownership (hex of 128 random bits).
    pub token: String,
    /// Lease length.
    pub ttl: Duration,
    /// This host's name, stored for `status`.
    pub host: String,
    /// This lockrun's pid, stored for `status`.
    pub pid: u32,
}

/// The answer to an acquire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// Ours, with this fencing token.
    Acquired {
        /// Strictly larger than every token handed out before for this name.
        fencing_token: u64,
    },
    /// Someone else holds it.
    Busy(Holder),
}

/// What to do with the key when releasing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Delete it now.
    Now,
    /// Keep it for this much longer (`--hold-at-least`), then let it expire.
    KeepFor(Duration),
}

/// A lock backend. Every call checks ownership by token on the server side (renew
/// and release never touch another holder's lock) and is bounded in time by the
/// caller with a timeout shorter than the lease left. Methods take `&self` so that a
/// renewal can be in flight while the driver does other work; implementations keep
/// their connection state behind short-lived locks, never held across an await.
#[allow(async_fn_in_trait)]
pub trait Backend {
    /// Tries once to take lock `name`.
    async fn acquire(&self, name: &str, req: &AcquireRequest) -> Result<Acquire, BackendError>;

    /// Extends our lease to `ttl` from now, if the stored token is still `token`.
    async fn renew(&self, name: &str, token: &str, ttl: Duration) -> Result<(), BackendError>;

    /// Gives the lock up if the stored token is still `token` and wakes one waiter.
    async fn release(&self, name: &str, token: &str, how: Release) -> Result<(), BackendError>;

    /// Who holds `name` now, if anyone.
    async fn inspect(&self, name: &str) -> Result<Option<Holder>, BackendError>;

    /// Breaks the lock whoever holds it; returns the holder it removed, if any.
    async fn force_release(&self, name: &str) -> Result<Option<Holder>, BackendError>;

    /// Waits until `name` may have become free: a release notification, the busy
    /// lease's expiry (`busy`), or `max`, whichever is first. Returning early is
    /// always allowed; the caller tries again.
    async fn wait_for_release(
        &self,
        name: &str,
        busy: &Holder,
        max: Duration,
    ) -> Result<(), BackendError>;

    /// Stops waiting for `name` (forgets this waiter's place in the queue).
    async fn stop_waiting(&self, name: &str) -> Result<(), BackendError>;
}

/// The backend named by the configuration's URL.
pub enum AnyBackend {
    /// One Redis server (boxed, like etcd: their clients are large).
    Redis(Box<redis::RedisBackend>),
    /// A lease table in PostgreSQL.
    Postgres(postgres::PostgresBackend),
    /// An etcd lease.
    Etcd(Box<etcd::EtcdBackend>),
    /// A Redlock quorum of Redis servers.
    Redlock(redlock::RedlockBackend),
}

impl AnyBackend {
    /// Opens (lazily: nothing is connected yet) the backend `config` names;
    /// `waiting` says the caller may wait for a busy lock (`--wait`).
    pub fn open(config: &crate::config::BackendConfig, waiting: bool) -> AnyBackend {
        use crate::config::Target;
        match &config.target {
            Target::Redis(t) => AnyBackend::Redis(Box::new(redis::RedisBackend::new(
                t.clone(),
                config,
                waiting,
            ))),
            Target::Postgres(t) => {
                AnyBackend::Postgres(postgres::PostgresBackend::new(t.clone(), config, waiting))
            }
            Target::Etcd(t) => {
                AnyBackend::Etcd(Box::new(etcd::EtcdBackend::new(t.clone(), config, waiting)))
            }
            Target::Redlock(nodes) => {
                AnyBackend::Redlock(redlock::RedlockBackend::new(nodes.clone(), config, waiting))
            }
        }
    }
}

/// Forwards a call to whichever backend this is.
macro_rules! dispatch {
    ($self:ident, $b:ident => $call:expr) => {
        match $self {
            AnyBackend::Redis($b) => $call.await,
            AnyBackend::Postgres($b) => $call.await,
            AnyBackend::Etcd($b) => $call.await,
            AnyBackend::Redlock($b) => $call.await,
        }
    };
}

impl Backend for AnyBackend {
    async fn acquire(&self, name: &str, req: &AcquireRequest) -> Result<Acquire, BackendError> {
        dispatch!(self, b => b.acquire(name, req))
    }

    async fn renew(&self, name: &str, token: &str, ttl: Duration) -> Result<(), BackendError> {
        dispatch!(self, b => b.renew(name, token, ttl))
    }

    async fn release(&self, name: &str, token: &str, how: Release) -> Result<(), BackendError> {
        dispatch!(self, b => b.release(name, token, how))
    }

    async fn inspect(&self, name: &str) -> Result<Option<Holder>, BackendError> {
        dispatch!(self, b => b.inspect(name))
    }

    async fn force_release(&self, name: &str) -> Result<Option<Holder>, BackendError> {
        dispatch!(self, b => b.force_release(name))
    }

    async fn wait_for_release(
        &self,
        name: &str,
        busy: &Holder,
        max: Duration,
    ) -> Result<(), BackendError> {
        dispatch!(self, b => b.wait_for_release(name, busy, max))
    }

    async fn stop_waiting(&self, name: &str) -> Result<(), BackendError> {
        dispatch!(self, b => b.stop_waiting(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_slices_end_at_the_expiry_the_cap_or_the_wait_left() {
        let ms = Duration::from_millis;
        for _ in 0..100 {
            let s = wait_slice(ms(300), Duration::from_secs(60));
            assert!(s >= ms(300) && s < ms(350), "{s:?}");
            let s = wait_slice(Duration::from_secs(30), Duration::from_secs(60));
            assert!(s >= MAX_WAIT_SLICE && s < MAX_WAIT_SLICE + ms(50), "{s:?}");
            assert_eq!(wait_slice(Duration::from_secs(30), ms(100)), ms(100));
        }
    }
}
